// attention.hpp — the causal self-attention core every family's layer calls, from a [q | k | v]
// buffer, by the kernel ModelSpec::attention names (--attention): the fused one (flash: saves the
// output and a log-sum-exp per head and position, "lse"; its backward recomputes the probabilities
// tile by tile) or the naive one (saves the (B, H, T, T) probabilities, "att"; with Korthikanti et
// al.'s selective recomputation, --activation-checkpointing attention drops them in forward and
// recomputes them from q and k in backward), or cuDNN's (cudnn, on a GPU: saves what flash saves);
// and the KV-cached path of decoding (by the same choice; cudnn decodes through the fused kernel).
//
// What differs between families stays with them: the projections around the core, RoPE (Llama
// rotates q and k before the core and the gradient back after it) and the number of K/V heads
// (KV == H is GPT-2's multi-head attention). Saved names are the core's: "qkv" (saved by the
// caller, as rotated when it rotates), "atty", and "lse" (flash) or "att" (naive).
#pragma once
#include <string>

#include "src/model/unit.hpp"

namespace shardlab::blocks {

// One rank's attention: B sequences of T positions, H query heads and KV K/V heads of hd channels,
// values of vd (0: hd; DeepSeek's latent attention has its own). The [q | k | v] rows are (H + KV)
// hd + KV v() wide, the output H v().
struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, KV = 0, hd = 0, vd = 0;
  int64_t v() const { return vd > 0 ? vd : hd; }
};

// atty (B*T, H v) = attention over qkv (B, T, (H + KV) hd + KV v), saved as "atty"; the probabilities
// are saved as "att" unless c.checkpointing drops them for backward to recompute. `product`: the
// dtype of the output projection's weight. Where products round to bf16 (blocks::products_round),
// cuDNN's operands are saved as it reads them: the saved "qkv" (when qkv is it) rounded once, and
// its bf16 output, which the products read as it is; else f32. The naive attention does the same
// where the saved activations are bf16 too (--activation-dtype bf16), its probabilities kept in
// bf16 (ops/attention.hpp: Megatron's products on the tensor cores).
Tensor attention_forward(UnitContext& c, Saved& s, Tensor qkv, const AttentionShape& a,
                         DType product = DType::f32);

// The dtype attention_forward keeps q, k, v and its output in: bf16 where it keeps them as the
// output's products (weight dtype `product`) read them (cuDNN's, or the naive one's under
// --activation-dtype bf16, where those products round to bf16), else f32 (flash, context parallel,
// f32 products). A caller whose product writes the saved "qkv" in it spares attention_forward the
// rounding pass.
DType attention_operand_dtype(const UnitContext& c, DType product);

// The workspace attention_backward needs, allocated where the caller's backward allocates its
// other workspace (so the peak holds the same blocks as before the core was shared).
Block attention_scratch(UnitContext& c, const AttentionShape& a, const std::string& prefix);

// dqkv = attention's gradient from datty (B*T, H v): f32, or bf16 like a bf16 s("qkv") where no K/V
// head sums over a group of query heads (ops/attention.hpp, cudnn_attention.hpp); the probabilities come from
// s("att"), or are recomputed from s("qkv") (as "<prefix>att (recomputed)") when forward dropped
// them. Kernels are deterministic, so both give the same bits.
void attention_backward(UnitContext& c, Saved& s, Tensor dqkv, Tensor datty, Tensor scratch, const AttentionShape& a,
                        const std::string& prefix);

// Refuses (InputError) a kernel the device or the model's heads cannot run: cudnn on the CPU, with
// heads cuDNN's attention is not built for here, or (this_binary) on CUDA in a build without cuDNN.
// The meta backend stands for either device and takes cudnn; a prediction for CUDA (this_binary
// false) needs no CUDA build.
void check_attention_kernel(const ModelSpec& spec, Device device, bool this_binary = true);

// Decoding: at pos0 == 0, (re)allocates the layer's K and V cache, c.spec.seq rows of KV hd each.
void kv_cache_open(UnitContext& c, Saved& cache, const AttentionShape& a, const std::string& prefix, int64_t pos0);
// Appends qkv's keys and values (positions [pos0, pos0 + T)) to the cache and returns atty (B*T,
// H hd, saved in s) of its queries over every cached position up to their own.
Tensor attention_cached(UnitContext& c, Saved& cache, Saved& s, Tensor qkv, const AttentionShape& a,
                        const std::string& prefix, int64_t pos0);

}  // namespace shardlab::blocks
