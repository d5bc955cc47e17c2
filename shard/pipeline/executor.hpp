// executor.hpp — one rank's part of a pipelined step: its list of actions (schedule.hpp) run
// over its units, with activations and their gradients sent to the neighbouring stages.
//
// A forward of (chunk c, micro-batch m) receives its input from the previous chunk's rank (the
// first chunk takes the tokens), runs the chunk's units keeping what their backward needs, and
// sends its output on; the last chunk computes the loss instead, leaving d(loss)/d(logits) in
// place (or, a GPU's bf16 head, in a block of its own: runner.hpp's logits_grad_dtype). A backward receives the gradient of its output (the last chunk has it), runs the units
// in reverse, and sends the gradient of its input back. Messages are in the activation dtype
// (--activation-dtype bf16: rounded to bf16 when sent, widened to f32 when received, as Megatron
// sends 2 bytes an activation between stages), a mixture of experts' auxiliary floats behind them. Point-to-point semantics are the ones
// check_schedule simulates: a send is posted and the rank moves on; each action first posts its
// own receive and those of the next forward and backward that need one; before it waits for its
// message, it waits for its own posted sends and frees their buffers there,
// so what a stage holds at each moment depends on the schedule only (predictions match runs to
// the byte). Messages are told apart by (kind, chunk, micro-batch), known from the schedule.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "src/model/runner.hpp"
#include "shard/pipeline/schedule.hpp"

namespace shardlab {

// Where one rank's time went in its part of a pipelined step (bench-train's measured bubble, the
// trace's action track). Times are ms on the ledger's clock (Ledger::start()). A wait is the time
// an action spent getting its message: posting receives, completing this rank's own posted sends,
// waiting for the message; the rest of an action is compute. Four clock reads per action: the
// executor always records (pp 1 does not run it).
struct PipelineTiming {
  struct Span {
    PipeAction action;
    double start_ms = 0, end_ms = 0;
    double wait_start_ms = 0, wait_ms = 0;  // the message wait inside the span (0 for none)
  };
  std::vector<Span> actions;  // in the order run
  double start_ms = 0, end_ms = 0;  // the first action's start, the last posted send's completion
  double busy_ms() const;           // the actions less their waits
  double wall_ms() const { return end_ms - start_ms; }
  // The idle share of the rank's pipelined part: 1 - busy / wall (0 when nothing ran).
  double bubble() const { return wall_ms() > 0 ? 1 - busy_ms() / wall_ms() : 0; }
  double compute_ms(PipeAction::Kind kind) const;  // compute in actions of a kind (their waits excluded)
  double forward_ms() const { return compute_ms(PipeAction::forward); }
  double backward_ms() const { return compute_ms(PipeAction::backward); }  // B only, under a split
  double weight_ms() const { return compute_ms(PipeAction::weight); }      // W (0 without a split)
};

struct PipelineRun {
  const StageSplit& split;
  const PipeSchedule& schedule;
  int rank = 0;                  // this rank's pipeline coordinate
  Communicator& pp;              // the pipeline group (peers by pipeline coordinate)
  // Elements of chunk c's input per micro-batch (the output of unit split.begin(c) - 1); unused for c = 0.
  std::vector<int64_t> input_elems;
  // Before each action: the strategy learns which micro-batch runs and whether it is the last
  // (the units' gradients are reduced after their last micro-batch's backward).
  std::function<void(int64_t micro, bool last)> begin_micro;
  PipelineTiming* timing = nullptr;  // filled by run_pipeline when given (the training step's)
};

// The step's actions of this rank over `units` (this rank's, in model order: split.units_of(rank)),
// one Batch per micro-batch. Returns this rank's loss sum (the last chunk's rank; 0 elsewhere).
// Ledger phases name local unit indices, as Trainer::unit_names() lists them.
RunResult run_pipeline(const PipelineRun& run, const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec,
                       Backend& be, Pool& pool, std::span<const Batch> micro, UnitHooks& hooks, float dlogit_scale,
                       Checkpointing checkpointing, const TpContext& tp, EpContext* ep = nullptr);

// Forward only (evaluation): every micro-batch through this rank's chunks in order, the loss on the
// last chunk's rank (hooks.forward_loss, or the vocabulary-parallel loss under TP); 0 elsewhere.
// With `logits` (one micro-batch: sampling), the last chunk's rank also copies its logits there,
// as run_forward does.
RunResult run_pipeline_forward(const PipelineRun& run, const std::vector<std::unique_ptr<Unit>>& units,
                               const ModelSpec& spec, Backend& be, Pool& pool, std::span<const Batch> micro,
                               UnitHooks& hooks, const TpContext& tp, EpContext* ep = nullptr,
                               std::vector<float>* logits = nullptr);

}  // namespace shardlab
