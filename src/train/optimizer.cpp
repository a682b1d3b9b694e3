#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"
#include "model/train_model.h"

namespace grpo {

Status AdamWConfig::validate() const {
  if (!(beta1 >= 0.f && beta1 < 1.f)) return error_status("adam_beta1 must be in [0, 1)");
  if (!(beta2 >= 0.f && beta2 < 1.f)) return error_status("adam_beta2 must be in [0, 1)");
  if (!(eps > 0.f)) return error_status("adam_epsilon must be > 0");
  if (!(weight_decay >= 0.f)) return error_status("weight_decay must be >= 0");
  return ok_status();
}

bool param_default_decay(const std::string& name) {
  auto ends_with = [&](const char* suf) {
    const std::string s = suf;
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  // attn_norm, mlp_norm, q_norm, k_norm, final_norm; bqkv is the q/k/v bias.
  return !(ends_with("norm") || ends_with("bqkv"));
}

namespace {
Tensor arena_slice(const Tensor& arena, int64_t off, int64_t n) {
  Tensor t = tensor_borrow(static_cast<char*>(arena.data) + size_t(off) * dtype_size(arena.dtype), arena.dtype,
                           arena.device, {n});
  t.owner = arena.owner;
  return t;
}
}  // namespace

namespace {
// Slots, zeroed gradients and Adam state, and the master copy for the parameters
// `named` (views of `arena`).
Optimizer optimizer_over(Context& ctx, const Tensor& arena, const std::vector<std::pair<std::string, Tensor*>>& named,
                         const AdamWConfig& cfg, int64_t lo, int64_t hi) {
  Optimizer o;
  o.cfg = cfg;
  const int64_t n = arena.numel();
  const size_t es = dtype_size(arena.dtype);
  for (auto& [name, t] : named) {
    ParamSlot s;
    s.name = name;
    s.offset = int64_t((static_cast<char*>(t->data) - static_cast<char*>(arena.data)) / es);
    s.numel = t->numel();
    s.decay = cfg.decay_all || param_default_decay(name);
    GRPO_CHECK(s.offset >= 0 && s.offset + s.numel <= n);
    o.slots.push_back(std::move(s));
  }
  if (hi < 0) hi = n;
  GRPO_CHECK_MSG(0 <= lo && lo <= hi && hi <= n, "optimizer shard outside the parameter arena");
  const Device dev = arena.device;
  // Only the shard's state is ever allocated: the point of ZeRO-1 is a model whose
  // full fp32 state does not fit one device.
  o.state_offset = lo;
  o.m = tensor_zeros(dev, DType::f32, {hi - lo});
  o.v = tensor_zeros(dev, DType::f32, {hi - lo});
  o.grad_arena = tensor_zeros(dev, DType::f32, {n});
  if (arena.dtype == DType::f32) {
    o.master = arena;
  } else {
    o.master = tensor_empty(dev, DType::f32, {hi - lo});
    cast(ctx, o.master, arena_slice(arena, lo, hi - lo));
  }
  return o;
}
}  // namespace

Optimizer optimizer_create(Context& ctx, ModelWeights& params, const AdamWConfig& cfg, int64_t shard_lo,
                           int64_t shard_hi) {
  Optimizer o = optimizer_over(ctx, params.arena, params.params(), cfg, shard_lo, shard_hi);
  weights_bind(o.grads, params.config, o.grad_arena);
  return o;
}

Optimizer optimizer_create_lora(Context& ctx, LoraWeights& adapters, const AdamWConfig& cfg, int64_t shard_lo,
                                int64_t shard_hi) {
  Optimizer o = optimizer_over(ctx, adapters.arena, adapters.params(), cfg, shard_lo, shard_hi);
  lora_bind(o.lora_grads, adapters.model, adapters.cfg, o.grad_arena);
  o.adapters = &adapters;
  return o;
}

Tensor& optimizer_param_arena(Optimizer& opt, ModelWeights& params) {
  return opt.adapters ? opt.adapters->arena : params.arena;
}

void optimizer_zero_grad(Context& ctx, Optimizer& opt) {
  tensor_fill_zero(opt.grad_arena);  // synchronous with every stream (core/tensor.cpp)
}

double grad_global_norm(Context& ctx, const Optimizer& opt) { return std::sqrt(sum_squares(ctx, opt.grad_arena)); }

OptimStepStats optimizer_step(Context& ctx, Optimizer& opt, ModelWeights& params, double lr) {
  GRPO_CHECK_MSG(!optimizer_is_sharded(opt), "optimizer_step on a ZeRO-1 shard: use dp_optimizer_step");
  OptimStepStats st;
  st.lr = lr;
  st.grad_norm = grad_global_norm(ctx, opt);
  if (!std::isfinite(st.grad_norm)) {
    st.skipped = true;
    return st;
  }
  if (opt.cfg.max_grad_norm > 0) st.clip_scale = std::min(1.0, double(opt.cfg.max_grad_norm) / (st.grad_norm + 1e-6));
  opt.step += 1;
  Tensor& arena = optimizer_param_arena(opt, params);
  const bool alias = arena.data == opt.master.data;
  for (const ParamSlot& s : opt.slots) {
    AdamWParams p;
    p.lr = float(lr);
    p.beta1 = opt.cfg.beta1;
    p.beta2 = opt.cfg.beta2;
    p.eps = opt.cfg.eps;
    p.weight_decay = s.decay ? opt.cfg.weight_decay : 0.f;
    p.step = opt.step;
    p.grad_scale = float(st.clip_scale);
    Tensor master = arena_slice(opt.master, s.offset, s.numel);
    Tensor param = alias ? master : arena_slice(arena, s.offset, s.numel);
    Tensor grad = arena_slice(opt.grad_arena, s.offset, s.numel);
    Tensor m = arena_slice(opt.m, s.offset, s.numel), v = arena_slice(opt.v, s.offset, s.numel);
    adamw_step(ctx, master, param, grad, m, v, p);
  }
  return st;
}

}  // namespace grpo
