// `shardlab plan`: every layout of tp x pp (schedule, virtual stages) x dp (strategy, shard group),
// sequence parallelism, checkpointing, offload and micro-batch for --world devices, timed by the
// model of src/plan/plan_time.hpp and walked fastest first with memory predicted exactly
// (src/plan/plan.hpp); a flag given pins its dimension. --measure-top K runs the best K here.
#include <algorithm>
#include <cstdio>

#include "src/plan/calibrate.hpp"
#include "src/plan/ledger_price.hpp"
#include "src/core/device_peaks.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"
#include "src/plan/measure.hpp"
#include "src/plan/plan.hpp"
#include "src/report/plan_report.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

ExitCode cmd_plan(const Args& args, const Context& ctx) {
  cli::PlanFlags f;
  PlanConfig pc;
  cli::Desc desc = cli::plan_options(f, pc);
  cli::po::variables_map vm;
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"plan"}, nullptr, &vm)) return ExitCode::ok;

  // The model: a preset, or the size flags over a family's small preset.
  if (!f.family.empty()) {
    const std::vector<std::string> names = model_family_names();
    SHARD_REQUIRE(std::find(names.begin(), names.end(), f.family) != names.end(), "--family {}: expected {}",
                  f.family, cli::family_names(" or "));
    SHARD_REQUIRE(f.model.preset.empty(), "--family {} with --model {}: the preset fixes the family; give one",
                  f.family, f.model.preset);
    f.model.preset = model_family(f.family).sized_preset();
  }
  pc.train.spec = f.model.spec();
  pc.train.optim.kind = parse_optimizer(f.optimizer);
  SHARD_REQUIRE(pc.train.optim.kind != OptimizerKind::sgd, "plan --optimizer sgd: plan prices adamw or muon");
  if (pc.train.optim.kind == OptimizerKind::muon) pc.train.optim.momentum = kMuonMomentum;
  f.strategy.apply_dtypes(pc.train.strategy);
  pc.train.strategy.precision.validate();
  cli::set_pins(pc.pins, f, vm);
  cli::set_zeropp(pc, f);
  pc.train.layout.cp.method = parse_cp_method(f.mesh.cp_method);  // a setting, not searched
  cli::set_device(pc, f, vm);
  // Predicted as the --gpu preset's device runs the step; as the CPU runs it where it is measured
  // here (--calibrate, --measure-top).
  pc.train.device = f.calibrate || f.measure_top > 0 ? Device::cpu : Device::cuda;
  pc.train.spec.activation_dtype =
      f.model.activation_dtype_on(pc.train.device, pc.train.strategy.precision.param_dtype);
  pc.keep = static_cast<size_t>(std::max({f.show, f.measure_top, f.ledger_top, 1}));
  SHARD_REQUIRE(f.ledger_top >= 0 && (f.ledger_top == 0 || !f.calibrate),
                "--ledger-top {}: expected K >= 0, priced on the --gpu preset (not with --calibrate)", f.ledger_top);
  SHARD_REQUIRE(f.measure_top >= 0 && f.measure_steps >= 2, "--measure-top {} --measure-steps {}: expected K >= 0 and "
                "at least 2 steps", f.measure_top, f.measure_steps);
  SHARD_REQUIRE(f.measure_top == 0 || ctx.mpi.world() == pc.world,
                "--measure-top runs the configurations on real ranks: start --nproc {} (the --world), not {}",
                pc.world, ctx.mpi.world());
  pc.validate();
  f.reports.check("before the search");  // every rank: each stops with the same message
  auto backend = make_cpu(f.run, ctx);
  if (f.calibrate) {
    Pool pool(*backend);
    auto comm = ctx.world(CommKind::mpi).connect(pool);
    pc.rates = calibrate_rates(*backend, *comm, pc, std::min<int64_t>(pc.batch() / pc.world, 8),
                               ctx.mpi.rank() == 0 ? stdout : nullptr);
    pc.rates.device.ranks_per_node = pc.ranks_per_node;
  }
  PlanResult plan = make_plan(pc, ctx.mpi.rank() == 0 ? stderr : nullptr);
  auto connect = [&](Pool& pool) { return ctx.world(CommKind::mpi).connect(pool); };
  if (f.measure_top > 0)
    measure_plan(*backend, connect, pc, f.memory.pools(), plan.entries, f.measure_top, f.measure_steps);
  if (f.ledger_top > 0 && ctx.mpi.rank() == 0)
    price_from_ledgers(pc, plan.entries, static_cast<size_t>(f.ledger_top),
                       gpu_device_model(device_preset(f.device.gpu)));
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  print_plan(pc, plan, static_cast<size_t>(std::max({f.show, f.measure_top, f.ledger_top})), stdout);
  if (!f.reports.json.empty()) write_text(f.reports.json, plan_json(pc, plan) + "\n", "--json");
  if (!f.reports.html.empty()) write_text(f.reports.html, plan_html(pc, plan), "--html");
  // Nothing that fits is an answer a script must not take for a plan: the out-of-memory status, and
  // the fastest layout that does not fit with why (the table above lists the next ones).
  if (std::none_of(plan.entries.begin(), plan.entries.end(), [](const PlanEntry& e) { return e.fits; })) {
    std::fprintf(stderr, "shardlab plan: nothing fits %s per rank%s\n", format_bytes(double(pc.device_memory)).c_str(),
                 plan.entries.empty() ? "" : fmt::format(" (the fastest layout, {}: {})", plan.entries[0].label(),
                                                          plan.entries[0].why).c_str());
    return ExitCode::out_of_memory;
  }
  return ExitCode::ok;
}

}  // namespace shardlab
