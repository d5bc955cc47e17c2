#include "src/model/unit.hpp"

#include <algorithm>

#include "src/model/parallel/cp.hpp"
#include "src/model/parallel/ep.hpp"

namespace shardlab {

bool Batch::context_parallel() const { return cp != nullptr && cp->active(); }
bool UnitContext::expert_parallel() const { return ep != nullptr && ep->active(); }

Tensor ParamSet::operator()(const std::string& name) const {
  auto it = map_.find(name);
  SHARD_CHECK(it != map_.end(), "parameter set has no tensor '{}'", name);
  SHARD_CHECK(!gemm_only_ || gemm_only_->count(name) == 0,
              "'{}' read in f32, but its unit reads it only through its GEMMs (Unit::gemm_only): no f32 copy was made",
              name);
  return it->second;
}

std::string ParamSet::name_at(const void* data) const {
  for (const auto& [name, t] : map_)
    if (t.data() == data) return name;
  return "";
}

Tensor ParamSet::gemm(const std::string& name) const { return low_ ? (*low_)(name) : (*this)(name); }

void ParamSet::set_zeroed(const UnitLayout& own) {
  zeroed_ = std::make_shared<std::set<std::string>>();
  for (const TensorDecl& t : own.tensors) zeroed_->insert(t.name);
}

bool ParamSet::claim_zeroed(const std::string& name) const { return zeroed_ && zeroed_->erase(name) == 1; }

Tensor Saved::add(Pool& pool, const std::string& name, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  blocks_.push_back(pool.alloc(DType::f32, n, Category::activations, name));
  Tensor t = blocks_.back().view(DType::f32, shape);
  tensors_[name] = t;
  return t;
}

Tensor Saved::add_as(Pool& pool, const std::string& name, std::initializer_list<int64_t> shape, DType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  blocks_.push_back(pool.alloc(dtype, n, Category::activations, name));
  Tensor t = blocks_.back().view(dtype, shape);
  tensors_[name] = t;
  as_stored_.insert(name);
  return t;
}

void Saved::move_one(Backend& be, Pool& pool, const std::string& name, Tensor& t, DType to) {
  auto old = std::find_if(blocks_.begin(), blocks_.end(), [&](const Block& b) { return b.data() == t.data(); });
  SHARD_CHECK(old != blocks_.end(), "saved activation '{}' has no block of its own", name);
  Block moved = pool.alloc(to, t.numel(), Category::activations, name);
  const Tensor dst = moved.flat(to).reshape(t.shape());
  be.cast(dst, t);
  *old = std::move(moved);  // frees the old block
  t = dst;
}

void Saved::move_to(Backend& be, Pool& pool, DType from, DType to) {
  for (auto& [name, t] : tensors_)
    if (t.dtype() == from && !as_stored_.count(name)) move_one(be, pool, name, t, to);
}

Tensor Saved::round(Backend& be, Pool& pool, const std::string& name, DType to) {
  auto it = tensors_.find(name);
  SHARD_CHECK(it != tensors_.end(), "no saved activation '{}' to round", name);
  if (it->second.dtype() != to) move_one(be, pool, name, it->second, to);
  as_stored_.insert(name);
  return it->second;
}

void Saved::narrow(Backend& be, Pool& pool, DType to) {
  SHARD_CHECK(to != DType::f32, "narrowing saved activations to f32");
  move_to(be, pool, DType::f32, to);
}

void Saved::widen(Backend& be, Pool& pool) {
  for (DType from : {DType::bf16, DType::f16}) move_to(be, pool, from, DType::f32);
}

void Saved::drop(const std::string& name) {
  auto it = tensors_.find(name);
  SHARD_CHECK(it != tensors_.end(), "no saved activation '{}' to drop", name);
  void* data = it->second.data();
  tensors_.erase(it);
  std::erase_if(blocks_, [&](const Block& b) { return b.data() == data; });
}

Block Saved::take(const void* data) {
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
    if (it->data() == data) {
      Block b = std::move(*it);
      blocks_.erase(it);
      std::erase_if(tensors_, [&](const auto& kv) {
        if (kv.second.data() != data) return false;
        as_stored_.erase(kv.first);
        return true;
      });
      return b;
    }
  return Block();
}

std::vector<const void*> Saved::block_starts() const {
  std::vector<const void*> out;
  for (const Block& b : blocks_) out.push_back(b.data());
  return out;
}

Tensor Saved::operator()(const std::string& name) const {
  auto it = tensors_.find(name);
  SHARD_CHECK(it != tensors_.end(), "no saved activation '{}'", name);
  return it->second;
}

void Unit::forward_cached(UnitContext&, const ParamSet&, Tensor, Tensor, Saved&, int64_t) {
  SHARD_CHECK(false, "unit {} has no cached forward (decodes() is false): decode by whole forwards instead", name());
}

Checkpointing parse_checkpointing(const std::string& s) {
  if (s == "none") return Checkpointing::none;
  if (s == "attention") return Checkpointing::attention;
  if (s == "blocks") return Checkpointing::blocks;
  throw InputError(fmt::format("--activation-checkpointing '{}': expected none, attention or blocks", s));
}

std::vector<Checkpointing> checkpointing_choices(const ModelSpec& spec) {
  if (spec.layers < 2) return {Checkpointing::none};
  return {Checkpointing::none, Checkpointing::attention, Checkpointing::blocks};
}

const char* checkpointing_name(Checkpointing c) {
  return c == Checkpointing::none ? "none" : c == Checkpointing::attention ? "attention" : "blocks";
}

void Unit::adopt_tied_copy(const TensorDecl& owner) {
  for (const TensorDecl& t : layout_.tensors)
    SHARD_CHECK(t.name != owner.name, "unit {} already holds {}", layout_.name, owner.name);
  TensorDecl copy = owner;
  copy.offset = layout_.numel;
  copy.tied_copy = true;
  layout_.numel += copy.numel;
  layout_.tensors.push_back(std::move(copy));
}

std::vector<BorrowedTensor> borrowed_tensors(const std::vector<std::unique_ptr<Unit>>& units, size_t u) {
  std::vector<BorrowedTensor> out;
  auto own = [&](const std::string& name) {
    for (const TensorDecl& t : units[u]->layout().tensors)
      if (t.name == name) return true;
    return false;
  };
  for (const std::string& name : units[u]->borrowed())
    if (!own(name))
      for (size_t o = 0; o < units.size(); ++o)
      for (const TensorDecl& t : units[o]->layout().tensors)
        if (t.name == name) out.push_back({o, &t});
  return out;
}

}  // namespace shardlab
