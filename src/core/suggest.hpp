// suggest.hpp — the names a place accepts, for messages: listed ("a, b, c"), and "did you mean
// ...?" for a mistyped one, the closest of them.
//
// Edit distance (Levenshtein, with a swap of two neighbours counting as one edit, so `trian` is one
// edit from `train`): a suggestion is made only when the word is within a third of its length of a
// name (at least one edit), so a word unlike every name gets no guess.
#pragma once
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

// "a, b, c": names as a message lists them.
inline std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

inline size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rows of the dynamic programme: the row before the previous one is what a swap reads.
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest of `names` to `word`, or "" when none is close enough to be a likely typo.
inline std::string closest_name(std::string_view word, const std::vector<std::string>& names) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& n : names) {
    const size_t d = edit_distance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

// " (did you mean X?)" for the closest name, or "" when there is none.
inline std::string did_you_mean(std::string_view word, const std::vector<std::string>& names,
                                std::string_view prefix = "") {
  const std::string n = closest_name(word, names);
  return n.empty() ? std::string() : std::string(" (did you mean ").append(prefix).append(n).append("?)");
}

}  // namespace shardlab
