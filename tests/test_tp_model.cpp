// Tensor parallelism at the model level, on real ranks (mpirun -np 2 or 4, the whole world one
// tensor-parallel group): each rank's Model holds its part of the model (Megatron's layout), and
// one forward and backward must give what one rank holding the whole model gives — the loss, this
// rank's vocabulary columns of the logits, and the gradient of every element of every tensor this
// rank holds (padding: zero) — with and without sequence parallelism, under every activation
// checkpointing mode, with a vocabulary the degree does not divide. The reference is the same
// model unsplit, on the same rank.
#include <catch2/catch.hpp>
#include <cmath>

#include "src/model/model.hpp"
#include "tests/mpi_test_env.hpp"

using namespace shardlab;
using shardlab::test::g_mpi;

namespace {

struct Worst {
  double loss = 0, logits = 0, grads = 0, padding = 0;
};

// The whole model and this rank's part, initialised from one seed, one micro-batch through both.
// The models compute on the communicator's backend: a second CUDA backend would compute on a stream
// of its own, which the staged transport (it synchronises its backend's stream) does not wait for.
Worst tp_against_whole(const ModelSpec& spec, Backend* be, Communicator& comm, bool sp, Checkpointing ck) {
  Pool pool(*be);
  const int T = comm.world_size(), r = comm.rank();
  Model whole(spec, *be, pool);
  Model part(spec, *be, pool, TpContext{TpConfig{T, r, sp}, &comm});
  whole.init(5);
  part.init(5);
  const int64_t B = 2, S = 8, N = B * S;
  std::vector<int32_t> tokens(static_cast<size_t>(N + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % spec.vocab);
  tokens[3] = static_cast<int32_t>(spec.vocab - 1);  // a token in the last rank's (padded) rows
  const Batch batch{tokens.data(), tokens.data() + 1, B, S};
  std::vector<float> lw, lp;
  const float loss_w = whole.forward_backward(batch, 1.f, &lw, ck);
  const float loss_p = part.forward_backward(batch, 1.f, &lp, ck);
  Worst w;
  w.loss = std::fabs(double(loss_p) - loss_w) / std::fabs(double(loss_w));
  const VocabShard v = vocab_shard(spec.vocab, T, r);
  REQUIRE(lp.size() == static_cast<size_t>(N * v.rows));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < v.valid; ++j)
      w.logits = std::max(w.logits, std::fabs(double(lp[static_cast<size_t>(i * v.rows + j)]) -
                                              lw[static_cast<size_t>(i * spec.vocab + v.begin + j)]));
  for (size_t u = 0; u < part.num_units(); ++u) {
    std::vector<float> gw(static_cast<size_t>(whole.unit(u).layout().numel)),
        gp(static_cast<size_t>(part.unit(u).layout().numel));
    be->copy(Tensor::of(std::span<float>(gw)), whole.unit_grads(u));
    be->copy(Tensor::of(std::span<float>(gp)), part.unit_grads(u));
    for (const TensorDecl& t : part.unit(u).layout().tensors) {
      const TensorDecl& full = whole.unit(u).layout().find(t.name);
      double largest = 0, err = 0;
      for (int64_t i = 0; i < full.numel; ++i) largest = std::max(largest, std::fabs(double(gw[full.offset + i])));
      for (const TpRun& run : tp_runs(t, T, r))
        for (int64_t i = 0; i < run.len; ++i) {
          const double got = gp[static_cast<size_t>(t.offset + run.local + i)];
          if (run.full < 0)
            w.padding = std::max(w.padding, std::fabs(got));
          else
            err = std::max(err, std::fabs(got - gw[static_cast<size_t>(full.offset + run.full + i)]));
        }
      UNSCOPED_INFO(t.name << ": largest |grad| " << largest << ", worst error " << err);
      w.grads = std::max(w.grads, err / (1e-6 + largest));
    }
  }
  return w;
}

void check_family(const std::vector<ModelSpec>& specs) {
  auto be = test::test_backend();
  Pool pool(*be);
  std::unique_ptr<Communicator> comm = test::test_communicator(pool);
  for (const ModelSpec& spec : specs) {
    if (spec.heads % comm->world_size() != 0 || spec.num_kv_heads() % comm->world_size() != 0) continue;
    for (bool sp : {false, true})
      for (Checkpointing ck : {Checkpointing::none, Checkpointing::attention, Checkpointing::blocks}) {
        INFO(spec.describe() << " tp " << comm->world_size() << (sp ? " sequence-parallel" : "") << " checkpointing "
                             << checkpointing_name(ck));
        const Worst w = tp_against_whole(spec, be.get(), *comm, sp, ck);
        CHECK(w.loss < 1e-6);
        CHECK(w.logits < 1e-5);
        CHECK(w.grads < 1e-5);  // each tensor's worst error against its largest |gradient|
        CHECK(w.padding == 0);
      }
  }
}

}  // namespace

TEST_CASE("GPT-2 split over a tensor-parallel group computes what the whole model does", "[tp][gpt2]") {
  ModelSpec tiny = model_preset("tiny");
  tiny.vocab = 67;  // divided by neither 2 nor 4: padded
  ModelSpec four = tiny;
  four.name = "tiny-4-heads";
  four.heads = 4;
  check_family({tiny, four});
}

TEST_CASE("Llama split over a tensor-parallel group computes what the whole model does", "[tp][llama]") {
  ModelSpec tiny = model_preset("llama-tiny");  // grouped-query: 4 heads, 2 KV heads, untied head
  tiny.vocab = 67;
  ModelSpec four = tiny;
  four.name = "llama-tiny-4-kv";
  four.kv_heads = 4;
  four.tied_head = true;
  check_family({tiny, four});
}
