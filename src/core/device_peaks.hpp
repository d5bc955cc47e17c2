// device_peaks.hpp — the published peak figures shardlab assumes where it does not measure: the
// MFU line of bench-train on a GPU and the default rates of `plan`. One table, so a figure is
// corrected in one place; a run that can measure (plan --calibrate) never uses it.
#pragma once

namespace shardlab {

struct DevicePeaks {
  const char* name;
  double dense_bf16_tflops;  // tensor-core peak without sparsity, TFLOP/s per GPU
  double intra_node_gbs;     // bus bandwidth between GPUs of one node (NVLink), GB/s
  double inter_node_gbs;     // bus bandwidth per GPU between nodes, GB/s
  double host_link_gbs;      // device <-> host copies, GB/s achieved
};

// H100 SXM in an 8-GPU node: 989 TFLOP/s dense bf16, NVLink 4 (360 GB/s of bus bandwidth achieved
// by all-reduce), one 400 Gb/s InfiniBand NIC per GPU (45 GB/s achieved), PCIe 5 x16 (25 GB/s).
inline constexpr DevicePeaks kH100{"H100", 989, 360, 45, 25};

}  // namespace shardlab
