// kv_cache.hpp — the KV cache family of incremental decoding (sample): a sequence's keys and
// values kept in k_cache and v_cache, (B, S, KV hd) each, row p holding position p's K/V heads, so
// each new position computes only its own row of attention_forward's. Conventions: ops/dispatch.hpp.
#pragma once
#include <array>

#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// Copies the k and v heads of qkv (B, T, (H + 2 KV) hd), positions [pos0, pos0 + T), into rows
// [pos0, pos0 + T).
void kv_cache_write(Backend& be, Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0);
// out (B, T, H hd): the queries of qkv, at positions pos0 + t, attend over cache rows [0, pos0 +
// t] (written before: causal within the new positions), as attention_forward's rows pos0 + t do
// over a whole sequence. No probabilities are kept: there is no backward.
void attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                      int64_t pos0);
// K/V rows moved between buffers of different widths (context parallelism's gathers and their
// gradients, src/model/parallel/cp.hpp): row r of dst (width floats at dst + r dst_ld) = row r
// of src (at src + r src_ld), for rows rows. dst and src start at their first row's first element.
void copy_rows(Backend& be, Tensor dst, int64_t dst_ld, Tensor src, int64_t src_ld, int64_t rows, int64_t width);
// The checks of both (and of the fused kernel's cached call, flash_attention.hpp): out may be empty
// (kv_cache_write). Returns {B, T, C, S}: C = H hd, the output's channels; S the cache's rows, at
// least pos0 + T. InternalError naming op and the shapes otherwise.
std::array<int64_t, 4> kv_cached_shape(const Tensor& out, const Tensor& qkv, const Tensor& k_cache,
                                       const Tensor& v_cache, int64_t H, int64_t KV, int64_t pos0, const char* op);

}  // namespace shardlab::ops
