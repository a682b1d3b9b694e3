// Model weights: every parameter is a view into one arena, in a fixed order,
// so that optimizer state, master weights and gradients can be arenas of the
// same layout (one flat AdamW over all parameters). q/k/v rows are stored
// concatenated (one GEMM) and so are gate/up; save splits them back into the
// Hugging Face tensors through the architecture's name table.
#pragma once
#include <string>
#include <vector>

#include "core/context.h"
#include "model/config.h"

namespace grpo {

struct LayerWeights {
  Tensor attn_norm;   // (C)
  Tensor wqkv;        // ((Hq+2Hkv)·D, C): rows q, then k, then v
  Tensor bqkv;        // ((Hq+2Hkv)·D) or empty when !attention_bias
  Tensor q_norm;      // (D) or empty when !qk_norm
  Tensor k_norm;      // (D) or empty when !qk_norm
  Tensor wo;          // (C, Hq·D)
  Tensor mlp_norm;    // (C)
  Tensor w_gate_up;   // (2F, C): rows gate, then up
  Tensor w_down;      // (C, F)
};

struct ModelWeights {
  ModelConfig config;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  Tensor arena;                 // (n_params) every tensor below is a view of it
  Tensor embed;                 // (V, C)
  std::vector<LayerWeights> layers;
  Tensor final_norm;            // (C)
  Tensor lm_head;               // (V, C); a view of embed when tied

  // Every parameter tensor in arena order, with a stable name (our names, e.g.
  // "layers.3.wqkv") for debugging and for LoRA/optimizer bookkeeping.
  std::vector<std::pair<std::string, Tensor*>> params();
};

// Lays out views for `cfg` over `arena` (which must hold weights_numel(cfg) elements).
void weights_bind(ModelWeights& w, const ModelConfig& cfg, Tensor arena);
int64_t weights_numel(const ModelConfig& cfg);
// Allocates an arena on `dev` of `dt` and binds it. Contents undefined.
ModelWeights weights_allocate(const ModelConfig& cfg, Device dev, DType dt);

}  // namespace grpo
