// units.hpp — byte sizes as people write them ("2GiB", "512MB", "1.5G") and back.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace shardlab {

// Parses a byte count. Suffixes: B, K/KB (1000), KiB (1024), M/MB, MiB, G/GB, GiB, T/TB, TiB;
// case-insensitive, optional space, fractional values allowed ("1.5GiB"). Throws InputError.
uint64_t parse_bytes(std::string_view text);
// "1.50 GiB", "512.00 KiB", "17 B".
std::string format_bytes(double bytes);

}  // namespace shardlab
