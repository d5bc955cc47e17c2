#include "src/model/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "src/core/check.hpp"
#include "src/core/tensor.hpp"

namespace shardlab {
namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MiB of JSON is far past any real model

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

// Bytes per element of every dtype the format defines; 0 for an unknown name.
size_t element_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "BOOL" || dt == "U8" || dt == "I8" || dt == "F8_E4M3" || dt == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::shape_str() const { return shardlab::shape_str(shape); }

namespace {

// One tensor's header entry, checked against the data section's size (nothing is read or
// allocated from the sizes it claims).
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                             uint64_t data_size) {
  SHARD_REQUIRE(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
                "'{}' has a bad header: tensor '{}' lacks dtype, shape or data_offsets", path, name);
  SafetensorsEntry e;
  e.name = name;
  std::string dt = v["dtype"].is_string() ? v["dtype"].get<std::string>() : "";
  e.dtype_name = dt;
  size_t elem_size = element_size(dt);
  SHARD_REQUIRE(elem_size > 0, "'{}' has a bad header: tensor '{}' has unknown dtype '{}'", path, name, dt);
  e.readable = dt == "F32" || dt == "BF16" || dt == "F16";
  if (dt == "BF16") e.dtype = DType::bf16;
  if (dt == "F16") e.dtype = DType::f16;
  SHARD_REQUIRE(v["shape"].is_array() && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                "'{}' has a bad header: tensor '{}' has a malformed shape or data_offsets", path, name);
  uint64_t elems = 1;
  for (const auto& d : v["shape"]) {
    SHARD_REQUIRE(d.is_number_unsigned(), "'{}' has a bad header: tensor '{}' has a non-integer dimension", path, name);
    uint64_t dim = d.get<uint64_t>();
    SHARD_REQUIRE(dim == 0 || elems <= data_size / dim, "'{}': tensor '{}' is larger than the file", path, name);
    elems *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  const auto& off = v["data_offsets"];
  SHARD_REQUIRE(off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                "'{}' has a bad header: tensor '{}' has non-integer data_offsets", path, name);
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  SHARD_REQUIRE(e.begin <= e.end && e.end <= data_size,
                "'{}' is truncated or corrupt: tensor '{}' spans bytes [{}, {}) of a {}-byte data section", path,
                name, e.begin, e.end, data_size);
  SHARD_REQUIRE(e.end - e.begin == elems * elem_size,
                "'{}': tensor '{}' {} {} needs {} bytes but its offsets give {}", path, name, dt, e.shape_str(),
                elems * elem_size, e.end - e.begin);
  return e;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  SHARD_REQUIRE(!ec, "cannot open safetensors file '{}': {}", path, ec.message());
  file_.open(path, std::ios::binary);
  SHARD_REQUIRE(file_.good(), "cannot open safetensors file '{}'", path);
  SHARD_REQUIRE(size >= 8, "'{}' is truncated: {} bytes, too short for a safetensors header", path, size);
  unsigned char len_bytes[8];
  file_.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  SHARD_REQUIRE(header_len <= kMaxHeader && header_len <= size - 8,
                "'{}' has a bad header: it claims {} bytes of JSON but the file holds {} bytes", path, header_len,
                size);
  std::string header(header_len, '\0');
  file_.read(header.data(), static_cast<std::streamsize>(header_len));
  SHARD_REQUIRE(file_.good(), "'{}': cannot read its {}-byte header", path, header_len);
  data_start_ = 8 + header_len;
  const uint64_t data_size = size - data_start_;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}' has a bad header: not valid JSON ({})", path, e.what()));
  }
  SHARD_REQUIRE(j.is_object(), "'{}' has a bad header: expected a JSON object", path);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      SHARD_REQUIRE(v.is_object(), "'{}': __metadata__ must be an object of strings", path);
      for (auto m = v.begin(); m != v.end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    entries_.emplace(name, parse_entry(path, name, v, data_size));
  }
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  SHARD_REQUIRE(it != entries_.end(), "'{}' has no tensor '{}'", path_, name);
  return it->second;
}

void SafetensorsReader::read_f32(const std::string& name, std::span<float> out,
                                 const std::vector<int64_t>* expect_shape) {
  const SafetensorsEntry& e = entry(name);
  SHARD_REQUIRE(e.readable, "'{}': tensor '{}' is {}; shardlab reads F32, BF16 and F16", path_, name, e.dtype_name);
  if (expect_shape) {
    SHARD_REQUIRE(e.shape == *expect_shape, "'{}': tensor '{}' has shape {}, the model expects {}", path_, name,
                  e.shape_str(), SafetensorsEntry{name, "", true, e.dtype, *expect_shape, 0, 0}.shape_str());
  }
  SHARD_CHECK(static_cast<int64_t>(out.size()) == e.numel(), "read_f32 '{}': {} elements into a span of {}", name,
              e.numel(), out.size());
  std::vector<char> raw(e.end - e.begin);
  file_.clear();
  file_.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  file_.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  SHARD_REQUIRE(file_.good(), "'{}': cannot read tensor '{}' ({} bytes)", path_, name, raw.size());
  convert(raw.data(), e.dtype, out.data(), DType::f32, out.size());
  // Weights that are NaN or infinite would train to NaN (blamed on the learning rate) or sample
  // nonsense: refused here, naming the tensor.
  const auto bad = std::find_if(out.begin(), out.end(), [](float v) { return !std::isfinite(v); });
  if (bad != out.end()) {
    const auto count = std::count_if(bad, out.end(), [](float v) { return !std::isfinite(v); });
    throw InputError(fmt::format("'{}': tensor '{}' holds {} non-finite value{} (the first, {}, at element {} of {}): "
                                 "a model with NaN or infinite weights cannot be trained or sampled", path_, name,
                                 count, count == 1 ? "" : "s", *bad, bad - out.begin(), out.size()));
  }
}

SafetensorsStreamWriter::SafetensorsStreamWriter(const std::string& path, std::vector<Entry> entries,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path + ".tmp"), entries_(std::move(entries)) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    uint64_t bytes = n * dtype_size(e.dtype);
    header[e.name] = {{"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  errno = 0;
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  SHARD_REQUIRE(out_.good(), "cannot write '{}': {}", tmp_, errno ? std::strerror(errno) : "unknown reason");
  uint64_t len = h.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  out_.write(reinterpret_cast<const char*>(len_bytes), 8);
  out_.write(h.data(), static_cast<std::streamsize>(h.size()));
  check_written();
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (done_) return;
  out_.close();
  std::error_code ec;
  std::filesystem::remove(tmp_, ec);
}

// The stream's failure with the system's reason: write(2)'s errno survives in the stream's buffer
// flush (ENOSPC, EFBIG past ulimit -f with SIGXFSZ ignored, EIO).
void SafetensorsStreamWriter::check_written() {
  if (out_.good()) return;
  const int err = errno;
  throw InputError(fmt::format("writing '{}' failed: {}", tmp_, err ? std::strerror(err) : "an I/O error"));
}

void SafetensorsStreamWriter::write_next(std::span<const float> values) {
  SHARD_CHECK(next_ < entries_.size(), "safetensors writer: {} tensors declared, writing one more", entries_.size());
  const Entry& e = entries_[next_++];
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  SHARD_CHECK(static_cast<int64_t>(values.size()) == n, "tensor '{}': {} values for {} elements", e.name,
              values.size(), n);
  std::vector<char> buf(values.size() * dtype_size(e.dtype));
  convert(values.data(), DType::f32, buf.data(), e.dtype, values.size());
  errno = 0;
  out_.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  check_written();
}

void SafetensorsStreamWriter::finish() {
  SHARD_CHECK(next_ == entries_.size(), "safetensors writer: {} of {} tensors written", next_, entries_.size());
  errno = 0;
  out_.flush();
  check_written();
  out_.close();
  check_written();
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  SHARD_REQUIRE(!ec, "cannot rename '{}' to '{}': {}", tmp_, path_, ec.message());
  done_ = true;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsStreamWriter::Entry> entries;
  for (const auto& t : tensors) entries.push_back({t.name, t.dtype, t.shape});
  SafetensorsStreamWriter w(path, std::move(entries), metadata);
  for (const auto& t : tensors) w.write_next(t.data);
  w.finish();
}

}  // namespace shardlab
