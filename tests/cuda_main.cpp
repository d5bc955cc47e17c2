// cuda_main.cpp — Catch2 runner for the [cuda] tests. Without a CUDA device (or without a CUDA
// build) it says so and exits 77, which ctest reports as "Skipped": visible, not a silent pass.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "src/backend/backend.hpp"

int main(int argc, char** argv) {
  if (shardlab::cuda_device_count() == 0) {
    std::printf("SKIPPED: [cuda] tests not run: %s\n",
                shardlab::cuda_compiled() ? "no CUDA device is visible" : "shardlab was built without CUDA");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
