// The fuzz targets link the model families' units but never run one: the operation families
// (src/backend/ops/) they call would bring the CPU kernels, OpenMP and the sgemm libraries, so
// they are linked as traps here (as tp_unreachable.cpp does for the tensor-parallel regions).
#include <cstdlib>

#include "src/backend/ops/activation.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/cudnn_attention.hpp"
#include "src/backend/ops/embedding.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/backend/ops/loss.hpp"
#include "src/backend/ops/mla.hpp"
#include "src/backend/ops/moe.hpp"
#include "src/backend/ops/norm.hpp"
#include "src/backend/ops/rope.hpp"

namespace shardlab::ops {

[[noreturn]] static void unreachable() { std::abort(); }

void embedding_forward(Backend&, Tensor, const int32_t*, int64_t, int64_t, Tensor, Tensor) { unreachable(); }
void embedding_backward(Backend&, Tensor, Tensor, Tensor, const int32_t*, int64_t, int64_t) { unreachable(); }
void embedding_forward_shard(Backend&, Tensor, const int32_t*, int64_t, int64_t, Tensor, Tensor, int64_t) {
  unreachable();
}
void embedding_backward_shard(Backend&, Tensor, Tensor, Tensor, const int32_t*, int64_t, int64_t, int64_t) {
  unreachable();
}
void layernorm_forward(Backend&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float, Tensor) { unreachable(); }
void layernorm_backward(Backend&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) {
  unreachable();
}
void rmsnorm_forward(Backend&, Tensor, Tensor, Tensor, Tensor, float, Tensor) { unreachable(); }
void rmsnorm_backward(Backend&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) { unreachable(); }
void head_rmsnorm_forward(Backend&, Tensor, Tensor, Tensor, Tensor, int64_t, float) { unreachable(); }
void head_rmsnorm_backward(Backend&, Tensor, Tensor, Tensor, Tensor, Tensor, int64_t) { unreachable(); }
void moe_gather(Backend&, Tensor, Tensor, const int32_t*) { unreachable(); }
void moe_combine(Backend&, Tensor, Tensor, const int32_t*, Tensor, int64_t, bool) { unreachable(); }
void moe_combine_backward(Backend&, Tensor, Tensor, Tensor, Tensor, const int32_t*, Tensor, int64_t) { unreachable(); }
void rope(Backend&, Tensor, int64_t, int64_t, const RopeFreqs&, int64_t, bool) { unreachable(); }
void mla_qkv_forward(Backend&, Tensor, Tensor, Tensor, Tensor, const MlaHeads&, const RopeFreqs&, int64_t) {
  unreachable();
}
void mla_qkv_backward(Backend&, Tensor, Tensor, Tensor, Tensor, const MlaHeads&, const RopeFreqs&, int64_t) {
  unreachable();
}
void gelu_forward(Backend&, Tensor, Tensor) { unreachable(); }
void gelu_backward(Backend&, Tensor, Tensor, Tensor) { unreachable(); }
void swiglu_forward(Backend&, Tensor, Tensor) { unreachable(); }
void swiglu_backward(Backend&, Tensor, Tensor, Tensor) { unreachable(); }
void attention_forward(Backend&, Tensor, Tensor, Tensor, int64_t, int64_t, int64_t) { unreachable(); }
void attention_backward(Backend&, Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, Tensor, int64_t) { unreachable(); }
void flash_attention_forward(Backend&, Tensor, Tensor, Tensor, int64_t, int64_t, bool, Tensor, int64_t) {
  unreachable();
}
void flash_attention_backward(Backend&, Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, bool, Tensor,
                              int64_t) {
  unreachable();
}
void flash_attention_cached(Backend&, Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, int64_t, Tensor) {
  unreachable();
}
void cudnn_attention_forward(Backend&, Tensor, Tensor, Tensor, int64_t, int64_t, Tensor) { unreachable(); }
void cudnn_attention_backward(Backend&, Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, Tensor) {
  unreachable();
}
void kv_cache_write(Backend&, Tensor, Tensor, Tensor, int64_t, int64_t, int64_t) { unreachable(); }
void copy_rows(Backend&, Tensor, int64_t, Tensor, int64_t, int64_t, int64_t) { unreachable(); }
void attention_cached(Backend&, Tensor, Tensor, Tensor, Tensor, int64_t, int64_t, int64_t) { unreachable(); }
void cross_entropy(Backend&, Tensor, Tensor, Tensor, const int32_t*, float) { unreachable(); }
void vocab_ce_max(Backend&, Tensor, Tensor, int64_t) { unreachable(); }
void vocab_ce_sums(Backend&, Tensor, Tensor, Tensor, const int32_t*, int64_t, int64_t, Tensor) { unreachable(); }
void vocab_ce_finish(Backend&, Tensor, Tensor, Tensor, const int32_t*, int64_t, int64_t, Tensor, Tensor, Tensor,
                     float) {
  unreachable();
}

}  // namespace shardlab::ops

namespace shardlab {
const char* gemm_epilogue_name(GemmEpilogue) { ops::unreachable(); }  // blocks/linear.cpp's messages
FlashShape flash_shape_of_qkv(int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t) { ops::unreachable(); }
FlashShape flash_shape_of_cache(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) { ops::unreachable(); }
std::string cudnn_attention_refusal(Device, bool, int64_t, int64_t, const std::string&) { ops::unreachable(); }
int64_t cudnn_attention_workspace_elems(int64_t, int64_t, int64_t, int64_t, int64_t, bool) { ops::unreachable(); }
}  // namespace shardlab
