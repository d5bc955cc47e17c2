// parallel_model_save.cpp — `train --save` under every layout: the whole model's parameters on
// world rank 0, assembled from the tensor-parallel parts and the pipeline stages, written as
// HF-named safetensors (parallel_model.hpp).
#include "shard/parallel_model.hpp"

#include "src/model/family.hpp"
#include "src/model/model.hpp"
#include "src/model/tp.hpp"

namespace shardlab {

namespace {
const UnitLayout& unit_named(const std::vector<UnitLayout>& layout, const std::string& name) {
  for (const UnitLayout& l : layout)
    if (l.name == name) return l;
  SHARD_CHECK(false, "unit {} is not the model's", name);
  return layout.front();
}
}  // namespace

// This rank's units without their tied copies (the owner's stage saves the tensor), assembled into
// whole units on tensor-parallel rank 0 (the others return their trimmed parts).
std::vector<std::vector<float>> ParallelModel::stage_units_whole(std::vector<std::vector<float>> host) {
  const std::vector<UnitLayout> whole = family_of(cfg_.spec).layout(cfg_.spec);
  std::vector<UnitLayout> local, wanted;
  const std::vector<UnitLayout> ep_whole =
      ep_.active() ? family_of(cfg_.spec).layout(cfg_.spec, tp_.config) : std::vector<UnitLayout>{};
  for (size_t u = 0; u < units_.size(); ++u) {
    // Under --ep host holds every expert already (ep_units_whole).
    UnitLayout l = ep_.active() ? unit_named(ep_whole, units_[u]->name()) : units_[u]->layout();
    while (!l.tensors.empty() && l.tensors.back().tied_copy) {  // tied copies are appended last
      l.numel = l.tensors.back().offset;
      l.tensors.pop_back();
    }
    host[u].resize(static_cast<size_t>(l.numel));
    wanted.push_back(unit_named(whole, l.name));
    local.push_back(std::move(l));
  }
  if (tp_.active()) host = gather_tp_units(*tp_.comm, local, wanted, host);
  return host;
}

// Every rank of the ep group gets its units (this stage's) with every expert: the group's parts
// all-gathered, each rank's experts put in place by name (the other tensors lie at the same offsets
// on each rank).
std::vector<std::vector<float>> ParallelModel::ep_units_whole(std::vector<std::vector<float>> host) {
  Communicator& ep = *ep_.comm;
  const int D = ep.world_size();
  const ModelFamily& family = family_of(cfg_.spec);
  const std::vector<UnitLayout> whole = family.layout(cfg_.spec, tp_.config);  // every expert
  std::vector<std::vector<UnitLayout>> parts;
  for (int q = 0; q < D; ++q) {
    parts.push_back(family.layout(cfg_.spec, tp_.config, EpConfig{D, q}));
  }
  std::vector<std::vector<float>> out(host.size());
  for (size_t u = 0; u < host.size(); ++u) {
    const size_t n = host[u].size();
    std::vector<float> all(n * static_cast<size_t>(D));
    ep.all_gather(std::span<const float>(host[u]), std::span<float>(all)).wait();
    const UnitLayout& w = unit_named(whole, units_[u]->name());
    out[u].assign(static_cast<size_t>(w.numel), 0.f);
    for (int q = 0; q < D; ++q)
      for (const TensorDecl& t : unit_named(parts[static_cast<size_t>(q)], units_[u]->name()).tensors) {
        const TensorDecl& to = w.find(t.name);  // (a unit's tied copy comes last, after every part's tensor)
        std::copy_n(all.begin() + static_cast<int64_t>(q * n) + t.offset, t.numel, out[u].begin() + to.offset);
      }
  }
  return out;
}

std::string ParallelModel::save(const std::string& path, bool overwrite, const std::string& base_config,
                                const std::string& base_source) {
  std::vector<std::vector<float>> host;
  for (size_t u = 0; u < units_.size(); ++u) host.push_back(strategy_->gather_unit_params(u));
  Communicator& world = mesh_.world();
  if (ep_.active()) host = ep_units_whole(std::move(host));
  if (!tp_.active() && !pipelined() && !ep_.active()) {
    if (world.rank() != 0) return "";
    return write_units(path, cfg_.spec, units_, host, DType::f32, overwrite, base_config, base_source);
  }
  const ModelFamily& family = family_of(cfg_.spec);
  host = stage_units_whole(std::move(host));
  if (!pipelined()) {
    if (world.rank() != 0) return "";
    return write_units(path, cfg_.spec, family.make_units(cfg_.spec), host, DType::f32, overwrite, base_config,
                       base_source);
  }
  // Every stage's first rank (data-parallel, context-parallel and tensor-parallel rank 0) sends its whole units to
  // world rank 0, the first stage's, over their pipeline group; world rank 0 writes the model.
  if (mesh_.rank(CommAxis::dp_cp) != 0 || mesh_.rank(CommAxis::tp) != 0) return "";
  Communicator& pp = mesh_.comm(CommAxis::pp);
  if (mesh_.rank(CommAxis::pp) != 0) {
    for (std::vector<float>& v : host) pp.send(Tensor::of(std::span<const float>(v)), 0).wait();
    return "";
  }
  const std::vector<UnitLayout> whole = family.layout(cfg_.spec);
  std::vector<std::vector<float>> all(whole.size());
  for (int s = 0; s < split_->pp; ++s) {
    const std::vector<int> units = split_->units_of(s);
    for (size_t i = 0; i < units.size(); ++i) {
      std::vector<float>& v = all[static_cast<size_t>(units[i])];
      if (s == 0) {
        v = std::move(host[i]);
        continue;
      }
      v.resize(static_cast<size_t>(whole[static_cast<size_t>(units[i])].numel));
      pp.recv(Tensor::of(std::span<float>(v)), s).wait();
    }
  }
  return write_units(path, cfg_.spec, family.make_units(cfg_.spec), all, DType::f32, overwrite, base_config,
                     base_source);
}

}  // namespace shardlab
