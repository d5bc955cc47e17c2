// source.hpp — a token source as a checkpoint records it (data.hpp's describe_source makes one):
// enough to tell, cheaply, whether a resumed run reads the same tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlab {

// One file of a source: its path as expanded, size and hash (DataSource's for one file).
struct DataFile {
  std::string path;
  uint64_t bytes = 0;
  std::string hash;
  bool operator==(const DataFile&) const = default;
};

struct DataSource {
  std::string path;   // "synthetic", or the path as given
  uint64_t bytes = 0;  // the file's size (0 for synthetic)
  std::string hash;   // "fnv1a64:<hex>" of the size and the first and last MiB; "" for synthetic
  // A list or pattern's files in stream order, each described alone (empty for one file, synthetic,
  // and checkpoints written before they were recorded): what tells a source that grew.
  std::vector<DataFile> files;
  bool same_tokens(const DataSource& o) const {
    return path == "synthetic" ? o.path == "synthetic" : o.path != "synthetic" && bytes == o.bytes && hash == o.hash;
  }
  // This source is `was` with files added after its own, which are unchanged and first.
  bool grown_from(const DataSource& was) const {
    if (was.files.empty() || files.size() <= was.files.size()) return false;
    for (size_t i = 0; i < was.files.size(); ++i)
      if (!(files[i] == was.files[i])) return false;
    return true;
  }
};

}  // namespace shardlab
