// libFuzzer target: any bytes as a checkpoint manifest, then an export of that (file-less)
// checkpoint. Parsing must reject bad structure with an InputError; the export must fail cleanly
// on missing or short files before allocating anything a manifest claims.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "src/checkpoint/checkpoint_format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/tmp/shardlab_fuzz_ckpt_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    shardlab::parse_manifest(text, "fuzz");
  } catch (const shardlab::InputError&) {
    return 0;
  }
  if (std::FILE* f = std::fopen((dir + "/manifest.json").c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    shardlab::export_checkpoint(dir, dir + "/out.safetensors");
  } catch (const shardlab::InputError&) {
  }
  return 0;
}
