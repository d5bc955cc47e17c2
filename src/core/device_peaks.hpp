// device_peaks.hpp — the published peak figures shardlab assumes where it does not measure: the
// MFU line of bench-train on a GPU and the device presets of plan's time model
// (src/plan/plan_time.hpp, `--gpu`). One table, so a figure is corrected in one place;
// a run that can measure (plan --calibrate) never uses it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardlab {

struct DevicePeaks {
  const char* name;
  double dense_bf16_tflops;  // tensor-core peak without sparsity, TFLOP/s per GPU
  double intra_node_gbs;     // bus bandwidth between GPUs of one node (NVLink), GB/s achieved by all-reduce
  double inter_node_gbs;     // bus bandwidth per GPU between nodes, GB/s achieved
  double host_link_gbs;      // device <-> host copies, GB/s achieved
  // Device memory: the total nvidia-smi lists for the part, MiB (its datasheet's "80GB" is a
  // marketing figure; 80 x 10^9 bytes under-counted an H100 by 5 GiB). plan's default budget.
  uint64_t memory_mib = 0;
  // The datasheet figures the time model starts from (it applies its own achievable fractions):
  double hbm_gbs = 0;        // HBM bandwidth, GB/s
  double nvlink_gbs = 0;     // NVLink per GPU and direction, GB/s (half the datasheet's bidirectional total)
  double nic_gbits = 0;      // InfiniBand per NIC, Gb/s
  int nics_per_node = 0;     // compute NICs per node (one per GPU on DGX/HGX)
  int gpus_per_node = 8;
  const char* source = "";   // where the figures come from
  // For the device model that prices a step's cost ledger (src/backend/price.hpp):
  double vector_f32_tflops = 0;  // f32 on the CUDA cores (no tensor cores), TFLOP/s
  int sms = 0;                   // streaming multiprocessors: a kernel with fewer blocks leaves some idle
  uint64_t memory_bytes() const { return memory_mib << 20; }
  // plan's default budget: the memory less kDeviceHeadroomMib.
  uint64_t budget_bytes() const;
};

// What a training process holds on a GPU outside the runtime's pool, which plan's default budget
// leaves free (--device-memory replaces the budget whole): the driver's reserve (nvidia-smi -q's
// "Reserved", about 0.5 GiB, within the total), the CUDA context and cuBLAS's workspace (628.9 MiB
// measured outside the pool on the lent H200, one process, staged transport: docs/gpus.md), and
// room for cuDNN's workspace and NCCL's buffers (4 MiB per channel and peer by default; not yet
// measured across 8 GPUs). 2 GiB in all.
inline constexpr uint64_t kDeviceHeadroomMib = 2048;

// H100 SXM in an 8-GPU node: 989 TFLOP/s dense bf16, NVLink 4 (360 GB/s of bus bandwidth achieved
// by all-reduce), one 400 Gb/s InfiniBand NIC per GPU (45 GB/s achieved), PCIe 5 x16 (25 GB/s).
// bench-train's MFU uses it (989, rounded: kept so its output does not move); plan uses the presets.
inline constexpr DevicePeaks kH100{"H100", 989, 360, 45, 25, 81559, 3350, 450, 400, 8, 8,
                                   "NVIDIA H100 Tensor Core GPU datasheet (SXM5), DGX H100 user guide", 67, 132};

// The presets of `--gpu` (SXM parts, 8 per node, one compute NIC per GPU):
//   a100-80gb  NVIDIA A100 datasheet (2021), 80GB SXM: BF16 tensor core 312 TFLOP/s dense (624 with
//              sparsity), FP32 19.5 TFLOP/s on 108 SMs (A100 whitepaper), HBM2e 2,039 GB/s, NVLink 3
//              600 GB/s bidirectional (12 links x 50 GB/s); DGX A100: 8x ConnectX-6 HDR InfiniBand
//              200 Gb/s for compute. Selene (Narayanan et al. 2021) is DGX A100 80GB nodes.
//   h100-80gb  NVIDIA H100 datasheet, SXM5: BF16 1,979 TFLOP/s with sparsity = 989.4 dense, FP32 67
//              TFLOP/s on 132 SMs (H100 whitepaper: 132 SMs in the SXM5 part), HBM3 3.35 TB/s,
//              NVLink 4 900 GB/s bidirectional; DGX H100: 8x ConnectX-7 NDR 400 Gb/s.
//   h200       NVIDIA H200 datasheet, SXM: BF16 989.4 dense, FP32 67 TFLOP/s (the H100's GH100 die,
//              132 SMs), 141 GB HBM3e at 4.8 TB/s, NVLink 4 900 GB/s; HGX H200 with 8x NDR 400 Gb/s.
//   b200       NVIDIA HGX B200 datasheet (1,000 W): BF16 4.5 PFLOP/s with sparsity = 2,250 dense, FP32
//              80 TFLOP/s, HBM3e 8 TB/s (the driver's 7,680-bit bus at 3,996 MHz gives 7.67 TB/s:
//              pytorch/ao#4002, which also reads 148 SMs from cudaGetDeviceProperties), NVLink 5 1.8
//              TB/s bidirectional; DGX B200: 8x ConnectX-7 400 Gb/s.
// The achieved bus bandwidths (intra/inter) are plan/1's figures, kept for reference (plan/2 applies
// its achievable shares to the datasheet ones); host_link_gbs is PCIe achieved, plan/2's host link.
// Memory is the total nvidia-smi lists on an idle GPU (memory.total), as public nvidia-smi output
// shows it: A100-SXM4-80GB 81,920 MiB (80.00 GiB), H100 80GB HBM3 (SXM5) 81,559 MiB (79.65 GiB),
// H200 (SXM) 143,771 MiB (140.40 GiB), B200 183,359 MiB (179.06 GiB). Not modelled: what the driver reserves of it (nvidia-smi -q's
// "Reserved", about 0.5 GiB; cudaMemGetInfo's total leaves it out) and what a process's CUDA
// context, cuBLAS workspaces and NCCL buffers take (hundreds of MiB, by driver and library version).
// plan's peaks are this runtime's pool; its default budget leaves kDeviceHeadroomMib for those.
inline constexpr DevicePeaks kA100_80GB{"a100-80gb", 312, 240, 22.5, 20, 81920, 2039, 300, 200, 8, 8,
                                        "NVIDIA A100 datasheet (80GB SXM), DGX A100 (8x HDR 200 Gb/s)", 19.5, 108};
inline constexpr DevicePeaks kH100_80GB{"h100-80gb", 989.4, 360, 45, 25, 81559, 3350, 450, 400, 8, 8,
                                        "NVIDIA H100 datasheet (SXM5), DGX H100 (8x NDR 400 Gb/s)", 67, 132};
inline constexpr DevicePeaks kH200{"h200", 989.4, 360, 45, 25, 143771, 4800, 450, 400, 8, 8,
                                   "NVIDIA H200 datasheet (SXM), HGX H200 (8x NDR 400 Gb/s)", 67, 132};

inline constexpr DevicePeaks kB200{"b200", 2250, 720, 45, 25, 183359, 8000, 900, 400, 8, 8,
                                   "NVIDIA HGX B200 datasheet (1,000 W), DGX B200 (8x ConnectX-7 400 Gb/s)", 80, 148};

// The preset of that name (a100-80gb, h100-80gb, h200, b200); InputError listing them otherwise.
const DevicePeaks& device_preset(std::string_view name);
std::vector<std::string> device_preset_names();

}  // namespace shardlab
