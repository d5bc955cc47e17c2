// resolve.hpp — which model a command means: a preset with size overrides, or the model an HF
// directory's config.json gives (which fixes the shape). A checkpoint's model comes from its
// manifest (src/checkpoint/checkpoint_format.hpp, read_manifest).
#pragma once
#include <cstdint>
#include <string>

#include "src/model/spec.hpp"

namespace shardlab {

struct ModelRequest {
  std::string preset;  // empty: not given (small, or the directory's model)
  int64_t layers = 0, dim = 0, heads = 0, seq = 0, vocab = 0;  // 0 = the preset's
  int64_t kv_heads = 0, ffn_dim = 0;                             // 0 = the preset's
  std::string init;    // --init: an HF model directory fixes the shape
};

// The preset with the overrides; or, when r.init is an HF model directory, the model its
// config.json gives: a preset is refused, dim, heads, vocab, kv_heads and ffn_dim must equal the
// config's, layers may be fewer (the first blocks load) and seq shorter where no tensor changes with
// it (docs/checkpoints-and-models.md, "Models from Hugging Face directories"). InputError naming
// the flag and both values.
ModelSpec resolve_model(const ModelRequest& r);

}  // namespace shardlab
