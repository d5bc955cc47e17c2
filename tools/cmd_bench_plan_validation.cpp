// `shardlab bench-plan-validation`: the time model of `plan` against Narayanan et al. 2021's Table 1
// (benchmarks/plan_validation.hpp), optionally beside plan's free search.
#include "benchmarks/plan_validation.hpp"
#include "src/core/device_peaks.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"
#include "tools/runtime.hpp"

namespace shardlab {

ExitCode cmd_bench_plan_validation(const Args& args, const Context& ctx) {
  cli::ReportOptions reports;
  cli::DeviceRateOptions device;
  bool search = false, ledger = false;
  cli::Desc desc = cli::command_options("bench-plan-validation");
  device.add(desc, kA100_80GB.name);
  cli::add_switch(desc, "search", search,
                  "also run plan's free search for each row's model, GPUs and global batch (80 GiB devices, the a100-80gb preset's) beside the "
                  "published layout pinned: does it find that layout, or a faster one that fits?");
  cli::add_switch(desc, "ledger", ledger,
                  "also price each row's published layout from its own step (the cost ledger of every pipeline "
                  "stage's meta step on the cuda target, the a100-80gb preset's device model) beside the model");
  reports.add(desc, "write the rows, the rates and the errors as JSON (schema shardlab.plan-validation/1)", nullptr,
              nullptr);
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"bench-plan-validation"})) return ExitCode::ok;
  const DeviceRates rates = device.rates();
  const Achievable& ach = device.achievable;
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  const ValidationResult res = run_plan_validation(rates, ach, stdout);
  if (ledger) run_ledger_validation(stdout);
  if (search) run_plan_search(rates, ach, stdout);
  if (!reports.json.empty()) write_text(reports.json, plan_validation_json(rates, ach, res) + "\n", "--json");
  return ExitCode::ok;
}

}  // namespace shardlab
