// gather_tp_units over real ranks (what `train --save` runs under tensor parallelism): for every tp
// degree that divides the world, each rank's part of every unit (its values from the whole model
// through tp_runs, padding poisoned) gathers on its tensor-parallel group's rank 0 into the whole
// model's unit buffers, element for element.
#include <catch2/catch.hpp>

#include "src/comm/mesh.hpp"
#include "src/model/family.hpp"
#include "src/checkpoint/checkpoint.hpp"
#include "src/model/tp.hpp"
#include "tests/mpi_test_env.hpp"

using namespace shardlab;

namespace {
// The whole model's value of element i of tensor `name` (distinct per element; exact in f32).
float whole_value(const std::string& name, int64_t i) {
  return static_cast<float>(static_cast<int64_t>(name.size()) * 100003 + i % 1000003) * 0.25f;
}
}  // namespace

TEST_CASE("gather_tp_units assembles whole tensors from every tensor-parallel rank's part", "[mpi][tp-ckpt]") {
  std::unique_ptr<Backend> be = make_cpu_backend(BackendConfig{1});
  Pool pool{*be};
  std::unique_ptr<Communicator> comm = test::test_communicator(pool);
  const int world = comm->world_size();
  ModelSpec spec;  // heads, MLP width divisible by 1..4; a vocabulary 2, 3 and 4 pad
  spec.name = "tp-gather";
  spec.layers = 2, spec.dim = 48, spec.heads = 12, spec.seq = 8, spec.vocab = 251;
  spec.validate();
  const ModelFamily& family = family_of(spec);
  const std::vector<UnitLayout> whole = family.layout(spec);
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    Mesh mesh(*comm, ParallelDims{1, 1, world / tp, tp});
    const int r = mesh.rank(CommAxis::tp);
    const std::vector<UnitLayout> local = family.layout(spec, TpConfig{tp, r});
    std::vector<std::vector<float>> parts;
    for (const UnitLayout& u : local) {
      std::vector<float>& v = parts.emplace_back(static_cast<size_t>(u.numel), 1e30f);
      for (const TensorDecl& t : u.tensors)
        for (const TpRun& run : tp_runs(t, tp, r))
          for (int64_t i = 0; run.full >= 0 && i < run.len; ++i)
            v[static_cast<size_t>(t.offset + run.local + i)] = whole_value(t.name, run.full + i);
    }
    const auto got = gather_tp_units(mesh.comm(CommAxis::tp), local, whole, parts);
    INFO("tp " << tp << " of world " << world << ", tensor-parallel rank " << r);
    if (r != 0) {
      CHECK(got.empty());
      continue;
    }
    REQUIRE(got.size() == whole.size());
    for (size_t u = 0; u < whole.size(); ++u) {
      REQUIRE(static_cast<int64_t>(got[u].size()) == whole[u].numel);
      for (const TensorDecl& t : whole[u].tensors)
        for (int64_t i = 0; i < t.numel; ++i)
          if (got[u][static_cast<size_t>(t.offset + i)] != whole_value(t.name, i)) {
            INFO(t.name << " element " << i);
            REQUIRE(got[u][static_cast<size_t>(t.offset + i)] == whole_value(t.name, i));
          }
    }
  }
}
