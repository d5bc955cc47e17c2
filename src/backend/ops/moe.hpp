// moe.hpp — the mixture-of-experts family: a layer's token rows moved into the experts' order and
// back (blocks/moe.hpp). The routing (which expert takes which token, and its weight) is decided on
// the host and stored in the backend's memory; the arrays below are that memory (int32 indices,
// device pointers on CUDA), unlike token ids. Conventions: ops/dispatch.hpp.
//
// A layer's N tokens each choose k experts: slot (n, j) of n * k + j. The kept slots, sorted by
// expert, are the `rows` of the experts' buffers: pos[n * k + j] is slot (n, j)'s row (-1: the slot
// was dropped past an expert's capacity), token_of[r] the token of row r.
#pragma once
#include "src/backend/ops/dispatch.hpp"

namespace shardlab::ops {

// dst (rows, C): dst[r] = src[token_of[r]] for src (N, C).
void moe_gather(Backend& be, Tensor dst, Tensor src, const int32_t* token_of);
// out (N, C) (+)= sum over j of w[n k + j] y[pos[n k + j]] (y (rows, C); j ascending; dropped
// slots add nothing). w empty: weight 1 (the gather's backward). Overwritten unless accumulate.
void moe_combine(Backend& be, Tensor out, Tensor y, const int32_t* pos, Tensor w, int64_t k, bool accumulate);
// The weighted combine's backward: dy[pos[s]] = w[s] dout[n] and dw[s] = dout[n] . y[pos[s]] for
// every kept slot s = n k + j; dw[s] = 0 for a dropped one (dy's rows are every kept slot's).
void moe_combine_backward(Backend& be, Tensor dy, Tensor dw, Tensor dout, Tensor y, const int32_t* pos, Tensor w,
                          int64_t k);

}  // namespace shardlab::ops
