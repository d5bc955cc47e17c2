#include "shard/mixed_precision.hpp"

#include <algorithm>

namespace shardlab {

void MixedPrecisionPolicy::validate() const {
  SHARD_REQUIRE(param_dtype != DType::f16 && reduce_dtype != DType::f16,
                "f16 storage needs loss scaling, which shardlab does not do: use --param-dtype and --reduce-dtype "
                "f32 or bf16");
}

MixedPrecision::MixedPrecision(MixedPrecisionPolicy policy, Pool& pool, size_t units)
    : policy_(policy), pool_(pool), be_(pool.backend()), param_ws_(units), grad_ws_(units), widened_(units) {}

Tensor MixedPrecision::compute_params(size_t u, Tensor storage, const std::string& unit_name,
                                      const std::vector<ElemRange>* only) {
  if (storage.dtype() == DType::f32) return storage;
  Block& ws = param_ws_[u];
  std::vector<ElemRange>& done = widened_[u];
  const std::vector<ElemRange> all{{0, storage.numel()}};
  if (!ws) {
    done.clear();
    ws = pool_.alloc(DType::f32, storage.numel(), Category::workspace, unit_name + " params (f32 compute)");
  }
  const Tensor w = ws.flat(DType::f32).slice(0, storage.numel());
  std::vector<ElemRange> wanted;
  for (const ElemRange& r : only ? *only : all) {
    const bool have = std::any_of(done.begin(), done.end(), [&](const ElemRange& d) {
      return d.offset <= r.offset && r.offset + r.count <= d.offset + d.count;
    });
    if (!have && r.count > 0) wanted.push_back(r);
  }
  if (wanted.size() == 1 && wanted[0].offset == 0 && wanted[0].count == storage.numel())
    be_.cast(w, storage);  // all of it: as widened before
  else if (!wanted.empty())
    be_.cast_ranges(w, storage, wanted);
  done.insert(done.end(), wanted.begin(), wanted.end());
  return w;
}

void MixedPrecision::release_params(size_t u) {
  param_ws_[u].reset();
  widened_[u].clear();
}

Tensor MixedPrecision::compute_grads(size_t u, Tensor storage, const std::string& unit_name) {
  if (storage.dtype() == DType::f32) return storage;
  Block& ws = grad_ws_[u];
  if (!ws) {
    ws = pool_.alloc(DType::f32, storage.numel(), Category::workspace, unit_name + " grads (f32 compute)");
    be_.fill(ws.flat(DType::f32), 0.f);
  }
  return ws.flat(DType::f32).slice(0, storage.numel());
}

void MixedPrecision::flush_grads(size_t u, Tensor storage) {
  Block& ws = grad_ws_[u];
  if (!ws) return;
  be_.add_into(storage, ws.flat(DType::f32).slice(0, storage.numel()));  // one rounding to the reduce dtype
  ws.reset();
}

void MixedPrecision::write_values(Tensor storage, Tensor master, std::span<const float> values) {
  Tensor src = Tensor::of(values);
  if (master.data()) be_.copy(master, src);
  if (storage.dtype() == DType::f32) {
    be_.copy(storage, src);
    return;
  }
  Block host = pool_.alloc(DType::f32, storage.numel(), Category::workspace, "values to store");
  Tensor h = host.flat(DType::f32).slice(0, storage.numel());
  be_.copy(h, src);
  be_.cast(storage, h);
}

void MixedPrecision::accumulate(Tensor dst, Tensor src) {
  if (dst.dtype() == DType::f32 && src.dtype() == DType::f32) {
    be_.add(dst, src, dst);
    return;
  }
  be_.add_into(dst, src);
}

void MixedPrecision::params_from_master(Tensor params, Tensor master) {
  if (mixed()) be_.cast(params, master);
}

}  // namespace shardlab
