// The cost ledger's launches (src/backend/cost.hpp, declared in src/backend/cuda/launches.hpp)
// against what a GPU really runs: CUPTI's activity records of one GPT-2 training step on the CUDA
// backend, counted by kind, beside the ledger of the same step predicted on the meta backend.
// CUPTI sees every kernel, cuBLAS's included, and every copy, whoever launched it: it shares no
// code with the declarations.
#include <catch2/catch.hpp>
#include <cupti.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "src/comm/sim_comm.hpp"
#include "src/train/predict.hpp"
#include "src/train/trainer.hpp"

using namespace shardlab;

namespace {

#define CUPTI_OK(call)                                                                       \
  do {                                                                                       \
    const CUptiResult r_ = (call);                                                           \
    if (r_ != CUPTI_SUCCESS) {                                                               \
      const char* what_ = nullptr;                                                           \
      cuptiGetResultString(r_, &what_);                                                      \
      FAIL(#call << ": " << (what_ ? what_ : "unknown CUPTI error"));                        \
    }                                                                                        \
  } while (0)

// What the records count: our kernels (their mangled names carry the namespace), the library's,
// copies, and memsets (the ledger declares none: shardlab issues none; a library's are its own).
struct Seen {
  int64_t own = 0, library = 0, copies = 0, memsets = 0;
};
Seen g_seen;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        const bool own = k->name != nullptr && std::strstr(k->name, "shardlab") != nullptr;
        (own ? g_seen.own : g_seen.library) += 1;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: g_seen.copies += 1; break;
      case CUPTI_ACTIVITY_KIND_MEMSET: g_seen.memsets += 1; break;  // none of ours; cuBLAS may (split-K)
      default: break;
    }
  }
  std::free(buffer);
}

// Tiny GPT-2 shapes with odd sizes; f32 gradient reductions, so the sim communicator of one rank
// has nothing to stage on the device (its stand-in work is not the step's).
TrainConfig launch_config(DType param_dtype) {
  TrainConfig cfg;
  cfg.spec = model_preset("tiny");
  cfg.spec.layers = 2, cfg.spec.dim = 64, cfg.spec.heads = 4, cfg.spec.seq = 47, cfg.spec.vocab = 203;
  cfg.spec.name = "tiny+custom";
  cfg.strategy.kind = StrategyKind::ddp;
  cfg.strategy.precision.param_dtype = param_dtype;
  cfg.strategy.precision.reduce_dtype = DType::f32;
  cfg.steps = 2;
  cfg.batch = 4;
  cfg.comm = CommKind::staged;
  return cfg;
}

}  // namespace

TEST_CASE("the ledger's launches are the ones a GPU runs for a GPT-2 step (CUPTI)", "[cuda]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    const TrainConfig cfg = launch_config(dt);
    const CostLedger ledger = step_costs(cfg, 1, 0, cfg.batch, Device::cuda);
    int64_t kernels = 0, copies = 0, library = 0;
    for (const OpCost& c : ledger.ops()) {
      kernels += c.kernels;
      copies += c.copies;
      library += c.launches - c.kernels - c.copies;
    }
    auto be = make_cuda_backend(BackendConfig{});
    Pool pool(*be);
    auto comm = make_sim_communicator(0, 1, pool, sim_transport(cfg.comm));
    Trainer t(*be, pool, *comm, cfg);
    t.step(0);  // the first step: buffers, cuBLAS's set-up
    be->synchronize();
    g_seen = {};
    static bool registered = false;
    if (!std::exchange(registered, true)) CUPTI_OK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                 CUPTI_ACTIVITY_KIND_MEMSET})
      CUPTI_OK(cuptiActivityEnable(k));
    t.step(1);
    be->synchronize();
    for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                 CUPTI_ACTIVITY_KIND_MEMSET})
      CUPTI_OK(cuptiActivityDisable(k));
    CUPTI_OK(cuptiActivityFlushAll(1));
    INFO(dtype_name(dt) << ": ledger kernels " << kernels << ", copies " << copies << ", library calls " << library
                        << "; CUPTI: our kernels " << g_seen.own << ", copies " << g_seen.copies << ", memsets "
                        << g_seen.memsets << ", library kernels " << g_seen.library);
    CHECK(g_seen.own == kernels);
    CHECK(g_seen.copies == copies);
    // A cuBLAS call runs one kernel or a few (split-K adds a reduction): at least one each.
    CHECK(g_seen.library >= library);
    CHECK(g_seen.library <= 3 * library);
  }
}
