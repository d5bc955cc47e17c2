// tensor.hpp — Tensor, a non-owning view: pointer, dtype, shape (up to 4 dims), device.
// Ownership lives in memory::Block; a Tensor is cheap to copy and never frees anything.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "src/core/check.hpp"
#include "src/core/dtype.hpp"

namespace shardlab {

// meta: memory that is accounted for but never touched (the meta backend, for predictions).
enum class Device : uint8_t { cpu, cuda, meta };
inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : d == Device::cuda ? "cuda" : "meta"; }

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::cpu)
      : data_(data), dtype_(dtype), device_(device) {
    SHARD_CHECK(shape.size() <= kMaxDims, "tensor rank {} exceeds {}", shape.size(), kMaxDims);
    for (int64_t d : shape) {
      SHARD_CHECK(d >= 0, "negative dimension {}", d);
      shape_[ndim_++] = d;
    }
  }
  // A 1-D view of n elements.
  static Tensor flat(void* data, DType dtype, int64_t n, Device device = Device::cpu) {
    return Tensor(data, dtype, {n}, device);
  }
  template <class T>
  static Tensor of(std::span<T> s, Device device = Device::cpu) {
    return flat(const_cast<std::remove_const_t<T>*>(s.data()), dtype_of_v<T>, static_cast<int64_t>(s.size()), device);
  }

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  std::span<const int64_t> shape() const { return {shape_.data(), static_cast<size_t>(ndim_)}; }
  int64_t dim(int i) const {
    SHARD_CHECK(i >= 0 && i < ndim_, "dimension {} of a rank-{} tensor", i, ndim_);
    return shape_[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= shape_[i];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  template <class T>
  T* ptr() const {
    SHARD_CHECK(dtype_of_v<T> == dtype_, "tensor holds {}, accessed as {}", dtype_name(dtype_),
                dtype_name(dtype_of_v<T>));
    return static_cast<T*>(data_);
  }
  template <class T>
  std::span<T> span() const {
    SHARD_CHECK(device_ == Device::cpu, "host span of a {} tensor", device_name(device_));
    return {ptr<T>(), static_cast<size_t>(numel())};
  }
  // Elements [offset, offset + n) as a 1-D view.
  Tensor slice(int64_t offset, int64_t n) const {
    SHARD_CHECK(offset >= 0 && n >= 0 && offset + n <= numel(), "slice [{}, {}) of {} elements", offset,
                offset + n, numel());
    return flat(static_cast<char*>(data_) + offset * static_cast<int64_t>(dtype_size(dtype_)), dtype_, n, device_);
  }
  // The same elements under another shape (numel must match).
  Tensor reshape(std::span<const int64_t> shape) const {
    SHARD_CHECK(shape.size() <= kMaxDims, "tensor rank {} exceeds {}", shape.size(), kMaxDims);
    Tensor t = *this;
    t.ndim_ = 0;
    for (int64_t d : shape) t.shape_[t.ndim_++] = d;
    SHARD_CHECK(t.numel() == numel(), "reshape {} to {}: element counts differ", shape_str(), t.shape_str());
    return t;
  }
  std::string shape_str() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
};

// "(2, 3, 4)": the one way shapes are written in messages.
inline std::string shape_str(std::span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

inline std::string Tensor::shape_str() const { return shardlab::shape_str(shape()); }

}  // namespace shardlab
