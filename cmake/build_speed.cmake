# Build time (issue 62): precompiled headers nearly everywhere, unity builds where no numeric code
# is. Target shardlab, -j2 Release on 2 cores: 597 CPU s before, 328 after.
#
# Precompiled headers: the standard and third-party headers that nearly every C++ file parses,
# built once and reused by every target whose flags match (GCC refuses a PCH built with other macros
# or -f options, and CMake's -Winvalid-pch says so). Three sets:
#  * common: the standard headers and fmt (fmt/format.h comes with check.hpp, in 169 of 177 files);
#  * json: common + nlohmann/json.hpp, for the libraries where most files read or write JSON (in a
#    PCH that every file loads, json costs ~0.5 s a file that does not use it);
#  * cli: common + boost/program_options.hpp for the binary's command files (its own macros).
# Only C++ files get them: $<COMPILE_LANGUAGE:CXX> keeps nvcc's .cu files away. Files that need
# other floating-point flags than their target's (-ffp-contract=off) skip the PCH.
# Under a PCH, GCC 12 -O3 no longer hides its -Warray-bounds false positive inside libstdc++'s
# std::string as a system header's: a vector<string>'s push_back of a long literal's temporary
# shows it (emplace_back does not). SHARDLAB_PCH=OFF builds without (every file must still include
# what it uses).
option(SHARDLAB_PCH "Precompile the standard, fmt, json and program_options headers" ON)
# Unity builds (8 files a unit) for the targets of plumbing, text and JSON (checkpoints, data files,
# compare, reports, the command line, benchmarks), whose files instantiate the same json and fmt
# templates over and over. Not for the numeric targets (backend, model, shard, optim, train, plan):
# a function of one file inlined into another could change what GCC fuses into a multiply-add.
# Names in anonymous namespaces must then differ across a target's files.
option(SHARDLAB_UNITY "Unity-build the non-numeric targets" ON)
if(SHARDLAB_UNITY)
  set_target_properties(shardlab_checkpoint shardlab_data shardlab_compare shardlab_report shardlab
    shardlab_benchmarks PROPERTIES UNITY_BUILD ON)
endif()
if(NOT SHARDLAB_PCH)
  return()
endif()

set(SHARDLAB_PCH_COMMON
  <algorithm> <array> <chrono> <cmath> <cstdint> <cstring> <filesystem> <fstream> <functional> <map>
  <memory> <mutex> <optional> <span> <sstream> <string> <string_view> <thread> <unordered_map> <utility>
  <vector> <fmt/format.h>)
list(TRANSFORM SHARDLAB_PCH_COMMON REPLACE "^<(.+)>$" "$<$<COMPILE_LANGUAGE:CXX>:<\\1$<ANGLE-R>>")

# Reuses the PCH of `from` in each target (when building for CUDA, too: only the .cpp files see it).
function(shardlab_pch_reuse from)
  foreach(target IN LISTS ARGN)
    target_precompile_headers(${target} REUSE_FROM ${from})
  endforeach()
endfunction()

target_precompile_headers(shardlab_core PRIVATE ${SHARDLAB_PCH_COMMON})
shardlab_pch_reuse(shardlab_core shardlab_memory shardlab_model shardlab_optim shardlab_comm shardlab_shard
  shardlab_pipeline shardlab_parallel shardlab_tools)
# The same set again for the targets compiled with -fopenmp (its _OPENMP macro voids a PCH made
# without): once for the backend (with CUDA it defines SHARDLAB_WITH_CUDA, which voids its PCH for
# any file without), once for the planner and the benchmarks.
target_precompile_headers(shardlab_backend PRIVATE ${SHARDLAB_PCH_COMMON})
target_precompile_headers(shardlab_plan PRIVATE ${SHARDLAB_PCH_COMMON})
shardlab_pch_reuse(shardlab_plan shardlab_benchmarks)

target_precompile_headers(shardlab_checkpoint PRIVATE ${SHARDLAB_PCH_COMMON}
  "$<$<COMPILE_LANGUAGE:CXX>:<nlohmann/json.hpp$<ANGLE-R>>")
shardlab_pch_reuse(shardlab_checkpoint shardlab_data shardlab_train shardlab_compare shardlab_report)

target_precompile_headers(shardlab PRIVATE ${SHARDLAB_PCH_COMMON}
  "$<$<COMPILE_LANGUAGE:CXX>:<boost/program_options.hpp$<ANGLE-R>>")

set_source_files_properties(src/model/llama/family.cpp src/model/deepseek/family.cpp PROPERTIES
  SKIP_PRECOMPILE_HEADERS ON)
