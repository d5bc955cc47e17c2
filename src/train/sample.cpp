#include "src/train/sample.hpp"

#include "src/data/tokenizer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "src/core/check.hpp"
#include "src/core/rng.hpp"

namespace shardlab {

void SampleConfig::validate(int64_t vocab) const {
  SHARD_REQUIRE(tokens >= 0 && tokens <= (int64_t{1} << 24), "--tokens {}: expected 0 to 16777216", tokens);
  SHARD_REQUIRE(std::isfinite(temperature) && temperature >= 0, "--temperature {}: expected 0 (greedy) or a positive number",
                temperature);
  SHARD_REQUIRE(top_k >= 0 && top_k <= vocab, "--top-k {}: expected 0 (all) to the vocabulary's {}", top_k, vocab);
}

int32_t sample_token(std::span<const float> logits, const SampleConfig& c, int64_t index) {
  const int64_t V = static_cast<int64_t>(logits.size());
  SHARD_CHECK(V > 0, "sampling from an empty row of logits");
  if (c.temperature == 0 || c.top_k == 1)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = c.top_k > 0 ? std::min(c.top_k, V) : V;
  // The k largest, ties to the lower index: a total order, so the draw never depends on the sort.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<double> p(static_cast<size_t>(k));
  const double top = logits[order[0]];
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += p[i] = std::exp((logits[order[i]] - top) / c.temperature);
  const Rng rng(c.seed, "sample");
  auto b = rng.bits((c.stream << 32) + static_cast<uint64_t>(index));
  const double u = static_cast<double>((static_cast<uint64_t>(b[0]) << 21) ^ b[1]) / 9007199254740992.0 * total;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i)
    if ((acc += p[i]) > u) return order[i];
  return order[k - 1];
}

std::vector<int32_t> encode_prompt(const std::string& prompt, int64_t vocab, const Tokenizer* tokenizer) {
  if (tokenizer) {
    SHARD_REQUIRE(static_cast<int64_t>(tokenizer->size()) <= vocab,
                  "--tokenizer has {} tokens, more than the model's vocabulary of {}", tokenizer->size(), vocab);
    return tokenizer->encode(prompt);
  }
  std::vector<int32_t> out;
  if (vocab <= 256) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      const int b = static_cast<unsigned char>(prompt[i]);
      SHARD_REQUIRE(b < vocab, "--prompt: byte {} ('{}') at position {} is outside the model's vocabulary of {}", b,
                    b >= 32 && b < 127 ? std::string(1, prompt[i]) : fmt::format("\\x{:02x}", b), i, vocab);
      out.push_back(b);
    }
    return out;
  }
  std::string s = prompt;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  for (std::string w; in >> w;) {
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SHARD_REQUIRE(used == w.size() && id >= 0 && id < vocab, "--prompt: '{}' is not a token id of the model's "
                  "vocabulary of {} (a model with more than 256 tokens takes token ids separated by spaces or commas)",
                  w, vocab);
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

namespace {
// The bytes at the end of `s` that begin a UTF-8 character the string does not finish (a lead byte
// with fewer continuation bytes after it than it announces); 0 when it ends complete or invalid.
size_t unfinished_utf8(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(n, 3); ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}
}  // namespace

std::string TextStream::push(int32_t t) {
  if (tokenizer_) {  // ids past the tokenizer's (a padded vocabulary) print as <id>
    held_ += t >= 0 && static_cast<size_t>(t) < tokenizer_->size() ? tokenizer_->decode(std::span<const int32_t>(&t, 1))
                                                                    : fmt::format("<{}>", t);
  } else if (vocab_ <= 256) {
    held_.push_back(static_cast<char>(t));
  } else {
    if (!first_) held_.push_back(' ');
    held_.append(std::to_string(t));
  }
  first_ = false;
  const size_t keep = unfinished_utf8(held_);
  std::string ready = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return ready;
}

std::string decode_tokens(std::span<const int32_t> tokens, int64_t vocab, const Tokenizer* tokenizer) {
  TextStream stream(vocab, tokenizer);
  std::string out;
  for (int32_t t : tokens) out += stream.push(t);
  return out + stream.finish();
}

}  // namespace shardlab
