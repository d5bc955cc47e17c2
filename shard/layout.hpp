// layout.hpp — ParallelLayout: how a run places the model on its ranks, beyond the data-parallel
// strategy: the degree of every mesh axis, the pipeline (schedule, virtual stages, split) and
// sequence parallelism, with every rule that ties the axes to each other and to the model and the
// batch in one validate(). The Trainer, the prediction, profile and plan check a layout here.
#pragma once
#include <cstdint>
#include <vector>

#include "shard/pipeline/schedule.hpp"
#include "shard/strategy.hpp"
#include "src/comm/mesh.hpp"
#include "src/model/parallel/cp.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

// Pipeline parallelism beyond its degree (dims.pp): the schedule, the virtual stages per rank and
// the split (shard/pipeline/schedule.hpp). The micro-batches are the accumulation micro-steps.
struct PipelineConfig {
  PpSchedule schedule;                            // --pp-schedule (the default unless given)
  int virtual_stages = 1;                         // --pp-virtual
  std::vector<int> split;                         // --pp-split: units per chunk; empty = balanced by cost
  // bench-train: the stages enter each step's pipelined part together (a barrier on the pipeline
  // group), so a stage's measured bubble is the schedule's and not the skew the previous step's
  // uneven optimizer work leaves between the stages.
  bool align_steps = false;
};

struct ParallelLayout {
  ParallelDims dims;  // resolved or not (0 = what the others leave of the world)
  PipelineConfig pipeline;
  // --sequence-parallel: with tensor parallelism (dims.tp > 1), the activations between its
  // regions split along the token rows too (src/model/tp.hpp).
  bool sequence_parallel = false;
  // Context parallelism beyond its degree (dims.cp): how keys and values reach the queries and how
  // each sequence is cut (src/model/parallel/cp.hpp).
  CpConfig cp;
  // --ranks-per-node R: consecutive ranks R to a node (0: one node holds every rank). ZeRO++'s
  // hierarchical levers cut the shard group by it, and reports split bytes into intra- and
  // inter-node by it (Mesh::crosses_nodes).
  int ranks_per_node = 0;

  // Every cross-axis rule, each message naming the values: the degrees against the world, the
  // global batch (sequences) against the data-parallel ranks and the micro-batches, sequence
  // parallelism against tp and the token rows, the pipeline's options against pp and the units.
  void validate(const ModelSpec& spec, const StrategyConfig& strategy, int64_t batch, int64_t micro_batches,
                int world) const;
  // The rules between the data-parallel strategy and the degrees alone (no model, no batch): dp
  // neither under tp nor pp, hybrid sharding only for zero1-3, group sizes in range.
  void check_strategy(const StrategyConfig& s) const;
  // The degrees strategy k runs with: dp and ddp replicate over one group of every data-parallel rank.
  ParallelDims dims_under(StrategyKind k) const;
  // --pp > 1: the split and the schedule against the model's units, before any unit is built.
  void validate_pipeline(const ModelSpec& spec, int64_t micro_batches) const;
  bool pipelined() const { return dims.pp > 1; }
  // The part of the model rank tp_rank of a tensor-parallel group builds, and the experts rank
  // ep_rank of an expert-parallel group holds.
  TpConfig tp(int tp_rank) const { return {dims.tp, tp_rank, sequence_parallel}; }
  EpConfig ep(int ep_rank) const { return {dims.ep, ep_rank}; }
};

}  // namespace shardlab
