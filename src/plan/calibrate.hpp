// calibrate.hpp — `plan --calibrate`: the rates of plan's time model, measured on this machine by
// every rank at once (so they see the contention a run sees), averaged over the ranks but flops:
//   flops       model FLOPs per second of single-rank training steps of the model (the median of
//               10) at the planned micro-batch and every power of two below it, the slowest rank's
//               (a step goes at its pace), the optimizer's update taken out (the model adds each
//               layout's own); every other kernel inside, not only the GEMMs; a layout takes its own
//               micro-batch's (DeviceRates::flops_at), FLOPs counted as the time model counts them
//               (megatron_flops: every GEMM, the attention s x s whole)
//   links       bus bandwidth of an f32 all-reduce of one unit's size over the ranks (the same
//               figure within and between nodes: one machine has one link)
//   host link   Backend::copy between the host tier and the device tier, 64 MiB
//   AdamW       bench-adamw's host kernel (on the CPU backend the device's is the same kernel)
//   sync        seconds a rank loses at a data-parallel collective it waits for inside a pass: rounds
//               of GEMMs (about a unit's forward) each ended by a barrier, less the same without,
//               per round, the ranks' mean (the model charges zero2's and zero3's waits per unit)
//   overlap     0: MPI's collectives progress only inside MPI calls on the CPU backend
// The time model then runs every GEMM at the whole-step rate (Achievable::whole_step).
#pragma once
#include "src/plan/plan.hpp"

namespace shardlab {

PlanRates calibrate_rates(Backend& be, Communicator& comm, const PlanConfig& cfg, int64_t micro_batch, std::FILE* log);

}  // namespace shardlab
