#include "src/model/model.hpp"

namespace shardlab {

Gpt2Model::Gpt2Model(const ModelSpec& spec, Backend& be, Pool& pool) : spec_(spec), be_(be), pool_(pool) {
  spec_.validate();
  units_ = make_gpt2_units(spec_);
  for (const auto& u : units_) {
    params_.push_back(pool_.alloc(DType::f32, u->layout().numel, Category::param_full, u->name() + " params"));
    grads_.push_back(pool_.alloc(DType::f32, u->layout().numel, Category::grad_full, u->name() + " grads"));
  }
  zero_grads();
}

int64_t Gpt2Model::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->layout().numel;
  return n;
}

void Gpt2Model::init(uint64_t seed) {
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

void Gpt2Model::load(const std::string& path) {
  SafetensorsReader r(path);
  for (size_t i = 0; i < units_.size(); ++i) {
    for (const TensorDecl& t : units_[i]->layout().tensors) {
      std::string name = r.has(t.name) ? t.name : "transformer." + t.name;
      SHARD_REQUIRE(r.has(name), "'{}' has no tensor '{}' (nor 'transformer.{}'): is it a GPT-2 checkpoint of {}?",
                    path, t.name, t.name, spec_.describe());
      std::vector<float> host(static_cast<size_t>(t.numel));
      r.read_f32(name, host, &t.shape);
      be_.copy(unit_params(i).slice(t.offset, t.numel), Tensor::of(std::span<float>(host)));
    }
  }
}

void Gpt2Model::save(const std::string& path, DType dtype) const {
  std::vector<std::vector<float>> host(units_.size());
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < units_.size(); ++i) {
    host[i].resize(static_cast<size_t>(units_[i]->layout().numel));
    be_.copy(Tensor::of(std::span<float>(host[i])), unit_params(i));
    for (const TensorDecl& t : units_[i]->layout().tensors)
      tensors.push_back({t.name, dtype, t.shape,
                         std::span<const float>(host[i].data() + t.offset, static_cast<size_t>(t.numel))});
  }
  write_safetensors(path, tensors, {{"format", "pt"}, {"model", spec_.describe()}});
}

Tensor Gpt2Model::param(const std::string& name) const {
  for (size_t i = 0; i < units_.size(); ++i)
    for (const TensorDecl& t : units_[i]->layout().tensors)
      if (t.name == name) return unit_params(i).slice(t.offset, t.numel);
  SHARD_CHECK(false, "model has no parameter '{}'", name);
}

Tensor Gpt2Model::grad(const std::string& name) const {
  for (size_t i = 0; i < units_.size(); ++i)
    for (const TensorDecl& t : units_[i]->layout().tensors)
      if (t.name == name) return unit_grads(i).slice(t.offset, t.numel);
  SHARD_CHECK(false, "model has no gradient '{}'", name);
}

void Gpt2Model::zero_grads() {
  for (const Block& g : grads_) be_.fill(g.flat(DType::f32), 0.f);
}

ParamSet Gpt2Model::view_set(size_t i, const std::vector<Block>& storage) const {
  ParamSet s;
  auto add_unit = [&](size_t u) {
    Tensor flat = storage[u].flat(DType::f32);
    for (const TensorDecl& t : units_[u]->layout().tensors)
      s.set(t.name, flat.slice(t.offset, t.numel).reshape(t.shape));
  };
  add_unit(i);
  for (const std::string& b : units_[i]->borrowed())
    for (size_t u = 0; u < units_.size(); ++u)
      for (const TensorDecl& t : units_[u]->layout().tensors)
        if (t.name == b) s.set(t.name, storage[u].flat(DType::f32).slice(t.offset, t.numel).reshape(t.shape));
  return s;
}

float Gpt2Model::forward_backward(const Batch& batch, float grad_scale, std::vector<float>* logits) {
  SHARD_REQUIRE(batch.T <= spec_.seq, "sequence length {} exceeds the model's {} positions", batch.T, spec_.seq);
  UnitContext ctx{be_, pool_, spec_, batch};
  const size_t U = units_.size();
  const int64_t N = batch.B * batch.T;
  std::vector<Block> outs(U);
  std::vector<Saved> saved(U);
  for (size_t u = 0; u < U; ++u) {
    pool_.ledger().set_phase("forward " + units_[u]->name());
    int64_t n = units_[u]->out_elems(spec_, batch.B, batch.T);
    outs[u] = pool_.alloc(DType::f32, n, Category::activations, units_[u]->name() + " output");
    Tensor in = u == 0 ? Tensor() : outs[u - 1].flat(DType::f32);
    units_[u]->forward(ctx, view_set(u, params_), in, outs[u].flat(DType::f32), saved[u]);
  }
  Tensor out = outs.back().view(DType::f32, {N, spec_.vocab});
  if (logits) {
    logits->resize(static_cast<size_t>(N * spec_.vocab));
    be_.copy(Tensor::of(std::span<float>(*logits)), out);
  }
  pool_.ledger().set_phase("loss");
  Block losses = pool_.alloc(DType::f32, N + 1, Category::activations, "losses");
  Tensor loss_t = losses.flat(DType::f32);
  be_.cross_entropy(loss_t.slice(0, N), out, out, batch.targets, grad_scale / static_cast<float>(N));
  be_.sum(loss_t.slice(0, N), loss_t.slice(N, 1), false);
  float loss_sum = 0.f;
  be_.copy(Tensor::flat(&loss_sum, DType::f32, 1), loss_t.slice(N, 1));
  Block dnext;  // gradient flowing into unit u's output
  for (size_t u = U; u-- > 0;) {
    pool_.ledger().set_phase("backward " + units_[u]->name());
    Block din;
    if (u > 0) din = pool_.alloc(DType::f32, outs[u - 1].bytes() / 4, Category::activations, units_[u]->name() + " dinput");
    Tensor dout = u + 1 == U ? out : dnext.flat(DType::f32);
    Tensor in = u == 0 ? Tensor() : outs[u - 1].flat(DType::f32);
    units_[u]->backward(ctx, view_set(u, params_), view_set(u, grads_), saved[u], in, dout,
                        u == 0 ? Tensor() : din.flat(DType::f32));
    saved[u].clear();
    outs[u].reset();
    dnext = std::move(din);
  }
  pool_.ledger().set_phase("");
  return loss_sum / static_cast<float>(N);
}

}  // namespace shardlab
