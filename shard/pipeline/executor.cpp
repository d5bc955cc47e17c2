// executor.cpp — the executor of one rank's pipeline actions (executor.hpp).
#include "shard/pipeline/executor.hpp"

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "src/comm/communicator.hpp"
#include "src/model/blocks/loss_head.hpp"
#include "src/model/family.hpp"
#include "src/model/blocks/weight_grad.hpp"

namespace shardlab {
namespace {

// A message is named by the action that consumes it: the activation a forward of (c, m) takes, or
// the gradient a backward of (c, m) takes.
using Key = std::pair<int, std::pair<int, int>>;  // (kind, (chunk, micro))
Key key_of(const PipeAction& a) { return {a.kind, {a.chunk, a.micro}}; }

class Executor {
 public:
  Executor(const PipelineRun& run, const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec,
           Backend& be, Pool& pool, UnitHooks& hooks, const TpContext& tp,
           const std::vector<std::vector<PipeAction>>& lists, bool train)
      : run_(run), split_(run.split), units_(units), spec_(spec), be_(be), pool_(pool), hooks_(hooks),
        tp_(tp), last_chunk_(run.split.chunks() - 1),
        aux_extra_(train ? aux_floats(spec) : 0), message_dtype_(spec.activation_dtype) {
    int local = 0;
    for (int c : split_.chunks_of(run.rank)) {
      local_begin_[c] = local;
      local += split_.count(c);
    }
    SHARD_CHECK(local == static_cast<int>(units.size()), "pipeline rank {}: {} units, the split gives it {}", run.rank,
                units.size(), local);
    // What each neighbour will send this rank, in the order it sends: its own list says.
    for (int q = 0; q < static_cast<int>(lists.size()); ++q)
      for (const PipeAction& a : lists[static_cast<size_t>(q)]) {
        if (q == run.rank) continue;  // between this rank's own chunks: handed over, not sent
        if (a.kind == PipeAction::forward && a.chunk < last_chunk_ && split_.rank_of(a.chunk + 1) == run.rank)
          inbox_[q].expected.push_back({PipeAction::forward, a.chunk + 1, a.micro});
        if (a.kind == PipeAction::backward && a.chunk > 0 && split_.rank_of(a.chunk - 1) == run.rank)
          inbox_[q].expected.push_back({PipeAction::backward, a.chunk - 1, a.micro});
      }
  }

  void forward(const PipeAction& a, bool train, UnitContext& ctx) {
    Flight& f = flights_[{a.chunk, a.micro}];
    const int first = local_begin_.at(a.chunk), n = split_.count(a.chunk);
    f.outs.resize(static_cast<size_t>(n));
    f.saved.resize(static_cast<size_t>(n));
    Tensor in;
    // In training, the auxiliary channel of the chunks before this one arrives with its input (the
    // units' forwards add to it; the last chunk has the whole model's).
    std::unique_ptr<AuxChannel> aux = aux_extra_ ? family_of(spec_).aux_channel(spec_) : nullptr;
    ctx.aux = aux.get();
    if (a.chunk > 0) {
      f.input = unpack(take(a), run_.input_elems.at(static_cast<size_t>(a.chunk)), aux.get());
      in = f.input.flat(DType::f32).slice(0, run_.input_elems.at(static_cast<size_t>(a.chunk)));
    }
    const Batch& b = ctx.batch;
    for (int k = 0; k < n; ++k) {
      const size_t i = static_cast<size_t>(first + k), ks = static_cast<size_t>(k);
      // Evaluation: an output (or the received input) lives until the next unit has read it.
      Block* release = train ? nullptr : k > 0 ? &f.outs[ks - 1] : &f.input;
      f.outs[ks] = forward_unit(*units_[i], i, ctx, hooks_, in, f.saved[ks], train, release);
      in = f.outs[ks].flat(DType::f32);
      poke();
    }
    Block& last = f.outs.back();
    if (a.chunk == last_chunk_) {
      pool_.ledger().set_phase({PhaseKind::loss});
      const int64_t N = b.B * b.T;
      const Tensor logits = last.view(DType::f32, {N, static_cast<int64_t>(last.bytes() / sizeof(float)) / N});
      if (logits_out_ && !blocks::chunked_loss(spec_, tp_.config)) {  // the chunked head gives no logits
        logits_out_->resize(static_cast<size_t>(logits.numel()));
        be_.copy(Tensor::of(std::span<float>(*logits_out_)), logits);
      }
      if (aux) finish_aux(std::move(aux), N, f);
      // The logits' gradient in a block of its own where the head reads it so (a GPU's bf16), the
      // f32 logits then freed (runner.hpp's logits_grad_dtype).
      f.dlogits_dtype = logits_grad_dtype(*units_[static_cast<size_t>(first + n - 1)], tp_, spec_, train);
      loss_sum_ += head_loss(hooks_, be_, pool_, tp_, spec_, logits, b, dlogit_scale_, train, f.dlogits_dtype,
                             &f.dlogits);
      if (f.dlogits) last.reset();
      positions_ += N;
      if (!train) flights_.erase({a.chunk, a.micro});
    } else {
      pass_on({PipeAction::forward, a.chunk + 1, a.micro}, pack(std::move(last), aux.get()));
      if (!train) flights_.erase({a.chunk, a.micro});
    }
    pool_.ledger().set_phase({});
  }

  // A whole backward, or under a schedule that splits it the input's gradient only (B): each unit's
  // weight-gradient GEMMs are held, with the operands they read, until the weight action (W).
  void backward(const PipeAction& a, UnitContext& ctx, bool split) {
    auto it = flights_.find({a.chunk, a.micro});
    SHARD_CHECK(it != flights_.end(), "pipeline rank {}: backward of {} before its forward", run_.rank, describe(a));
    Flight f = std::move(it->second);
    flights_.erase(it);
    const int first = local_begin_.at(a.chunk), n = split_.count(a.chunk);
    std::vector<DeferredWeightGrads> held;
    if (split)
      for (int k = 0; k < n; ++k) held.emplace_back(units_[static_cast<size_t>(first + k)]->name());
    Block dnext;
    Tensor dout;
    // The whole model's auxiliary channel of this micro-batch, finished by the last chunk and passed
    // back with the gradients.
    std::unique_ptr<AuxChannel> aux = std::move(f.aux);
    if (a.chunk == last_chunk_ && f.dlogits) {  // the loss wrote d(loss)/d(logits) in a block of its own
      dnext = std::move(f.dlogits);
      dout = dnext.flat(f.dlogits_dtype);
    } else if (a.chunk == last_chunk_) {
      dout = f.outs.back().flat(DType::f32);  // the loss left d(loss)/d(logits) there
    } else {
      const int64_t elems = run_.input_elems.at(static_cast<size_t>(a.chunk) + 1);
      if (aux_extra_) aux = family_of(spec_).aux_channel(spec_);
      dnext = unpack(take(a), elems, aux.get());
      dout = dnext.flat(DType::f32).slice(0, elems);
      if (aux) aux->finish(dlogit_scale_);
    }
    ctx.aux = aux.get();
    for (int k = n; k-- > 0;) {
      const size_t i = static_cast<size_t>(first + k), ks = static_cast<size_t>(k);
      // The unit's input: the previous unit's output, or the chunk's received activation (without
      // the statistics riding behind it).
      const Block* input = k > 0 ? &f.outs[ks - 1] : a.chunk > 0 ? &f.input : nullptr;
      const int64_t din_elems = !input ? 0
                                : k > 0 ? static_cast<int64_t>(input->bytes() / sizeof(float))
                                        : run_.input_elems.at(static_cast<size_t>(a.chunk));
      const Tensor in = input ? input->flat(DType::f32).slice(0, din_elems) : Tensor();
      backward_unit(*units_[i], i, ctx, hooks_, in, f.outs[ks], f.saved[ks], dout, din_elems, dnext,
                    split ? &held[ks] : nullptr);
      dout = dnext ? dnext.flat(DType::f32) : Tensor();
      poke();
    }
    f.input.reset();
    if (a.chunk > 0)
      pass_on({PipeAction::backward, a.chunk - 1, a.micro}, pack(std::move(dnext), aux.get()));
    if (split) owed_[{a.chunk, a.micro}] = std::move(held);
    pool_.ledger().set_phase({});
  }

  // The weight action: the held GEMMs of the chunk's units, in backward's order, each unit's
  // after_backward following its own.
  void weight(const PipeAction& a, UnitContext& ctx) {
    auto it = owed_.find({a.chunk, a.micro});
    SHARD_CHECK(it != owed_.end(), "pipeline rank {}: {} before its backward", run_.rank, describe(a));
    std::vector<DeferredWeightGrads> held = std::move(it->second);
    owed_.erase(it);
    const int first = local_begin_.at(a.chunk);
    for (size_t k = held.size(); k-- > 0;) {
      const size_t i = static_cast<size_t>(first) + k;
      weight_unit(*units_[i], i, ctx, hooks_, held[k]);
      poke();
    }
    pool_.ledger().set_phase({});
  }

  // Lets the transport move this rank's posted messages along (an MPI send or receive progresses
  // only inside an MPI call): tested between units, so a neighbour waiting on a message does not
  // wait for this rank's whole action. Only what is issued is tested (Work::progress: NCCL's held
  // sends and receives must go out as one group, at take()), and nothing is freed here: buffers go
  // where the schedule says.
  void poke() {
    for (Sent& x : sends_) x.work.progress();
    for (auto& [peer, box] : inbox_)
      for (Posted& p : box.pending) p.work.progress();
  }

  // The end of the list: every posted send completes.
  void finish() {
    wait_sends();
    SHARD_CHECK(flights_.empty(), "pipeline rank {}: {} micro-batches left without a backward", run_.rank,
                flights_.size());
    SHARD_CHECK(owed_.empty(), "pipeline rank {}: {} micro-batches left without a weight action", run_.rank,
                owed_.size());
  }

  void set_scale(float s) { dlogit_scale_ = s; }
  void set_logits(std::vector<float>* l) { logits_out_ = l; }
  double now_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pool_.ledger().start()).count();
  }
  // The last action's message wait: when it began, how long it took (0 without one); reset per action.
  std::pair<double, double> take_wait() { return std::exchange(wait_, {0.0, 0.0}); }
  RunResult result() const {
    RunResult r = aux_result_;
    r.loss_sum = loss_sum_, r.positions = positions_;
    return r;
  }

 private:
  struct Flight {
    Block input;                 // the received activation (chunks after the first)
    std::vector<Block> outs;     // each unit's output
    std::vector<Saved> saved;    // what each unit's backward needs
    std::unique_ptr<AuxChannel> aux;  // the last chunk's: the micro-batch's finished auxiliary channel
    Block dlogits;               // the last chunk's: the logits' gradient, where it has a block of its own
    DType dlogits_dtype = DType::f32;
  };

  // ---- the messages: activations or gradients in the activation dtype, the auxiliary channel
  // (src/model/aux.hpp) behind them ----
  static int64_t aux_floats(const ModelSpec& spec) {
    const std::unique_ptr<AuxChannel> aux = family_of(spec).aux_channel(spec);
    return aux ? aux->packed_size() : 0;
  }
  // Elements of message_dtype_ the auxiliary channel's floats take behind a message (their bits,
  // two bf16 slots a float under --activation-dtype bf16).
  int64_t aux_slots() const { return aux_extra_ * static_cast<int64_t>(sizeof(float) / dtype_size(message_dtype_)); }
  // The message that carries `data` (an f32 block, freed) and the channel `aux` (when given): the
  // block itself when it is all; else one block of message_dtype_, the data rounded to it
  // (--activation-dtype bf16: Megatron's 2 bytes an activation between stages) and the channel's
  // floats behind, bit for bit.
  Block pack(Block data, const AuxChannel* aux) {
    const int64_t n = static_cast<int64_t>(data.bytes() / sizeof(float));
    if (message_dtype_ == DType::f32 && !aux) return data;
    const int64_t tail = aux ? aux_slots() : 0;
    Block msg = pool_.alloc(message_dtype_, n + tail, Category::activations,
                            aux ? "message with auxiliary statistics" : "message (narrowed)");
    if (message_dtype_ == DType::f32) be_.copy(msg.flat(DType::f32).slice(0, n), data.flat(DType::f32));
    else be_.cast(msg.flat(message_dtype_).slice(0, n), data.flat(DType::f32));
    data.reset();
    if (aux) {
      std::vector<float> p = aux->pack();
      const Tensor bits(p.data(), message_dtype_, {tail});
      be_.copy(msg.flat(message_dtype_).slice(n, tail), bits);
    }
    return msg;
  }
  // A received message's first n elements as an f32 block (the message itself when it is one),
  // and the channel behind them read into `aux` (when given).
  Block unpack(Block msg, int64_t n, AuxChannel* aux) {
    if (aux) {
      std::vector<float> p(static_cast<size_t>(aux_extra_), 0.f);
      const Tensor bits(p.data(), message_dtype_, {aux_slots()});
      be_.copy(bits, msg.flat(message_dtype_).slice(n, aux_slots()));
      aux->unpack(p);
    }
    if (message_dtype_ == DType::f32) return msg;
    Block wide = pool_.alloc(DType::f32, n, Category::activations, "message widened");
    be_.cast(wide.flat(DType::f32), msg.flat(message_dtype_).slice(0, n));
    return wide;
  }
  // The last chunk: the whole model's channel summed over the data-parallel group, finished (the
  // auxiliary loss and what the backward reads), kept for the backward, and counted.
  void finish_aux(std::unique_ptr<AuxChannel> aux, int64_t positions, Flight& f) {
    std::vector<float> packed = aux->pack();
    hooks_.reduce_aux(packed);
    aux->unpack(packed);
    aux->finish(dlogit_scale_);
    aux_result_.aux_sum += aux->loss() * static_cast<double>(positions);
    aux->add_stats(aux_result_.aux_stats);
    f.aux = std::move(aux);
  }
  struct Posted {
    Key key;
    Block buf;
    Work work;  // declared last: waited on before the buffer goes
  };
  struct Inbox {
    std::vector<PipeAction> expected;  // the messages from this peer, in its order
    size_t posted = 0;                 // receives posted so far
    std::deque<Posted> pending;        // posted, not yet waited for
  };
  struct Sent {
    Block buf;
    Work work;  // declared last: waited on before the buffer goes
  };
  // take()'s span, however it returns.
  struct Waiting {
    Executor& ex;
    double start;
    explicit Waiting(Executor& e) : ex(e), start(e.now_ms()) {}
    ~Waiting() { ex.wait_ = {start, ex.now_ms() - start}; }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
  };

  int64_t message_elems(const PipeAction& a) const {
    // An activation for chunk c's forward is its input; a gradient for chunk c's backward has
    // the size of its output, which is chunk c + 1's input.
    const int c = a.kind == PipeAction::forward ? a.chunk : a.chunk + 1;
    return run_.input_elems.at(static_cast<size_t>(c)) + aux_slots();
  }

  // Whether action a takes a message from another rank (one from this rank's own chunk is handed
  // over through the stash: pass_on).
  bool needs_message(const PipeAction& a) const {
    if (a.kind == PipeAction::weight) return false;
    const bool takes = a.kind == PipeAction::forward ? a.chunk > 0 : a.chunk < last_chunk_;
    return takes && sender(a) != run_.rank;
  }
  int sender(const PipeAction& a) const {
    return a.kind == PipeAction::forward ? split_.rank_of(a.chunk - 1) : split_.rank_of(a.chunk + 1);
  }

 public:
  // Before action i of `list` runs: the receive of its message and those posted ahead of it
  // (check_schedule's rules: without these, Megatron's interleaved order deadlocks).
  void post_receives(const std::vector<PipeAction>& list, size_t i) {
    const auto remote = [&](const PipeAction& a) { return needs_message(a); };
    for (size_t j : receives_to_post(run_.schedule.kind, list, i, remote)) post_until(list[j]);
  }

 private:
  // The message action a consumes, with every receive from its sender up to it posted (in the
  // order the sender sends), unless it is here already.
  void post_until(const PipeAction& a) {
    const Key k = key_of(a);
    if (stash_.count(k)) return;
    const int peer = sender(a);
    Inbox& box = inbox_[peer];
    bool found = false;
    for (const Posted& p : box.pending) found = found || p.key == k;
    while (!found) {
      SHARD_CHECK(box.posted < box.expected.size(), "pipeline rank {}: {} never comes from rank {}", run_.rank,
                  describe(a), peer);
      const PipeAction& e = box.expected[box.posted++];
      Block buf = pool_.alloc(message_dtype_, message_elems(e), Category::activations,
                              e.kind == PipeAction::forward ? "received activation" : "received gradient");
      Work w = run_.pp.recv(buf.flat(message_dtype_), peer);
      found = key_of(e) == k;
      box.pending.push_back({key_of(e), std::move(buf), std::move(w)});
    }
  }

  // The message action a consumes (posted by post_receives): this rank's own sends complete (their
  // buffers freed), then the receives from its sender are waited for in order up to it. The time
  // from here to the message is the action's wait (PipelineTiming).
  Block take(const PipeAction& a) {
    Waiting waiting(*this);
    const Key k = key_of(a);
    if (auto s = stash_.find(k); s != stash_.end()) {
      Block b = std::move(s->second);
      stash_.erase(s);
      return b;
    }
    SHARD_CHECK(sender(a) != run_.rank, "pipeline rank {}: {} takes a message from its own rank that is not here",
                run_.rank, describe(a));
    post_until(a);
    Inbox& box = inbox_[sender(a)];
    wait_sends();
    for (;;) {
      Posted p = std::move(box.pending.front());
      box.pending.pop_front();
      p.work.wait();
      if (p.key == k) return std::move(p.buf);
      stash_[p.key] = std::move(p.buf);
    }
  }

  // The output of an action, for the action `to` that consumes it: sent to its rank, or kept here
  // when that is this rank (a V's turn), as a received message would be.
  void pass_on(const PipeAction& to, Block buf) {
    const int peer = split_.rank_of(to.chunk);
    if (peer == run_.rank) {
      stash_[key_of(to)] = std::move(buf);
      return;
    }
    send(std::move(buf), peer);
  }

  void send(Block buf, int peer) {
    Work w = run_.pp.send(buf.flat(message_dtype_), peer);
    sends_.push_back({std::move(buf), std::move(w)});
  }
  void wait_sends() {
    for (Sent& s : sends_) s.work.wait();
    sends_.clear();
  }

  const PipelineRun& run_;
  const StageSplit& split_;
  const std::vector<std::unique_ptr<Unit>>& units_;
  const ModelSpec& spec_;
  Backend& be_;
  Pool& pool_;
  UnitHooks& hooks_;
  const TpContext& tp_;
  const int last_chunk_;
  const int64_t aux_extra_;  // floats of the auxiliary channel behind each message (0: none carried)
  const DType message_dtype_;  // the activations' and their gradients' between stages: --activation-dtype
  RunResult aux_result_;     // the last chunk's: the auxiliary loss and statistics
  float dlogit_scale_ = 0.f;
  std::vector<float>* logits_out_ = nullptr;
  double loss_sum_ = 0;
  int64_t positions_ = 0;
  std::map<int, int> local_begin_;  // chunk -> its first unit among this rank's
  std::map<std::pair<int, int>, Flight> flights_;
  std::map<std::pair<int, int>, std::vector<DeferredWeightGrads>> owed_;  // (chunk, micro) -> its units' held W
  std::map<int, Inbox> inbox_;
  std::map<Key, Block> stash_;
  std::vector<Sent> sends_;
  std::pair<double, double> wait_{0.0, 0.0};  // (start, ms) of the current action's message wait
};

void check_batches(const ModelSpec& spec, std::span<const Batch> micro) {
  SHARD_CHECK(!micro.empty(), "a pipelined step without micro-batches");
  for (const Batch& b : micro)
    SHARD_REQUIRE(b.T <= spec.seq, "sequence length {} exceeds the model's {} positions", b.T, spec.seq);
}

}  // namespace

double PipelineTiming::busy_ms() const { return forward_ms() + backward_ms() + weight_ms(); }

double PipelineTiming::compute_ms(PipeAction::Kind kind) const {
  double ms = 0;
  for (const Span& s : actions)
    if (s.action.kind == kind) ms += s.end_ms - s.start_ms - s.wait_ms;
  return ms;
}

RunResult run_pipeline(const PipelineRun& run, const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec,
                       Backend& be, Pool& pool, std::span<const Batch> micro, UnitHooks& hooks, float dlogit_scale,
                       Checkpointing checkpointing, const TpContext& tp, EpContext* ep) {
  check_batches(spec, micro);
  SHARD_CHECK(static_cast<int64_t>(micro.size()) == run.schedule.micro_batches,
              "{} micro-batches for a schedule of {}", micro.size(), run.schedule.micro_batches);
  Executor ex(run, units, spec, be, pool, hooks, tp, run.schedule.ranks, true);
  ex.set_scale(dlogit_scale);
  const int64_t M = run.schedule.micro_batches;
  const std::vector<PipeAction>& list = run.schedule.ranks.at(static_cast<size_t>(run.rank));
  PipelineTiming* timing = run.timing;
  if (timing) {
    timing->actions.clear();
    timing->actions.reserve(list.size());
    timing->start_ms = ex.now_ms();
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeAction& a = list[i];
    const double start = timing ? ex.now_ms() : 0;
    ex.post_receives(list, i);
    if (run.begin_micro) run.begin_micro(a.micro, a.micro + 1 == M);
    UnitContext ctx{be, pool, spec, micro[static_cast<size_t>(a.micro)], checkpointing, tp, ep};
    if (a.kind == PipeAction::forward) ex.forward(a, true, ctx);
    else if (a.kind == PipeAction::backward) ex.backward(a, ctx, run.schedule.kind->splits_backward);
    else ex.weight(a, ctx);
    const auto [wait_start, wait] = ex.take_wait();
    if (timing) timing->actions.push_back({a, start, ex.now_ms(), wait_start, wait});
  }
  ex.finish();
  if (timing) timing->end_ms = ex.now_ms();
  return ex.result();
}

RunResult run_pipeline_forward(const PipelineRun& run, const std::vector<std::unique_ptr<Unit>>& units,
                               const ModelSpec& spec, Backend& be, Pool& pool, std::span<const Batch> micro,
                               UnitHooks& hooks, const TpContext& tp, EpContext* ep, std::vector<float>* logits) {
  check_batches(spec, micro);
  SHARD_CHECK(!logits || micro.size() == 1, "logits of {} micro-batches", micro.size());
  // Every rank: each micro-batch through its chunks in model order.
  std::vector<std::vector<PipeAction>> lists(static_cast<size_t>(run.split.pp));
  for (int r = 0; r < run.split.pp; ++r)
    for (int m = 0; m < static_cast<int>(micro.size()); ++m)
      for (int c : run.split.chunks_of(r)) lists[static_cast<size_t>(r)].push_back({PipeAction::forward, c, m});
  Executor ex(run, units, spec, be, pool, hooks, tp, lists, false);
  ex.set_logits(logits);
  const std::vector<PipeAction>& list = lists.at(static_cast<size_t>(run.rank));
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeAction& a = list[i];
    ex.post_receives(list, i);
    UnitContext ctx{be, pool, spec, micro[static_cast<size_t>(a.micro)], Checkpointing::none, tp, ep};
    ex.forward(a, false, ctx);
  }
  ex.finish();
  return ex.result();
}

}  // namespace shardlab
