#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "src/compare/compare.hpp"

using namespace shardlab;

TEST_CASE("compare fails loudly when a strategy's losses drift", "[compare]") {
  CompareResult r;
  r.runs.resize(3);
  r.runs[0].name = "dp";
  r.runs[0].losses = {5.0f, 4.0f, 3.0f};
  r.runs[1].name = "ddp";
  r.runs[1].losses = {5.0f, 4.00001f, 3.0f};
  r.runs[2].name = "zero3";
  r.runs[2].losses = {5.0f, 4.0f, 3.5f};
  check_agreement(r, 1e-4);
  CHECK_FALSE(r.agree);
  CHECK_THAT(r.disagreement, Catch::Contains("zero3 step 3: loss 3.5000000, dp has 3.0000000"));
  CHECK(r.runs[1].max_rel_dev == Approx(2.5e-6).epsilon(0.05));
  r.runs[2].losses = {5.0f, 4.0f, NAN};
  check_agreement(r, 1e-4);
  CHECK_FALSE(r.agree);  // a NaN loss never agrees
  r.runs[2].losses = {5.0f, 4.0f, 3.0f};
  check_agreement(r, 1e-4);
  CHECK(r.agree);
  r.runs[0].oom = true;  // the reference is the first strategy that fit
  check_agreement(r, 1e-4);
  CHECK(r.agree);
  CompareConfig cfg;
  cfg.train.spec = model_preset("tiny");
  auto j = nlohmann::json::parse(compare_json(cfg, r, 4));
  CHECK(j["schema"] == "shardlab.compare/1");
  CHECK(j["strategies"][0]["fits"] == false);
  CHECK(j["strategies"][1]["losses"].size() == 3);
}

TEST_CASE("compare holds ZeRO++'s quantized rows to 1% on their last loss", "[compare]") {
  CompareResult r;
  r.runs.resize(2);
  r.runs[0].name = "zero3";
  r.runs[0].losses = {5.0f, 4.0f, 3.0f};
  r.runs[1].name = "zero3 qwZ hpZ qgZ4";
  r.runs[1].quantized = true;
  r.runs[1].losses = {5.0f, 4.06f, 3.015f};  // 1.5% off at step 2, 0.5% at the end
  check_agreement(r, 1e-4);
  CHECK(r.agree);
  CHECK(r.runs[1].max_rel_dev == Approx(0.015).epsilon(0.01));
  r.runs[1].losses = {5.0f, 4.0f, 3.06f};  // 2% at the end
  check_agreement(r, 1e-4);
  CHECK_FALSE(r.agree);
  CHECK_THAT(r.disagreement, Catch::Contains("step 3: loss 3.05999") &&
                                 Catch::Contains("> 1e-02"));
  r.runs[1].quantized = false;  // hpZ alone is exact: every step within the tolerance
  r.runs[1].losses = {5.0f, 4.06f, 3.0f};
  check_agreement(r, 1e-4);
  CHECK_FALSE(r.agree);
}
