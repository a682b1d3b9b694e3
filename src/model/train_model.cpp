#include "model/train_model.h"

#include <algorithm>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/columns.h"
#include "kernels/elementwise.h"
#include "kernels/gather.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "model/transformer.h"

namespace grpo {

namespace {

// A growable buffer: get() returns a view of exactly `shape`, reallocating
// only when the storage is too small (views taken earlier stay alive).
struct Buf {
  Tensor storage;
  Tensor get(Device dev, DType dt, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    if (!storage.defined() || storage.dtype != dt || storage.numel() < n)
      storage = tensor_empty(dev, dt, {std::max<int64_t>(n, 1)});
    Tensor t = tensor_borrow(storage.data, dt, dev, shape);
    t.owner = storage.owner;
    return t;
  }
};

// What one layer's backward needs. q_raw/k_raw/rstd_q/rstd_k only with qk_norm.
struct LayerActs {
  Tensor xn1, rstd1;            // (T,C), (T)
  Tensor q_raw, k_raw;          // (T,Hq,D), (T,Hkv,D) before q/k norm
  Tensor rstd_q, rstd_k;        // (T·Hq), (T·Hkv)
  Tensor q, k, v;               // (T,Hq,D), (T,Hkv,D), (T,Hkv,D) after norm + rope
  Tensor attn, lse;             // (T,Hq,D), (Hq,T)
  Tensor x_mid;                 // (T,C) residual after attention
  Tensor xn2, rstd2;            // (T,C), (T)
  Tensor gu, act;               // (T,2F), (T,F)
  Tensor lora_h[kLoraTargets];  // (T,r) x·Aᵀ of each adapted projection (LoRA only)
};

struct LayerBufs {
  Buf xn1, rstd1, q_raw, k_raw, rstd_q, rstd_k, q, k, v, attn, lse, x_mid, xn2, rstd2, gu, act;
  Buf lora_h[kLoraTargets];
  // lora_r = 0: no adapters.
  LayerActs carve(const ModelConfig& c, Device dev, DType dt, int64_t T, int lora_r) {
    const int64_t C = c.hidden_size, F = c.intermediate_size, D = c.head_dim, Hq = c.n_heads, Hk = c.n_kv_heads;
    LayerActs a;
    a.xn1 = xn1.get(dev, dt, {T, C});
    a.rstd1 = rstd1.get(dev, DType::f32, {T});
    if (c.qk_norm) {
      a.q_raw = q_raw.get(dev, dt, {T, Hq, D});
      a.k_raw = k_raw.get(dev, dt, {T, Hk, D});
      a.rstd_q = rstd_q.get(dev, DType::f32, {T * Hq});
      a.rstd_k = rstd_k.get(dev, DType::f32, {T * Hk});
    }
    a.q = q.get(dev, dt, {T, Hq, D});
    a.k = k.get(dev, dt, {T, Hk, D});
    a.v = v.get(dev, dt, {T, Hk, D});
    a.attn = attn.get(dev, dt, {T, Hq, D});
    a.lse = lse.get(dev, DType::f32, {Hq, T});
    a.x_mid = x_mid.get(dev, dt, {T, C});
    a.xn2 = xn2.get(dev, dt, {T, C});
    a.rstd2 = rstd2.get(dev, DType::f32, {T});
    a.gu = gu.get(dev, dt, {T, 2 * F});
    a.act = act.get(dev, dt, {T, F});
    if (lora_r > 0)
      for (int i = 0; i < kLoraTargets; ++i) a.lora_h[i] = lora_h[i].get(dev, dt, {T, lora_r});
    return a;
  }
};

Tensor upload_i32(Context& ctx, const std::vector<int32_t>& v) {
  Tensor host = tensor_borrow(const_cast<int32_t*>(v.data()), DType::i32, Device::cpu, {int64_t(v.size())});
  if (ctx.device() == Device::cpu) {
    Tensor t = tensor_empty(Device::cpu, DType::i32, {int64_t(v.size())});
    std::memcpy(t.data, v.data(), v.size() * sizeof(int32_t));
    return t;
  }
  Tensor t = tensor_empty(ctx.device(), DType::i32, {int64_t(v.size())});
  tensor_copy(t, host);
  return t;
}

}  // namespace

struct TrainState {
  std::vector<Buf> resid;                // layer inputs (L+1 when kept, else 2 ping-pong)
  std::vector<LayerBufs> layer_bufs;     // L when activations are stored, else 1 (scratch)
  std::vector<LayerActs> acts;
  std::vector<Tensor> x;                 // views of resid for this batch
  Buf qkv, xf, rstd_f, h_sel, lse_sel;
  Buf dx, dtmp, dxn, dact, dgu, dattn, dq, dk, dv, dq_raw, dk_raw, dqkv, dh_sel, dxf;
  Buf lora_tmp, lora_dh;                 // LoRA scratch: (T, out) of one projection, (T, r)
  RopeTable rope;
  int rope_positions = 0;
  Tensor xf_t, rstd_f_t, h_sel_t, lse_sel_t;
  // Batch-invariant CUDA contexts (bitwise on-policy, docs/bitwise.md): the batch as the
  // engine's paged cache, so that attention runs the engine's per-token kernels.
  bool paged = false;
  PagedAttnMeta paged_meta;              // blocks of kPagedBlock positions, per sequence in order
  Buf k_cache, v_cache;
  int paged_meta_blocks = 0;
  bool kept = false;                     // the last forward kept activations
  const void* kept_weights = nullptr;
  int kept_tokens = 0;
};

TrainModel::TrainModel(const TrainModelOptions& o) : opt(o), state(std::make_unique<TrainState>()) {}
TrainModel::~TrainModel() = default;
TrainModel::TrainModel(TrainModel&&) noexcept = default;
TrainModel& TrainModel::operator=(TrainModel&&) noexcept = default;

size_t train_model_activation_bytes(const ModelConfig& c, DType dt, int64_t max_tokens, bool recompute) {
  const size_t T = size_t(std::max<int64_t>(max_tokens, 1)), es = dtype_size(dt);
  const size_t C = size_t(c.hidden_size), F = size_t(c.intermediate_size), D = size_t(c.head_dim);
  const size_t Hq = size_t(c.n_heads), Hk = size_t(c.n_kv_heads), L = size_t(c.n_layers);
  // One layer's LayerBufs per token (see LayerBufs::carve).
  size_t layer = es * (3 * C + 2 * Hq * D + 2 * Hk * D + 3 * F) + 4 * (2 + Hq);
  if (c.qk_norm) layer += es * (Hq + Hk) * D + 4 * (Hq + Hk);
  const size_t stored_layers = recompute ? 1 : L;  // layer inputs (L + 1) are kept either way
  // Backward scratch (dx ... dxf), counted at 4 bytes so that f32 accumulators fit too.
  const size_t backward = 4 * (5 * C + 3 * F + 2 * size_t(c.qkv_dim()) + 2 * Hq * D);
  const size_t inputs = 4 * 6;  // tokens, positions, rows, targets, logp, dlogp
  return T * (stored_layers * layer + (L + 1) * 4 * C + backward + inputs + es * size_t(c.qkv_dim()));
}

Result<TrainBatch> train_batch_build(Context& ctx, const std::vector<std::vector<int32_t>>& sequences,
                                     const std::vector<int32_t>& prompt_lens, int vocab_size) {
  if (sequences.empty()) return error_status("train batch: no sequences");
  if (sequences.size() != prompt_lens.size())
    return error_status("train batch: " + std::to_string(sequences.size()) + " sequences but " +
                        std::to_string(prompt_lens.size()) + " prompt lengths");
  TrainBatch b;
  std::vector<int32_t> positions, rows, targets;
  b.attn.cu_seqlens.push_back(0);
  b.completion_offsets.push_back(0);
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto& seq = sequences[s];
    const int32_t n = int32_t(seq.size()), p = prompt_lens[s];
    if (p < 1 || p >= n)
      return error_status("train batch: sequence " + std::to_string(s) + " has " + std::to_string(n) +
                          " tokens and prompt length " + std::to_string(p) +
                          " (need a prompt of >= 1 token and a completion of >= 1 token)");
    TrainSeq ts{int32_t(b.tokens_host.size()), p, n};
    for (int32_t i = 0; i < n; ++i) {
      if (seq[size_t(i)] < 0 || seq[size_t(i)] >= vocab_size)
        return error_status("train batch: sequence " + std::to_string(s) + " token " + std::to_string(i) + " = " +
                            std::to_string(seq[size_t(i)]) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size) + ")");
      b.tokens_host.push_back(seq[size_t(i)]);
      positions.push_back(i);
      if (i >= p) {
        rows.push_back(ts.start + i - 1);
        targets.push_back(seq[size_t(i)]);
      }
    }
    b.seqs.push_back(ts);
    b.attn.cu_seqlens.push_back(int32_t(b.tokens_host.size()));
    b.completion_offsets.push_back(int32_t(targets.size()));
    b.attn.max_seqlen = std::max(b.attn.max_seqlen, int(n));
  }
  b.n_tokens = int(b.tokens_host.size());
  b.n_completion = int(targets.size());
  b.tokens = upload_i32(ctx, b.tokens_host);
  b.positions = upload_i32(ctx, positions);
  b.rows = upload_i32(ctx, rows);
  b.targets = upload_i32(ctx, targets);
  b.attn.cu_seqlens_dev = upload_i32(ctx, b.attn.cu_seqlens);
  return b;
}

namespace {

// The batch's attention metadata with layer l's sliding window.
AttnVarlen layer_attn(const ModelConfig& c, const TrainBatch& b, int l) {
  AttnVarlen m = b.attn;
  m.window = c.attn_window(l);
  return m;
}

// out += the adapters of `targets` (those present) of layer l applied to x.
void lora_forward(Context& ctx, TrainState& st, const LoraWeights* lw, int l, std::initializer_list<LoraTarget> targets,
                  const Tensor& x, Tensor& out, LayerActs& a) {
  if (!lw) return;
  for (LoraTarget t : targets) {
    const LoraPair& p = lw->pair(l, t);
    if (p.A.empty()) continue;
    const LoraGeom g = lora_geom(lw->model, t);
    Tensor tmp = st.lora_tmp.get(ctx.device(), x.dtype, {x.shape[0], g.out});
    lora_target_forward(ctx, p, g, lw->scaling, x, out, a.lora_h[int(t)], tmp);
  }
}

// Adapter gradients of `targets` into *m.lora_grads and dx += the input gradient through them.
void lora_backward(Context& ctx, TrainState& st, const TrainModel& m, int l, std::initializer_list<LoraTarget> targets,
                   const Tensor& dout, const Tensor& x, const LayerActs& a, Tensor& dx) {
  if (!m.lora) return;
  GRPO_CHECK_MSG(m.lora_grads, "train_model_backward: LoRA forward needs lora_grads to train the adapters");
  for (LoraTarget t : targets) {
    const LoraPair& p = m.lora->pair(l, t);
    if (p.A.empty()) continue;
    const LoraGeom g = lora_geom(m.lora->model, t);
    Tensor dy = st.lora_tmp.get(ctx.device(), x.dtype, {x.shape[0], g.out});
    Tensor dh = st.lora_dh.get(ctx.device(), x.dtype, {x.shape[0], int64_t(m.lora->cfg.r)});
    lora_target_backward(ctx, p, m.lora_grads->layers[size_t(l)][size_t(t)], g, m.lora->scaling, dout, x,
                         a.lora_h[int(t)], dx, dy, dh);
  }
}

constexpr int kPagedBlock = 16;  // positions per block of the trainer's paged view

// The batch's paged view (TrainState::paged_meta): sequence s owns blocks base_s ..
// base_s + ceil(n_s / 16) - 1, its token at position p sits in slot 16·base_s + p.
void build_paged_view(Context& ctx, TrainState& st, const TrainBatch& b) {
  const auto& cu = b.attn.cu_seqlens;
  const int S = int(cu.size()) - 1;
  std::vector<int32_t> base(size_t(S) + 1, 0);
  int max_blocks = 1, max_len = 1;
  for (int s = 0; s < S; ++s) {
    const int n = cu[size_t(s) + 1] - cu[size_t(s)];
    const int nb = (n + kPagedBlock - 1) / kPagedBlock;
    base[size_t(s) + 1] = base[size_t(s)] + nb;
    max_blocks = std::max(max_blocks, nb);
    max_len = std::max(max_len, n);
  }
  std::vector<int32_t> table(size_t(S) * size_t(max_blocks), 0), seq(size_t(b.n_tokens)), slots(size_t(b.n_tokens));
  for (int s = 0; s < S; ++s) {
    for (int j = 0; j < base[size_t(s) + 1] - base[size_t(s)]; ++j)
      table[size_t(s) * size_t(max_blocks) + size_t(j)] = base[size_t(s)] + j;
    for (int t = cu[size_t(s)]; t < cu[size_t(s) + 1]; ++t) {
      seq[size_t(t)] = s;
      slots[size_t(t)] = base[size_t(s)] * kPagedBlock + (t - cu[size_t(s)]);
    }
  }
  PagedAttnMeta& m = st.paged_meta;
  m.token_seq = upload_i32(ctx, seq);
  m.token_pos = b.positions;
  m.block_table = upload_i32(ctx, table).view({int64_t(S), int64_t(max_blocks)});
  m.slot_mapping = upload_i32(ctx, slots);
  m.block_size = kPagedBlock;
  m.max_context = max_len;
  m.window = 0;
  m.n_prefill_tiles = 0;
  st.paged_meta_blocks = base[size_t(S)];
}

void layer_forward(Context& ctx, TrainState& st, const LoraWeights* lw, const ModelConfig& c, int l,
                   const LayerWeights& L, const RopeTable& rope, const TrainBatch& b, const Tensor& x_in, LayerActs& a,
                   Tensor& qkv, Tensor& x_out) {
  const int64_t T = b.n_tokens, D = c.head_dim, Hq = c.n_heads, Hk = c.n_kv_heads;
  const float eps = c.rms_norm_eps;
  rmsnorm_forward(ctx, a.xn1, &a.rstd1, x_in, L.attn_norm, eps);
  linear_forward(ctx, qkv, a.xn1, L.wqkv, L.bqkv.empty() ? nullptr : &L.bqkv, false);
  lora_forward(ctx, st, lw, l, {LoraTarget::q, LoraTarget::k, LoraTarget::v}, a.xn1, qkv, a);
  if (c.qk_norm) {
    qkv_split(ctx, a.q_raw, a.k_raw, a.v, qkv);
    Tensor qn = a.q.view({T * Hq, D}), kn = a.k.view({T * Hk, D});
    rmsnorm_forward(ctx, qn, &a.rstd_q, a.q_raw.view({T * Hq, D}), L.q_norm, eps);
    rmsnorm_forward(ctx, kn, &a.rstd_k, a.k_raw.view({T * Hk, D}), L.k_norm, eps);
  } else {
    qkv_split(ctx, a.q, a.k, a.v, qkv);
  }
  rope_forward(ctx, a.q, b.positions, rope.cos, rope.sin);
  rope_forward(ctx, a.k, b.positions, rope.cos, rope.sin);
  if (st.paged) {
    // Bitwise on-policy on CUDA: the engine's own per-layer step over this batch laid out as
    // its paged cache: the fused rope (+ q/k norm) kernel writes q and the cache rows, and the
    // per-token paged attention reads them, so every row is computed as the rollout computed
    // it. The same kernel writes the log-sum-exp the backward reads.
    const Device dev = ctx.device();
    const int64_t nb = st.paged_meta_blocks;
    Tensor kc = st.k_cache.get(dev, a.k.dtype, {nb, kPagedBlock, Hk, D});
    Tensor vc = st.v_cache.get(dev, a.v.dtype, {nb, kPagedBlock, Hk, D});
    PagedAttnMeta pm = st.paged_meta;
    pm.window = c.attn_window(l);
    if (c.qk_norm)
      qk_norm_rope_cache_write(ctx, a.q, qkv, L.q_norm, L.k_norm, eps, b.positions, rope.cos, rope.sin, kc, vc, pm);
    else
      rope_qkv_cache_write(ctx, a.q, qkv, b.positions, rope.cos, rope.sin, kc, vc, pm);
    attention_paged(ctx, a.attn, a.q, kc, vc, pm, &a.lse);
  } else {
    attention_forward(ctx, a.attn, &a.lse, a.q, a.k, a.v, layer_attn(c, b, l));
  }
  // Deterministic runs add each block's output to the residual in the engine's order
  // (residual + product, then the adapters: transformer_forward accumulates into x), so
  // that its rollouts reproduce these bits (docs/bitwise.md); otherwise the product and its
  // adapters come first and the residual is added last.
  const bool engine_order = ctx.deterministic();
  auto block_out = [&](Tensor& out, const Tensor& in, const Tensor& wt, LoraTarget t, const Tensor& residual) {
    if (engine_order) cast(ctx, out, residual);  // same dtype: a copy on the context's stream
    linear_forward(ctx, out, in, wt, nullptr, engine_order);
    lora_forward(ctx, st, lw, l, {t}, in, out, a);
    if (!engine_order) add_inplace(ctx, out, residual);
  };
  block_out(a.x_mid, a.attn.view({T, Hq * D}), L.wo, LoraTarget::o, x_in);
  rmsnorm_forward(ctx, a.xn2, &a.rstd2, a.x_mid, L.mlp_norm, eps);
  linear_forward(ctx, a.gu, a.xn2, L.w_gate_up, nullptr, false);
  lora_forward(ctx, st, lw, l, {LoraTarget::gate, LoraTarget::up}, a.xn2, a.gu, a);
  swiglu_forward(ctx, a.act, a.gu);
  block_out(x_out, a.act, L.w_down, LoraTarget::down, a.x_mid);
}

// dx: gradient w.r.t. the layer output on entry, w.r.t. its input on return.
// G is null when the base weights are frozen (LoRA training): no base gradients.
void layer_backward(Context& ctx, TrainState& st, const TrainModel& m, const ModelConfig& c, int l,
                    const LayerWeights& L, LayerWeights* G, const RopeTable& rope, const TrainBatch& b,
                    const Tensor& x_in, const LayerActs& a, Tensor& dx) {
  const Device dev = ctx.device();
  const DType dt = dx.dtype;
  const int64_t T = b.n_tokens, C = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads;
  Tensor dtmp = st.dtmp.get(dev, dt, {T, C}), dxn = st.dxn.get(dev, dt, {T, C});
  Tensor dact = st.dact.get(dev, dt, {T, F}), dgu = st.dgu.get(dev, dt, {T, 2 * F});
  // MLP block: x_out = x_mid + down(swiglu(gate_up(norm(x_mid))))
  linear_backward(ctx, &dact, G ? &G->w_down : nullptr, nullptr, dx, a.act, L.w_down, false);
  lora_backward(ctx, st, m, l, {LoraTarget::down}, dx, a.act, a, dact);
  swiglu_backward(ctx, dgu, dact, a.gu);
  linear_backward(ctx, &dxn, G ? &G->w_gate_up : nullptr, nullptr, dgu, a.xn2, L.w_gate_up, false);
  lora_backward(ctx, st, m, l, {LoraTarget::gate, LoraTarget::up}, dgu, a.xn2, a, dxn);
  rmsnorm_backward(ctx, dtmp, G ? &G->mlp_norm : nullptr, dxn, a.x_mid, L.mlp_norm, a.rstd2);
  add_inplace(ctx, dx, dtmp);
  // Attention block: x_mid = x_in + o(attn(rope(norm?(q)), rope(norm?(k)), v))
  Tensor dattn = st.dattn.get(dev, dt, {T, Hq * D});
  Tensor dq = st.dq.get(dev, dt, {T, Hq, D}), dk = st.dk.get(dev, dt, {T, Hk, D}), dv = st.dv.get(dev, dt, {T, Hk, D});
  linear_backward(ctx, &dattn, G ? &G->wo : nullptr, nullptr, dx, a.attn.view({T, Hq * D}), L.wo, false);
  lora_backward(ctx, st, m, l, {LoraTarget::o}, dx, a.attn.view({T, Hq * D}), a, dattn);
  attention_backward(ctx, dq, dk, dv, dattn.view({T, Hq, D}), a.q, a.k, a.v, a.attn, a.lse,
                     layer_attn(c, b, l));
  rope_backward(ctx, dq, b.positions, rope.cos, rope.sin);
  rope_backward(ctx, dk, b.positions, rope.cos, rope.sin);
  Tensor dqkv = st.dqkv.get(dev, dt, {T, int64_t(c.qkv_dim())});
  if (c.qk_norm) {
    Tensor dq_raw = st.dq_raw.get(dev, dt, {T * Hq, D}), dk_raw = st.dk_raw.get(dev, dt, {T * Hk, D});
    rmsnorm_backward(ctx, dq_raw, G ? &G->q_norm : nullptr, dq.view({T * Hq, D}), a.q_raw.view({T * Hq, D}), L.q_norm,
                     a.rstd_q);
    rmsnorm_backward(ctx, dk_raw, G ? &G->k_norm : nullptr, dk.view({T * Hk, D}), a.k_raw.view({T * Hk, D}), L.k_norm,
                     a.rstd_k);
    qkv_merge(ctx, dqkv, dq_raw.view({T, Hq, D}), dk_raw.view({T, Hk, D}), dv);
  } else {
    qkv_merge(ctx, dqkv, dq, dk, dv);
  }
  linear_backward(ctx, &dxn, G ? &G->wqkv : nullptr, (G && !L.bqkv.empty()) ? &G->bqkv : nullptr, dqkv, a.xn1,
                  L.wqkv, false);
  lora_backward(ctx, st, m, l, {LoraTarget::q, LoraTarget::k, LoraTarget::v}, dqkv, a.xn1, a, dxn);
  rmsnorm_backward(ctx, dtmp, G ? &G->attn_norm : nullptr, dxn, x_in, L.attn_norm, a.rstd1);
  add_inplace(ctx, dx, dtmp);
}

}  // namespace

void train_model_forward(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b, Tensor& logp,
                         Tensor* entropy, bool keep_for_backward) {
  const ModelConfig& c = w.config;
  TrainState& st = *m.state;
  const Device dev = ctx.device();
  const DType dt = w.dtype;
  const int64_t T = b.n_tokens, Tc = b.n_completion, C = c.hidden_size;
  const int Ln = c.n_layers;
  GRPO_CHECK_MSG(w.device == dev, "train_model_forward: weights are on another device than the context");
  GRPO_CHECK(logp.numel() == Tc && logp.dtype == DType::f32);
  GRPO_CHECK(!entropy || (entropy->numel() == Tc && entropy->dtype == DType::f32));
  if (b.attn.max_seqlen > st.rope_positions) {
    st.rope_positions = std::max(b.attn.max_seqlen, std::max(st.rope_positions * 2, 256));
    st.rope = rope_table_build(c, dev, st.rope_positions);
  }
  const bool store_all = keep_for_backward && !m.opt.recompute;
  const size_t n_resid = keep_for_backward ? size_t(Ln + 1) : 2;
  if (st.resid.size() < n_resid) st.resid.resize(n_resid);
  const size_t n_layer_bufs = store_all ? size_t(Ln) : 1;
  if (st.layer_bufs.size() < n_layer_bufs) st.layer_bufs.resize(n_layer_bufs);
  st.x.assign(n_resid, Tensor{});
  for (size_t i = 0; i < n_resid; ++i) st.x[i] = st.resid[i].get(dev, dt, {T, C});
  st.acts.assign(n_layer_bufs, LayerActs{});
  if (m.lora)
    GRPO_CHECK_MSG(m.lora->dtype == dt && m.lora->device == dev && int(m.lora->layers.size()) == Ln,
                   "train_model_forward: the LoRA adapters must match the weights' dtype, device and layers");
  const int lora_r = m.lora ? m.lora->cfg.r : 0;
  for (size_t i = 0; i < n_layer_bufs; ++i) st.acts[i] = st.layer_bufs[i].carve(c, dev, dt, T, lora_r);
  Tensor qkv = st.qkv.get(dev, dt, {T, int64_t(c.qkv_dim())});

  st.paged = ctx.batch_invariant() && dev == Device::cuda;
  if (st.paged) build_paged_view(ctx, st, b);
  auto x_of = [&](int l) -> Tensor& { return keep_for_backward ? st.x[size_t(l)] : st.x[size_t(l % 2)]; };
  gather_rows_forward(ctx, x_of(0), w.embed, b.tokens);
  for (int l = 0; l < Ln; ++l)
    layer_forward(ctx, st, m.lora, c, l, w.layers[size_t(l)], st.rope, b, x_of(l), st.acts[store_all ? size_t(l) : 0],
                  qkv, x_of(l + 1));
  st.xf_t = st.xf.get(dev, dt, {T, C});
  st.rstd_f_t = st.rstd_f.get(dev, DType::f32, {T});
  st.h_sel_t = st.h_sel.get(dev, dt, {Tc, C});
  st.lse_sel_t = st.lse_sel.get(dev, DType::f32, {Tc});
  rmsnorm_forward(ctx, st.xf_t, &st.rstd_f_t, x_of(Ln), w.final_norm, c.rms_norm_eps);
  gather_rows_forward(ctx, st.h_sel_t, st.xf_t, b.rows);
  token_logprobs_forward(ctx, logp, st.lse_sel_t, entropy, st.h_sel_t, w.lm_head, b.targets, m.opt.temperature);
  st.kept = keep_for_backward;
  st.kept_weights = w.arena.data;
  st.kept_tokens = b.n_tokens;
}

void train_model_backward(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b,
                          const Tensor& dlogp, ModelWeights& grads, const std::function<void(int)>& layer_done) {
  const ModelConfig& c = w.config;
  TrainState& st = *m.state;
  GRPO_CHECK_MSG(st.kept && st.kept_weights == w.arena.data && st.kept_tokens == b.n_tokens,
                 "train_model_backward: needs a forward with keep_for_backward on the same weights and batch");
  GRPO_CHECK(dlogp.numel() == b.n_completion && dlogp.dtype == DType::f32);
  const bool frozen = m.lora_grads != nullptr;
  GRPO_CHECK(frozen || (grads.layers.size() == w.layers.size() && grads.arena.dtype == DType::f32));
  GRPO_CHECK_MSG(!frozen || (m.lora && m.lora_grads->arena.dtype == DType::f32 &&
                             m.lora_grads->layers.size() == m.lora->layers.size()),
                 "train_model_backward: lora_grads must be f32 adapters of the forward's LoRA layout");
  const Device dev = ctx.device();
  const DType dt = w.dtype;
  const int64_t T = b.n_tokens, Tc = b.n_completion, C = c.hidden_size;
  const int Ln = c.n_layers;

  // LM head and final norm.
  Tensor dh = st.dh_sel.get(dev, dt, {Tc, C}), dxf = st.dxf.get(dev, dt, {T, C}), dx = st.dx.get(dev, dt, {T, C});
  token_logprobs_backward(ctx, dh, frozen ? nullptr : &grads.lm_head, dlogp, st.h_sel_t, w.lm_head, b.targets, st.lse_sel_t,
                          m.opt.temperature);
  gather_rows_backward(ctx, dxf, dh, b.rows, false);
  rmsnorm_backward(ctx, dx, frozen ? nullptr : &grads.final_norm, dxf, st.x[size_t(Ln)], w.final_norm, st.rstd_f_t);
  if (layer_done) layer_done(Ln);  // a tied lm_head wrote into embed, which is final only at the end

  Tensor qkv = st.qkv.get(dev, dt, {T, int64_t(c.qkv_dim())});
  for (int l = Ln - 1; l >= 0; --l) {
    const LayerWeights& L = w.layers[size_t(l)];
    LayerActs* a = &st.acts[0];
    if (m.opt.recompute)  // re-run this layer's forward (its output equals the kept x[l+1])
      layer_forward(ctx, st, m.lora, c, l, L, st.rope, b, st.x[size_t(l)], *a, qkv, st.x[size_t(l + 1)]);
    else
      a = &st.acts[size_t(l)];
    layer_backward(ctx, st, m, c, l, L, frozen ? nullptr : &grads.layers[size_t(l)], st.rope, b, st.x[size_t(l)], *a,
                   dx);
    if (layer_done) layer_done(l);
  }
  if (!frozen) gather_rows_backward(ctx, grads.embed, dx, b.tokens, true);
  if (layer_done) layer_done(-1);
  st.kept = false;  // recompute overwrote kept values and a second backward would double-count
}

int64_t train_activation_bytes(const ModelConfig& c, DType dt, int64_t T, bool recompute) {
  const int64_t es = int64_t(dtype_size(dt));
  const int64_t C = c.hidden_size, F = c.intermediate_size;
  const int64_t q = c.q_dim(), kv = c.kv_dim();
  int64_t layer = es * T * (3 * C + q + 2 * kv + q + 3 * F) + 4 * T * (2 + c.n_heads);
  if (c.qk_norm) layer += es * T * (q + kv) + 4 * T * (c.n_heads + c.n_kv_heads);
  const int64_t resid = es * T * C * (c.n_layers + 1);
  return resid + (recompute ? 1 : c.n_layers) * layer;
}

}  // namespace grpo
