// gpt2.hpp — GPT-2 as a list of Units with explicit forward and backward.
//
// A Unit is the FSDP wrapping granularity: embedding, each transformer block, and the head
// (ln_f + the lm head tied to wte). A unit computes with the tensors a ParamSet hands it, wherever
// they live (a full replica, or a freshly gathered unit), and keeps what backward needs in Saved,
// allocated from the pool as `activations`. Every kernel goes through Backend.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memory/estimator.hpp"
#include "memory/pool.hpp"
#include "src/model/spec.hpp"

namespace shardlab {

// Token ids for one micro-batch, on the backend's device: inputs and targets, (B, T) each.
struct Batch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t B = 0, T = 0;
};

// Tensors by name (views; the owner is elsewhere).
class ParamSet {
 public:
  void set(const std::string& name, Tensor t) { map_[name] = t; }
  Tensor operator()(const std::string& name) const;
  bool has(const std::string& name) const { return map_.count(name) != 0; }

 private:
  std::map<std::string, Tensor> map_;
};

// What a unit's forward keeps for its backward; freed (back to the pool) by clear().
class Saved {
 public:
  Tensor add(Pool& pool, const std::string& name, std::initializer_list<int64_t> shape);
  Tensor operator()(const std::string& name) const;
  void clear() {
    tensors_.clear();
    blocks_.clear();
  }

 private:
  std::vector<Block> blocks_;
  std::map<std::string, Tensor> tensors_;
};

struct UnitContext {
  Backend& be;
  Pool& pool;
  const ModelSpec& spec;
  Batch batch;
};

class Unit {
 public:
  explicit Unit(UnitLayout layout) : layout_(std::move(layout)) {}
  virtual ~Unit() = default;
  const UnitLayout& layout() const { return layout_; }
  const std::string& name() const { return layout_.name; }
  // Tensors of other units this unit computes with (the head borrows wte.weight).
  virtual std::vector<std::string> borrowed() const { return {}; }
  // Elements of this unit's output for a (B, T) batch, of what its forward saves for backward, and
  // of the scratch its backward holds (all f32). The memory estimator reads these; a test checks
  // them against what the pool records.
  virtual int64_t out_elems(const ModelSpec& s, int64_t B, int64_t T) const { return B * T * s.dim; }
  virtual int64_t saved_elems(const ModelSpec& s, int64_t B, int64_t T) const { return 0; }
  virtual int64_t backward_workspace_elems(const ModelSpec& s, int64_t B, int64_t T) const { return 0; }

  // in: the previous unit's output (empty for the embedding); out: out_elems floats.
  virtual void forward(UnitContext& ctx, const ParamSet& p, Tensor in, Tensor out, Saved& saved) = 0;
  // dout: gradient of out; din: receives the gradient of in (overwritten; empty for the
  // embedding). Parameter gradients in g accumulate.
  virtual void backward(UnitContext& ctx, const ParamSet& p, const ParamSet& g, Saved& saved, Tensor in,
                        Tensor dout, Tensor din) = 0;

 private:
  UnitLayout layout_;
};

std::vector<std::unique_ptr<Unit>> make_gpt2_units(const ModelSpec& spec);

// The tensors unit u borrows from other units (tied weights), with the index of their owner.
struct BorrowedTensor {
  size_t owner;
  const TensorDecl* decl;
};
std::vector<BorrowedTensor> borrowed_tensors(const std::vector<std::unique_ptr<Unit>>& units, size_t u);

// The units as the memory estimator sees them, for micro-batches of B sequences of T tokens.
std::vector<UnitMemDesc> gpt2_mem_desc(const ModelSpec& spec, int64_t B, int64_t T);

}  // namespace shardlab
