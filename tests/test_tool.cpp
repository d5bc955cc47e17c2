// test_tool — small helpers the CLI tests chain together (no Python needed in CI):
//   compare-logs A.jsonl B.jsonl TOL      losses of the steps both logs have: |a-b| <= TOL*|a|, and
//                                         at least one step in common; prints the largest difference
//   same-safetensors A B                  every tensor of A equals B's, bit for bit, and B has no
//                                         others (each a .safetensors file or an HF model directory)
//   flip-byte FILE OFFSET                 corrupts one byte
//   truncate FILE BYTES                   cuts a file short
//   check-best DIR LOG.jsonl              DIR/best links to the step of LOG's lowest val_loss (the
//                                         first such step), and that checkpoint is complete
//   differ-logs A.jsonl B.jsonl           some step both logs have differs in loss
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "src/model/hf_dir.hpp"

using namespace shardlab;

namespace {
void read(HfWeights& w, const std::string& name, std::vector<float>& out) {
  out.resize(static_cast<size_t>(w.entry(name).numel()));
  w.read_f32(name, out);
}
std::map<int64_t, double> losses(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::map<int64_t, double> out;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("event")) continue;  // a marker (a resumed run's "resume"), not a step
    out[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "compare-logs" && argc == 5) {
      auto a = losses(argv[2]), b = losses(argv[3]);
      double tol = std::stod(argv[4]), worst = 0;
      int common = 0;
      for (auto [step, la] : a) {
        auto it = b.find(step);
        if (it == b.end()) continue;
        ++common;
        worst = std::max(worst, std::fabs(la - it->second) / std::fabs(la));
      }
      std::printf("%d common steps, largest relative loss difference %.3g (tolerance %.3g)\n", common, worst, tol);
      return common > 0 && worst <= tol ? 0 : 1;
    }
    if (cmd == "check-best" && argc == 4) {
      std::ifstream f(argv[3]);
      if (!f) throw std::runtime_error(std::string("cannot read ") + argv[3]);
      int64_t best_step = -1, validated = 0;
      double best = INFINITY;
      for (std::string line; std::getline(f, line);) {
        auto j = nlohmann::json::parse(line);
        if (!j.contains("val_loss")) continue;
        ++validated;
        if (j["val_loss"].get<double>() < best) best = j["val_loss"].get<double>(), best_step = j["step"].get<int64_t>();
      }
      const std::filesystem::path link = std::filesystem::path(argv[2]) / "best";
      char want[32];
      std::snprintf(want, sizeof(want), "step_%08lld", static_cast<long long>(best_step));
      const std::string got = std::filesystem::is_symlink(link) ? std::filesystem::read_symlink(link).string() : "(none)";
      const bool complete = std::filesystem::exists(std::filesystem::path(argv[2]) / want / "manifest.json");
      std::printf("%lld validations, lowest %.6f at step %lld; best -> %s; %s %s\n", static_cast<long long>(validated),
                  best, static_cast<long long>(best_step), got.c_str(), want, complete ? "complete" : "MISSING");
      return validated > 0 && got == want && complete ? 0 : 1;
    }
    if (cmd == "differ-logs" && argc == 4) {
      auto a = losses(argv[2]), b = losses(argv[3]);
      int differ = 0;
      for (auto [step, la] : a)
        if (b.count(step) && b[step] != la) ++differ;
      std::printf("%d steps differ\n", differ);
      return differ > 0 ? 0 : 1;
    }
    if (cmd == "same-safetensors" && argc == 4) {
      HfWeights a(argv[2]), b(argv[3]);
      int tensors = 0;
      for (const std::string& name : a.names()) {
        if (!b.has(name)) {
          std::printf("tensor %s is missing from %s\n", name.c_str(), b.where().c_str());
          return 1;
        }
        std::vector<float> va, vb;
        read(a, name, va);
        read(b, name, vb);
        if (va != vb) {
          std::printf("tensor %s differs\n", name.c_str());
          return 1;
        }
        ++tensors;
      }
      std::printf("%d tensors identical\n", tensors);
      return tensors > 0 && a.names().size() == b.names().size() ? 0 : 1;
    }
    if (cmd == "flip-byte" && argc == 4) {
      std::fstream f(argv[2], std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::stoll(argv[3]));
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(std::stoll(argv[3]));
      f.write(&c, 1);
      return f.good() ? 0 : 1;
    }
    if (cmd == "truncate" && argc == 4) {
      std::filesystem::resize_file(argv[2], std::stoull(argv[3]));
      return 0;
    }
    std::fprintf(stderr, "usage: test_tool compare-logs A B TOL | same-safetensors A B | flip-byte FILE OFF | truncate FILE N\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_tool: %s\n", e.what());
    return 1;
  }
}
