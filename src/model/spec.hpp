// spec.hpp — ModelSpec (a model's family and shape), presets, its JSON form, and the parameter
// layout: which tensors each Unit owns, in which order, with which shape, initialisation and
// weight-decay flag. What differs between families (which tensors, their names, the FLOPs) is the
// family's (family.hpp); this header is model-neutral.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include "src/core/dtype.hpp"

namespace shardlab {

// The model families shardlab implements; family.hpp finds each one's ModelFamily.
enum class FamilyId : uint8_t { gpt2, llama, mixtral, qwen3_moe, qwen3, deepseek_v3 };

// Llama 3.1's RoPE frequency scaling (Hugging Face's rope_scaling of type "llama3"): wavelengths
// longer than original_max_positions / low_freq_factor are stretched by `factor`, those shorter
// than original_max_positions / high_freq_factor kept, and the band between interpolated.
// factor 0: no scaling.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_positions = 0;  // HF's original_max_position_embeddings
  bool enabled() const { return factor != 0; }
  bool operator==(const RopeScaling&) const = default;
};

// A mixture-of-experts MLP (Mixtral, Qwen3-MoE; blocks/moe.hpp) in every decoder layer: a router
// (linear, softmax over the experts, top-k, renormalised when norm_topk) and `experts` SwiGLU MLPs
// of width ffn_dim. experts 0: a dense MLP. aux_coef: the load-balancing loss's weight in the
// objective (HF's router_aux_loss_coef).
struct MoeSpec {
  int64_t experts = 0;  // E
  int64_t top_k = 0;    // k, experts per token
  int64_t ffn_dim = 0;  // each expert's MLP width
  bool norm_topk = false;
  double aux_coef = 0;
  // Whether the objective adds aux_coef x the balancing loss (HF's output_router_logits: transformers
  // adds it only then, and a config without the field has it false). It is computed and reported
  // either way.
  bool aux_loss = true;
  // DeepSeek-V3's router (sigmoid): scores sigmoid(logits); a token's k experts are those with the
  // largest score + the layer's correction bias (e_score_correction_bias) among the topk_groups of
  // `groups` contiguous groups whose two best biased scores sum highest; their weights the unbiased
  // scores (over their sum + 1e-20 when norm_topk), times routed_scale. Softmax routers: groups 1,
  // routed_scale 1.
  bool sigmoid = false;
  int64_t groups = 1, topk_groups = 1;
  double routed_scale = 1.0;
  int64_t shared_ffn = 0;    // the shared experts' width (their count x ffn_dim), beside the routed ones; 0: none
  int64_t dense_layers = 0;  // the first layers have a dense MLP of the spec's ffn_dim (first_k_dense_replace)
  // The sigmoid router's auxiliary-loss-free balancing (--moe-bias-update-rate, DeepSeek-V3's γ):
  // after each step every layer's correction bias moves by bias_rate x sign(mean load - load) per
  // expert, the loads counted over the global batch (blocks/moe.hpp). 0: the bias stays as loaded
  // (transformers' training); the family's presets and config.json imports: 0.001, the paper's.
  double bias_rate = 0;
  bool enabled() const { return experts > 0; }
  bool sparse(int64_t layer) const { return enabled() && layer >= dense_layers; }
  bool operator==(const MoeSpec&) const = default;
};

// YaRN (a DeepSeek config's rope_parameters of type yarn, transformers' _compute_yarn_parameters):
// the rope channels' frequencies divided by `factor` below the band of beta_fast to beta_slow
// rotations over original_max_positions, kept above it, blended in it; and the softmax scale times
// mscale^2, mscale = 0.1 mscale_all_dim ln(factor) + 1 (1 when mscale_all_dim is 0). factor 0: none.
struct YarnSpec {
  double factor = 0, mscale = 0, mscale_all_dim = 0, beta_fast = 32, beta_slow = 1;
  int64_t original_max_positions = 0;
  bool truncate = true;  // the band's ends rounded out to whole channels
  bool enabled() const { return factor != 0; }
  double softmax_scale() const;  // mscale^2 (1 without YaRN)
  bool operator==(const YarnSpec&) const = default;
};

// DeepSeek's multi-head latent attention (deepseek/): queries through a low-rank path (q_rank > 0:
// q_a_proj, RMSNorm, q_b_proj) or one projection (0: q_proj); keys and values from a latent of
// kv_rank channels (kv_a_proj_with_mqa, RMSNorm, kv_b_proj) and one rotary key part of `rope`
// channels every head shares. A head's query and key are [nope | rope] channels, its value `v`.
// kv_rank 0: none (every other family's attention).
struct MlaSpec {
  int64_t q_rank = 0, kv_rank = 0, nope = 0, rope = 0, v = 0;
  bool interleave = true;  // RoPE rotates channel pairs (2i, 2i + 1) (HF's rope_interleave), else (i, i + rope/2)
  // num_nextn_predict_layers: DeepSeek-V3's multi-token prediction modules, read and written back,
  // never built or trained (as transformers).
  int64_t nextn = 0;
  YarnSpec yarn;  // RoPE's YaRN scaling of the rope channels, none unless set
  bool enabled() const { return kv_rank > 0; }
  int64_t qk() const { return nope + rope; }
  bool operator==(const MlaSpec&) const = default;
};

// How attention is computed (--attention): the fused kernel (ops/flash_attention.hpp; O(T) memory,
// the default), the naive one that materialises the (B, H, T, T) probabilities (the reference), or
// cuDNN's fused attention on a GPU (ops/cudnn_attention.hpp; bf16 inside, saves what flash saves).
enum class AttentionKernel : uint8_t { flash, naive, cudnn };
AttentionKernel parse_attention_kernel(const std::string& s);  // InputError naming the choices otherwise
const char* attention_kernel_name(AttentionKernel k);

struct ModelSpec {
  std::string name = "custom";
  int64_t layers = 0;  // L
  int64_t dim = 0;     // C
  int64_t heads = 0;   // H
  int64_t seq = 0;     // T, the longest sequence (rows of wpe)
  int64_t vocab = 0;   // V
  FamilyId family = FamilyId::gpt2;
  // Fields some families need. Their defaults are GPT-2's, so a spec built from the six sizes
  // above is the GPT-2 it always was; a family rejects values its units do not compute.
  int64_t kv_heads = 0;    // heads of K and V (grouped-query attention); 0: as many as heads
  int64_t ffn_dim = 0;     // the MLP's hidden width; 0: 4C
  double norm_eps = 1e-5;  // the normalisation's epsilon
  double rope_theta = 0;   // rotary position embedding base; 0: none (learned positions, wpe)
  bool tied_head = true;   // the LM head is the token embedding's transpose
  RopeScaling rope_scaling;  // none unless set (rope_theta > 0 then)
  int64_t head_dim = 0;      // each attention head's size; 0: dim / heads
  bool qk_norm = false;      // RMSNorm of every query and key head before RoPE (Qwen3)
  MoeSpec moe;               // experts in place of the dense MLP (none unless set)
  MlaSpec mla;               // multi-head latent attention (none unless set)
  // How the model computes, not what it is: not in its JSON form (a checkpoint resumes under either).
  AttentionKernel attention = AttentionKernel::flash;
  DType activation_dtype = DType::f32;  // --activation-dtype: its saved activations' (f32, bf16: Saved)
  int64_t loss_chunk = 0;  // --loss-chunk: the head's loss this many positions at a time (0: the (N, V) logits whole)
  // --moe-capacity-factor: each expert takes at most ceil(F * N * k / E) of a micro-batch's N
  // tokens per layer, the rest dropped (their slot adds nothing); 0: dropless.
  double moe_capacity_factor = 0;
  int64_t num_kv_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t ffn_hidden() const { return ffn_dim > 0 ? ffn_dim : 4 * dim; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : dim / heads; }

  void validate() const;  // throws InputError naming the bad value (the family's checks included)
  std::string describe() const;  // "gpt2 (L=12 C=768 H=12 T=1024 V=50257, 124.44M params)"
};

// Every family's presets (family.hpp): GPT-2's tiny (tests), small (the embedded demo), gpt2,
// gpt2-medium, gpt2-large, gpt2-xl; Llama's llama-tiny, llama-small, llama2-7b, llama3-8b,
// llama3-70b, llama3-405b, tinyllama-1.1b, smollm-135m. InputError naming the presets for an
// unknown name.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// {"family", "name", "layers", "dim", "heads", "seq", "vocab"}, and those of kv_heads, ffn_dim,
// norm_eps, rope_theta and tied_head that differ from their defaults, and "rope_scaling"
// ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) when
// set, and "head_dim", "qk_norm" and "moe" ({"experts", "top_k", "ffn_dim", "norm_topk",
// "aux_coef"}) when set: the form checkpoints and reports store.
nlohmann::json spec_to_json(const ModelSpec& spec);
// The inverse, validated: each size must be an integer (at least 1; vocab at least 2), a present
// "name" a string (absent: "custom"), a present "family" a known family's name (absent: gpt2, as
// specs written before families were), and the whole pass ModelSpec::validate. Throws InputError.
ModelSpec spec_from_json(const nlohmann::json& j);

enum class Init : uint8_t { normal, zeros, ones };

// Tensor parallelism (Megatron-LM's layout, --tp): which part of a model each rank of a
// tensor-parallel group of `degree` ranks computes. Units are built for one (degree, rank); with
// sequence_parallel the activations between the tensor-parallel regions (norms, residuals, the
// units' inputs and outputs) are split along the B*T token rows too.
struct TpConfig {
  int degree = 1;
  int rank = 0;
  bool sequence_parallel = false;
  bool operator==(const TpConfig&) const = default;
};

// Expert parallelism (--ep): which experts one rank of an expert-parallel group of `degree` ranks
// holds. A mixture of experts' E experts are split in contiguous blocks, rank r holding experts
// [r E / degree, (r + 1) E / degree) (TensorDecl::expert); every other tensor is whole on each of
// them. The group's communication is src/model/parallel/ep.hpp's.
struct EpConfig {
  int degree = 1;
  int rank = 0;
  bool operator==(const EpConfig&) const = default;
};

// How one tensor is split over the tensor-parallel group. dim -1: replicated (every rank holds it
// whole). Otherwise dimension `dim` of the whole tensor is `parts` equal blocks (GPT-2's c_attn
// columns: q, k, v), each cut into `degree` contiguous chunks, and rank r holds chunk r of every
// block, in block order. `pad`: a block that degree does not divide is padded up to a multiple (the
// vocabulary: padding rows are zero, no token reads them and the loss masks them out); without it
// such a split is an InputError naming the tensor.
struct TpSplit {
  int dim = -1;
  int parts = 1;
  bool pad = false;
  // Replicated and computed whole on every rank of the group (a mixture of experts' router): its
  // gradient is complete on each rank, never a partial sum to reduce.
  bool whole = false;
  bool split() const { return dim >= 0; }
};

struct TensorDecl {
  std::string name;              // the family's name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;            // elements from the start of the unit's flat buffer
  int64_t numel = 0;
  bool decay = false;            // weight decay applies (tensors with >= 2 dims)
  Init init = Init::zeros;
  float std = 0.f;               // for Init::normal
  TpSplit tp;                    // how tensor parallelism splits it (replicated unless set)
  std::vector<int64_t> full_shape;  // the whole tensor's shape (HF's): shape when not split
  // Pipeline parallelism: this unit's copy of a tensor another unit owns (a tied head's token
  // embedding on a stage without the embedding; Unit::adopt_tied_copy). Initialised and loaded
  // as the owner's, its gradient summed with the owner's every step, never saved.
  bool tied_copy = false;
  // One expert's tensor of a mixture of experts: held by one expert-parallel rank only (EpConfig).
  bool expert = false;
  std::string shape_str() const;
};

struct UnitLayout {
  std::string name;  // "embedding", "h.0", ..., "head"
  std::vector<TensorDecl> tensors;
  int64_t numel = 0;
  int tp_degree = 1, tp_rank = 0;  // the tensor-parallel rank whose part of the tensors this is
  EpConfig ep;                     // the expert-parallel rank whose experts it holds
  const TensorDecl& find(std::string_view tensor) const;  // InternalError if absent
};

// Appends a tensor to a unit's flat buffer (after the last one); decay for 2 dims or more.
// `shape` is the whole tensor's; the unit holds its tensor-parallel rank's part as `tp` says.
void add_tensor(UnitLayout& unit, std::string name, std::vector<int64_t> shape, Init init, float std = 0.f,
                TpSplit tp = {});
int64_t num_params(const std::vector<UnitLayout>& layout);

// A run of elements a tensor-parallel rank holds: `len` elements from `local` (index in the rank's
// tensor, row-major) are the whole tensor's elements from `full` on (row-major in full_shape);
// full is -1 for padding (elements no whole tensor has).
struct TpRun {
  int64_t local = 0, full = 0, len = 0;
};
// Every run of t's local elements in order (one run for a replicated tensor), covering all of them.
std::vector<TpRun> tp_runs(const TensorDecl& t, int tp_degree, int tp_rank);

// The vocabulary rows a tensor-parallel rank holds of the embedding and the LM head (padded to a
// multiple of the degree): [begin, begin + rows), of which the first `valid` are real tokens.
struct VocabShard {
  int64_t begin = 0, rows = 0, valid = 0;
};
VocabShard vocab_shard(int64_t vocab, int tp_degree, int tp_rank);

// Initialisation of elements [first, first + out.size()) of a unit's flat buffer, as its tensors'
// Init says, as a function of (seed, tensor name, index in the whole tensor) only: any shard, and
// any tensor-parallel rank's part, initialises alone to what one rank holding everything would.
void init_flat_range(const UnitLayout& unit, uint64_t seed, int64_t first, std::span<float> out);

}  // namespace shardlab
