// The chunked loss head (--loss-chunk, src/model/blocks/loss_head.hpp) against the whole (N, V)
// logits: the same loss and the same gradient of every parameter, for GPT-2 (tied head) and Llama
// (untied), with a chunk that does not divide the positions and one larger than them. (Every
// strategy with it: cli_compare_loss_chunk; measured = predicted memory: cli_profile_loss_chunk.)
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "src/model/model.hpp"
#include "tests/test_util.hpp"

using namespace shardlab;

namespace {

struct Out {
  float loss = 0;
  std::vector<float> grads;
};

Out run(ModelSpec spec, int64_t chunk) {
  spec.loss_chunk = chunk;
  auto be = make_cpu_backend(BackendConfig{1});
  Pool pool(*be);
  Model m(spec, *be, pool);
  m.init(11);
  const int64_t B = 2, T = 9, N = B * T;
  std::vector<int32_t> tokens(static_cast<size_t>(N + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 29 + 3) % spec.vocab);
  Out o;
  o.loss = m.forward_backward(Batch{tokens.data(), tokens.data() + 1, B, T}, 1.f);
  for (size_t u = 0; u < m.num_units(); ++u) {
    const Tensor g = m.unit_grads(u);
    const float* p = g.ptr<float>();
    o.grads.insert(o.grads.end(), p, p + g.numel());
  }
  return o;
}

}  // namespace

TEST_CASE("the chunked loss head gives the whole logits' loss and gradients", "[loss][model]") {
  for (const char* preset : {"tiny", "llama-tiny"}) {
    const ModelSpec spec = model_preset(preset);
    const Out whole = run(spec, 0);
    for (int64_t chunk : {int64_t{5}, int64_t{64}}) {
      INFO(preset << ", --loss-chunk " << chunk);
      const Out got = run(spec, chunk);
      CHECK(std::fabs(double(got.loss) - whole.loss) <= 1e-6 * std::fabs(double(whole.loss)));
      REQUIRE(got.grads.size() == whole.grads.size());
      double err = 0, scale = 1e-12;
      for (size_t i = 0; i < whole.grads.size(); ++i) {
        err = std::max(err, std::fabs(double(got.grads[i]) - whole.grads[i]));
        scale = std::max(scale, std::fabs(double(whole.grads[i])));
      }
      CHECK(err <= 1e-5 * scale);
    }
  }
}
