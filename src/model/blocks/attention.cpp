// attention.cpp — the attention core shared by the families (attention.hpp).
#include "src/model/blocks/attention.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/cudnn_attention.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/backend/ops/kv_cache.hpp"
#include "src/model/blocks/linear.hpp"
#include "src/model/parallel/cp_attention.hpp"

namespace shardlab::blocks {

namespace {
bool flash(const UnitContext& c) { return c.spec.attention == AttentionKernel::flash; }
bool cudnn(const UnitContext& c) { return c.spec.attention == AttentionKernel::cudnn; }

// Whether the attention keeps its operands as bf16 products read them: where the output's products
// round to bf16 and qkv is the saved "qkv" (read by this forward and its backward, and by nothing
// else), which is then rounded once (Saved::round).
bool keeps_bf16(UnitContext& c, Saved& s, Tensor& qkv, DType product) {
  if (attention_operand_dtype(c, product) != DType::bf16 || !s.has("qkv") || s("qkv").data() != qkv.data())
    return false;
  qkv = s.round(c.be, c.pool, "qkv", DType::bf16);
  return true;
}

// A saved tensor in bf16 and kept so (`bf16`: the products' operand), else saved as any other.
Tensor saved(UnitContext& c, Saved& s, bool bf16, const std::string& name, std::initializer_list<int64_t> shape) {
  return bf16 ? s.add_as(c.pool, name, shape, DType::bf16) : s.add(c.pool, name, shape);
}
}  // namespace

DType attention_operand_dtype(const UnitContext& c, DType product) {
  if (c.batch.context_parallel() || flash(c) || product != DType::bf16 || !products_round(c, product))
    return DType::f32;
  return cudnn(c) || c.spec.activation_dtype == DType::bf16 ? DType::bf16 : DType::f32;
}

void check_attention_kernel(const ModelSpec& spec, Device device, bool this_binary) {
  if (spec.attention != AttentionKernel::cudnn) return;
  const int64_t hd = spec.mla.enabled() ? spec.mla.qk() : spec.head_size();
  const int64_t vd = spec.mla.enabled() ? spec.mla.v : hd;
  const std::string why = cudnn_attention_refusal(device, this_binary, hd, vd, spec.describe());
  if (!why.empty()) throw InputError(why);
}

Tensor attention_forward(UnitContext& c, Saved& s, Tensor qkv, const AttentionShape& a, DType product) {
  if (c.batch.context_parallel()) return cp::attention_forward(c, s, qkv, a);  // fused, over the cp group
  if (flash(c)) {
    Tensor atty = s.add(c.pool, "atty", {a.B * a.T, a.H * a.v()}), lse = s.add_f32(c.pool, "lse", {a.B, a.H, a.T});
    Block tiles =
        c.pool.alloc(DType::f32, flash_attention_workspace_elems(a.B, a.T, a.H, a.KV, a.hd, false, false, a.vd),
                     Category::workspace, "attention tiles");
    ops::flash_attention_forward(c.be, atty, lse, qkv, a.H, a.KV, true, tiles.flat(DType::f32), a.vd);
    return atty;  // nothing to drop for --activation-checkpointing attention: no probabilities kept
  }
  if (cudnn(c)) {  // saves what flash saves
    SHARD_CHECK(a.v() == a.hd, "cuDNN attention with values of {} channels beside {} (check_attention_kernel refuses)",
                a.v(), a.hd);
    // Where the output's products round to bf16, cuDNN's own operands are kept: qkv rounded once
    // and its bf16 output.
    const bool bf16 = keeps_bf16(c, s, qkv, product);
    Tensor atty = saved(c, s, bf16, "atty", {a.B * a.T, a.H * a.v()});
    Tensor lse = s.add_f32(c.pool, "lse", {a.B, a.H, a.T});
    Block work = c.pool.alloc(DType::f32, cudnn_attention_workspace_elems(a.B, a.T, a.H, a.KV, a.hd, false),
                              Category::workspace, "attention bf16 operands");
    ops::cudnn_attention_forward(c.be, atty, lse, qkv, a.H, a.KV, work.flat(DType::f32));
    return atty;
  }
  // The same where the saved activations are bf16 too, as Megatron's: the products on the tensor
  // cores, the probabilities and the output kept in bf16.
  const bool bf16 = keeps_bf16(c, s, qkv, product);
  Tensor atty = saved(c, s, bf16, "atty", {a.B * a.T, a.H * a.v()});
  Tensor att = saved(c, s, bf16, "att", {a.B, a.H, a.T, a.T});
  ops::attention_forward(c.be, atty, att, qkv, a.H, a.KV, a.vd);
  if (c.checkpointing == Checkpointing::attention) s.drop("att");  // recomputed in backward
  return atty;
}

Block attention_scratch(UnitContext& c, const AttentionShape& a, const std::string& prefix) {
  if (c.batch.context_parallel())
    return c.pool.alloc(DType::f32, cp::attention_scratch_elems(c, a), Category::workspace, prefix + "attention tiles");
  if (flash(c))
    return c.pool.alloc(DType::f32, flash_attention_workspace_elems(a.B, a.T, a.H, a.KV, a.hd, true, false, a.vd),
                        Category::workspace, prefix + "attention tiles");
  if (cudnn(c))
    return c.pool.alloc(DType::f32, cudnn_attention_workspace_elems(a.B, a.T, a.H, a.KV, a.hd, true),
                        Category::workspace, prefix + "attention bf16 operands");
  return c.pool.alloc(DType::f32, attention_scratch_elems(a.T, a.H), Category::workspace,
                      prefix + "attention scratch");
}

void attention_backward(UnitContext& c, Saved& s, Tensor dqkv, Tensor datty, Tensor scratch, const AttentionShape& a,
                        const std::string& prefix) {
  if (c.batch.context_parallel()) return cp::attention_backward(c, s, dqkv, datty, scratch, a);
  if (flash(c)) {
    ops::flash_attention_backward(c.be, dqkv, datty, s("qkv"), s("atty"), s("lse"), a.H, a.KV, true, scratch, a.vd);
    return;
  }
  if (cudnn(c)) {
    ops::cudnn_attention_backward(c.be, dqkv, datty, s("qkv"), s("atty"), s("lse"), a.H, a.KV, scratch);
    return;
  }
  // The probabilities are kept in qkv's dtype (bf16 where attention_forward rounded it).
  const DType kept = s("qkv").dtype();
  Block att_again;  // --activation-checkpointing attention: the probabilities again, from q and k
  if (!s.has("att")) {
    att_again = c.pool.alloc(kept, a.B * a.H * a.T * a.T, Category::activations, prefix + "att (recomputed)");
    // atty is overwritten with the values forward wrote: the kernels are deterministic.
    ops::attention_forward(c.be, s("atty"), att_again.view(kept, {a.B, a.H, a.T, a.T}), s("qkv"), a.H, a.KV, a.vd);
  }
  Tensor att = att_again ? att_again.view(kept, {a.B, a.H, a.T, a.T}) : s("att");
  Block held;  // the output's gradient rounded once for the two products that read it (f32: itself)
  const Tensor dh = rounded_once(c, datty, kept, held, prefix + "attention rounded datty");
  ops::attention_backward(c.be, dqkv, dh, s("qkv"), att, a.H, a.KV, scratch, a.vd);
}

namespace {
std::string k_name(const std::string& prefix) { return prefix + "k cache"; }
std::string v_name(const std::string& prefix) { return prefix + "v cache"; }
}  // namespace

void kv_cache_open(UnitContext& c, Saved& cache, const AttentionShape& a, const std::string& prefix, int64_t pos0) {
  SHARD_CHECK(a.v() == a.hd, "{}: the KV cache holds values of the keys' head dimension ({}), not {}", prefix, a.hd,
              a.v());
  if (pos0 != 0) return;
  cache.clear();
  cache.add(c.pool, k_name(prefix), {a.B, c.spec.seq, a.KV * a.hd});
  cache.add(c.pool, v_name(prefix), {a.B, c.spec.seq, a.KV * a.hd});
}

Tensor attention_cached(UnitContext& c, Saved& cache, Saved& s, Tensor qkv, const AttentionShape& a,
                        const std::string& prefix, int64_t pos0) {
  const Tensor k = cache(k_name(prefix)), v = cache(v_name(prefix));
  ops::kv_cache_write(c.be, k, v, qkv, a.H, a.KV, pos0);
  Tensor atty = s.add(c.pool, "atty", {a.B * a.T, a.H * a.hd});
  if (c.spec.attention != AttentionKernel::naive) {  // decoding with cudnn too goes through the fused kernel
    Block tiles = c.pool.alloc(DType::f32,
                               flash_cached_workspace_elems(a.B, a.T, c.spec.seq, a.H, a.KV, a.hd, pos0),
                               Category::workspace, prefix + "attention tiles");
    ops::flash_attention_cached(c.be, atty, qkv, k, v, a.H, a.KV, pos0, tiles.flat(DType::f32));
  } else {
    ops::attention_cached(c.be, atty, qkv, k, v, a.H, a.KV, pos0);
  }
  return atty;
}

}  // namespace shardlab::blocks
