#include "src/train/sgemm_ceiling.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <fmt/format.h>
#include <functional>
#include <vector>

#include "src/backend/cpu/gemm.hpp"
#include "src/comm/communicator.hpp"
#include "src/model/family.hpp"
#include "src/train/predict.hpp"
#include "src/train/trainer.hpp"

namespace shardlab {
namespace {

struct Product {
  std::string what;
  Trans ta = Trans::N, tb = Trans::N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float beta = 0.f;
  int64_t calls = 0;  // per training step; 0 = not one of the step's products (the grid)
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
  std::string op() const { return {ta == Trans::N ? 'N' : 'T', tb == Trans::N ? 'N' : 'T'}; }
};

Product product(std::string what, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                int64_t ldc, float beta, int64_t calls) {
  return Product{std::move(what), ta, tb, m, n, k, lda, ldb, ldc, beta, calls};
}

// The four layer shapes under all four transpose combinations, leading dimensions packed.
std::vector<Product> grid_products(int64_t C, int64_t BT) {
  struct Shape {
    const char* what;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{"qkv (BT,C)x(C,3C)", BT, 3 * C, C},
                          {"fc (BT,C)x(C,4C)", BT, 4 * C, C},
                          {"proj (BT,4C)x(4C,C)", BT, C, 4 * C},
                          {"fc dW (C,BT)x(BT,4C)", C, 4 * C, BT}};
  std::vector<Product> out;
  for (const Shape& s : shapes)
    for (int t = 0; t < 4; ++t) {
      const Trans ta = (t & 2) ? Trans::T : Trans::N, tb = (t & 1) ? Trans::T : Trans::N;
      out.push_back(product(s.what, ta, tb, s.m, s.n, s.k, ta == Trans::N ? s.k : s.m, tb == Trans::N ? s.n : s.k,
                            s.n, 0.f, 0));
    }
  return out;
}

// The recorded products, one row per distinct product with how often the step issued it.
std::vector<Product> recorded_products(const std::vector<GemmDesc>& recorded) {
  std::vector<Product> out;
  for (const GemmDesc& d : recorded) {
    Product p = product("", d.trans_a, d.trans_b, d.m, d.n, d.k, d.lda, d.ldb, d.ldc, d.beta, d.batch);
    auto same = [&p](const Product& q) {
      return q.ta == p.ta && q.tb == p.tb && q.m == p.m && q.n == p.n && q.k == p.k && q.lda == p.lda &&
             q.ldb == p.ldb && q.ldc == p.ldc && q.beta == p.beta;
    };
    auto it = std::find_if(out.begin(), out.end(), same);
    if (it != out.end()) {
      it->calls += p.calls;
      continue;
    }
    p.what = fmt::format("step #{}{}", out.size() + 1, p.beta != 0.f ? " (+=)" : "");
    out.push_back(p);
  }
  return out;
}

// What one training step runs, with its leading dimensions and call counts: the recorded products
// or GPT-2's (src/model/gpt2/units.cpp), then attention's, which the CPU backend runs per head
// inside its kernels (src/backend/cpu/kernels.cpp).
std::vector<Product> step_products(const GemmBenchConfig& cfg) {
  const int64_t C = cfg.dim, N = cfg.tokens, L = cfg.layers;
  std::vector<Product> out = recorded_products(cfg.recorded);
  const struct {
    const char* what;
    int64_t ic, oc;
  } linears[] = {{"qkv", C, 3 * C}, {"attn proj", C, C}, {"fc", C, 4 * C}, {"fc proj", 4 * C, C}};
  if (cfg.recorded.empty())
    for (const auto& l : linears) {
      const std::string w = l.what;
      out.push_back(product(w + " fwd", Trans::N, Trans::N, N, l.oc, l.ic, l.ic, l.oc, l.oc, 0.f, L));
      out.push_back(product(w + " dinp", Trans::N, Trans::T, N, l.ic, l.oc, l.oc, l.oc, l.ic, 0.f, L));
      out.push_back(product(w + " dW", Trans::T, Trans::N, l.ic, l.oc, N, l.ic, l.oc, l.oc, 1.f, L));
    }
  if (cfg.heads > 0 && cfg.seq > 0) {
    const int64_t T = cfg.seq, H = cfg.heads, hs = cfg.head_dim > 0 ? cfg.head_dim : C / H, calls = L * (N / T) * H;
    const int64_t C3 = (H + 2 * (cfg.kv_heads > 0 ? cfg.kv_heads : H)) * hs;  // a qkv row
    const int64_t A = H * hs;  // an attention output row (C unless the head size is its own)
    out.push_back(product("att q k^T", Trans::N, Trans::T, T, T, hs, C3, C3, T, 0.f, calls));
    out.push_back(product("att a v", Trans::N, Trans::N, T, hs, T, T, C3, A, 0.f, calls));
    out.push_back(product("att d(a)", Trans::N, Trans::T, T, T, hs, A, C3, T, 0.f, calls));
    out.push_back(product("att dv", Trans::T, Trans::N, T, hs, T, T, A, C3, 0.f, calls));
    out.push_back(product("att dq", Trans::N, Trans::N, T, hs, T, T, C3, C3, 0.f, calls));
    out.push_back(product("att dk", Trans::T, Trans::N, T, hs, T, T, C3, C3, 0.f, calls));
  }
  if (cfg.vocab > 0 && cfg.recorded.empty()) {
    const int64_t V = cfg.vocab;
    out.push_back(product("head fwd", Trans::N, Trans::T, N, V, C, C, C, V, 0.f, 1));
    out.push_back(product("head dx", Trans::N, Trans::N, N, C, V, V, C, C, 0.f, 1));
    out.push_back(product("head dW", Trans::T, Trans::N, V, C, N, V, C, C, 1.f, 1));
  }
  return out;
}

// Seconds per call: the best of three windows of at least seconds/3 and three calls each. On a
// shared machine a neighbour's burst only ever slows a window down.
double time_call(const std::function<void()>& call, Backend& be, double seconds) {
  call();  // warm-up
  be.synchronize();
  double best = 0;
  for (int window = 0; window < 3; ++window) {
    int n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double e = 0;
    while (e < seconds / 3 || n < 3) {
      call();
      be.synchronize();
      ++n;
      e = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (window == 0 || e / n < best) best = e / n;
  }
  return best;
}

// Seconds per call of product p on each candidate: each cpu library in `libs`, or the backend
// itself elsewhere. a, b, c hold p's operands (filled here).
std::vector<double> time_candidates(const Product& p, Backend& be, const std::vector<cpu::GemmLib>& libs, Block& a,
                                    Block& b, Block& c, double seconds) {
  be.fill(a.flat(DType::f32), 0.5f);
  be.fill(b.flat(DType::f32), 0.25f);
  be.fill(c.flat(DType::f32), 0.f);
  const bool cpu = be.device() == Device::cpu;
  std::vector<double> secs;
  for (size_t i = 0; i < (cpu ? libs.size() : 1); ++i) {
    std::function<void()> call;
    if (cpu) {
      const cpu::GemmLib lib = libs[i];
      const float *A = static_cast<const float*>(a.data()), *B = static_cast<const float*>(b.data());
      float* Cp = static_cast<float*>(c.data());
      call = [&p, lib, A, B, Cp] {
        cpu::sgemm_with(lib, p.ta, p.tb, p.m, p.n, p.k, 1.f, A, p.lda, B, p.ldb, p.beta, Cp, p.ldc);
      };
    } else {
      GemmDesc d;
      d.trans_a = p.ta, d.trans_b = p.tb;
      d.m = p.m, d.n = p.n, d.k = p.k, d.lda = p.lda, d.ldb = p.ldb, d.ldc = p.ldc, d.beta = p.beta;
      call = [&, d] { be.gemm(d, a.data(), b.data(), c.data()); };
    }
    secs.push_back(time_call(call, be, seconds));
  }
  return secs;
}

}  // namespace

GemmBenchConfig step_gemm_config(const ModelSpec& spec, int64_t micro_batch) {
  StepConfig step;  // the products do not depend on the data-parallel strategy
  step.spec = spec;
  return step_gemm_config(step, 1, micro_batch);
}

GemmBenchConfig step_gemm_config(const StepConfig& step, int world, int64_t micro_batch) {
  const ModelSpec& spec = step.spec;
  const int tp = step.layout.dims.resolved(world).tp;
  if (auto why = tp_split_problem(spec, tp)) throw InputError(*why);
  GemmBenchConfig g;
  // Attention runs inside the CPU kernels on this rank's heads (all the sequence's rows, with
  // sequence parallelism too: the region gathers them first); its row is heads/tp heads wide.
  g.dim = spec.dim / tp;
  g.tokens = micro_batch * spec.seq;
  g.heads = spec.heads / tp, g.seq = spec.seq, g.vocab = spec.vocab, g.layers = spec.layers;
  g.kv_heads = spec.num_kv_heads() / tp;
  g.head_dim = spec.head_dim;
  g.recorded = step_gemms(step, world, 0, micro_batch);
  g.grid = false;
  return g;
}

double gemm_benchmark_pass_flops(const GemmBenchConfig& cfg) {
  double flops = 0;
  for (const Product& p : step_products(cfg)) flops += p.flops();
  if (cfg.grid)
    for (const Product& p : grid_products(cfg.dim, cfg.tokens)) flops += p.flops();
  return flops * 2;  // the cpu's two candidates (oneDNN, OpenBLAS); elsewhere one
}

GemmBenchResult run_gemm_benchmark(Pool& pool, const GemmBenchConfig& cfg, std::FILE* out) {
  SHARD_REQUIRE(cfg.dim > 0 && cfg.tokens > 0 && cfg.layers > 0, "gemm benchmark: --dim {} --tokens {}: expected "
                "positive sizes", cfg.dim, cfg.tokens);
  SHARD_REQUIRE(cfg.heads <= 0 || cfg.seq <= 0 ||
                    ((cfg.head_dim > 0 || cfg.dim % cfg.heads == 0) && cfg.tokens % cfg.seq == 0),
                "gemm benchmark: --heads {} must divide --dim {} and --seq {} must divide --tokens {}", cfg.heads,
                cfg.dim, cfg.seq, cfg.tokens);
  Backend& be = pool.backend();
  const bool cpu = be.device() == Device::cpu;
  // The candidates: each library the cpu backend can call, or the backend itself elsewhere.
  const std::vector<cpu::GemmLib> libs = {cpu::GemmLib::onednn, cpu::GemmLib::openblas};
  std::vector<std::string> names;
  if (cpu)
    for (cpu::GemmLib lib : libs) names.push_back(cpu::gemm_lib_name(lib));
  else names = {"backend"};

  std::vector<Product> products = step_products(cfg);
  if (cfg.grid) {
    std::vector<Product> g = grid_products(cfg.dim, cfg.tokens);
    products.insert(products.begin(), g.begin(), g.end());
  }
  std::fprintf(out, "# sgemm on %s; GFLOP/s of each candidate, the backend's pick and its share of the best\n",
               be.describe().c_str());
  std::fprintf(out, "#%-21s %6s %6s %6s %2s %6s", "product", "m", "n", "k", "op", "calls");
  for (const std::string& n : names) std::fprintf(out, " %9s", n.c_str());
  std::fprintf(out, " %9s %6s\n", "picked", "%best");

  GemmBenchResult r;
  double step_flops = 0, best_s = 0, chosen_s = 0;
  bool grid_done = !cfg.grid;
  for (const Product& p : products) {
    if (!grid_done && p.calls > 0) {
      grid_done = true;
      std::fprintf(out, "# one training step's products (calls per step: %lld layers, %lld sequences of %lld)\n",
                   static_cast<long long>(cfg.layers), static_cast<long long>(cfg.tokens / std::max<int64_t>(1, cfg.seq)),
                   static_cast<long long>(cfg.seq));
    }
    const int64_t a_rows = p.ta == Trans::N ? p.m : p.k, b_rows = p.tb == Trans::N ? p.k : p.n;
    Block a = pool.alloc(DType::f32, a_rows * p.lda, Category::workspace, "gemm bench A");
    Block b = pool.alloc(DType::f32, b_rows * p.ldb, Category::workspace, "gemm bench B");
    Block c = pool.alloc(DType::f32, p.m * p.ldc, Category::workspace, "gemm bench C");
    const std::vector<double> secs = time_candidates(p, be, libs, a, b, c, cfg.seconds);
    const size_t picked =
        cpu ? static_cast<size_t>(std::find(libs.begin(), libs.end(),
                                            cpu::gemm_pick(cpu::GemmShape{p.ta, p.tb, p.m, p.n, p.k, p.lda, p.ldb})) -
                                  libs.begin())
            : 0;
    const double best = *std::min_element(secs.begin(), secs.end()), ratio = best / secs[picked];
    std::fprintf(out, " %-21s %6lld %6lld %6lld %s %6lld", p.what.c_str(), static_cast<long long>(p.m),
                 static_cast<long long>(p.n), static_cast<long long>(p.k), p.op().c_str(),
                 static_cast<long long>(p.calls));
    for (double s : secs) std::fprintf(out, " %9.1f", p.flops() / s / 1e9);
    std::fprintf(out, " %9s %5.1f%%\n", names[picked].c_str(), 100.0 * ratio);
    if (ratio < r.worst_ratio) {
      r.worst_ratio = ratio;
      r.worst = p.what + " " + p.op();
    }
    step_flops += p.flops() * p.calls;
    best_s += best * p.calls;
    chosen_s += secs[picked] * p.calls;
  }
  r.ceiling = step_flops / best_s / 1e9;
  r.chosen = step_flops / chosen_s / 1e9;
  std::fprintf(out, "# step's products, FLOP-weighted: ceiling (best candidate each) %.1f GFLOP/s, picked %.1f "
               "(%.1f%%)\n", r.ceiling, r.chosen, 100.0 * r.chosen / r.ceiling);
  if (r.worst.empty()) std::fprintf(out, "# the pick was the best candidate for every product\n");
  else std::fprintf(out, "# lowest share of the best: %.1f%% (%s)\n", 100.0 * r.worst_ratio, r.worst.c_str());
  std::fflush(out);
  return r;
}

// Under a second at the 80-100 GFLOP/s of this machine type.
constexpr double kCeilingBudgetFlops = 60e9;

void measure_sgemm_ceiling(TrainConfig& cfg, Backend& be, Communicator& comm) {
  const int world = comm.world_size();
  // This rank's products: its part of the model under --tp, its data-parallel share of the batch.
  const int64_t micro = std::max<int64_t>(1, cfg.batch / cfg.layout.dims.resolved(world).dp() / cfg.accum);
  GemmBenchConfig g = step_gemm_config(cfg, world, micro);
  g.seconds = 0.001;  // per product and library: the step's products are timed in ~0.1 s (tiny, small)
  const double cost = 10 * gemm_benchmark_pass_flops(g);
  const bool too_costly = cost > kCeilingBudgetFlops;
  if (too_costly) {
    cfg.sgemm_ceiling_note = fmt::format("not measured (timing this step's products takes about {:.0f} GFLOP; "
                                         "--sgemm-ceiling GFLOPS takes bench-train's)", cost / 1e9);
    // A small probe instead (GPT-2's four linears at width 384 over 1,024 rows, ~11 GFLOP a pass):
    // its rate estimates a long step's time, announced before step 1 (an estimate, not a bound:
    // the step's own products may run faster or slower).
    g = GemmBenchConfig{};
    g.dim = 384, g.tokens = 1024, g.heads = 0, g.seq = 0, g.grid = false, g.seconds = 0.001;
  }
  Pool scratch(be);  // not the run's pool: its ledger and budget see only the run
  std::FILE* sink = std::fopen("/dev/null", "w");
  comm.all_gather_strings("");  // the ranks start together
  const auto t0 = std::chrono::steady_clock::now();
  const double mine = run_gemm_benchmark(scratch, g, sink ? sink : stdout).ceiling;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sink) std::fclose(sink);
  double sum = 0;
  for (const std::string& v : comm.all_gather_strings(fmt::format("{}", mine))) sum += std::stod(v);
  if (too_costly) {
    cfg.sgemm_probe = sum * 1e9;
    return;
  }
  cfg.sgemm_ceiling = sum * 1e9;
  cfg.sgemm_ceiling_note = fmt::format("{:.1f} GFLOP/s{} on this step's products, best library each (measured in "
                                       "{:.2f} s; --sgemm-ceiling off skips it)", sum / world,
                                       world > 1 ? " per rank" : "", secs);
}

bool step_too_small_for_threads(const TrainConfig& cfg, int world) {
  // profile's dims are resolved against its --world (a simulated one), the others' against this job's.
  const ParallelDims dims = cfg.layout.dims.is_resolved() ? cfg.layout.dims : cfg.layout.dims.resolved(world);
  const double tokens = double(std::max<int64_t>(1, cfg.batch / dims.dp() / cfg.accum) * (cfg.spec.seq / dims.cp));
  const double widest = double(std::max(cfg.spec.ffn_hidden(), cfg.spec.vocab)) / dims.tp;
  return 2 * tokens * widest * double(cfg.spec.dim) < kThreadedProductFlops;
}

void set_sgemm_ceiling(TrainConfig& cfg, const std::string& flag, Backend& be, Communicator& comm) {
  if (flag == "off") return;
  const bool cpu = be.device() == Device::cpu;
  SHARD_REQUIRE(cpu || flag == "auto", "--sgemm-ceiling {}: the sgemm ceiling is the CPU's (on a GPU the progress "
                "line shows MFU)", flag);
  if (!cpu) return;
  if (flag == "auto") return measure_sgemm_ceiling(cfg, be, comm);
  double gflops = 0;
  const auto [p, ec] = std::from_chars(flag.data(), flag.data() + flag.size(), gflops);
  SHARD_REQUIRE(ec == std::errc() && p == flag.data() + flag.size() && gflops > 0,
                "--sgemm-ceiling '{}': expected auto, off or a rank's GFLOP/s (bench-train's \"ceiling\")", flag);
  cfg.sgemm_ceiling = gflops * 1e9 * comm.world_size();
  cfg.sgemm_ceiling_note = fmt::format("{:.1f} GFLOP/s per rank (--sgemm-ceiling)", gflops);
}

}  // namespace shardlab
