// AdamW over the whole parameter arena (kernels/optim.h), with global-norm
// gradient clipping. Gradients, fp32 master weights and Adam m/v are arenas of
// the weights' layout (model/weights.h), so one parameter's state is the same
// slice of each. The compute-dtype parameters are written in place by the
// step: they are the very buffers the engine reads. When the parameters are
// f32 (the CPU), master and parameters are one buffer.
//
// Weight decay (decoupled, torch.optim.AdamW): by default it skips biases and
// norm weights, as HF Trainer's get_decay_parameter_names does (forbidden
// name patterns "bias", "layernorm", "rmsnorm", "norm", "_norm": input/
// post-attention layernorms, the final norm, q/k norms and q/k/v biases);
// embeddings and every matrix decay. `decay_all` applies it to every tensor.
// Clipping as torch.nn.utils.clip_grad_norm_: coef = max_grad_norm / (‖g‖ + 1e-6),
// grads scaled by min(1, coef); max_grad_norm <= 0 disables it.
#pragma once
#include <string>
#include <vector>

#include "core/context.h"
#include "kernels/optim.h"
#include "model/lora.h"
#include "model/weights.h"

namespace grpo {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.f;   // HF TrainingArguments default
  bool decay_all = false;     // true: decay norms and biases too
  float max_grad_norm = 1.f;  // HF default; <= 0: no clipping
  Status validate() const;
};

// True when the parameter (our name, from ModelWeights::params()) gets weight
// decay under the HF default rule.
bool param_default_decay(const std::string& name);

struct ParamSlot {
  std::string name;
  int64_t offset = 0, numel = 0;  // elements within the arenas
  bool decay = true;
};

struct Optimizer {
  AdamWConfig cfg;
  std::vector<ParamSlot> slots;  // every parameter, arena order
  Tensor master;                 // (n) f32; aliases the parameter arena when it is f32
  Tensor m, v;                   // (n) f32, zero-initialised
  // ZeRO-1 (optimizer_create with a shard): m, v and a separate master hold only
  // the arena elements [state_offset, state_offset + m.numel()); 0 and n otherwise.
  int64_t state_offset = 0;
  Tensor grad_arena;             // (n) f32 gradients, accumulated by the backward
  ModelWeights grads;            // views of grad_arena with the weights' layout (tied lm_head = embed)
  int64_t step = 0;              // optimizer steps taken
  // LoRA training (optimizer_create_lora): the parameters are these adapters, not
  // the model passed to optimizer_step (whose base weights stay frozen, with no
  // master copy, gradients or Adam state); grads is unbound and lora_grads holds
  // the adapters' gradients (views of grad_arena).
  LoraWeights* adapters = nullptr;
  LoraWeights lora_grads;
};

struct OptimStepStats {
  double grad_norm = 0;    // global L2 norm before clipping
  double clip_scale = 1;   // factor applied to the gradients
  double lr = 0;
  bool skipped = false;    // non-finite gradient norm: nothing was updated
};

// Allocates grads/m/v (and the f32 master copy when params are not f32) on
// the parameters' device, zeroed / copied from the parameters. A shard
// [shard_lo, shard_hi) of the arena (ZeRO-1) limits m, v and the separate
// master to those elements (the gradients stay full-length); shard_hi < 0 = all.
Optimizer optimizer_create(Context& ctx, ModelWeights& params, const AdamWConfig& cfg, int64_t shard_lo = 0,
                           int64_t shard_hi = -1);
// The same over LoRA adapters only; `adapters` must outlive the optimizer.
Optimizer optimizer_create_lora(Context& ctx, LoraWeights& adapters, const AdamWConfig& cfg, int64_t shard_lo = 0,
                                int64_t shard_hi = -1);
// Elements of the parameter arena (the length of grad_arena).
inline int64_t optimizer_numel(const Optimizer& opt) { return opt.grad_arena.numel(); }
// Whether m / v cover only a shard of the arena (ZeRO-1).
inline bool optimizer_is_sharded(const Optimizer& opt) { return opt.m.numel() != opt.grad_arena.numel(); }
// The tensor the optimizer steps: the adapters' arena in LoRA training, else params.arena.
Tensor& optimizer_param_arena(Optimizer& opt, ModelWeights& params);
void optimizer_zero_grad(Context& ctx, Optimizer& opt);
double grad_global_norm(Context& ctx, const Optimizer& opt);
// Clips, takes one AdamW step with learning rate `lr` (step counter +1 for bias
// correction) and writes the parameters. Does not zero the gradients. Not for a
// sharded optimizer (train/data_parallel.h steps those).
OptimStepStats optimizer_step(Context& ctx, Optimizer& opt, ModelWeights& params, double lr);

}  // namespace grpo
