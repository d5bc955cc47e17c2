// cuda_unavailable.cpp — linked instead of the CUDA backend (cuda_*.cpp, kernels.cu) when CMake found no CUDA toolkit
// (or SHARDLAB_CUDA=OFF), so shared code asks at run time and never needs an #ifdef.
#include "src/backend/backend.hpp"
#include "src/backend/ops/cudnn_attention.hpp"

namespace shardlab {

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
bool cudnn_attention_built() { return false; }

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig&) {
  throw InputError("--device cuda: this shardlab was built without CUDA (configure with SHARDLAB_CUDA=ON and a CUDA toolkit)");
}

}  // namespace shardlab
