// attention_bench.cpp — `shardlab bench-attention` (attention_bench.hpp).
#include "benchmarks/attention_bench.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "memory/pool.hpp"
#include "src/backend/ops/attention.hpp"
#include "src/backend/ops/cudnn_attention.hpp"
#include "src/backend/ops/flash_attention.hpp"
#include "src/core/rng.hpp"
#include "src/core/units.hpp"

namespace shardlab {
namespace {

// Peak resident set of this process so far (getrusage: KiB on Linux).
uint64_t peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

struct Timing {
  double fwd_ms = 0, bwd_ms = 0;
  uint64_t bytes = 0;  // what the pass holds
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Timing time_point(Backend& be, const AttentionBenchConfig& cfg, AttentionKernel kernel, int64_t T, int64_t H,
                  int64_t hd) {
  Pool pool(be);
  const int64_t KV = H / cfg.group, R = (H + 2 * KV) * hd, C = H * hd;
  auto alloc = [&](int64_t n, const char* name) { return pool.alloc(DType::f32, n, Category::activations, name); };
  Block qkv = alloc(T * R, "qkv"), dqkv = alloc(T * R, "dqkv"), out = alloc(T * C, "out"), dout = alloc(T * C, "dout");
  Block lse, fwd_ws, bwd_ws, att, scratch;
  if (kernel == AttentionKernel::flash) {
    lse = alloc(H * T, "lse");
    fwd_ws = alloc(flash_attention_workspace_elems(1, T, H, KV, hd, false), "forward tiles");
    bwd_ws = alloc(flash_attention_workspace_elems(1, T, H, KV, hd, true), "backward tiles");
  } else if (kernel == AttentionKernel::cudnn) {
    lse = alloc(H * T, "lse");
    fwd_ws = alloc(cudnn_attention_workspace_elems(1, T, H, KV, hd, false), "forward bf16 operands");
    bwd_ws = alloc(cudnn_attention_workspace_elems(1, T, H, KV, hd, true), "backward bf16 operands");
  } else {
    att = alloc(H * T * T, "att");
    scratch = alloc(attention_scratch_elems(T, H), "scratch");
  }
  if (be.device() != Device::cpu) {  // constant inputs on a device: the timing does not depend on the values
    be.fill(qkv.flat(DType::f32), 0.01f);
    be.fill(dout.flat(DType::f32), 0.01f);
  } else {  // random inputs
    for (Block* b : {&qkv, &dout}) {
      const Rng rng(7, b == &qkv ? "qkv" : "dout");
      Tensor t = b->flat(DType::f32);
      float* p = t.ptr<float>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(static_cast<uint64_t>(i)) * 2.f - 1.f;
    }
  }
  const std::vector<int64_t> qkv_shape{1, T, R}, att_shape{1, H, T, T};
  Tensor tq = qkv.flat(DType::f32).reshape(qkv_shape), to = out.flat(DType::f32), tdo = dout.flat(DType::f32);
  Tensor tdq = dqkv.flat(DType::f32);
  Timing best{1e30, 1e30, pool.ledger().current_total()};
  for (int rep = 0; rep < cfg.warmup + cfg.repeats; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    if (kernel == AttentionKernel::flash)
      ops::flash_attention_forward(be, to, lse.flat(DType::f32), tq, H, KV, cfg.causal, fwd_ws.flat(DType::f32));
    else if (kernel == AttentionKernel::cudnn)
      ops::cudnn_attention_forward(be, to, lse.flat(DType::f32), tq, H, KV, fwd_ws.flat(DType::f32));
    else
      ops::attention_forward(be, to, att.flat(DType::f32).reshape(att_shape), tq, H, KV);
    be.synchronize();
    const double f = seconds_since(t0) * 1e3;
    t0 = std::chrono::steady_clock::now();
    if (kernel == AttentionKernel::flash)
      ops::flash_attention_backward(be, tdq, tdo, tq, to, lse.flat(DType::f32), H, KV, cfg.causal,
                                    bwd_ws.flat(DType::f32));
    else if (kernel == AttentionKernel::cudnn)
      ops::cudnn_attention_backward(be, tdq, tdo, tq, to, lse.flat(DType::f32), H, KV, bwd_ws.flat(DType::f32));
    else
      ops::attention_backward(be, tdq, tdo, tq, att.flat(DType::f32).reshape(att_shape), H, KV,
                              scratch.flat(DType::f32));
    be.synchronize();
    const double b = seconds_since(t0) * 1e3;
    if (rep >= cfg.warmup) best.fwd_ms = std::min(best.fwd_ms, f), best.bwd_ms = std::min(best.bwd_ms, b);
  }
  return best;
}

}  // namespace

void run_attention_benchmark(Backend& be, const AttentionBenchConfig& cfg, std::FILE* out) {
  const uint64_t rss0 = peak_rss();
  const std::string heads = cfg.group == 1 ? "multi-head" : fmt::format("{} query heads per K/V head", cfg.group);
  std::fprintf(out, "# attention forward + backward, batch 1, %s, f32, %s, %s, %d thread(s); best of %d after %d "
                    "warm-up\n", heads.c_str(), cfg.causal ? "causal" : "not causal", be.describe().c_str(),
               be.threads(), cfg.repeats, cfg.warmup);
  std::fprintf(out, "#%7s %6s %5s %-6s %10s %10s %10s %9s %12s\n", "T", "heads", "hd", "kernel", "fwd ms", "bwd ms",
               "total ms", "GFLOP/s", "holds");
  for (int64_t T : cfg.seqs)
    for (int64_t H : cfg.heads)
      for (int64_t hd : cfg.head_dims)
        for (AttentionKernel k : cfg.kernels) {
          if (k == AttentionKernel::naive && 2 * H * T * T * 4 > cfg.naive_max_bytes) {
            std::fprintf(out, " %7lld %6lld %5lld %-6s %10s (2 x (H, T, T) f32 = %s: over --naive-max)\n",
                         static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(hd), "naive", "-",
                         format_bytes(static_cast<double>(2 * H * T * T * 4)).c_str());
            continue;
          }
          const Timing t = time_point(be, cfg, k, T, H, hd);
          // Matrix products' FLOPs: forward QKᵀ and PV, backward five of the same size; causal halves them.
          const double fwd_flops = 4.0 * double(T) * double(T) * double(hd) * double(H) * (cfg.causal ? 0.5 : 1.0);
          const double gflops = fwd_flops * 3.5 / ((t.fwd_ms + t.bwd_ms) * 1e-3) / 1e9;
          std::fprintf(out, " %7lld %6lld %5lld %-6s %10.2f %10.2f %10.2f %9.1f %12s\n", static_cast<long long>(T),
                       static_cast<long long>(H), static_cast<long long>(hd), attention_kernel_name(k), t.fwd_ms,
                       t.bwd_ms, t.fwd_ms + t.bwd_ms, gflops, format_bytes(static_cast<double>(t.bytes)).c_str());
          std::fflush(out);
        }
  std::fprintf(out, "# peak resident growth %s (meaningful for one point per process)\n",
               format_bytes(static_cast<double>(peak_rss() - rss0)).c_str());
  std::fprintf(out, "# result peak_rss_growth_bytes=%llu\n", static_cast<unsigned long long>(peak_rss() - rss0));
}

}  // namespace shardlab
