#include "src/model/decode.hpp"

#include <algorithm>

namespace shardlab {

bool Decoder::supported(const std::vector<std::unique_ptr<Unit>>& units) {
  return std::all_of(units.begin(), units.end(), [](const auto& u) { return u->decodes(); });
}

Decoder::Decoder(const std::vector<std::unique_ptr<Unit>>& units, const ModelSpec& spec, Backend& be, Pool& pool)
    : units_(units), spec_(spec), be_(be), pool_(pool), caches_(units.size()) {
  spec_.loss_chunk = 0;  // decoding wants the logits, not a loss
  SHARD_CHECK(supported(units), "a Decoder over units that do not all decode with a cache");
}

void Decoder::reset() {
  for (Saved& c : caches_) c.clear();
  length_ = 0;
}

void Decoder::forward(std::span<const int32_t> tokens, UnitHooks& hooks, std::vector<float>& logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  SHARD_REQUIRE(n >= 1 && length_ + n <= spec_.seq,
                "decoding {} more tokens after {} exceeds the model's {} positions", n, length_, spec_.seq);
  Batch batch{tokens.data(), nullptr, 1, n};  // no targets: no loss is computed
  UnitContext ctx{be_, pool_, spec_, batch, Checkpointing::none, TpContext{}};
  Block in, out;
  for (size_t u = 0; u < units_.size(); ++u) {
    pool_.ledger().set_phase(Phase::forward(u));
    Backend::Range range(be_, ("decode " + units_[u]->name()).c_str());  // NVTX on CUDA
    out = pool_.alloc(DType::f32, units_[u]->out_elems(spec_, 1, n), Category::activations,
                      units_[u]->name() + " output");
    units_[u]->forward_cached(ctx, hooks.forward_params(u), u == 0 ? Tensor() : in.flat(DType::f32),
                              out.flat(DType::f32), caches_[u], length_);
    hooks.after_forward(u);
    in = std::move(out);
  }
  pool_.ledger().set_phase({});
  logits.resize(static_cast<size_t>(in.bytes() / sizeof(float)));
  be_.copy(Tensor::of(std::span<float>(logits)), in.flat(DType::f32));
  length_ += n;
}

}  // namespace shardlab
