#include <catch2/catch.hpp>

#include "memory/pool.hpp"

using namespace shardlab;

namespace {
std::unique_ptr<Backend> cpu() { return make_cpu_backend(BackendConfig{}); }
}

TEST_CASE("pool charges every block to its category and the ledger tracks peaks", "[memory]") {
  auto be = cpu();
  Pool pool(*be);
  Ledger& L = pool.ledger();
  {
    Block w = pool.alloc(1000, Category::param_full, "wte");
    L.set_phase(Phase::forward(1));
    Block a = pool.alloc(DType::f32, 250, Category::activations, "h.0 saved");
    CHECK(a.bytes() == 1000);
    CHECK(L.current(Category::param_full) == 1000);
    CHECK(L.current(Category::activations) == 1000);
    CHECK(pool.in_use() == 2000);
    a.reset();
    Block g = pool.alloc(500, Category::grad_full, "h.0 grad");
    CHECK(L.current_total() == 1500);
    CHECK(L.peak_total() == 2000);
    CHECK(L.peak(Category::activations) == 1000);
    CHECK(L.current(Category::activations) == 0);
    // Composition at the overall peak: the moment both wte and the activations were live.
    CHECK(L.composition_at_peak()[static_cast<int>(Category::param_full)] == 1000);
    CHECK(L.composition_at_peak()[static_cast<int>(Category::activations)] == 1000);
    CHECK(L.composition_at_peak()[static_cast<int>(Category::grad_full)] == 0);
    CHECK(L.phase_at_peak() == Phase::forward(1));
    CHECK(phase_label(L.phase_at_peak(), {"embedding", "h.0"}) == "forward h.0");
    Block moved = std::move(w);
    CHECK_FALSE(static_cast<bool>(w));
    CHECK(pool.in_use() == 1500);
  }
  CHECK(pool.in_use() == 0);
  const auto& tl = L.timeline();
  REQUIRE(tl.size() == 6);  // 3 allocations, 3 frees
  CHECK(tl[0].tag == "wte");
  CHECK(tl[0].delta == 1000);
  CHECK(tl[1].phase == Phase::forward(1));
  CHECK(tl[0].phase.kind == PhaseKind::idle);
  CHECK(tl[2].delta == -1000);
  CHECK(tl.back().total_after == 0);
  for (size_t i = 1; i < tl.size(); ++i) CHECK(tl[i].t_ms >= tl[i - 1].t_ms);
  L.reset_peaks();
  CHECK(L.peak_total() == 0);
}

TEST_CASE("an allocation past the budget names the request and lists what is live", "[memory]") {
  auto be = cpu();
  Pool pool(*be, PoolConfig{1 << 20});  // 1 MiB
  Block p = pool.alloc(600 << 10, Category::param_full, "h.0.mlp.c_fc.weight");
  Block o = pool.alloc(300 << 10, Category::optim_state, "adam m");
  try {
    Block too_much = pool.alloc(200 << 10, Category::activations, "h.1 saved");
    FAIL("allocation past the budget did not throw");
  } catch (const OutOfMemory& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("cannot allocate 200.00 KiB"));
    CHECK_THAT(msg, Catch::Contains("activations 'h.1 saved'"));
    CHECK_THAT(msg, Catch::Contains("900.00 KiB of the 1.00 MiB budget in use"));
    CHECK_THAT(msg, Catch::Contains("param_full 600.00 KiB in 1 block"));
    CHECK_THAT(msg, Catch::Contains("optim_state 300.00 KiB in 1 block"));
    CHECK_THAT(msg, Catch::Contains("largest: 'h.0.mlp.c_fc.weight' (param_full) 600.00 KiB"));
    CHECK(e.requested == 200u << 10);
    CHECK(e.in_use == 900u << 10);
    CHECK(e.budget == 1u << 20);
  }
  CHECK(pool.in_use() == 900u << 10);  // the failed request left nothing behind
  Block exact = pool.alloc((1 << 20) - (900 << 10), Category::workspace, "fills the budget exactly");
  CHECK(pool.in_use() == 1u << 20);
}

TEST_CASE("block views check that the shape fits", "[memory]") {
  auto be = cpu();
  Pool pool(*be);
  Block b = pool.alloc(DType::f32, 12, Category::workspace, "w");
  Tensor t = b.view(DType::f32, {3, 4});
  CHECK(t.numel() == 12);
  CHECK(b.flat(DType::bf16).numel() == 24);
  CHECK(b.span<float>().size() == 12);
  CHECK_THROWS_AS(b.view(DType::f32, {4, 4}), InternalError);
  auto live = pool.live_blocks();
  REQUIRE(live.size() == 1);
  CHECK(live[0].tag == "w");
}
