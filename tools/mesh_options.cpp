// mesh_options.cpp — the mesh's flags: every axis's degree (--dp-shard, --dp-replicate, --ep, --cp,
// --tp, --pp) and what each axis needs beyond it (one group of options.hpp, in a file of its own).
#include <fmt/format.h>

#include "tools/options.hpp"

namespace shardlab::cli {

namespace {
// --shard-group S (the name before the mesh): --dp-shard S, the replicas taking the rest;
// InputError naming S and the world when S does not divide it.
ParallelDims shard_group_dims(int S, int world) {
  SHARD_REQUIRE(S >= 0 && S <= (1 << 20), "--shard-group {}: expected 0 (the whole world) or a group size", S);
  SHARD_REQUIRE(S == 0 || (S <= world && world % S == 0),
                "--shard-group {} does not divide the world of {} ranks: every group needs S ranks", S, world);
  ParallelDims d;
  d.dp_shard = S;
  return d.resolved(world);
}
}  // namespace

void MeshOptions::add(Desc& d) {
  Desc g("mesh");
  g.add_options()("dp-shard", po::value(&dims.dp_shard)->default_value(0),
                  "data-parallel ranks that shard the model state (zero1-3; FSDP's shard dimension), in groups of "
                  "consecutive ranks; 0 = what --dp-replicate, --tp and --pp leave of the world")(
      "dp-replicate", po::value(&dims.dp_replicate)->default_value(0),
      "replicas of the sharded state (hybrid sharding: gradients reduce-scattered within a shard group, then "
      "all-reduced across the replicas); 0 = what the other degrees leave (1 when --dp-shard is 0 too)")(
      "tp", po::value(&dims.tp)->default_value(1),
      "tensor-parallel ranks, innermost (consecutive ranks: keep a group inside a node): Megatron's layout, "
      "attention split by heads and the MLP by its width, the vocabulary over the embedding and the head; must "
      "divide the heads, the KV heads and the MLP width")(
      "pp", po::value(&dims.pp)->default_value(1),
      "pipeline stages, outermost (consecutive stages on different nodes): the units split into contiguous "
      "stages, activations sent between neighbours; with DDP/ZeRO over each stage's data-parallel ranks and TP "
      "inside it")(
      "pp-schedule", po::value(&pp_schedule)->default_value(pp_schedule),
      ("with --pp: " + pp_schedule_help()).c_str())(
      "pp-virtual", po::value(&pp_virtual)->default_value(pp_virtual),
      "with --pp-schedule interleaved-1f1b or zb-v: model chunks per rank (virtual stages); chunk c runs "
      "on stage c % pp (zb-v: in a V, c and 2 pp - 1 - c on stage c). 0: the schedule's own (zb-v 2, others 1)")(
      "pp-split", po::value(&pp_split)->default_value(""),
      "with --pp: units per chunk in model order, e.g. 3,3,2 (pp x pp-virtual counts summing to the units: "
      "the embedding, the blocks and the head); default: balanced by each unit's parameters and attention work")(
      "shard-group", po::value(&shard_group)->default_value(0),
      "the old name of --dp-shard, kept: S must divide the world; 0 = the whole world");
  add_switch(g, "sequence-parallel", sequence_parallel,
             "with --tp: split the activations between the tensor-parallel regions (norms, residuals) along the "
             "token rows too: all-gathers and reduce-scatters instead of all-reduces, those activations / tp");
  g.add_options()("cp", po::value(&dims.cp)->default_value(1),
                  "context-parallel ranks, between --dp-shard and --tp: each sequence cut into pieces over them "
                  "(activations / cp), keys and values exchanged in attention (fused attention only); their "
                  "gradients add up like data-parallel ranks' and ZeRO/FSDP shard over dp-shard x cp")(
      "ep", po::value(&dims.ep)->default_value(1),
      "expert-parallel ranks (mixtral, qwen3_moe), drawn from the data-parallel ones, between --dp-shard and "
      "--cp: each holds E / ep of every layer's experts and the tokens routed to them arrive by all-to-all; the "
      "other tensors are whole on each, sharded by the strategy over the data-parallel ranks that hold the same "
      "experts (dp / ep) and their gradients summed over the ep group; must divide the experts")(
      "cp-method", po::value(&cp_method)->default_value(cp_method),
      "with --cp: allgather (each layer all-gathers the group's keys and values, again in backward, and "
      "reduce-scatters their gradients) or ring (the keys and values passed from rank to rank while the tiles "
      "run, partial results merged by their log-sum-exp; dK/dV travel the ring in backward)")(
      "cp-balance", po::value(&cp_balance)->default_value(cp_balance),
      "with --cp: head-tail (2 x cp pieces, rank r holding pieces r and 2 cp - 1 - r: equal causal work) or "
      "contiguous (piece r of cp); --seq must split into the pieces");
  d.add(g);
}

PipelineConfig MeshOptions::pipeline() const {
  PipelineConfig p;
  p.schedule = parse_pp_schedule(pp_schedule);
  SHARD_REQUIRE(pp_virtual >= 0 && pp_virtual <= 1024,
                "--pp-virtual {}: expected 1 to 1024 chunks per rank (0: the schedule's own)", pp_virtual);
  // Unless given: the one count a schedule runs (zb-v's V of two chunks), else one chunk per rank.
  const std::vector<int>& own = p.schedule->plan_virtual;
  p.virtual_stages = pp_virtual > 0 ? pp_virtual : own.size() == 1 ? own.front() : 1;
  if (!pp_split.empty()) p.split = parse_pp_split(pp_split);
  return p;
}

ParallelDims MeshOptions::resolve(int world, int hsdp_ranks) const {
  ParallelDims d = dims;
  SHARD_REQUIRE(shard_group == 0 || (d.dp_shard == 0 && d.dp_replicate == 0),
                "--shard-group {} with --dp-shard/--dp-replicate: --shard-group is --dp-shard's old name; give one",
                shard_group);
  if (shard_group > 0) d.dp_shard = shard_group_dims(shard_group, world).dp_shard;
  if (hsdp_ranks > 0 && d.dp_shard == 0 && d.dp_replicate == 0)
    d.dp_shard = shard_group_dims(hsdp_ranks, world).dp_shard;
  return d.resolved(world);
}

ParallelLayout MeshOptions::layout(int world, int hsdp_ranks) const {
  ParallelLayout l;
  l.dims = resolve(world, hsdp_ranks);
  l.sequence_parallel = sequence_parallel;
  l.pipeline = pipeline();
  l.cp = {parse_cp_method(cp_method), parse_cp_balance(cp_balance)};
  return l;
}

}  // namespace shardlab::cli
