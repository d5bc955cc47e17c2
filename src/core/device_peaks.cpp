// device_peaks.cpp — the presets of `--gpu` by name.
#include "src/core/device_peaks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "src/core/check.hpp"

namespace shardlab {

namespace {
constexpr const DevicePeaks* kPresets[] = {&kA100_80GB, &kH100_80GB, &kH200, &kB200};
}

uint64_t DevicePeaks::budget_bytes() const { return memory_bytes() - (kDeviceHeadroomMib << 20); }

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const DevicePeaks* p : kPresets) names.emplace_back(p->name);
  return names;
}

const DevicePeaks& device_preset(std::string_view name) {
  for (const DevicePeaks* p : kPresets)
    if (name == p->name) return *p;
  if (name == "h100") return kH100_80GB;  // the short names people write: the 80 GB parts
  if (name == "a100") return kA100_80GB;
  throw InputError(fmt::format("--gpu '{}': unknown device; expected one of {} (h100 and a100: their 80 GB parts)",
                               name, fmt::join(device_preset_names(), ", ")));
}

}  // namespace shardlab
