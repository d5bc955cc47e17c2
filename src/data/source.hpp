// source.hpp — a token source as a checkpoint records it (data.hpp's describe_source makes one):
// enough to tell, cheaply, whether a resumed run reads the same tokens.
#pragma once
#include <cstdint>
#include <string>

namespace shardlab {

struct DataSource {
  std::string path;   // "synthetic", or the path as given
  uint64_t bytes = 0;  // the file's size (0 for synthetic)
  std::string hash;   // "fnv1a64:<hex>" of the size and the first and last MiB; "" for synthetic
  bool same_tokens(const DataSource& o) const {
    return path == "synthetic" ? o.path == "synthetic" : o.path != "synthetic" && bytes == o.bytes && hash == o.hash;
  }
};

}  // namespace shardlab
