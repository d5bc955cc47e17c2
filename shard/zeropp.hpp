// zeropp.hpp — ZeRO++'s collectives (Wang et al. 2023) for zero3 (shard/zero.cpp): quantized
// weight all-gathers (qwZ), a secondary parameter shard inside the node for backward's all-gather
// (hpZ), and a hierarchical all-to-all of quantized gradients in place of the reduce-scatter (qgZ).
// The levers and their options: ZeroPP in shard/strategy.hpp; the record format:
// src/backend/ops/quantize.hpp.
//
// With S ranks in the shard group, N nodes of L of them (S = N L), a unit of P padded elements and
// b-byte parameters and gradients, the bus bytes per rank per step of the three collectives are
//   forward all-gather    plain (S-1)/S P b         qwZ (S-1)/S P q8 (dp_shard_cp, crosses nodes)
//   backward all-gather   plain (S-1)/S P b         hpZ (L-1)/L P b  (dp_shard_node, inside the node)
//   gradient reduction    plain (S-1)/S P b         qgZ (L-1)/L P qg (dp_shard_node)
//                                                     + (N-1)/N P/L qg (dp_shard_cross, across nodes)
// where qk = (1 + block k / 32) * 4 / block bytes per element: k-bit codes and one f32 scale per block.
#pragma once
#include <string>

#include "memory/pool.hpp"
#include "shard/strategy.hpp"
#include "src/backend/ops/quantize.hpp"

namespace shardlab {

// The table above for `params` parameters (the whole model's, unpadded) in one micro-step: bus bytes
// per rank of each collective on its link. Without a lever its entry is plain zero3's.
struct ZeroPPBytes {
  double gather = 0;       // forward all-gather, over the shard group
  double back_shard = 0;   // backward all-gather over the shard group (without hpZ)
  double back_node = 0;    // backward all-gather inside the node (hpZ)
  double grads_shard = 0;  // the reduce-scatter over the shard group (without qgZ)
  double grads_node = 0, grads_cross = 0;  // qgZ's all-to-alls inside the node and across nodes
  double total() const { return gather + back_shard + back_node + grads_shard + grads_node + grads_cross; }
  double inter_node() const { return gather + back_shard + grads_shard + grads_cross; }  // when S spans nodes
};
// S the shard group, L of its ranks on a node; param_bytes and grad_bytes per element as they move.
ZeroPPBytes zeropp_step_bytes(const ZeroPP& z, double params, int S, int L, double param_bytes, double grad_bytes);

class ZeroPPComms {
 public:
  // shard: the strategy's shard group (dp_shard_cp); the node groups come from the mesh when hpZ or
  // qgZ is on.
  ZeroPPComms(const ZeroPP& cfg, Mesh& mesh, Pool& pool, Communicator& shard);
  const ZeroPP& cfg() const { return cfg_; }

  // qwZ. A quantized all-gather in flight: the records of this rank's shard and of every rank's.
  struct QuantizedGather {
    Block mine, all;
    Work work;  // declared last: waited on before the buffers go
    explicit operator bool() const { return static_cast<bool>(all); }
  };
  // Quantizes `shard` (the param dtype) and issues the all-gather of its records.
  QuantizedGather gather_quantized(Tensor shard, const std::string& name);
  // After g.work: every rank's shard, dequantized, into full (S x shard values).
  void finish_gather(QuantizedGather& g, Tensor full, int64_t shard);

  // hpZ. Elements of a unit of `padded` elements this rank keeps: padded / L.
  int64_t secondary_numel(int64_t padded) const { return padded / node_size(); }
  // This rank's slice of a gathered unit (its place in its node), in a Block of its own.
  Block keep_secondary(Tensor full, const std::string& name);
  // The all-gather inside the node that rebuilds the unit from the secondary shards.
  Work gather_secondary(Tensor secondary, Tensor full);

  // qgZ, in three calls so the all-to-alls overlap compute: start quantizes full (the reduce dtype,
  // S chunks of `chunk`) and issues the all-to-all inside the node; advance waits for it, sums the
  // node's chunks in f32 and issues the one across nodes; finish waits for that and writes this
  // rank's chunk, summed over the shard group, into out. The caller may free full after start.
  struct QuantizedReduction {
    int stage = 0;  // 1: the node's all-to-all in flight; 2: the nodes' in flight; 3: summed
    int64_t chunk = 0;
    Block send, recv;  // the records of the all-to-all in flight
    Block sum;         // f32: the node's sums (stage 2: of this rank's chunk of every node; 3: the total)
    Work work;         // declared last: waited on before the buffers go
  };
  // feedback (error feedback; f32 full only): what this rank's last quantization of its gradient got
  // wrong, negated; subtracted from full first, then replaced by this one's. Empty: none.
  QuantizedReduction start_reduction(Tensor full, int64_t chunk, const std::string& name, Tensor feedback = {});
  void advance(QuantizedReduction& r, const std::string& name);
  void finish_reduction(QuantizedReduction& r, Tensor out, const std::string& name);
  // The three at once (out holds the sum on return).
  void reduce_scatter_quantized(Tensor full, Tensor out, const std::string& name);

 private:
  int node_size() const { return node_ ? node_->world_size() : shard_.world_size(); }
  QuantSpec spec(int bits) const { return {bits, cfg_.block}; }

  ZeroPP cfg_;
  Pool& pool_;
  Communicator& shard_;
  Communicator* node_ = nullptr;   // dp_shard_node: the shard group's ranks on this node
  Communicator* cross_ = nullptr;  // dp_shard_cross: one per node, at this rank's place in it
};

}  // namespace shardlab
