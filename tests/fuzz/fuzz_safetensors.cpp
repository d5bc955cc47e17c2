// libFuzzer target: any bytes as a safetensors file. The reader must reject what it cannot use with
// an InputError — never crash, never allocate what a header merely claims.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/shardlab_fuzz_" + std::to_string(getpid()) + ".safetensors";
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    shardlab::SafetensorsReader r(path);
    for (const auto& [name, e] : r.entries()) {
      if (!e.readable) continue;
      std::vector<float> v(static_cast<size_t>(e.numel()));  // bounded: the reader checked it against the file
      r.read_f32(name, v, &e.shape);
    }
  } catch (const shardlab::InputError&) {
  }
  return 0;
}
