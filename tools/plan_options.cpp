// plan_options.cpp — plan's option group (plan_options.hpp).
#include "tools/plan_options.hpp"

#include <algorithm>

#include "src/core/device_peaks.hpp"
#include "src/core/units.hpp"
#include "src/model/family.hpp"

namespace shardlab::cli {

std::string family_names(const char* sep, bool with_preset) {
  std::string s;
  for (const std::string& n : model_family_names())
    s += (s.empty() ? "" : sep) + (with_preset ? fmt::format("{}: from {}", n, model_family(n).sized_preset()) : n);
  return s;
}

Desc plan_options(PlanFlags& f, PlanConfig& pc) {
  f.strategy.param = "bf16";
  Desc desc = command_options("plan");
  add_world(desc, pc.world, "devices (ranks) to plan for");
  f.device.add(desc, kH100_80GB.name);
  desc.add_options()(
      "ranks-per-node", po::value(&pc.ranks_per_node)->default_value(pc.ranks_per_node),
      "ranks per node: tensor parallelism stays within one; collectives within it use NVLink, across nodes the "
      "network; hybrid sharding groups are one node's data-parallel ranks")(
      "family", po::value(&f.family)->default_value(""),
      fmt::format("{}: the family the size flags (--layers --dim --heads --vocab --seq --kv-heads --ffn-dim) describe, "
                  "without --model ({})", family_names(" or "), family_names("; ", true)).c_str())(
      "global-batch", po::value(&pc.global_batch)->default_value(0), "sequences per step (0 = 8 per rank)")(
      "strategy", po::value(&f.kind)->default_value(""), "pin the data-parallel strategy: ddp, zero1, zero2, zero3")(
      "activation-checkpointing", po::value(&f.ckpt)->default_value(""), "pin it: none, attention, blocks")(
      "offload", po::value(&f.offload)->default_value(""), "pin it: none, optimizer, params")(
      "optimizer", po::value(&f.optimizer)->default_value(f.optimizer),
      "adamw or muon (its state in each layout's memory; muon pins --offload none: docs/muon.md)")(
      "micro-batch", po::value(&f.micro_batch)->default_value(0),
      "pin the sequences per micro-batch (accumulation makes up --global-batch)")(
      "overlap", po::value(&pc.rates.dp_overlap)->default_value(pc.rates.dp_overlap, "0.9"),
      "share of the overlappable data-parallel traffic hidden behind compute")(
      "measure-top", po::value(&f.measure_top)->default_value(0),
      "run the top K configurations that fit for --measure-steps steps each (needs --nproc = --world) and print "
      "measured beside predicted")(
      "ledger-top", po::value(&f.ledger_top)->default_value(0),
      "price the top K configurations that fit from their own steps as well (profile --time's cost ledger on the "
      "--gpu preset, every pipeline stage, the schedule's bubble) and print it beside the model's time")(
      "show", po::value(&f.show)->default_value(f.show),
      "configurations that fit to find and list (the search ends when it has them)");
  add_switch(desc, "calibrate", f.calibrate,
                  "measure the rates on this machine instead of --gpu (a few training steps, an all-reduce, copies, "
                  "AdamW, the wait at a collective between ranks); needs --device-memory");
  add_measure_steps(desc, f.measure_steps,
                    "steps per measured configuration (the first a warm-up; 11 or more go in rounds over the "
                    "configurations in turn, up to 4, each round's first step a warm-up too)");
  Desc z("ZeRO++ (zero3 whose shard group spans nodes is tried plain and with these levers: hpZ by default, the "
         "lossy qwZ and qgZ only when given)");
  f.strategy.add_zeropp_levers(z, pc.zeropp);
  desc.add(z);
  f.run.add(desc);
  f.memory.add(desc);
  f.model.add(desc);
  f.strategy.add_dtypes(desc, nullptr);
  f.mesh.add(desc);
  f.reports.add(desc, "write the configurations walked as JSON (schema shardlab.plan/2)",
                "write a self-contained HTML page: the rates and the ranked configurations with their time split as bars",
                nullptr);
  return desc;
}

void set_pins(PlanPins& pins, const PlanFlags& f, const po::variables_map& vm) {
  SHARD_REQUIRE(!given_flag(vm, "pp-split"), "plan --pp-split: the planner splits the stages by cost; leave it out");
  SHARD_REQUIRE(!given_flag(vm, "cp-balance") || f.mesh.cp_balance == "head-tail",
                "plan --cp-balance {}: the planner times head-tail pieces (equal causal work per rank); leave it out",
                f.mesh.cp_balance);
  SHARD_REQUIRE(!given_flag(vm, "dp-replicate") || given_flag(vm, "dp-shard"),
                "plan --dp-replicate without --dp-shard: pin the shard group with --dp-shard (the replicas follow)");
  const MeshOptions& mesh = f.mesh;
  if (given_flag(vm, "tp")) pins.tp = mesh.dims.tp;
  if (given_flag(vm, "cp")) pins.cp = mesh.dims.cp;
  if (given_flag(vm, "ep")) pins.ep = mesh.dims.ep;
  if (given_flag(vm, "pp")) pins.pp = mesh.dims.pp;
  if (given_flag(vm, "pp-virtual") && mesh.pp_virtual > 0) pins.pp_virtual = mesh.pp_virtual;
  if (given_flag(vm, "pp-schedule")) pins.schedule = parse_pp_schedule(mesh.pp_schedule);
  if (given_flag(vm, "dp-shard")) pins.dp_shard = mesh.dims.dp_shard;
  if (given_flag(vm, "shard-group")) pins.dp_shard = mesh.shard_group;
  if (given_flag(vm, "sequence-parallel")) pins.sequence_parallel = mesh.sequence_parallel;
  if (!f.kind.empty()) pins.strategy = parse_strategy(f.kind);
  if (!f.ckpt.empty()) pins.checkpointing = parse_checkpointing(f.ckpt);
  if (!f.offload.empty()) pins.offload = parse_offload(f.offload);
  if (f.micro_batch != 0) pins.micro_batch = f.micro_batch;
  if (f.optimizer == "muon") {  // the host update cannot bring a matrix whole (docs/muon.md)
    SHARD_REQUIRE(!pins.offload || *pins.offload == Offload::none, "plan --optimizer muon --offload {}: Muon runs "
                  "without offload; leave --offload out", f.offload);
    pins.offload = Offload::none;
  }
}

void set_zeropp(PlanConfig& pc, const PlanFlags& f) {
  StrategyConfig s = pc.train.strategy.under(StrategyKind::zero3);
  s.zeropp.block = pc.zeropp.block;
  f.strategy.apply_zeropp(s);                             // the lossy levers as given, none otherwise
  if (f.strategy.secondary_shard.empty()) s.zeropp.secondary = true;  // hpZ changes no number: tried unless refused
  s.validate();
  const bool lossy = s.zeropp.weight_bits > 0 || s.zeropp.grad_bits > 0;
  SHARD_REQUIRE(!lossy || !pc.pins.strategy || *pc.pins.strategy == StrategyKind::zero3,
                "plan {} with --strategy {}: the ZeRO++ levers are zero3's; pin zero3 or leave --strategy out",
                s.zeropp.label(), strategy_name(*pc.pins.strategy));
  pc.zeropp = s.zeropp;
}

void set_device(PlanConfig& pc, const PlanFlags& f, const po::variables_map& vm) {
  const PoolConfig budgets = f.memory.pools();
  SHARD_REQUIRE(!f.calibrate || !given_flag(vm, "gpu"), "--calibrate measures this machine: leave --gpu {} out",
                f.device.gpu);
  const DevicePeaks& preset = device_preset(f.device.gpu);
  if (!f.calibrate) {
    DeviceRates& r = pc.rates.device;
    r = f.device.rates();
    pc.rates.achievable = f.device.achievable;
    pc.rates.source = fmt::format("{} preset", preset.name);
    pc.rates.flash_attention = pc.train.spec.attention != AttentionKernel::naive;  // as the runtime would run it
    if (given_flag(vm, "ranks-per-node")) r.ranks_per_node = pc.ranks_per_node;
    else pc.ranks_per_node = std::min(r.ranks_per_node, pc.world);
    r.ranks_per_node = pc.ranks_per_node;
  }
  pc.device_memory = budgets.budget > 0 ? budgets.budget
                     : f.calibrate      ? 0
                                        : preset.budget_bytes();
  if (budgets.budget == 0 && !f.calibrate)
    pc.budget_note = fmt::format(" ({} {} less {} for the CUDA context, cuBLAS/cuDNN workspaces and NCCL's buffers; "
                                 "--device-memory sets it)", preset.name, format_bytes(double(preset.memory_bytes())),
                                 format_bytes(double(kDeviceHeadroomMib << 20)));
  pc.host_memory = budgets.host_budget;
}

}  // namespace shardlab::cli
