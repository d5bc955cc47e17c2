// safetensors.hpp — read and write the safetensors format (an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets}}, then the raw data), f32, bf16 and f16.
//
// The reader validates everything a header claims before trusting it — header length against the
// file size, offsets inside the data section, byte counts against dtype × shape — and reads one
// tensor at a time, so a file larger than memory can be streamed.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "src/core/dtype.hpp"

namespace shardlab {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;        // as in the file: F32, BF16, F16 (readable); I64, BOOL, ... (skipped)
  bool readable = false;         // one of the three dtypes shardlab converts
  DType dtype = DType::f32;      // when readable
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
  int64_t numel() const;
  std::string shape_str() const;
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // throws InputError naming the file
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // InputError if absent
  // Reads a tensor converted to f32; checks its shape against `expect_shape` when given.
  void read_f32(const std::string& name, std::span<float> out, const std::vector<int64_t>* expect_shape = nullptr);

 private:
  std::string path_;
  std::ifstream file_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsTensor {
  std::string name;
  DType dtype;                   // stored dtype
  std::vector<int64_t> shape;
  std::span<const float> data;   // f32 values, converted to dtype on write
};

// Writes tensors one at a time, so a file larger than memory can be produced holding one tensor:
// the header (names, dtypes, shapes) goes first, then each tensor's values in the same order.
// Writes to path + ".tmp" and renames on finish(), so a reader never sees a half-written file.
class SafetensorsStreamWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsStreamWriter(const std::string& path, std::vector<Entry> entries,
                          const std::map<std::string, std::string>& metadata = {});
  // A writer destroyed before finish() (a failure, here or in the caller) removes its temporary.
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;
  // The next entry's values, converted to its dtype. A failed write is an InputError naming the
  // file and the system's reason (no space left, file too large, ...).
  void write_next(std::span<const float> values);
  void finish();

 private:
  void check_written();
  std::string path_, tmp_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  bool done_ = false;
  std::ofstream out_;
};

// Writes to path + ".tmp" and renames, so a reader never sees a half-written file.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace shardlab
