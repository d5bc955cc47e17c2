// mixed_precision.hpp — the mixed-precision policy of a run (in the manner of FSDP2's
// MixedPrecisionPolicy) and the per-unit f32 buffers it implies.
//
// Parameters are stored (and gathered) in param_dtype, gradients stored and reduced in
// reduce_dtype; when param_dtype is not f32, an f32 master copy of what a rank updates lives beside
// the optimizer state. Kernels compute in f32: a unit's bf16 parameters are widened into a
// workspace while it runs, and its gradients accumulate in an f32 workspace that is folded into the
// reduce-dtype buffer after its backward (one rounding). With f32 storage every call is a no-op
// that hands back the storage itself.
#pragma once
#include <span>
#include <vector>

#include "memory/pool.hpp"

namespace shardlab {

struct MixedPrecisionPolicy {
  DType param_dtype = DType::f32;   // storage and all-gather of the parameters units compute with
  DType reduce_dtype = DType::f32;  // storage and reduction of gradients
  bool mixed() const { return param_dtype != DType::f32; }  // an f32 master copy is kept
  void validate() const;
};

class MixedPrecision {
 public:
  MixedPrecision(MixedPrecisionPolicy policy, Pool& pool, size_t units);
  const MixedPrecisionPolicy& policy() const { return policy_; }
  bool mixed() const { return policy_.mixed(); }

  // An f32 view of unit u's parameters held in `storage`; widened into a workspace that lives until
  // release_params(u) when the storage is not f32. `only` (optional): the ranges of it that are
  // read in f32, the rest left unwidened (its reader's GEMMs take the storage); each range widened
  // once while the workspace lives, whichever reader asks.
  Tensor compute_params(size_t u, Tensor storage, const std::string& unit_name,
                        const std::vector<ElemRange>* only = nullptr);
  void release_params(size_t u);
  // The f32 tensor unit u's backward accumulates into; flush_grads(u, storage) adds it to `storage`.
  Tensor compute_grads(size_t u, Tensor storage, const std::string& unit_name);
  // Whether compute_grads(u, storage) would hand out a new workspace: zeros.
  bool fresh_grads(size_t u, const Tensor& storage) const { return storage.dtype() != DType::f32 && !grad_ws_[u]; }
  void flush_grads(size_t u, Tensor storage);
  // Writes f32 values into a parameter buffer of any dtype, and into its master copy if given.
  void write_values(Tensor storage, Tensor master, std::span<const float> values);
  // dst += src for buffers of any (equal) dtype, computed in f32.
  void accumulate(Tensor dst, Tensor src);
  // Under mixed precision: the parameters a rank updates <- its f32 master copy (one rounding).
  void params_from_master(Tensor params, Tensor master);

 private:
  MixedPrecisionPolicy policy_;
  Pool& pool_;
  Backend& be_;
  std::vector<Block> param_ws_, grad_ws_;  // per unit
  std::vector<std::vector<ElemRange>> widened_;  // per unit: the ranges of param_ws_ widened so far
};

}  // namespace shardlab
