// kv_cache.cpp — the CUDA KV cache of decoding (ops/kv_cache.hpp): kernels in kv_cache.cu.
//
// Decoding's attention over a KV cache: one small kernel per op (a decoded position is one query
// row per head, too thin for cuBLAS's batched products to pay), the scores in device scratch.
#include "src/backend/cuda/cuda_backend.hpp"
#include "src/backend/cuda/ops.hpp"

namespace shardlab::cuda {

void copy_rows(Backend& be, float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
               int64_t width) {
  const size_t f = sizeof(float);
  CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_ld) * f, src, static_cast<size_t>(src_ld) * f,
                               static_cast<size_t>(width) * f, static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                               CudaBackend::of(be).compute_stream()));
}

void kv_cache_write(Backend& be, Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t H, int64_t KV, int64_t pos0,
                    int64_t B, int64_t T, int64_t C, int64_t S) {
  CUDA_CHECK(launch_kv_cache_write(k_cache.ptr<float>(), v_cache.ptr<float>(), qkv.ptr<float>(), B, T, S, H, KV, C / H,
                                   pos0, CudaBackend::of(be).compute_stream()));
}

void attention_cached(Backend& be, Tensor out, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t H, int64_t KV,
                      int64_t pos0, int64_t B, int64_t T, int64_t C, int64_t S) {
  CudaBackend& cb = CudaBackend::of(be);
  auto* scores = static_cast<float*>(cb.device_scratch(static_cast<size_t>(B * H * T * (pos0 + T)) * sizeof(float)));
  CUDA_CHECK(launch_attention_cached(out.ptr<float>(), qkv.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(),
                                     scores, B, T, S, H, KV, C / H, pos0, cb.compute_stream()));
}

}  // namespace shardlab::cuda
