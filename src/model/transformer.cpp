// Inference forward over the paged KV cache, built only from kernels/ ops so
// that the same code runs on the CPU and on CUDA. Per layer:
//   xn = rmsnorm(x); qkv = xn·Wqkvᵀ (+b); q,k,v = split(qkv); [q,k = rmsnorm per head]
//   rope(q, k); cache ← k, v; a = attention(q, cache); x += a·Woᵀ
//   xn = rmsnorm(x); x += (silu(xn·Wgᵀ) ⊙ xn·Wuᵀ)·Wdᵀ
// then logits = rmsnorm(x[logit_rows])·Wlmᵀ (f32).
// The rotary table follows transformers' inv_freq computation step by step in
// f32 (modeling_rope_utils: default, linear, llama3), so positions rotate by
// the same angles as the reference.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gather.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace grpo {

size_t KVCache::bytes_per_block() const {
  if (k.empty() || n_blocks == 0) return 0;
  return (k.size() + v.size()) * (k[0].nbytes() / size_t(n_blocks));
}

KVCache kv_cache_allocate(const ModelConfig& cfg, Device dev, DType dt, int n_blocks, int block_size) {
  GRPO_CHECK(n_blocks > 0 && block_size > 0);
  KVCache c;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  for (int l = 0; l < cfg.n_layers; ++l) {
    c.k.push_back(tensor_zeros(dev, dt, {n_blocks, block_size, cfg.n_kv_heads, cfg.head_dim}));
    c.v.push_back(tensor_zeros(dev, dt, {n_blocks, block_size, cfg.n_kv_heads, cfg.head_dim}));
  }
  return c;
}

namespace {
// inv_freq[i] for i < D/2, in f32 as transformers computes it.
std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int D = cfg.head_dim, half = D / 2;
  const float theta = cfg.rope_theta;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv[size_t(i)] = 1.f / std::pow(theta, float(2 * i) / float(D));
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "linear") {
    for (float& f : inv) f = f / rs.factor;
  } else if (rs.type == "llama3") {
    const float old_ctx = float(rs.original_max_position_embeddings);
    const float low_wl = float(double(rs.original_max_position_embeddings) / rs.low_freq_factor);
    const float high_wl = float(double(rs.original_max_position_embeddings) / rs.high_freq_factor);
    const float two_pi = float(2.0 * M_PI);
    for (float& f : inv) {
      const float wavelen = two_pi / f;
      float g = wavelen > low_wl ? f / rs.factor : f;  // low frequencies: divided by factor
      const float smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      const float smoothed = (1.f - smooth) * g / rs.factor + smooth * g;
      const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
      f = medium ? smoothed : g;
    }
  } else {
    GRPO_CHECK_MSG(rs.type == "none" || rs.type == "default" || rs.type.empty(),
                   "rope_table_build: unsupported rope scaling (config validation should have caught it)");
  }
  return inv;
}
}  // namespace

RopeTable rope_table_build(const ModelConfig& cfg, Device dev, int max_positions) {
  const int half = cfg.head_dim / 2;
  const std::vector<float> inv = rope_inv_freq(cfg);
  std::vector<float> c(size_t(max_positions) * size_t(half)), s(c.size());
  for (int p = 0; p < max_positions; ++p)
    for (int i = 0; i < half; ++i) {
      const float a = float(p) * inv[size_t(i)];  // f32 product, as position_ids.float() @ inv_freq
      c[size_t(p) * half + i] = std::cos(a);
      s[size_t(p) * half + i] = std::sin(a);
    }
  RopeTable t;
  t.cos = tensor_from_f32(dev, DType::f32, c, {max_positions, half});
  t.sin = tensor_from_f32(dev, DType::f32, s, {max_positions, half});
  return t;
}

ForwardScratch forward_scratch_allocate(const ModelConfig& cfg, Device dev, DType dt, int max_tokens,
                                        int max_logit_rows, int lora_r) {
  const int64_t T = max_tokens, C = cfg.hidden_size, D = cfg.head_dim, F = cfg.intermediate_size;
  ForwardScratch s;
  s.max_tokens = max_tokens;
  s.max_logit_rows = max_logit_rows;
  s.x = tensor_empty(dev, dt, {T, C});
  s.xn = tensor_empty(dev, dt, {T, C});
  s.qkv = tensor_empty(dev, dt, {T, cfg.qkv_dim()});
  s.q = tensor_empty(dev, dt, {T, cfg.n_heads, D});
  s.attn = tensor_empty(dev, dt, {T, cfg.n_heads, D});
  s.gate_up = tensor_empty(dev, dt, {T, 2 * F});
  s.mlp_act = tensor_empty(dev, dt, {T, F});
  s.rows = tensor_empty(dev, dt, {int64_t(max_logit_rows), C});
  s.lora_r = lora_r;
  if (lora_r > 0) {
    s.lora_h = tensor_empty(dev, dt, {T * lora_r});
    s.lora_tmp = tensor_empty(dev, dt, {T * std::max<int64_t>({cfg.q_dim(), C, F})});
  }
  return s;
}

namespace {
// out += each row group's adapters of `targets` applied to x (rows of x and out line up).
void lora_rows_forward(Context& ctx, const ForwardBatch& batch, ForwardScratch& s, int l,
                       std::initializer_list<LoraTarget> targets, const Tensor& x, Tensor& out) {
  for (const ForwardBatch::LoraRows& g : batch.lora) {
    if (!g.w || g.end <= g.begin) continue;
    const int64_t M = g.end - g.begin, r = g.w->cfg.r;
    GRPO_CHECK_MSG(r <= s.lora_r, "transformer_forward: LoRA rank above the scratch's lora_r");
    Tensor xs = x.slice0(g.begin, g.end), os = out.slice0(g.begin, g.end);
    for (LoraTarget t : targets) {
      const LoraPair& p = g.w->pair(l, t);
      if (p.A.empty()) continue;
      const LoraGeom geom = lora_geom(g.w->model, t);
      Tensor h = tensor_borrow(s.lora_h.data, s.lora_h.dtype, s.lora_h.device, {M, r});
      Tensor tmp = tensor_borrow(s.lora_tmp.data, s.lora_tmp.dtype, s.lora_tmp.device, {M, geom.out});
      lora_target_forward(ctx, p, geom, g.w->scaling, xs, os, h, tmp);
    }
  }
}

bool lora_touches(const ForwardBatch& batch, int l, LoraTarget t) {
  for (const auto& g : batch.lora)
    if (g.w && g.end > g.begin && !g.w->pair(l, t).A.empty()) return true;
  return false;
}
}  // namespace

void transformer_forward(Context& ctx, const ModelWeights& w, KVCache& cache, const RopeTable& rope,
                         const ForwardBatch& batch, ForwardScratch& scratch, Tensor& logits) {
  const ModelConfig& cfg = w.config;
  const int64_t T = batch.tokens.numel(), R = batch.logit_rows.numel();
  const int64_t D = cfg.head_dim, Hq = cfg.n_heads;
  GRPO_CHECK_MSG(T > 0 && T <= scratch.max_tokens, "transformer_forward: batch larger than the scratch");
  GRPO_CHECK_MSG(R <= scratch.max_logit_rows && R <= T, "transformer_forward: too many logit rows");
  GRPO_CHECK_MSG(int(cache.k.size()) == cfg.n_layers, "transformer_forward: cache has the wrong layer count");
  GRPO_CHECK_MSG(logits.ndim == 2 && logits.shape[0] == R && logits.shape[1] == cfg.vocab_size &&
                     logits.dtype == DType::f32,
                 "transformer_forward: logits must be (R, V) f32");
  const float eps = cfg.rms_norm_eps;

  Tensor x = scratch.x.slice0(0, T);              // (T, C) residual stream
  Tensor xn = scratch.xn.slice0(0, T);            // (T, C)
  Tensor qkv = scratch.qkv.slice0(0, T);          // (T, (Hq+2Hkv)·D)
  Tensor q = scratch.q.slice0(0, T);              // (T, Hq, D)
  Tensor attn = scratch.attn.slice0(0, T);        // (T, Hq, D)
  Tensor gate_up = scratch.gate_up.slice0(0, T);  // (T, 2F)
  Tensor act = scratch.mlp_act.slice0(0, T);      // (T, F)

  gather_rows_forward(ctx, x, w.embed, batch.tokens);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    rmsnorm_forward(ctx, xn, nullptr, x, L.attn_norm, eps);
    linear_forward(ctx, qkv, xn, L.wqkv, L.bqkv.empty() ? nullptr : &L.bqkv, false);
    lora_rows_forward(ctx, batch, scratch, l, {LoraTarget::q, LoraTarget::k, LoraTarget::v}, xn, qkv);
    // With qk-norm the normalised q lands in `attn` and the attention output in
    // `q`; without it the rotated q goes to `q` straight from the fused projection
    // (k and v go from there to the cache) and the output to `attn`.
    Tensor* qr = &q;
    Tensor* out = &attn;
    if (cfg.qk_norm) {
      qk_norm_rope_cache_write(ctx, attn, qkv, L.q_norm, L.k_norm, eps, batch.positions, rope.cos, rope.sin,
                               cache.k[size_t(l)], cache.v[size_t(l)], batch.attn);
      qr = &attn;
      out = &q;
    } else {
      rope_qkv_cache_write(ctx, q, qkv, batch.positions, rope.cos, rope.sin, cache.k[size_t(l)], cache.v[size_t(l)],
                           batch.attn);
    }
    PagedAttnMeta layer_meta = batch.attn;  // the step's metadata with this layer's sliding window
    layer_meta.window = cfg.attn_window(l);
    attention_paged(ctx, *out, *qr, cache.k[size_t(l)], cache.v[size_t(l)], layer_meta);
    Tensor out2 = out->view({T, Hq * D});
    linear_forward(ctx, x, out2, L.wo, nullptr, true);  // x += attention output
    lora_rows_forward(ctx, batch, scratch, l, {LoraTarget::o}, out2, x);
    rmsnorm_forward(ctx, xn, nullptr, x, L.mlp_norm, eps);
    if (lora_touches(batch, l, LoraTarget::gate) || lora_touches(batch, l, LoraTarget::up)) {
      // The adapters add to the pre-activations, so gate_up must exist: no fused SwiGLU.
      linear_forward(ctx, gate_up, xn, L.w_gate_up, nullptr, false);
      lora_rows_forward(ctx, batch, scratch, l, {LoraTarget::gate, LoraTarget::up}, xn, gate_up);
      swiglu_forward(ctx, act, gate_up);
    } else {
      linear_swiglu_forward(ctx, act, gate_up, xn, L.w_gate_up);  // act = swiglu(xn · w_gate_upᵀ)
    }
    linear_forward(ctx, x, act, L.w_down, nullptr, true);  // x += MLP output
    lora_rows_forward(ctx, batch, scratch, l, {LoraTarget::down}, act, x);
  }
  if (R == 0) return;
  Tensor rows = scratch.rows.slice0(0, R);
  Tensor rows_n = scratch.xn.slice0(0, R);
  gather_rows_forward(ctx, rows, x, batch.logit_rows);
  rmsnorm_forward(ctx, rows_n, nullptr, rows, w.final_norm, eps);
  linear_forward(ctx, logits, rows_n, w.lm_head, nullptr, false);
}

void transformer_gemm_prewarm(Context& ctx, const ModelWeights& w, ForwardScratch& scratch, Tensor& logits) {
  if (ctx.device() != Device::cuda || ctx.batch_invariant() || w.layers.empty()) return;
  const ModelConfig& cfg = w.config;
  const LayerWeights& L = w.layers[0];
  const int64_t HD = int64_t(cfg.n_heads) * cfg.head_dim;
  const int64_t max_T = scratch.max_tokens, max_R = std::min<int64_t>(scratch.max_logit_rows, logits.shape[0]);
  for (int64_t m = 65; m <= max_T; m = gemm_row_bucket(m) + 1) {
    const int64_t T = std::min(gemm_row_bucket(m), max_T);  // the bucket's algorithm, asked at any m in it
    Tensor x = scratch.x.slice0(0, T), xn = scratch.xn.slice0(0, T), qkv = scratch.qkv.slice0(0, T);
    Tensor gate_up = scratch.gate_up.slice0(0, T), act = scratch.mlp_act.slice0(0, T);
    Tensor out2 = (cfg.qk_norm ? scratch.q : scratch.attn).slice0(0, T).view({T, HD});
    linear_forward(ctx, qkv, xn, L.wqkv, L.bqkv.empty() ? nullptr : &L.bqkv, false);
    linear_forward(ctx, x, out2, L.wo, nullptr, true);
    linear_swiglu_forward(ctx, act, gate_up, xn, L.w_gate_up);
    linear_forward(ctx, x, act, L.w_down, nullptr, true);
    if (m <= max_R) {
      const int64_t R = std::min(gemm_row_bucket(m), max_R);
      Tensor lg = logits.slice0(0, R), rows_n = scratch.xn.slice0(0, R);
      linear_forward(ctx, lg, rows_n, w.lm_head, nullptr, false);
    }
  }
}

}  // namespace grpo
