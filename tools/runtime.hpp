// runtime.hpp — what commands do with the run options: backends, transports, the watchdog, files.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "src/backend/backend.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

namespace shardlab {

// The cpu backend with --threads and --cpu-gemm, its threads shared among this node's ranks.
std::unique_ptr<Backend> make_cpu(const cli::RunOptions& run, const Context& ctx);
// The backend of `device`: the cpu one, or the CUDA one on this rank's local GPU.
std::unique_ptr<Backend> make_device_backend(Device device, const cli::RunOptions& run, const Context& ctx);
// --comm for a backend on `device`: the transport this rank uses.
CommKind comm_for(const std::string& comm, Device device, const Context& ctx);
// --collective-timeout: rank 0 names a fresh job directory for the progress records (every rank
// creates it on its own node), then each rank starts its watchdog. 0 = off. save_timeout_s
// (train's --save-timeout): the limit of waits inside a checkpoint save; 0 = those not watched.
void start_watchdog(const Context& ctx, double timeout_s, double save_timeout_s = 0);
// For a job that spans hosts, a collective that times the links between them (link_probe.hpp; rank
// 0 gets the line that names a straggler); an empty function on one host.
std::function<std::string()> link_checker(const Context& ctx);
// Ranks per node: MPI's shared-memory split, or $SHARDLAB_RANKS_PER_NODE, which lets one machine
// pretend to be several nodes (tests, rehearsals).
int ranks_per_node(const Context& ctx);
// --ranks-per-node for the per-link counts: `given` where given (a warning on rank 0 where MPI's
// real placement spans nodes otherwise), else, when the job spans nodes, MPI's placement where it
// is consecutive blocks of equal size (0, warned, where it is not; 0 on one node).
int node_ranks_for_links(const Context& ctx, int world, int given);
// On the cpu with no --device-memory nothing bounds a step but the host: a step that cannot fit
// this node's memory (shared by its ranks) is an input error naming the sizes, found before any
// allocation by predicting the step (src/train/predict.hpp; it allocates nothing).
void require_step_fits_host(const TrainConfig& cfg, const cli::TrainOptions& opts, const Context& ctx);
// Writes a report file and says so; `option` names the flag in errors.
void write_text(const std::string& path, const std::string& text, const char* option);

}  // namespace shardlab
