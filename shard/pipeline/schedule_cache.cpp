// schedule_cache.cpp — build_schedule: each shape's schedule built and checked (a simulation) once.
// plan and profile build a model, and so its schedule, for every layout they predict; the check
// was most of an impossible plan's walk.
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "shard/pipeline/schedule.hpp"

namespace shardlab {

PipeSchedule build_schedule(PpSchedule kind, int pp, int virtual_stages, int micro_batches) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, int, int, int>, PipeSchedule> built;
  static size_t held = 0;  // actions in `built`: bounded to a few tens of MB
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(std::string(kind.name()), pp, virtual_stages, micro_batches);
  if (auto it = built.find(key); it != built.end()) return it->second;
  PipeSchedule s = build_schedule_uncached(kind, pp, virtual_stages, micro_batches);
  size_t actions = 0;
  for (const auto& r : s.ranks) actions += r.size();
  if (held + actions > (size_t{4} << 20)) built.clear(), held = 0;
  held += actions;
  return built.emplace(key, std::move(s)).first->second;
}

}  // namespace shardlab
