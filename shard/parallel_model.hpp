// parallel_model.hpp — ParallelModel: this rank's part of the model under every axis of its layout,
// and the work that crosses those axes. It builds the units (the tensor-parallel rank's slices), keeps
// the stage's chunks under pipeline parallelism with copies of the tied tensors the other end stage
// owns, and runs a step's micro-batches (the unit loop, or the pipeline's schedule through the same
// unit loop), evaluation batches and sampling forwards; it reduces the loss, the gradient norm and the
// tied gradients over the axes and gathers the whole model for a save. The Trainer asks it and never
// branches on an axis itself (torchtitan's parallelize step, as one object).
#pragma once
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shard/layout.hpp"
#include "shard/pipeline/executor.hpp"
#include "shard/strategy.hpp"
#include "src/model/parallel/ep.hpp"

namespace shardlab {

// Pipeline parallelism: the units' split into stages for `layout` (--pp-split as given, or balanced
// by each unit's cost), so reports can name what each stage holds.
StageSplit stage_split(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec,
                       const ParallelLayout& layout);
StageSplit stage_split(const ModelSpec& spec, const ParallelLayout& layout);  // over tp rank 0's units

struct ParallelModelConfig {
  ModelSpec spec;
  ParallelLayout layout;  // resolved against the world
  int64_t batch = 1;      // global, in sequences
  int64_t micro_batches = 1;
  Checkpointing checkpointing = Checkpointing::none;
};

// Fills `count` sequences from sequence `first` of one global batch into inputs and targets (B x T each).
using BatchFill = std::function<void(int64_t first, int64_t count, int32_t* inputs, int32_t* targets)>;

class ParallelModel {
 public:
  ParallelModel(ParallelModelConfig cfg, Mesh& mesh, Backend& be, Pool& pool);
  std::vector<std::unique_ptr<Unit>>& units() { return units_; }  // this rank's, in model order
  const std::vector<std::unique_ptr<Unit>>& units() const { return units_; }
  void attach(Strategy& strategy) { strategy_ = &strategy; }  // before any step

  // One training step's micro-batches of one global batch (fill) forward and backward: this rank's
  // loss sum. timing (pipeline parallelism): where the rank's time went.
  double train(const BatchFill& fill, float dlogit_scale, PipelineTiming* timing);
  // The step's mean-loss numerator from each rank's train(): summed over the data-parallel ranks
  // and the stages (the last one holds it).
  float reduce_loss(double loss_sum);
  // A model with an auxiliary channel (src/model/aux.hpp), after train(): the step's auxiliary loss
  // times the batch's positions (summed over the data-parallel ranks, as reduce_loss sums), and the
  // channel's statistics over every micro-step, every rank's (a mixture of experts: blocks/moe.hpp's
  // MoeRouting reads them). Collective; then reset.
  struct AuxStep {
    double aux_sum = 0;
    std::vector<double> stats;
  };
  AuxStep take_aux();
  // Forward only, one global batch: this rank's share of its loss sum (over the stages already).
  double evaluate(const BatchFill& fill);
  // After backward: the tied tensors' gradients summed over their stages (and under --ep the
  // tensors other than the experts' over the ep group); then the squared global gradient norm of the
  // whole model, the same on every rank.
  void sync_tied_grads();
  double grad_norm_sq();
  // Sampling: the logits of the context's last position (vocab columns, whole) from a forward of
  // `context` (B = 1), or from `logits` a decoder computed (decoded). False on the stages that do
  // not hold them (they take the token from share_token).
  bool last_logits(std::span<const int32_t> context, std::vector<float>& logits, bool decoded);
  int32_t share_token(int32_t token);  // the last stage's token on every rank (itself without --pp)
  bool decodes() const;                // a KV-cache decoder can run this rank's units
  // Collective: the model's parameters, gathered, and written as HF-named safetensors by rank 0
  // (write_units: base_config the model's original config.json); rank 0's config note, "" elsewhere.
  std::string save(const std::string& path, bool overwrite = false, const std::string& base_config = "",
                   const std::string& base_source = "");

  bool pipelined() const { return schedule_.has_value(); }
  // Seconds spent in the collectives of each group the units communicate over (--cp, --ep) since
  // the last call (then reset): an entry per active group.
  std::vector<std::pair<CommAxis, double>> take_axis_waits_s();
  // The train header's pipeline lines (none without --pp).
  void print_pipeline(std::FILE* out) const;

 private:
  void take_stage_units();
  void sum_dense_grads_over_ep();
  void add_aux(const RunResult& r);  // a micro-step's (or a pipelined step's) auxiliary channel into aux_
  PipelineRun pipeline_run(int64_t B = 0, int64_t T = 0);
  std::vector<Batch> stage_batches(const BatchFill& fill);  // every micro-batch of this rank
  Batch micro_step(const BatchFill& fill, int64_t k);       // micro-step k of every rank, this rank's Batch
  int64_t micro() const { return cfg_.batch / mesh_.dp_size() / cfg_.micro_batches; }
  int64_t local_seq() const { return cp_.active() ? cp_.local() : cfg_.spec.seq; }  // positions per sequence here
  // Fills count sequences, as `fill` does, with this rank's pieces of them under --cp (else fill itself).
  void fill_local(const BatchFill& fill, int64_t first, int64_t count, int32_t* inputs, int32_t* targets);
  Batch batch_of(int32_t* inputs, int32_t* targets, int64_t n);  // n sequences of local_seq(), cp attached
  std::vector<std::vector<float>> stage_units_whole(std::vector<std::vector<float>> host);
  std::vector<std::vector<float>> ep_units_whole(std::vector<std::vector<float>> host);

  ParallelModelConfig cfg_;
  Mesh& mesh_;
  Backend& be_;
  Pool& pool_;
  Strategy* strategy_ = nullptr;
  TpContext tp_;  // this rank's tensor-parallel group (inactive at --tp 1)
  CpContext cp_;  // this rank's context-parallel group and pieces (inactive at --cp 1)
  EpContext ep_;  // this rank's expert-parallel group (inactive at --ep 1)
  std::vector<int32_t> whole_inputs_, whole_targets_;  // --cp: whole sequences, before their pieces are taken
  std::vector<std::unique_ptr<Unit>> units_;
  // Pipeline parallelism (--pp > 1): the split, the step's schedule, every unit of the model (for
  // the sizes of the stages' inputs), and the tied tensors whose twin is on the other end stage.
  std::optional<StageSplit> split_;
  std::optional<PipeSchedule> schedule_;
  std::vector<std::unique_ptr<Unit>> model_units_;
  std::vector<std::pair<size_t, const TensorDecl*>> tied_;
  double tied_copy_sq_ = 0;  // this rank's tied copies' squared gradient, counted at their owner
  AuxStep aux_;              // this rank's, since the last take_aux()
  // Token ids: one micro-step of this rank's (of every data-parallel rank's under dp); under --pp every
  // micro-batch of this rank's.
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace shardlab
