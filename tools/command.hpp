// command.hpp — shardlab's commands and what each gets from the entry point.
//
//   shardlab train               train any family under any strategy and mesh on any number of ranks
//   shardlab compare             every strategy on the same model, data and seed, side by side
//   shardlab profile             the memory profile: every strategy x category per rank, predicted and
//                                measured; --time: the step's time, predicted from its cost ledger
//   shardlab plan                the fastest configuration that fits N ranks, predicted (and measured)
//   shardlab sample              text from a model file or a checkpoint, on one rank
//   shardlab export              a checkpoint as an HF model directory or one safetensors file
//   shardlab tokenize            text files to llm.c token shards (a validation shard, then train shards)
//   shardlab report              a --log file: a text summary, and the run report (--html)
//   shardlab info                runtime facts per rank: build, backend, threads, ranks per node
//   shardlab bench-collectives   collective benchmark (nccl-tests table) over mpi, nccl, staged or sim
//   shardlab bench-gemm          sgemm GFLOP/s of each CPU library on GPT-2 products, and the pick
//   shardlab bench-train         training-step throughput beside the sgemm ceiling (a lever against none)
//   shardlab bench-attention     attention forward + backward alone, fused against naive
//   shardlab bench-adamw         the host optimizer of --offload against STREAM's triad
//   shardlab bench-plan-validation  plan's time model against Narayanan et al. 2021, Table 1
//
// One file per command (tools/cmd_*.cpp); their options come from tools/options.hpp, their exit
// codes from src/core/exit_code.hpp. A command never names the transport: it opens communicators
// through the Context's ProcessGroup, which the entry point (main.cpp) builds over MPI.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "src/comm/communicator.hpp"
#include "src/comm/mpi_runtime.hpp"
#include "src/core/exit_code.hpp"

namespace shardlab {

struct Context {
  const MpiRuntime& mpi;
  // The world's processes, with collectives over `kind` (resolved: comm_for in runtime.hpp). mpi
  // carries host buffers, nccl and staged device buffers (staged also host ones).
  std::function<ProcessGroup(CommKind kind)> world;
};

using Args = std::vector<std::string>;

ExitCode cmd_train(const Args& args, const Context& ctx);
ExitCode cmd_compare(const Args& args, const Context& ctx);
ExitCode cmd_profile(const Args& args, const Context& ctx);
ExitCode cmd_plan(const Args& args, const Context& ctx);
ExitCode cmd_sample(const Args& args, const Context& ctx);
ExitCode cmd_export(const Args& args, const Context& ctx);
ExitCode cmd_tokenize(const Args& args, const Context& ctx);
ExitCode cmd_report(const Args& args, const Context& ctx);
ExitCode cmd_info(const Args& args, const Context& ctx);
ExitCode cmd_bench_collectives(const Args& args, const Context& ctx);
ExitCode cmd_bench_gemm(const Args& args, const Context& ctx);
ExitCode cmd_bench_train(const Args& args, const Context& ctx);
ExitCode cmd_bench_adamw(const Args& args, const Context& ctx);
ExitCode cmd_bench_attention(const Args& args, const Context& ctx);
ExitCode cmd_bench_plan_validation(const Args& args, const Context& ctx);

}  // namespace shardlab
