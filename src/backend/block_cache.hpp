// block_cache.hpp — freed raw blocks kept by size and handed out again, up to a byte limit.
//
// A training step frees and reallocates the same sizes every step; fresh host pages cost page
// faults (the CPU backend) and pinned ones milliseconds of cudaMallocHost (the CUDA backend's host
// tier). Both keep their freed blocks here. The pool's ledger counts live blocks only.
#pragma once
#include <algorithm>
#include <cstddef>
#include <unordered_map>
#include <vector>

namespace shardlab {

class BlockCache {
 public:
  BlockCache(size_t align, size_t limit) : align_(align), limit_(limit) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // The size blocks of `bytes` are allocated at (and cached under): a multiple of the alignment.
  size_t round(size_t bytes) const { return std::max(align_, (bytes + align_ - 1) / align_ * align_); }
  // A cached block of `rounded` bytes, or nullptr.
  void* take(size_t rounded) {
    auto it = blocks_.find(rounded);
    if (it == blocks_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    return p;
  }
  // Keeps p (of `rounded` bytes) for reuse; false when the cache is full and the caller frees it.
  bool keep(void* p, size_t rounded) {
    if (cached_ + rounded > limit_) return false;
    blocks_[rounded].push_back(p);
    cached_ += rounded;
    return true;
  }
  // Hands every cached block to `free_block` (on destruction of the owner).
  template <class Free>
  void release_all(Free free_block) {
    for (auto& [size, list] : blocks_)
      for (void* p : list) free_block(p);
    blocks_.clear();
    cached_ = 0;
  }

 private:
  size_t align_, limit_;
  std::unordered_map<size_t, std::vector<void*>> blocks_;  // rounded size -> free blocks
  size_t cached_ = 0;
};

}  // namespace shardlab
