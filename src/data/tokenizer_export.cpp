// tokenizer_export.cpp — a Tokenizer as a Hugging Face tokenizer.json (tokenizer.hpp), for export
// and checkpoints: one form, whichever a run read (tokenizer.json, GPT-2's two files, tiktoken).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>

#include "src/data/tokenizer.hpp"

namespace shardlab {
namespace {

using nlohmann::json;

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json hf_document(json pre_tokenizer, json vocab, json merges, bool ignore_merges, json added) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", nullptr},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", nullptr},
          {"decoder", byte_level(true)},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
            {"ignore_merges", ignore_merges}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}}}};
}

}  // namespace

json byte_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_text(std::string(1, static_cast<char>(b)))] = b;
  return hf_document(byte_level(false), std::move(vocab), json::array(), false, json::array());
}

bool Tokenizer::added_token_holds(char c) const {
  return std::any_of(added_.begin(), added_.end(), [c](const AddedToken& t) { return t.text.find(c) != std::string::npos; });
}

int32_t Tokenizer::find_token(std::initializer_list<std::string_view> texts) const {
  for (std::string_view t : texts) {
    for (const AddedToken& a : added_)
      if (a.text == t) return a.id;
    if (auto it = vocab_.find(std::string(t)); it != vocab_.end()) return it->second;
  }
  return -1;
}

json Tokenizer::to_hf_json() const {
  // GPT-2's one stage is ByteLevel's own regex; any other list is Splits and Digits, then ByteLevel.
  json pre;
  if (pre_.size() == 1 && pre_[0] == PreTokenizer::gpt2) {
    pre = byte_level(true);
  } else {
    json stages = json::array();
    for (PreTokenizer p : pre_) {
      if (p == PreTokenizer::digits || p == PreTokenizer::digits_individual) {
        stages.push_back({{"type", "Digits"}, {"individual_digits", p == PreTokenizer::digits_individual}});
        continue;
      }
      const SplitPattern sp = p == PreTokenizer::gpt2 ? SplitPattern::gpt2 : SplitPattern::llama3;
      stages.push_back({{"type", "Split"}, {"pattern", {{"Regex", split_pattern_regex(sp)}}},
                        {"behavior", "Isolated"}, {"invert", false}});
    }
    stages.push_back(byte_level(false));
    pre = {{"type", "Sequence"}, {"pretokenizers", std::move(stages)}};
  }
  json vocab = json::object();
  for (const auto& [bytes, id] : vocab_) vocab[byte_level_text(bytes)] = id;
  // Merges in rank order; a rank shared by several pairs (tiktoken: the splits of one token) in
  // the order of their ids.
  std::vector<std::tuple<int32_t, int32_t, int32_t>> order;  // rank, left, right
  order.reserve(merges_.size());
  for (const auto& [key, m] : merges_)
    order.emplace_back(m.rank, static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xffffffffu));
  std::sort(order.begin(), order.end());
  json merges = json::array();
  for (const auto& [rank, a, b] : order)
    merges.push_back({byte_level_text(tokens_[static_cast<size_t>(a)]), byte_level_text(tokens_[static_cast<size_t>(b)])});
  json added = json::array();
  std::vector<AddedToken> by_id = added_;
  std::sort(by_id.begin(), by_id.end(), [](const AddedToken& x, const AddedToken& y) { return x.id < y.id; });
  for (const AddedToken& t : by_id)
    added.push_back({{"id", t.id}, {"content", t.text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", t.normalized}, {"special", !t.normalized}});
  return hf_document(std::move(pre), std::move(vocab), std::move(merges), ignore_merges_, std::move(added));
}

}  // namespace shardlab
