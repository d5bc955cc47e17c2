#include "memory/pool.hpp"

#include <algorithm>
#include <utility>
#include <cstdio>

#include "src/core/units.hpp"

namespace shardlab {

Block& Block::operator=(Block&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = std::exchange(o.pool_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    id_ = std::exchange(o.id_, 0);
    category_ = o.category_;
  }
  return *this;
}

void Block::reset() {
  if (pool_) pool_->release(*this);
  pool_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
  id_ = 0;
}

Device Block::device() const {
  SHARD_CHECK(pool_ != nullptr, "device() of an empty block");
  return pool_->backend().device();
}

Tensor Block::view(DType dtype, std::initializer_list<int64_t> shape) const {
  Tensor t(ptr_, dtype, shape, device());
  SHARD_CHECK(t.bytes() <= bytes_, "view {} of {} needs {} bytes, block has {}", t.shape_str(), dtype_name(dtype),
              t.bytes(), bytes_);
  return t;
}

Tensor Block::flat(DType dtype) const {
  return Tensor::flat(ptr_, dtype, static_cast<int64_t>(bytes_ / dtype_size(dtype)), device());
}

Pool::Pool(Backend& backend, PoolConfig cfg)
    : alloc_backend_(backend),
      backend_(backend),
      tier_(Tier::device),
      budget_(cfg.budget),
      own_ledger_(std::make_unique<Ledger>()),
      ledger_(own_ledger_.get()) {
  host_.reset(new Pool(backend, cfg.host_budget, *ledger_));
}

Pool::Pool(Backend& device_backend, uint64_t budget, Ledger& ledger)
    : alloc_backend_(device_backend),
      backend_(device_backend.host()),
      tier_(Tier::host),
      budget_(budget),
      ledger_(&ledger) {}

Pool::~Pool() {
  if (!live_.empty()) {
    // A block outlived its pool: a bug, but a destructor must not throw. Say what leaked.
    std::fprintf(stderr, "shardlab [%s]: pool destroyed with %zu live blocks: %s\n", process_identity().c_str(),
                 live_.size(), describe_live().c_str());
  }
}

void Pool::set_budgets(PoolConfig cfg) {
  SHARD_CHECK(tier_ == Tier::device, "set_budgets: called on the host tier; call it on the device tier's pool");
  std::lock_guard lock(mutex_);
  budget_ = cfg.budget;
  std::lock_guard host_lock(host_->mutex_);
  host_->budget_ = cfg.host_budget;
}

uint64_t Pool::in_use() const {
  std::lock_guard lock(mutex_);
  return ledger_->current_total(tier_);
}

Block Pool::alloc(uint64_t bytes, Category category, std::string tag) {
  std::lock_guard lock(mutex_);
  uint64_t used = ledger_->current_total(tier_);
  if (budget_ > 0 && (used > budget_ || bytes > budget_ - used)) {
    std::string msg = fmt::format(
        "out of memory: cannot allocate {} ({} bytes) for {} '{}' on the {} tier: {} of the {} budget in use "
        "({}), {} free.\n  live: {}",
        format_bytes(static_cast<double>(bytes)), bytes, category_name(category), tag, tier_name(tier_),
        format_bytes(static_cast<double>(used)), format_bytes(static_cast<double>(budget_)),
        tier_ == Tier::device ? "--device-memory" : "--host-memory",
        format_bytes(static_cast<double>(budget_ > used ? budget_ - used : 0)), describe_live());
    throw OutOfMemory(msg, bytes, used, budget_);
  }
  Block b;
  b.ptr_ = tier_ == Tier::device ? alloc_backend_.raw_alloc(bytes) : alloc_backend_.raw_alloc_host(bytes);
  b.pool_ = this;
  b.bytes_ = bytes;
  b.category_ = category;
  b.id_ = next_id_++;
  ledger_->on_alloc(category, bytes, tag, tier_);
  live_.emplace(b.id_, LiveBlock{std::move(tag), category, bytes});
  return b;
}

void Pool::release(Block& b) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(b.id_);
  SHARD_CHECK(it != live_.end(), "releasing block {} that this pool does not hold", b.id_);
  if (tier_ == Tier::device) alloc_backend_.raw_free(b.ptr_, b.bytes_);
  else alloc_backend_.raw_free_host(b.ptr_, b.bytes_);
  ledger_->on_free(it->second.category, it->second.bytes, it->second.tag, tier_);
  live_.erase(it);
}

std::vector<LiveBlock> Pool::live_blocks() const {
  std::lock_guard lock(mutex_);
  std::vector<LiveBlock> out;
  for (const auto& [id, lb] : live_) out.push_back(lb);
  std::stable_sort(out.begin(), out.end(), [](const LiveBlock& a, const LiveBlock& b) { return a.bytes > b.bytes; });
  return out;
}

std::string Pool::describe_live(size_t max_tags) const {
  std::lock_guard lock(mutex_);
  if (live_.empty()) return "nothing";
  std::array<uint64_t, kNumCategories> bytes{};
  std::array<int, kNumCategories> count{};
  for (const auto& [id, lb] : live_) {
    bytes[static_cast<int>(lb.category)] += lb.bytes;
    count[static_cast<int>(lb.category)] += 1;
  }
  std::string s;
  for (int c = 0; c < kNumCategories; ++c) {
    if (count[c] == 0) continue;
    s += fmt::format("{}{} {} in {} block{}", s.empty() ? "" : ", ", kCategoryNames[c],
                     format_bytes(static_cast<double>(bytes[c])), count[c], count[c] == 1 ? "" : "s");
  }
  s += "; largest:";
  auto blocks = live_blocks();
  for (size_t i = 0; i < blocks.size() && i < max_tags; ++i)
    s += fmt::format("{} '{}' ({}) {}", i ? "," : "", blocks[i].tag, category_name(blocks[i].category),
                     format_bytes(static_cast<double>(blocks[i].bytes)));
  return s;
}

}  // namespace shardlab
