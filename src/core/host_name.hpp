// host_name.hpp — this machine's host name (gethostname), "?" where it cannot be read.
#pragma once
#include <unistd.h>

#include <string>

namespace shardlab {

inline std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

}  // namespace shardlab
