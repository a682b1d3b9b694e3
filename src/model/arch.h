// Architecture tables: the Hugging Face tensor names of each architecture and
// where each tensor lives in our ModelWeights (which slot, which rows of the
// fused wqkv / w_gate_up). Loading, saving and conversion all go through
// arch_tensors(), so a new architecture is a new table in arch.cpp.
#pragma once
#include <string>
#include <vector>

#include "model/weights.h"

namespace grpo {

// Our parameter slots (fields of ModelWeights / LayerWeights).
enum class WeightSlot { embed, attn_norm, wqkv, bqkv, q_norm, k_norm, wo, mlp_norm, w_gate_up, w_down, final_norm, lm_head };
// Which rows of the slot one HF tensor fills.
enum class WeightPart { whole, q, k, v, gate, up };
// When the HF tensor exists.
enum class WeightWhen { always, attention_bias, qk_norm, untied };

struct ArchWeightName {
  const char* hf_name;  // "{i}" stands for the layer index
  bool per_layer;
  WeightSlot slot;
  WeightPart part;
  WeightWhen when;
};

struct ArchSpec {
  Arch arch;
  const char* model_type;   // config.json model_type
  const char* hf_class;     // config.json architectures[0]
  std::vector<ArchWeightName> names;
  std::vector<const char*> harmless_extra;  // name suffixes ignored on load without a warning
};

// One concrete HF tensor of a model: its name, shape and destination rows.
struct HfTensorSpec {
  std::string name;            // e.g. "model.layers.3.self_attn.k_proj.weight"
  std::vector<int64_t> shape;  // HF shape, e.g. (Hkv·D, C)
  WeightSlot slot;
  int layer;                   // -1 for model-level tensors
  int64_t row_begin, row_end;  // rows [begin, end) of dim 0 of the slot tensor
};

const ArchSpec& arch_spec(Arch a);
// Every tensor a checkpoint of `cfg` must hold, in HF order (lm_head only when untied).
std::vector<HfTensorSpec> arch_tensors(const ModelConfig& cfg);
// True for names that may appear in a checkpoint but carry no parameters we
// load (rotary inv_freq buffers, and lm_head.weight when embeddings are tied).
bool arch_is_harmless_extra(const ModelConfig& cfg, const std::string& name);
// The view of `w` that `t` fills: rows [row_begin, row_end) of the slot tensor.
Tensor arch_view(const ModelWeights& w, const HfTensorSpec& t);

}  // namespace grpo
