// zeropp.cpp — ZeRO++'s collectives (zeropp.hpp).
#include "shard/zeropp.hpp"

namespace shardlab {

ZeroPPBytes zeropp_step_bytes(const ZeroPP& z, double params, int S, int L, double param_bytes, double grad_bytes) {
  auto per_element = [&](int bits) {
    const QuantSpec q{bits, z.block};
    return double(q.record_words()) * 4 / double(q.block);
  };
  const double fs = (S - 1.0) / S, fl = (L - 1.0) / L, N = double(S) / L;
  ZeroPPBytes b;
  b.gather = fs * params * (z.weight_bits ? per_element(z.weight_bits) : param_bytes);
  (z.secondary ? b.back_node : b.back_shard) = z.secondary ? fl * params * param_bytes : b.gather;
  if (!z.grad_bits) {
    b.grads_shard = fs * params * grad_bytes;
  } else {
    b.grads_node = fl * params * per_element(z.grad_bits);
    b.grads_cross = (N - 1) / N * params / L * per_element(z.grad_bits);
  }
  return b;
}

ZeroPPComms::ZeroPPComms(const ZeroPP& cfg, Mesh& mesh, Pool& pool, Communicator& shard)
    : cfg_(cfg), pool_(pool), shard_(shard) {
  if (cfg_.weight_bits) check_quant_spec(spec(cfg_.weight_bits), "--quantize-weights");
  if (cfg_.grad_bits) check_quant_spec(spec(cfg_.grad_bits), "--quantize-grads");
  if (!cfg_.hierarchical()) return;
  node_ = &mesh.comm(CommAxis::dp_shard_node);
  cross_ = &mesh.comm(CommAxis::dp_shard_cross);
  SHARD_CHECK(node_->world_size() * cross_->world_size() == shard_.world_size() &&
                  shard_.rank() == cross_->rank() * node_->world_size() + node_->rank(),
              "ZeRO++ node groups: rank {} of a shard group of {} is rank {} of {} on its node and {} of {} nodes",
              shard_.rank(), shard_.world_size(), node_->rank(), node_->world_size(), cross_->rank(),
              cross_->world_size());
}

ZeroPPComms::QuantizedGather ZeroPPComms::gather_quantized(Tensor shard, const std::string& name) {
  const QuantSpec q = spec(cfg_.weight_bits);
  const int64_t words = q.words(shard.numel());
  QuantizedGather g;
  g.mine = pool_.alloc(DType::f32, words, Category::comm_buffer, name + " int8 shard");
  g.all = pool_.alloc(DType::f32, words * shard_.world_size(), Category::comm_buffer, name + " int8 gathered");
  Tensor mine = g.mine.flat(DType::f32).slice(0, words), all = g.all.flat(DType::f32).slice(0, words * shard_.world_size());
  ops::quantize_blocks(pool_.backend(), mine, shard, shard.numel(), 1, shard.numel(), q);
  g.work = shard_.all_gather(mine, all);
  return g;
}

void ZeroPPComms::finish_gather(QuantizedGather& g, Tensor full, int64_t shard) {
  const QuantSpec q = spec(cfg_.weight_bits);
  const int64_t S = shard_.world_size();
  g.work.wait();
  ops::dequantize_blocks(pool_.backend(), full.slice(0, S * shard), g.all.flat(DType::f32).slice(0, S * q.words(shard)),
                         S, shard, q, false);
  g.mine.reset();
  g.all.reset();
}

Block ZeroPPComms::keep_secondary(Tensor full, const std::string& name) {
  const int64_t n = secondary_numel(full.numel());
  Block b = pool_.alloc(full.dtype(), n, Category::secondary_shard, name + " secondary shard");
  pool_.backend().copy(b.flat(full.dtype()).slice(0, n), full.slice(node_->rank() * n, n));
  return b;
}

Work ZeroPPComms::gather_secondary(Tensor secondary, Tensor full) {
  return node_->all_gather(secondary.slice(0, secondary_numel(full.numel())), full);
}

// Chunk j of the S chunks of `full` belongs to shard rank j = n L + l (node n, place l). Step 1:
// within the node, place l' receives from every peer the chunks n L + l' of every node n,
// quantized, and sums them (f32). Step 2: across the nodes at one place, node n receives the node
// sums of its chunk n L + l from every node, quantized, and sums them: the group's sum of chunk j.
ZeroPPComms::QuantizedReduction ZeroPPComms::start_reduction(Tensor full, int64_t c, const std::string& name,
                                                              Tensor feedback) {
  Backend& be = pool_.backend();
  const QuantSpec q = spec(cfg_.grad_bits);
  const int64_t L = node_->world_size(), N = cross_->world_size(), rw = q.words(c), n = L * N * rw;
  SHARD_CHECK(full.numel() == c * N * L, "qgZ: {} gradient values for {} x {} chunks of {}", full.numel(), N, L, c);
  QuantizedReduction r;
  r.chunk = c;
  r.send = pool_.alloc(DType::f32, n, Category::comm_buffer, name + " qgZ node send");
  r.recv = pool_.alloc(DType::f32, n, Category::comm_buffer, name + " qgZ node recv");
  Tensor send = r.send.flat(DType::f32).slice(0, n);
  const bool ef = feedback.data() != nullptr;
  SHARD_CHECK(!ef || (full.dtype() == DType::f32 && feedback.numel() >= full.numel()),
              "qgZ error feedback: {} {} gradient values, {} of feedback", full.numel(), dtype_name(full.dtype()),
              feedback.numel());
  Tensor e = ef ? feedback.slice(0, full.numel()) : Tensor();
  if (ef) be.axpy(-1.f, e, full);  // the gradient plus what the last quantization lost
  for (int64_t p = 0; p < L; ++p)  // to place p: rows n L + p, n = 0 .. N-1
    ops::quantize_blocks(be, send.slice(p * N * rw, N * rw), full.slice(p * c, full.numel() - p * c), L * c, N, c, q);
  if (ef) {  // e = dequantized - sent: minus this quantization's error
    be.copy(e, full);
    be.scale(e, -1.f);
    for (int64_t p = 0; p < L; ++p)
      ops::dequantize_blocks(be, e.slice(p * c, full.numel() - p * c), send.slice(p * N * rw, N * rw), N, c, q, true, L * c);
  }
  r.work = node_->all_to_all(send, r.recv.flat(DType::f32).slice(0, n));
  r.stage = 1;
  return r;
}

void ZeroPPComms::advance(QuantizedReduction& r, const std::string& name) {
  SHARD_CHECK(r.stage == 1, "qgZ: advancing a reduction at stage {}", r.stage);
  Backend& be = pool_.backend();
  const QuantSpec q = spec(cfg_.grad_bits);
  const int64_t c = r.chunk, L = node_->world_size(), N = cross_->world_size(), rw = q.words(c);
  r.work.wait();
  r.sum = pool_.alloc(DType::f32, N * c, Category::comm_buffer, name + " qgZ node sums");
  Tensor sum = r.sum.flat(DType::f32).slice(0, N * c), recv = r.recv.flat(DType::f32).slice(0, L * N * rw);
  be.fill(sum, 0.f);
  for (int64_t p = 0; p < L; ++p) ops::dequantize_blocks(be, sum, recv.slice(p * N * rw, N * rw), N, c, q, true);
  r.send.reset();
  r.recv.reset();
  r.stage = N == 1 ? 3 : 2;  // one node: nothing crosses, nothing more to quantize
  if (N == 1) return;
  r.send = pool_.alloc(DType::f32, N * rw, Category::comm_buffer, name + " qgZ cross send");
  r.recv = pool_.alloc(DType::f32, N * rw, Category::comm_buffer, name + " qgZ cross recv");
  ops::quantize_blocks(be, r.send.flat(DType::f32).slice(0, N * rw), sum, c, N, c, q);
  r.sum.reset();
  r.work = cross_->all_to_all(r.send.flat(DType::f32).slice(0, N * rw), r.recv.flat(DType::f32).slice(0, N * rw));
}

void ZeroPPComms::finish_reduction(QuantizedReduction& r, Tensor out, const std::string& name) {
  if (r.stage == 1) advance(r, name);
  Backend& be = pool_.backend();
  const int64_t c = r.chunk;
  SHARD_CHECK(out.numel() == c, "qgZ: a chunk of {} into {} values", c, out.numel());
  if (r.stage == 2) {
    const QuantSpec q = spec(cfg_.grad_bits);
    const int64_t N = cross_->world_size(), rw = q.words(c);
    r.work.wait();
    r.sum = pool_.alloc(DType::f32, c, Category::comm_buffer, name + " qgZ sum");
    be.fill(r.sum.flat(DType::f32).slice(0, c), 0.f);
    for (int64_t n = 0; n < N; ++n)
      ops::dequantize_blocks(be, r.sum.flat(DType::f32).slice(0, c), r.recv.flat(DType::f32).slice(n * rw, rw), 1, c, q,
                             true);
    r.send.reset();
    r.recv.reset();
    r.stage = 3;
  }
  be.cast(out, r.sum.flat(DType::f32).slice(0, c));
  r.sum.reset();
}

void ZeroPPComms::reduce_scatter_quantized(Tensor full, Tensor out, const std::string& name) {
  QuantizedReduction r = start_reduction(full, out.numel(), name);
  finish_reduction(r, out, name);
}

}  // namespace shardlab
