// Checkpoints across tensor-parallel layouts, without a Trainer: every rank of a (tp, dp) layout
// writes its file as save_checkpoint does (append_unit_state over the range a ZeRO flat-parameter
// shard or a DDP replica owns), and every rank of another layout reads its owned ranges back
// (read_unit_state). The values are a function of (state, tensor, whole-tensor index) computed in
// the test, so each element read is checked against the whole model, and padding against 0.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shard/flat_param.hpp"
#include "src/core/hash.hpp"
#include "src/model/family.hpp"
#include "src/model/safetensors.hpp"
#include "src/checkpoint/checkpoint_format.hpp"

using namespace shardlab;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kStates{"param", "adam_m", "adam_v"};
constexpr float kUnset = -12345.f;  // what a destination holds before a read

// The whole model's value of element `full` of state s of tensor `name`: distinct per element.
float whole_value(size_t s, const std::string& name, int64_t full) {
  const uint64_t h = fnv1a64(name, kFnv1a64Basis ^ (s * 0x9e3779b97f4a7c15ull)) ^ static_cast<uint64_t>(full) * 0xff51afd7ed558ccdull;
  return static_cast<float>(static_cast<int64_t>(h % 2000001) - 1000000) * 1e-6f;
}

// GPT-2 and Llama shapes that tp 1, 2 and 4 divide (heads, KV heads, MLP width) and whose
// vocabulary none of 2 and 4 divides, so the embedding and head are padded.
ModelSpec gpt2_spec() {
  ModelSpec s;
  s.name = "tp-ckpt-gpt2";
  s.layers = 2, s.dim = 48, s.heads = 12, s.seq = 16, s.vocab = 251;
  s.validate();
  return s;
}
ModelSpec llama_spec() {
  ModelSpec s;
  s.name = "tp-ckpt-llama";
  s.family = FamilyId::llama;
  s.layers = 2, s.dim = 48, s.heads = 12, s.kv_heads = 4, s.ffn_dim = 96, s.seq = 16, s.vocab = 253;
  s.rope_theta = 10000, s.tied_head = false;
  s.validate();
  return s;
}

// A (tp, dp) layout: world rank = dp rank * tp + tp rank (tp innermost, as the mesh lays it out).
// zero: each tensor-parallel part sharded over dp as a ZeRO FlatParam; else replicated (DDP), with
// dp rank 0 writing.
struct Layout {
  int tp, dp;
  bool zero = true;
  int world() const { return tp * dp; }
};

// One rank of a layout: its units' layouts, and the range of each it owns and the range it saves.
struct RankPart {
  std::vector<UnitLayout> units;
  std::vector<std::pair<int64_t, int64_t>> owned, saved;
};

RankPart rank_part(const ModelSpec& spec, const Layout& l, int world_rank) {
  const int t = world_rank % l.tp, d = world_rank / l.tp;
  RankPart p;
  p.units = family_of(spec).layout(spec, TpConfig{l.tp, t});
  for (const UnitLayout& u : p.units) {
    std::pair<int64_t, int64_t> own{0, u.numel};
    if (l.zero) {
      const FlatParam f = make_flat_param(u, l.dp, d);
      own = {std::min(f.shard_begin(), f.numel), std::min(f.shard_begin() + f.shard, f.numel)};
    }
    p.owned.push_back(own);
    p.saved.push_back(l.zero || d == 0 ? own : std::pair<int64_t, int64_t>{0, 0});
  }
  return p;
}

// Unit u's local buffer of state s as tensor-parallel rank `unit.tp_rank` holds it: whole-model
// values through tp_runs, padding poisoned (a save must not write it, a load must zero it).
std::vector<float> local_values(const UnitLayout& unit, size_t s) {
  std::vector<float> v(static_cast<size_t>(unit.numel), 1e30f);
  for (const TensorDecl& t : unit.tensors)
    for (const TpRun& r : tp_runs(t, unit.tp_degree, unit.tp_rank))
      if (r.full >= 0)
        for (int64_t i = 0; i < r.len; ++i) v[static_cast<size_t>(t.offset + r.local + i)] = whole_value(s, t.name, r.full + i);
  return v;
}

std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A checkpoint every rank of layout l wrote, in a fresh directory (removed at the end).
struct TpCheckpoint {
  fs::path dir;
  TpCheckpoint(const ModelSpec& spec, const Layout& l) {
    static int serial = 0;
    dir = fs::temp_directory_path() / fmt::format("shardlab_test_tp_ckpt_{}_{}", ::getpid(), serial++);
    fs::create_directories(dir);
    json m = {{"format", kCheckpointFormat}, {"model", spec_to_json(spec)}, {"strategy", l.zero ? "zero3" : "ddp"},
              {"world", l.world()}, {"mesh", {{"pp", 1}, {"dp_replicate", 1}, {"dp_shard", l.dp}, {"tp", l.tp}}},
              {"optimizer", {{"kind", "adamw"}, {"states", kStates}}}, {"step", 7}, {"files", json::array()},
              {"tensors", json::object()}};
    for (int r = 0; r < l.world(); ++r) {
      const RankPart p = rank_part(spec, l, r);
      std::vector<float> file;
      json pieces = json::object();
      for (size_t u = 0; u < p.units.size(); ++u) {
        const auto [a, b] = p.saved[u];
        if (b <= a) continue;
        for (size_t s = 0; s < kStates.size(); ++s) {
          const std::vector<float> v = local_values(p.units[u], s);
          std::vector<float> staged;
          append_unit_state(p.units[u], a, b, std::span<const float>(v).subspan(static_cast<size_t>(a), static_cast<size_t>(b - a)),
                            r, kStates[s], file.size() * sizeof(float), staged, pieces);
          file.insert(file.end(), staged.begin(), staged.end());
        }
      }
      if (pieces.empty()) continue;
      const std::string name = fmt::format("rank_{:05d}.bin", r), b = bytes_of(file);
      std::ofstream(dir / name, std::ios::binary) << b;
      m["files"].push_back({{"rank", r}, {"tp_rank", r % l.tp}, {"file", name}, {"bytes", b.size()},
                            {"checksum", fmt::format("fnv1a64:{:016x}", fnv1a64(b))}});
      for (auto& [tensor, states] : pieces.items())
        for (auto& [state, list] : states.items())
          for (auto& piece : list) m["tensors"][tensor][state].push_back(piece);
    }
    for (const UnitLayout& u : family_of(spec).layout(spec))
      for (const TensorDecl& t : u.tensors) m["tensors"][t.name]["shape"] = t.shape;
    std::ofstream(dir / "manifest.json") << m.dump(1);
  }
  ~TpCheckpoint() { fs::remove_all(dir); }
  TpCheckpoint(const TpCheckpoint&) = delete;
  TpCheckpoint& operator=(const TpCheckpoint&) = delete;
};

// Every rank of layout l reads every state of its owned ranges from c and checks each element:
// the whole model's value, 0 for padding, untouched past the tensors. Returns the elements checked.
int64_t load_and_check(const TpCheckpoint& c, const ModelSpec& spec, const Layout& l) {
  const Manifest m = read_manifest(c.dir);
  CheckpointFiles files(c.dir, m.files);
  int64_t checked = 0;
  for (int r = 0; r < l.world(); ++r) {
    const RankPart p = rank_part(spec, l, r);
    for (size_t u = 0; u < p.units.size(); ++u) {
      const auto [a, b] = p.owned[u];
      const UnitLayout& unit = p.units[u];
      for (size_t s = 0; s < kStates.size(); ++s) {
        std::vector<float> dst(static_cast<size_t>(b - a), kUnset);
        read_unit_state(m, files, unit, a, b, kStates[s], dst, c.dir.string());
        std::vector<float> want = local_values(unit, s);
        for (const TensorDecl& t : unit.tensors)
          for (const TpRun& run : tp_runs(t, unit.tp_degree, unit.tp_rank))
            if (run.full < 0) std::fill_n(want.begin() + t.offset + run.local, run.len, 0.f);
        for (int64_t i = a; i < b; ++i) {
          const float got = dst[static_cast<size_t>(i - a)];
          if (got != want[static_cast<size_t>(i)]) {
            INFO("rank " << r << " (tp " << l.tp << " x dp " << l.dp << ") unit " << unit.name << " state " << kStates[s]
                         << " local element " << i);
            REQUIRE(got == want[static_cast<size_t>(i)]);
          }
          ++checked;
        }
      }
    }
  }
  return checked;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("local_regions: a part's elements as whole-tensor boxes, padding left out", "[ckpt][tp]") {
  // GPT-2's c_attn weight (C, 3C) at tp 2: rank 1 holds columns [C/2, C) of each of q, k and v.
  const ModelSpec spec = gpt2_spec();
  const UnitLayout block = family_of(spec).layout(spec, TpConfig{2, 1})[1];
  const TensorDecl& w = block.find("h.0.attn.c_attn.weight");
  REQUIRE(w.shape == std::vector<int64_t>{48, 72});
  // Local elements [30, 100): row 0 from column 30 (k's chunk from 24, v's from 48), row 1 to column 28.
  const auto regions = local_regions(w, 2, 1, 30, 100);
  REQUIRE(regions.size() == 3);
  CHECK(regions[0].region.box == std::vector<SliceDim>{{0, 48}, {24, 24}});  // q's columns [24, 48)
  CHECK(regions[0].region.begin == 24);  // row 1 of the box: local elements [72, 96)
  CHECK(regions[0].region.end == 48);
  CHECK(regions[0].local == std::vector<std::pair<int64_t, int64_t>>{{72, 96}});
  CHECK(regions[1].region.box == std::vector<SliceDim>{{0, 48}, {72, 24}});  // k's columns [72, 96)
  CHECK(regions[1].region.begin == 6);  // local 30 is column 6 of k's chunk
  CHECK(regions[1].region.end == 28);   // row 1: local [96, 100) = columns 0..3
  CHECK(regions[1].local == std::vector<std::pair<int64_t, int64_t>>{{30, 48}, {96, 100}});
  CHECK(regions[2].region.box == std::vector<SliceDim>{{0, 48}, {120, 24}});  // v's columns [120, 144)
  CHECK(regions[2].local == std::vector<std::pair<int64_t, int64_t>>{{48, 72}});

  // The embedding at tp 4: 251 rows in 4 chunks of 63; rank 3 holds rows [189, 251) and one pad row.
  const UnitLayout emb = family_of(spec).layout(spec, TpConfig{4, 3})[0];
  const TensorDecl& wte = emb.find("wte.weight");
  REQUIRE(wte.shape == std::vector<int64_t>{63, 48});
  const auto all = local_regions(wte, 4, 3, 0, wte.numel);
  REQUIRE(all.size() == 1);
  CHECK(all[0].region.box == std::vector<SliceDim>{{189, 62}, {0, 48}});
  CHECK(all[0].region.end == 62 * 48);
  CHECK(local_regions(wte, 4, 3, 62 * 48, 63 * 48).empty());  // the pad row alone: nothing to save
  // A replicated tensor, and any tensor at tp 1: one flat range, as data-parallel runs write.
  const auto ln = local_regions(block.find("h.0.ln_1.weight"), 2, 1, 3, 40);
  REQUIRE(ln.size() == 1);
  CHECK(ln[0].region.box.empty());
  CHECK(ln[0].local == std::vector<std::pair<int64_t, int64_t>>{{3, 40}});
}

TEST_CASE("checkpoints written under one (tp, dp) layout load under any other", "[ckpt][tp]") {
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec()}) {
    const std::vector<Layout> layouts{{2, 2}, {1, 4}, {4, 1}, {2, 3}, {1, 1}, {2, 2, false}, {4, 2, false}};
    for (const Layout& from : layouts) {
      const TpCheckpoint c(spec, from);
      for (const Layout& to : layouts) {
        INFO(spec.describe() << ": written at tp " << from.tp << " x dp " << from.dp << (from.zero ? " zero" : " ddp")
                             << ", read at tp " << to.tp << " x dp " << to.dp << (to.zero ? " zero" : " ddp"));
        const int64_t checked = load_and_check(c, spec, to);
        // Every rank checks its whole owned part of every state: the layout's share of the model.
        int64_t owned = 0;
        for (int r = 0; r < to.world(); ++r)
          for (auto [a, b] : rank_part(spec, to, r).owned) owned += b - a;
        CHECK(checked == owned * static_cast<int64_t>(kStates.size()));
      }
    }
  }
}

TEST_CASE("a tensor-parallel checkpoint's pieces are whole-tensor boxes that any reader assembles", "[ckpt][tp]") {
  const ModelSpec spec = gpt2_spec();
  const TpCheckpoint c(spec, {2, 2});
  const Manifest m = read_manifest(c.dir);
  CHECK(m.tp == 2);
  REQUIRE(m.files.size() == 4);
  CHECK(m.files[3].tp_rank == 1);
  // c_attn's weight: every rank's part is its q, k and v boxes (each cut once by the dp shard at most).
  const ManifestTensor& w = m.tensors.at("h.0.attn.c_attn.weight");
  CHECK(w.shape == std::vector<int64_t>{48, 144});
  for (const ManifestPiece& p : w.states.at("param")) CHECK(p.slice.size() == 2);
  // A replicated tensor is written once per data-parallel shard: by tensor-parallel rank 0.
  for (const ManifestPiece& p : m.tensors.at("h.0.ln_1.weight").states.at("adam_v")) {
    CHECK(p.slice.empty());
    CHECK(p.rank % 2 == 0);
  }
  // The whole vocabulary, no padding row: each of the 251 rows once.
  CheckpointFiles files(c.dir, m.files);
  const ManifestTensor& wte = m.tensors.at("wte.weight");
  std::vector<float> whole(251 * 48);
  CHECK(read_region(files, wte.states.at("param"), wte.shape, {{}, 0, 251 * 48}, whole.data(), "wte.weight") == 251 * 48);
  for (int64_t i = 0; i < 251 * 48; ++i) {
    INFO("wte element " << i);
    REQUIRE(whole[static_cast<size_t>(i)] == whole_value(0, "wte.weight", i));
  }
}

TEST_CASE("export of a tensor-parallel checkpoint equals the tp-1 export of the same values", "[ckpt][tp]") {
  for (const ModelSpec& spec : {gpt2_spec(), llama_spec()}) {
    const TpCheckpoint tp1(spec, {1, 4}), tp2(spec, {2, 2}), tp4(spec, {4, 1}), ddp(spec, {2, 2, false});
    const fs::path out = fs::temp_directory_path() / fmt::format("shardlab_test_tp_export_{}", ::getpid());
    fs::remove_all(out);
    fs::create_directories(out);
    export_checkpoint(tp1.dir.string(), (out / "tp1.safetensors").string());
    const std::string reference = read_bytes(out / "tp1.safetensors");
    // The tp-1 export against the values themselves, so the comparisons below check against them.
    SafetensorsReader r((out / "tp1.safetensors").string());
    for (const UnitLayout& u : family_of(spec).layout(spec))
      for (const TensorDecl& t : u.tensors) {
        std::vector<float> v(static_cast<size_t>(t.numel));
        r.read_f32(family_of(spec).hf_name(t), v, &t.shape);
        for (int64_t i = 0; i < t.numel; ++i) {
          INFO(t.name << " element " << i);
          REQUIRE(v[static_cast<size_t>(i)] == whole_value(0, t.name, i));
        }
      }
    for (const TpCheckpoint* c : {&tp2, &tp4, &ddp}) {
      export_checkpoint(c->dir.string(), (out / "tp.safetensors").string());
      CHECK(read_bytes(out / "tp.safetensors") == reference);
      // An HF directory (config.json and shards) too, shard for shard.
      export_checkpoint(tp1.dir.string(), (out / "dir1").string(), DType::bf16, 100000);
      export_checkpoint(c->dir.string(), (out / "dirT").string(), DType::bf16, 100000);
      for (const auto& e : fs::directory_iterator(out / "dir1")) {
        INFO(e.path().filename().string());
        CHECK(read_bytes(e.path()) == read_bytes(out / "dirT" / e.path().filename()));
      }
    }
    fs::remove_all(out);
  }
}
