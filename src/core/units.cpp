#include "src/core/units.hpp"

#include <cctype>
#include <charconv>
#include <cmath>

#include "src/core/check.hpp"

namespace shardlab {

uint64_t parse_bytes(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  size_t num_end = 0;
  while (num_end < s.size() && (std::isdigit(static_cast<unsigned char>(s[num_end])) || s[num_end] == '.'))
    ++num_end;
  SHARD_REQUIRE(num_end > 0, "cannot parse byte size '{}': expected a number such as 2GiB or 512MB", text);
  double value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + num_end, value);
  SHARD_REQUIRE(ec == std::errc() && ptr == s.data() + num_end, "cannot parse byte size '{}'", text);
  std::string unit;
  for (char c : s.substr(num_end))
    if (!std::isspace(static_cast<unsigned char>(c))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb") mult = 1e12;
  else if (unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  SHARD_REQUIRE(mult > 0, "unknown unit '{}' in byte size '{}': use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB", unit, text);
  double bytes = value * mult;
  SHARD_REQUIRE(bytes < 1.8e19, "byte size '{}' is too large", text);
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{:.0f} B", v);
  return fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace shardlab
