// pool.hpp — Pool and Block: the only way the runtime gets device or host memory.
//
// Every allocation carries a Category and a free-text tag, is charged to the rank's Ledger, and
// counts against a hard per-rank budget (--device-memory). Going past the budget throws
// OutOfMemory naming the request and listing what is live, by category and largest tags — the
// same failure a GPU gives, so "too big for one device" can be tested on CPUs.
// Blocks are RAII: the memory returns to the pool when the Block is destroyed or reset.
//
// Two tiers: a Pool is a rank's device memory, and host() is its host tier (a Pool of its own,
// with its own budget, --host-memory, and pinned memory on CUDA) charged to the same Ledger under
// Tier::host. Host-tier blocks are computed on by the backend's host() backend; moving data
// between the tiers is a Backend::copy, counted like any other.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/category.hpp"
#include "memory/ledger.hpp"
#include "src/backend/backend.hpp"

namespace shardlab {

class Pool;

class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(const std::string& msg, uint64_t requested_bytes, uint64_t in_use_bytes, uint64_t budget_bytes)
      : std::runtime_error(msg), requested(requested_bytes), in_use(in_use_bytes), budget(budget_bytes) {}
  uint64_t requested, in_use, budget;
};

class Block {
 public:
  Block() = default;
  Block(Block&& o) noexcept { *this = std::move(o); }
  Block& operator=(Block&& o) noexcept;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { reset(); }

  void reset();  // return the memory now
  explicit operator bool() const { return pool_ != nullptr; }
  void* data() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  Category category() const { return category_; }
  Device device() const;

  // Views of the block's memory; the shape must fit in it.
  Tensor view(DType dtype, std::initializer_list<int64_t> shape) const;
  Tensor flat(DType dtype) const;  // every whole element of dtype the block holds
  template <class T>
  std::span<T> span() const {
    return flat(dtype_of_v<T>).template span<T>();
  }

 private:
  friend class Pool;
  Pool* pool_ = nullptr;
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t id_ = 0;
  Category category_ = Category::workspace;
};

struct PoolConfig {
  uint64_t budget = 0;       // device tier, bytes; 0 = no limit
  uint64_t host_budget = 0;  // host tier, bytes; 0 = no limit
};

struct LiveBlock {
  std::string tag;
  Category category;
  uint64_t bytes;
};

class Pool {
 public:
  Pool(Backend& backend, PoolConfig cfg = {});  // the device tier, with its host tier
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  Block alloc(uint64_t bytes, Category category, std::string tag);
  Block alloc(DType dtype, int64_t count, Category category, std::string tag) {
    SHARD_CHECK(count >= 0 && static_cast<uint64_t>(count) <= (uint64_t{1} << 60) / dtype_size(dtype),
                "allocation of {} {} elements for '{}'", count, dtype_name(dtype), tag);
    return alloc(static_cast<uint64_t>(count) * dtype_size(dtype), category, std::move(tag));
  }

  // An f32 copy of t (any dtype) in a workspace block that `hold` keeps alive: how bf16/f16
  // buffers are computed with in f32.
  Tensor widen(Tensor t, Block& hold, std::string tag) {
    hold = alloc(DType::f32, t.numel(), Category::workspace, std::move(tag));
    Tensor w = hold.flat(DType::f32).slice(0, t.numel());
    backend_.cast(w, t);
    return w;
  }

  // The backend that computes on this tier's memory (the host tier's: the device backend's host()).
  Backend& backend() const { return backend_; }
  Tier tier() const { return tier_; }
  // The host tier of this rank's memory (itself for the host tier).
  Pool& host() { return tier_ == Tier::host ? *this : *host_; }
  // The rank's one ledger, for both tiers.
  Ledger& ledger() { return *ledger_; }
  const Ledger& ledger() const { return *ledger_; }
  uint64_t budget() const { return budget_; }
  // Both tiers' budgets from now on (0 = no limit): how a prediction stops at the first allocation
  // past a budget once its model states are set up (src/train/predict.hpp, predict_step_within).
  void set_budgets(PoolConfig cfg);
  uint64_t in_use() const;  // this tier
  std::vector<LiveBlock> live_blocks() const;  // largest first
  // "param_full 1.00 GiB in 3 blocks, ...; largest: 'wte' (param_full) 512.00 MiB, ..."
  std::string describe_live(size_t max_tags = 8) const;

 private:
  friend class Block;
  Pool(Backend& device_backend, uint64_t budget, Ledger& ledger);  // a host tier
  void release(Block& b);

  Backend& alloc_backend_;  // raw memory comes from here (the device backend, for both tiers)
  Backend& backend_;
  Tier tier_;
  uint64_t budget_;
  std::unique_ptr<Ledger> own_ledger_;  // the device tier owns the ledger
  Ledger* ledger_;
  std::unique_ptr<Pool> host_;
  mutable std::recursive_mutex mutex_;  // recursive: alloc() describes live blocks while holding it
  std::map<uint64_t, LiveBlock> live_;
  uint64_t next_id_ = 1;
};

}  // namespace shardlab
