// embedding.hpp — the embedding family: token and learned-position lookups and their gradients,
// whole and vocabulary-parallel (--tp). Conventions: ops/dispatch.hpp.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// out (B*T, C) = wte[tokens] + wpe[t]; an empty wpe (no data: a family without learned
// positions) adds nothing, and embedding_backward then leaves dwpe alone.
void embedding_forward(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte, Tensor wpe);
// dwte[tokens] += dout, dwpe[t] += dout (accumulate)
void embedding_backward(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                        int64_t T);

// The vocabulary-parallel embedding (--tp): wte holds rows [v0, v0 + rows) of the whole token
// embedding; out (B*T, C) = wte[token - v0] for tokens in that range and 0 for the others, plus
// wpe[t] when wpe is not empty. Backward accumulates dwte[token - v0] += dout for tokens in
// range only, and dwpe[t] += dout (when not empty). Tokens outside are other ranks' rows.
void embedding_forward_shard(Backend& be, Tensor out, const int32_t* tokens, int64_t B, int64_t T, Tensor wte,
                             Tensor wpe, int64_t v0);
void embedding_backward_shard(Backend& be, Tensor dwte, Tensor dwpe, Tensor dout, const int32_t* tokens, int64_t B,
                              int64_t T, int64_t v0);

}  // namespace shardlab::ops
