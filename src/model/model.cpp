#include "src/model/model.hpp"

#include <algorithm>

namespace shardlab {

Model::Model(const ModelSpec& spec, Backend& be, Pool& pool, const TpContext& tp)
    : spec_(spec), be_(be), pool_(pool), tp_(tp) {
  spec_.validate();
  SHARD_CHECK(!tp.active() || tp.comm != nullptr, "a tensor-parallel model (degree {}) needs its group's communicator",
              tp.config.degree);
  units_ = family_of(spec_).make_units(spec_, tp.config);
  for (const auto& u : units_) {
    params_.push_back(pool_.alloc(DType::f32, u->layout().numel, Category::param_full, u->name() + " params"));
    grads_.push_back(pool_.alloc(DType::f32, u->layout().numel, Category::grad_full, u->name() + " grads"));
  }
  zero_grads();
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->layout().numel;
  return n;
}

void Model::init(uint64_t seed) {
  for (size_t i = 0; i < units_.size(); ++i) {
    const UnitLayout& l = units_[i]->layout();
    if (be_.device() == Device::cpu) {
      init_flat_range(l, seed, 0, params_[i].span<float>());
    } else {
      std::vector<float> host(static_cast<size_t>(l.numel));
      init_flat_range(l, seed, 0, host);
      be_.copy(unit_params(i), Tensor::of(std::span<float>(host)));
    }
  }
}

void read_unit(HfWeights& r, const UnitLayout& unit, std::span<float> out, const ModelSpec& spec) {
  SHARD_CHECK(static_cast<int64_t>(out.size()) >= unit.numel, "read_unit {}: {} floats for {}", unit.name, out.size(),
              unit.numel);
  const ModelFamily& family = family_of(spec);
  for (const TensorDecl& t : unit.tensors) {
    const std::vector<std::string> names = family.hf_load_names(t);
    auto name = std::find_if(names.begin(), names.end(), [&](const std::string& n) { return r.has(n); });
    if (name == names.end()) {
      std::string others;
      for (size_t i = 1; i < names.size(); ++i) others += fmt::format("{}'{}'", i > 1 ? ", " : "", names[i]);
      throw InputError(fmt::format("'{}' has no tensor '{}'{}: is it a {} checkpoint of {}?", r.where(), names[0],
                                   others.empty() ? "" : " (nor " + others + ")", family.name(), spec.describe()));
    }
    std::span<float> dst = out.subspan(static_cast<size_t>(t.offset), static_cast<size_t>(t.numel));
    if (unit.tp_degree == 1 || !t.tp.split()) {
      r.read_f32(*name, dst, &t.full_shape);
      continue;
    }
    // A tensor-parallel part: the whole tensor, then this rank's runs of it (padding zero).
    int64_t full_numel = 1;
    for (int64_t d : t.full_shape) full_numel *= d;
    std::vector<float> whole(static_cast<size_t>(full_numel));
    r.read_f32(*name, whole, &t.full_shape);
    for (const TpRun& run : tp_runs(t, unit.tp_degree, unit.tp_rank)) {
      float* to = dst.data() + run.local;
      if (run.full < 0)
        std::fill_n(to, run.len, 0.f);
      else
        std::copy_n(whole.data() + run.full, run.len, to);
    }
  }
}

void Model::load(const std::string& path) {
  HfWeights r(path);
  for (size_t i = 0; i < units_.size(); ++i) {
    std::vector<float> host(static_cast<size_t>(units_[i]->layout().numel));
    read_unit(r, units_[i]->layout(), host, spec_);
    be_.copy(unit_params(i), Tensor::of(std::span<float>(host)));
  }
}

std::string write_units(const std::string& path, const ModelSpec& spec,
                        const std::vector<std::unique_ptr<Unit>>& units, const std::vector<std::vector<float>>& values,
                        DType dtype, bool overwrite, const std::string& base_config, const std::string& base_source) {
  SHARD_CHECK(units.empty() || units[0]->layout().tp_degree == 1,
              "write_units takes whole tensors (tensor-parallel degree 1), not degree {}", units[0]->layout().tp_degree);
  std::vector<HfTensorDecl> tensors;
  for (size_t u = 0; u < units.size(); ++u)
    for (const TensorDecl& t : units[u]->layout().tensors) tensors.push_back({family_of(spec).hf_name(t), t.shape});
  HfWriteOptions opts;
  opts.dtype = dtype;
  opts.metadata = {{"model", spec.describe()}};
  opts.overwrite = overwrite;
  opts.base_config = base_config;
  opts.base_config_source = base_source;
  HfModelWriter w(path, spec, std::move(tensors), std::move(opts));
  for (size_t u = 0; u < units.size(); ++u)
    for (const TensorDecl& t : units[u]->layout().tensors)
      w.write_next(std::span<const float>(values[u].data() + t.offset, static_cast<size_t>(t.numel)));
  w.finish();
  return w.config_note();
}

void Model::save(const std::string& path, DType dtype) const {
  std::vector<std::vector<float>> host(units_.size());
  for (size_t i = 0; i < units_.size(); ++i) {
    host[i].resize(static_cast<size_t>(units_[i]->layout().numel));
    be_.copy(Tensor::of(std::span<float>(host[i])), unit_params(i));
  }
  write_units(path, spec_, units_, host, dtype);
}

Tensor Model::find(const std::string& name, const std::vector<Block>& storage, const char* what) const {
  for (size_t i = 0; i < units_.size(); ++i)
    for (const TensorDecl& t : units_[i]->layout().tensors)
      if (t.name == name) return storage[i].flat(DType::f32).slice(t.offset, t.numel);
  SHARD_CHECK(false, "model has no {} '{}'", what, name);
}

Tensor Model::param(const std::string& name) const { return find(name, params_, "parameter"); }
Tensor Model::grad(const std::string& name) const { return find(name, grads_, "gradient"); }

void Model::zero_grads() {
  for (const Block& g : grads_) be_.fill(g.flat(DType::f32), 0.f);
}

ParamSet Model::view_set(size_t i, const std::vector<Block>& storage) const {
  ParamSet s;
  add_unit_views(s, units_[i]->layout(), storage[i].flat(DType::f32));
  for (const BorrowedTensor& b : borrowed_tensors(units_, i))
    s.set(b.decl->name, storage[b.owner].flat(DType::f32).slice(b.decl->offset, b.decl->numel).reshape(b.decl->shape));
  return s;
}

float Model::forward_backward(const Batch& batch, float grad_scale, std::vector<float>* logits,
                              Checkpointing checkpointing) {
  const float positions = static_cast<float>(batch.B * batch.T);
  RunResult r = run_forward_backward(units_, spec_, be_, pool_, batch, *this, grad_scale / positions, logits,
                                     checkpointing, tp_);
  return static_cast<float>(r.loss_sum / positions);
}

}  // namespace shardlab
