// hf_config_reader.hpp — reading a Hugging Face config.json field by field, for the families'
// spec_from_hf_config: every missing field is named at once, every field the family does not know
// is refused by name, and a field shardlab computes one way only must be absent or that way.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "src/core/check.hpp"
#include "src/core/suggest.hpp"

namespace shardlab {

class HfConfigReader {
 public:
  // family: the name errors give the model ("GPT-2", "Llama"). known: the fields the family reads
  // or checks; ignored: fields that change nothing it computes. Any other field is an error.
  HfConfigReader(const nlohmann::json& j, const char* family, const std::set<std::string>& known,
                 const std::set<std::string>& ignored)
      : j_(j), family_(family) {
    SHARD_REQUIRE(j.is_object(), "config.json: expected an object, got {}", j.type_name());
    std::vector<std::string> unknown;
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!known.count(it.key()) && !ignored.count(it.key())) unknown.push_back(it.key());
    SHARD_REQUIRE(unknown.empty(), "config.json: unknown fields {} (shardlab's {} would ignore what they ask for)",
                  join_names(unknown), family_);
  }

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  // A required integer of at least lo; a missing one is remembered for check_missing().
  int64_t integer(const char* key, int64_t lo) {
    if (!has(key)) {
      missing_.push_back(key);
      return lo;
    }
    SHARD_REQUIRE(j_[key].is_number_integer() && j_[key].get<int64_t>() >= lo,
                  "config.json: \"{}\" is {}, expected an integer of at least {}", key, j_[key].dump(), lo);
    return j_[key].get<int64_t>();
  }
  // A required number; a missing one is remembered for check_missing().
  double number(const char* key) {
    if (!has(key)) {
      missing_.push_back(key);
      return 0;
    }
    return number_or(key, 0);
  }
  // A field HF gives a default when absent: that default.
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    SHARD_REQUIRE(j_[key].is_number(), "config.json: \"{}\" is {}, expected a number", key, j_[key].dump());
    return j_[key].get<double>();
  }
  // A bool HF gives a default when absent: that default.
  bool flag_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    SHARD_REQUIRE(j_[key].is_boolean(), "config.json: \"{}\" is {}, expected true or false", key, j_[key].dump());
    return j_[key].get<bool>();
  }
  void add_missing(std::string what) { missing_.push_back(std::move(what)); }
  // Throws InputError naming every required field found missing so far.
  void check_missing() const {
    if (!missing_.empty()) throw InputError(fmt::format("config.json: missing {}", join_names(missing_)));
  }
  // A field shardlab computes one way only: absent, or equal to that way.
  template <class T>
  void expect(const char* key, const T& value, const char* why) const {
    if (!has(key)) return;
    SHARD_REQUIRE(j_[key] == nlohmann::json(value), "config.json: \"{}\" is {}; shardlab's {} needs {} ({})", key,
                  j_[key].dump(), family_, nlohmann::json(value).dump(), why);
  }

 private:
  const nlohmann::json& j_;
  const char* family_;
  std::vector<std::string> missing_;
};

}  // namespace shardlab
