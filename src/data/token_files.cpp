// token_files.cpp — token streams over parts, llm.c shards mapped in place, and --data's lists and
// patterns.
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "src/data/source.hpp"
#include "src/core/check.hpp"
#include "src/core/hash.hpp"
#include "src/data/data.hpp"
#include "src/data/mapped_files.hpp"

namespace shardlab {

// ---- TokenStream ---------------------------------------------------------------------------------

TokenStream::TokenStream(std::vector<int32_t> tokens, std::string source_name) : source(std::move(source_name)) {
  auto held = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  append({held, held->data(), 4, static_cast<int64_t>(held->size())});
}

void TokenStream::append(TokenPart part) {
  SHARD_CHECK(begin_ == 0 && end_ == total_, "appending to a slice of a token stream");
  SHARD_CHECK(part.width == 2 || part.width == 4, "token width {}", part.width);
  if (part.count == 0) return;
  starts_.push_back(total_);
  total_ += part.count;
  end_ = total_;
  parts_.push_back(std::move(part));
}

std::pair<int64_t, int64_t> TokenStream::in_slice(size_t i) const {
  return {std::max<int64_t>(begin_ - starts_[i], 0), std::min(parts_[i].count, end_ - starts_[i])};
}

void TokenStream::append_stream(const TokenStream& other) {
  for (size_t i = 0; i < other.parts_.size(); ++i) {
    const TokenPart& p = other.parts_[i];
    const auto [lo, hi] = other.in_slice(i);
    if (lo >= hi) continue;
    append({p.keep, static_cast<const char*>(p.data) + lo * p.width, p.width, hi - lo, p.mapped});
  }
}

void TokenStream::read(int64_t pos, int64_t count, int32_t* out) const {
  SHARD_CHECK(pos >= 0 && count >= 0 && pos + count <= size(), "reading tokens [{}, {}) of a stream of {}", pos,
              pos + count, size());
  int64_t at = begin_ + pos;
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin()) - 1;
  while (count > 0) {
    const TokenPart& p = parts_[i];
    const int64_t off = at - starts_[i], n = std::min(count, p.count - off);
    if (p.width == 4) {
      std::memcpy(out, static_cast<const int32_t*>(p.data) + off, static_cast<size_t>(n) * sizeof(int32_t));
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(p.data) + off;
      for (int64_t k = 0; k < n; ++k) out[k] = src[k];
    }
    out += n, at += n, count -= n, ++i;
  }
}

std::vector<int32_t> TokenStream::to_vector() const {
  std::vector<int32_t> v(static_cast<size_t>(size()));
  read(0, size(), v.data());
  return v;
}

int64_t TokenStream::first_outside(int64_t vocab, uint32_t* value) const {
  const uint64_t limit = static_cast<uint64_t>(std::max<int64_t>(vocab, 0));
  for (size_t i = 0; i < parts_.size(); ++i) {
    const TokenPart& p = parts_[i];
    const auto [lo, hi] = in_slice(i);
    for (int64_t k = lo; k < hi; ++k) {
      // A held int32 token below zero reads as a uint32 past any vocabulary.
      const uint32_t t = p.width == 2 ? static_cast<const uint16_t*>(p.data)[k] : static_cast<const uint32_t*>(p.data)[k];
      if (t >= limit) return *value = t, starts_[i] + k - begin_;
    }
  }
  return -1;
}

TokenStream TokenStream::slice(int64_t begin, int64_t end, std::string source_name) const {
  SHARD_CHECK(0 <= begin && begin <= end && end <= size(), "slice [{}, {}) of a stream of {}", begin, end, size());
  TokenStream s = *this;
  s.begin_ = begin_ + begin;
  s.end_ = begin_ + end;
  s.source = std::move(source_name);
  return s;
}

int TokenStream::mapped_parts() const {
  int n = 0;
  for (size_t i = 0; i < parts_.size(); ++i) n += parts_[i].mapped && in_slice(i).first < in_slice(i).second;
  return n;
}

// ---- Files ---------------------------------------------------------------------------------------

namespace {

const char* file_kind(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISFIFO(m) ? "a pipe" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

// A read-only mapping of a whole file, unmapped with its last owner.
struct Mapping {
  void* base = MAP_FAILED;
  size_t length = 0;
  ~Mapping() {
    if (base == MAP_FAILED) return;
    unwatch_mapping(base);
    munmap(base, length);
  }
};

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

constexpr int32_t kMagic16 = 20240520, kVersion16 = 1;  // llm.c's "gpt-2" header: uint16 tokens
constexpr int32_t kMagic32 = 20240801, kVersion32 = 7;  // llm.c's "llama-3" header: uint32 tokens

bool has_pattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> split_list(const std::string& what) {
  std::vector<std::string> items;
  size_t from = 0;
  while (true) {
    const size_t comma = what.find(',', from);
    items.push_back(what.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) return items;
    from = comma + 1;
  }
}

bool ends_with_bin(const std::string& p) { return p.size() >= 4 && p.compare(p.size() - 4, 4, ".bin") == 0; }

}  // namespace

namespace {
void require_regular(const std::string& path, const struct stat& st) {
  SHARD_REQUIRE(S_ISREG(st.st_mode), "data file '{}' is {}: --data and --val-data take regular files (llm.c .bin "
                "shards or text)", path, file_kind(st.st_mode));
}
}  // namespace

void require_regular_file(const std::string& path) {
  struct stat st {};
  SHARD_REQUIRE(stat(path.c_str(), &st) == 0, "cannot open data file '{}': {}", path, std::strerror(errno));
  require_regular(path, st);
}

TokenStream load_llmc_bin(const std::string& path) {
  // O_NONBLOCK: opening a pipe to read would wait for a writer; the fstat below refuses it instead.
  Fd f{open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  SHARD_REQUIRE(f.fd >= 0, "cannot open token file '{}': {}", path, std::strerror(errno));
  struct stat st {};
  SHARD_REQUIRE(fstat(f.fd, &st) == 0, "cannot read token file '{}': {}", path, std::strerror(errno));
  require_regular(path, st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  SHARD_REQUIRE(size >= 1024, "'{}' is too short for an llm.c token file header (1024 bytes)", path);
  auto map = std::make_shared<Mapping>();
  map->length = static_cast<size_t>(size);
  map->base = mmap(nullptr, map->length, PROT_READ, MAP_SHARED, f.fd, 0);
  SHARD_REQUIRE(map->base != MAP_FAILED, "cannot map token file '{}' ({} bytes): {}", path, size, std::strerror(errno));
  watch_mapping(path, map->base, map->length);
  int32_t header[256];
  std::memcpy(header, map->base, sizeof(header));
  const int32_t magic = header[0], version = header[1];
  SHARD_REQUIRE(magic == kMagic16 || magic == kMagic32, "'{}' is not an llm.c token file: magic {} (expected {}), nor "
                "{} (the uint32 form)", path, magic, kMagic16, kMagic32);
  const bool wide = magic == kMagic32;
  SHARD_REQUIRE(version == (wide ? kVersion32 : kVersion16), "'{}': llm.c token file version {} with magic {} "
                "(shardlab reads magic {} version {}: uint16 tokens, and magic {} version {}: uint32 tokens)", path,
                version, magic, kMagic16, kVersion16, kMagic32, kVersion32);
  const int64_t count = header[2];
  const uint64_t width = wide ? 4 : 2;
  SHARD_REQUIRE(count >= 0 && 1024 + width * static_cast<uint64_t>(count) <= size,
                "'{}' is truncated: header promises {} tokens, the file holds {}", path, count, (size - 1024) / width);
  // A file longer than its header says is not what was written (llm.c's loader refuses it too).
  SHARD_REQUIRE(1024 + width * static_cast<uint64_t>(count) == size,
                "'{}' holds {} bytes past the {} tokens its header promises ({} bytes of {}-byte tokens after the "
                "1024-byte header, the file {} bytes): a token file whose size disagrees with its header is refused "
                "(rewrite the header's count, or the file)", path, size - 1024 - width * static_cast<uint64_t>(count),
                count, width * static_cast<uint64_t>(count), width, size);
  TokenStream s;
  s.source = path;
  s.append({map, static_cast<const char*>(map->base) + 1024, static_cast<int>(width), count, true});
  return s;
}

std::vector<std::string> data_paths(const std::string& what) {
  if (what == "synthetic") return {};
  std::error_code ec;
  if (std::filesystem::exists(what, ec)) return {what};  // one file, whatever its name holds
  std::vector<std::string> paths;
  for (const std::string& item : split_list(what)) {
    SHARD_REQUIRE(!item.empty(), "--data '{}': an empty item in the list (files are separated by single commas)", what);
    SHARD_REQUIRE(item != "synthetic", "--data '{}': 'synthetic' is a source of its own, not a file of a list", what);
    if (!has_pattern(item)) {
      paths.push_back(item);
      continue;
    }
    glob_t g{};
    const int rc = glob(item.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
    globfree(&g);
    SHARD_REQUIRE(rc == 0 && !matches.empty(), "--data pattern '{}' matches no file", item);
    std::sort(matches.begin(), matches.end());
    paths.insert(paths.end(), matches.begin(), matches.end());
  }
  const size_t bins = static_cast<size_t>(std::count_if(paths.begin(), paths.end(), ends_with_bin));
  SHARD_REQUIRE(bins == 0 || bins == paths.size(), "--data '{}' mixes llm.c .bin shards and text files ('{}' and '{}'): "
                "one stream is all shards or all text", what,
                *std::find_if(paths.begin(), paths.end(), ends_with_bin),
                *std::find_if_not(paths.begin(), paths.end(), ends_with_bin));
  return paths;
}

std::vector<std::pair<std::string, std::string>> data_inputs(const std::string& data, const std::string& val_data) {
  std::vector<std::pair<std::string, std::string>> named;
  for (const std::string& p : data_paths(data)) named.emplace_back("--data", p);
  if (!val_data.empty())
    for (const std::string& p : data_paths(val_data)) named.emplace_back("--val-data", p);
  return named;
}

bool is_text_source(const std::string& what) {
  if (what == "synthetic") return false;
  std::error_code ec;
  return !ends_with_bin(std::filesystem::exists(what, ec) ? what : split_list(what).front());
}

namespace {
DataSource describe_file(const std::string& path) {
  require_regular_file(path);
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  SHARD_REQUIRE(!ec, "cannot read data file '{}': {}", path, ec.message());
  std::ifstream f(path, std::ios::binary);
  SHARD_REQUIRE(f.good(), "cannot open data file '{}'", path);
  constexpr uint64_t kMiB = 1 << 20;
  std::string head(static_cast<size_t>(std::min(size, kMiB)), '\0');
  std::string tail(static_cast<size_t>(size > kMiB ? std::min(size - kMiB, kMiB) : 0), '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  f.seekg(static_cast<std::streamoff>(size - tail.size()));
  f.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  SHARD_REQUIRE(f.good(), "reading data file '{}' failed", path);
  const std::string size_text = std::to_string(size);
  const uint64_t h = fnv1a64(tail, fnv1a64(head, fnv1a64(size_text)));
  return {path, size, fnv1a64_text(h), {}};
}
}  // namespace

DataSource describe_source(const std::string& what) {
  if (what == "synthetic") return {what, 0, "", {}};
  const std::vector<std::string> paths = data_paths(what);
  if (paths.size() == 1 && paths[0] == what) return describe_file(what);  // as checkpoints have always recorded it
  DataSource all{what, 0, "", {}};
  uint64_t h = fnv1a64(std::to_string(paths.size()));
  for (const std::string& p : paths) {
    const DataSource one = describe_file(p);
    all.bytes += one.bytes;
    h = fnv1a64(one.hash, h);
    all.files.push_back({one.path, one.bytes, one.hash});
  }
  all.hash = fnv1a64_text(h);
  return all;
}

}  // namespace shardlab
