// grad_check.hpp — every gradient of a Model against a reference file's "ref.grad.<name>" tensors
// (made by transformers: tests/reference/make_*_reference.py, make_hf_moe_dirs.py), each tensor
// within abs_tol + rel_tol x its largest |reference|.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "src/model/model.hpp"

namespace shardlab::test {

struct GradCheck {
  int compared = 0, failures = 0;
  double worst = 0;      // the largest error / tolerance
  double worst_abs = 0;  // the largest absolute error
  std::string worst_name;
};

// Prints a MISMATCH line per tensor past its tolerance. `skip`: tensors the reference has no
// gradient for (transformers' buffers, e.g. DeepSeek-V3's correction biases).
inline GradCheck check_grads(Model& model, SafetensorsReader& ref, double abs_tol, double rel_tol,
                             bool (*skip)(const std::string&) = nullptr) {
  GradCheck r;
  for (size_t u = 0; u < model.num_units(); ++u)
    for (const TensorDecl& t : model.unit(u).layout().tensors) {
      if (skip != nullptr && skip(t.name)) continue;
      const std::string name = "ref.grad." + t.name;
      std::vector<float> want(static_cast<size_t>(ref.entry(name).numel()));
      ref.read_f32(name, want);
      const auto got = model.grad(t.name).span<float>();
      if (got.size() != want.size()) {
        ++r.failures;
        std::printf("  MISMATCH %s: %zu values against %zu\n", t.name.c_str(), got.size(), want.size());
        continue;
      }
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
        max_ref = std::max(max_ref, std::fabs(double(want[i])));
      }
      const double tol = abs_tol + rel_tol * max_ref;
      ++r.compared;
      r.worst_abs = std::max(r.worst_abs, max_err);
      if (max_err / tol > r.worst) r.worst = max_err / tol, r.worst_name = t.name;
      if (max_err > tol) {
        ++r.failures;
        std::printf("  MISMATCH %-48s max abs error %.3g (largest |grad| %.3g, tolerance %.3g)\n", t.name.c_str(),
                    max_err, max_ref, tol);
      }
    }
  return r;
}

}  // namespace shardlab::test
