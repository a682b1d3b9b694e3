// LoRA adapters (Hu et al. 2021) in PEFT's conventions: for a target linear
// layer y = x·Wᵀ the adapter adds (x·Aᵀ)·Bᵀ·scaling with A (r, in), B (out, r),
// scaling = alpha / r (alpha / √r with use_rslora). Targets are the seven
// projections q, k, v, o, gate, up, down. Our weights fuse q/k/v and gate/up
// into one GEMM each; an adapter keeps one A/B pair per HF projection and its
// output lands in that projection's column range of the fused output.
//
// Every A and B of a set of adapters is a view into one arena (layer order,
// then target order), so gradients, fp32 master and Adam state can be arenas
// of the same layout as for the base model. Initialisation is PEFT's
// init_lora_weights=True: A as nn.Linear's kaiming_uniform_(a=√5), i.e.
// U(−1/√in, 1/√in); B = 0 (the adapted model starts equal to the base).
//
// Files: PEFT's adapter directory, adapter_config.json + adapter_model.safetensors
// with names base_model.model.<HF module>.lora_A.weight (r, in) and .lora_B.weight (out, r).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "model/weights.h"

namespace grpo {

enum class LoraTarget { q, k, v, o, gate, up, down };
constexpr int kLoraTargets = 7;

// "q" or PEFT's "q_proj" (likewise k, v, o, gate, up, down).
Result<LoraTarget> lora_target_parse(const std::string& name);
const char* lora_target_peft_name(LoraTarget t);  // "q_proj", ...

struct LoraConfig {
  bool enabled = false;
  int r = 8;
  float alpha = 16.f;
  float dropout = 0.f;     // recorded in adapter_config.json; training requires 0 (see docs/lora.md)
  bool use_rslora = false;
  std::vector<LoraTarget> targets{LoraTarget::q, LoraTarget::k, LoraTarget::v, LoraTarget::o,
                                  LoraTarget::gate, LoraTarget::up, LoraTarget::down};
  std::string base_model;  // base_model_name_or_path written into adapter_config.json

  float scaling() const;
  bool has(LoraTarget t) const;
  // Checks ranges and duplicates (for adapters read from files as well as configs).
  Status validate() const;
};

// Where a target sits in the base model: input and output features and the
// first column of its output inside the fused layer output.
struct LoraGeom {
  int64_t in = 0, out = 0, col0 = 0;
};
LoraGeom lora_geom(const ModelConfig& mc, LoraTarget t);

struct LoraPair {
  Tensor A;  // (r, in)  empty when the target is not adapted
  Tensor B;  // (out, r)
};

struct LoraWeights {
  ModelConfig model;
  LoraConfig cfg;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  Tensor arena;                                                // (n) every A/B is a view of it
  std::vector<std::array<LoraPair, kLoraTargets>> layers;      // (L)
  float scaling = 1.f;

  const LoraPair& pair(int layer, LoraTarget t) const { return layers[size_t(layer)][size_t(t)]; }
  // Every A and B in arena order, named "layers.3.q.A" (all of them matrices: weight decay applies).
  std::vector<std::pair<std::string, Tensor*>> params();
};

int64_t lora_numel(const ModelConfig& mc, const LoraConfig& lc);
void lora_bind(LoraWeights& w, const ModelConfig& mc, const LoraConfig& lc, Tensor arena);
// Allocates a zeroed arena of `dt` on `dev` and binds it.
LoraWeights lora_allocate(const ModelConfig& mc, const LoraConfig& lc, Device dev, DType dt);
// PEFT's initialisation (see above) from a seeded generator: the same seed gives the same A.
void lora_init(LoraWeights& w, uint64_t seed);

// The PEFT tensor name of a target's A or B in layer `layer`, e.g.
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.
std::string lora_peft_name(const ModelConfig& mc, int layer, LoraTarget t, bool is_b);

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (f32 tensors, PEFT's names).
// `w` may live on any device in any float dtype.
Status lora_save(const std::string& dir, const LoraWeights& w);
// Reads a PEFT LoRA adapter directory for base model `mc` into a fresh arena of `dt` on `dev`.
// Refuses what it cannot represent exactly (DoRA, rank/alpha patterns, bias, other modules).
Result<LoraWeights> lora_load(const std::string& dir, const ModelConfig& mc, Device dev, DType dt);

// Reads a PEFT adapter into the existing buffers of `dst` (any dtype and device): an
// in-place swap that keeps every pointer valid, so engine slots and captured CUDA
// graphs see the new adapter on their next step. The adapter must have dst's r,
// targets and scaling (graphs hold the scaling as a kernel argument). On error dst is
// unchanged.
Status lora_load_into(LoraWeights& dst, const std::string& dir);

// base += scaling·B·A for every adapted target (the merged model computes what
// base + adapter compute unmerged). Done in f32 on the host, one rounding to base's dtype.
void lora_merge_into(ModelWeights& base, const LoraWeights& w);

// ---- ops on one target (used by the training and inference forwards) ----

// out_wide[:, col0:col0+out] += scaling·(x·Aᵀ)·Bᵀ. h (M, r) receives x·Aᵀ (kept for
// backward); tmp (M, out) is scratch. All of x's dtype on ctx's device.
void lora_target_forward(Context& ctx, const LoraPair& p, const LoraGeom& g, float scaling, const Tensor& x,
                         Tensor& out_wide, Tensor& h, Tensor& tmp);
// Given dout_wide (the fused output's gradient) and the forward's x and h:
// dA, dB (f32) += their gradients, dx += the input gradient through the adapter.
// dy (M, out) and dh (M, r) are scratch of x's dtype.
void lora_target_backward(Context& ctx, const LoraPair& p, LoraPair& grad, const LoraGeom& g, float scaling,
                          const Tensor& dout_wide, const Tensor& x, const Tensor& h, Tensor& dx, Tensor& dy,
                          Tensor& dh);

}  // namespace grpo
