// CPU causal grouped-query attention, f32, plain loops.
// Forward for one query row q against keys 0..n-1 (scale s = 1/sqrt(D)):
//   a_j = s·q·k_j,  lse = log Σ_j exp(a_j),  p_j = exp(a_j − lse),  out = Σ_j p_j·v_j.
// Backward (from dout, with Δ = dout·out):
//   dp_j = dout·v_j,  da_j = p_j·(dp_j − Δ),  dq = s·Σ_j da_j·k_j,
//   dk_j += s·da_j·q,  dv_j += p_j·dout.
// The paged form reads the same rows through the block table; both share attend_row.
// A sliding window W narrows the keys of the query at position p to p-W+1..p.
// A paged cache is f32 or f8e4m3 (kv_cache_dtype = fp8): rows are converted to E4M3
// on write and decoded to their exact f32 values on read, so attention over an fp8
// cache is the f32 computation over the quantised keys and values.
#include "kernels/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace grpo::cpu {

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// First key position a query at position `pos` attends to under sliding window W.
inline int64_t window_start(int64_t pos, int window) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; }

// Softmax attention of one query row over keys j0..n-1; key(j)/val(j) give row pointers.
// `p` has room for n floats. Returns the log-sum-exp of the scaled scores.
template <class KeyFn, class ValFn>
float attend_row(const float* q, int64_t j0, int64_t n, int64_t D, float scale, KeyFn key, ValFn val, float* p,
                 float* out) {
  float m = -INFINITY;
  for (int64_t j = j0; j < n; ++j) {
    p[j] = scale * dot(q, key(j), D);
    m = std::max(m, p[j]);
  }
  float l = 0.f;
  for (int64_t j = j0; j < n; ++j) {
    p[j] = std::exp(p[j] - m);
    l += p[j];
  }
  std::fill(out, out + D, 0.f);
  for (int64_t j = j0; j < n; ++j) {
    const float* v = val(j);
    for (int64_t d = 0; d < D; ++d) out[d] += p[j] * v[d];
  }
  const float inv = 1.f / l;
  for (int64_t d = 0; d < D; ++d) out[d] *= inv;
  return m + std::log(l);
}

// Smallest number of (token, head) rows worth a task: ~16 KFLOP of work per
// task, so tiny decode steps stay on one thread instead of paying a hand-off.
int64_t min_items(int64_t max_keys, int64_t D) {
  return std::max<int64_t>(1, (int64_t(1) << 13) / std::max<int64_t>(1, max_keys * D));
}

// Sequence index of every packed token.
std::vector<int32_t> token_seqs(const AttnVarlen& meta, int64_t T) {
  std::vector<int32_t> s(size_t(T), 0);
  for (size_t i = 0; i + 1 < meta.cu_seqlens.size(); ++i)
    for (int32_t t = meta.cu_seqlens[i]; t < meta.cu_seqlens[i + 1]; ++t) s[size_t(t)] = int32_t(i);
  return s;
}

// f32 value of every E4M3 code (NaN codes decode to NaN).
const std::array<float, 256>& f8e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[size_t(b)] = f8e4m3_to_f32(uint8_t(b));
    return t;
  }();
  return table;
}

// Copies n f32 values into a cache row of dtype `dt` (f32 or f8e4m3).
void store_row(void* dst, DType dt, const float* src, int64_t n) {
  if (dt == DType::f32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  uint8_t* d = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(src[i]);
}

int64_t max_len(const AttnVarlen& meta) {
  int64_t m = 0;
  for (size_t i = 0; i + 1 < meta.cu_seqlens.size(); ++i)
    m = std::max<int64_t>(m, meta.cu_seqlens[i + 1] - meta.cu_seqlens[i]);
  return m;
}

}  // namespace

void attention_forward(Context& ctx, Tensor& out, Tensor* lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttnVarlen& meta) {
  const int64_t T = q.shape[0], Hq = q.shape[1], D = q.shape[2], Hkv = k.shape[1], G = Hq / Hkv;
  const float scale = 1.f / std::sqrt(float(D));
  const std::vector<int32_t> seq = token_seqs(meta, T);
  const int64_t L = max_len(meta);
  const float *Q = q.ptr<float>(), *K = k.ptr<float>(), *V = v.ptr<float>();
  float* O = out.ptr<float>();
  float* LSE = lse ? lse->ptr<float>() : nullptr;
  ctx.parallel_for(T * Hq, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(L));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, g = h / G;
      const int64_t start = meta.cu_seqlens[size_t(seq[size_t(t)])];
      auto key = [&](int64_t j) { return K + ((start + j) * Hkv + g) * D; };
      auto val = [&](int64_t j) { return V + ((start + j) * Hkv + g) * D; };
      const int64_t pos = t - start;
      float l = attend_row(Q + i * D, window_start(pos, meta.window), pos + 1, D, scale, key, val, p.data(), O + i * D);
      if (LSE) LSE[h * T + t] = l;
    }
  }, min_items(L, D));
}

void attention_backward(Context& ctx, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const AttnVarlen& meta) {
  const int64_t T = q.shape[0], Hq = q.shape[1], D = q.shape[2], Hkv = k.shape[1], G = Hq / Hkv;
  const int64_t S = int64_t(meta.cu_seqlens.size()) - 1;
  const float scale = 1.f / std::sqrt(float(D));
  const float *Q = q.ptr<float>(), *K = k.ptr<float>(), *V = v.ptr<float>();
  const float *DO = dout.ptr<float>(), *O = out.ptr<float>(), *LSE = lse.ptr<float>();
  float *DQ = dq.ptr<float>(), *DK = dk.ptr<float>(), *DV = dv.ptr<float>();
  // One task per (sequence, kv head): it owns the dk/dv rows of that head and
  // the dq rows of its query heads, so nothing is shared between tasks.
  ctx.parallel_for(S * Hkv, [&](int64_t i0, int64_t i1) {
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t s = task / Hkv, g = task % Hkv;
      const int64_t start = meta.cu_seqlens[size_t(s)], n = meta.cu_seqlens[size_t(s) + 1] - start;
      for (int64_t j = 0; j < n; ++j) {
        std::fill(DK + ((start + j) * Hkv + g) * D, DK + ((start + j) * Hkv + g + 1) * D, 0.f);
        std::fill(DV + ((start + j) * Hkv + g) * D, DV + ((start + j) * Hkv + g + 1) * D, 0.f);
      }
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = start + i;
          const float* qi = Q + (t * Hq + h) * D;
          const float* doi = DO + (t * Hq + h) * D;
          float* dqi = DQ + (t * Hq + h) * D;
          std::fill(dqi, dqi + D, 0.f);
          const float delta = dot(doi, O + (t * Hq + h) * D, D);
          const float l = LSE[h * T + t];
          for (int64_t j = window_start(i, meta.window); j <= i; ++j) {
            const float* kj = K + ((start + j) * Hkv + g) * D;
            const float* vj = V + ((start + j) * Hkv + g) * D;
            const float p = std::exp(scale * dot(qi, kj, D) - l);
            const float da = p * (dot(doi, vj, D) - delta);
            float* dkj = DK + ((start + j) * Hkv + g) * D;
            float* dvj = DV + ((start + j) * Hkv + g) * D;
            for (int64_t d = 0; d < D; ++d) {
              dqi[d] += scale * da * kj[d];
              dkj[d] += scale * da * qi[d];
              dvj[d] += p * doi[d];
            }
          }
        }
      }
    }
  }, 1);
}

void kv_cache_write(Context& ctx, Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const PagedAttnMeta& meta) {
  const int64_t T = k.shape[0], row = k.shape[1] * k.shape[2];
  const DType dt = k_cache.dtype;
  const size_t row_bytes = size_t(row) * dtype_size(dt);
  const int32_t* slot = meta.slot_mapping.ptr<int32_t>();
  uint8_t *KC = k_cache.ptr<uint8_t>(), *VC = v_cache.ptr<uint8_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0) continue;  // padding token: nothing to store
    store_row(KC + size_t(slot[t]) * row_bytes, dt, k.ptr<float>() + t * row, row);
    store_row(VC + size_t(slot[t]) * row_bytes, dt, v.ptr<float>() + t * row, row);
  }
}

void attention_paged(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const PagedAttnMeta& meta, Tensor* lse) {
  const int64_t T = q.shape[0], Hq = q.shape[1], D = q.shape[2];
  const int64_t bs = k_cache.shape[1], Hkv = k_cache.shape[2], G = Hq / Hkv;
  const int64_t max_blocks = meta.block_table.shape[1];
  const float scale = 1.f / std::sqrt(float(D));
  const int32_t *SEQ = meta.token_seq.ptr<int32_t>(), *POS = meta.token_pos.ptr<int32_t>();
  const int32_t* BT = meta.block_table.ptr<int32_t>();
  const float* Q = q.ptr<float>();
  const bool fp8 = k_cache.dtype == DType::f8e4m3;
  const float* lut = f8e4m3_table().data();
  float* O = out.ptr<float>();
  float* LSE = lse ? lse->ptr<float>() : nullptr;
  int64_t L = 0;
  for (int64_t t = 0; t < T; ++t) L = std::max<int64_t>(L, POS[t] + 1);
  ctx.parallel_for(T * Hq, [&](int64_t i0, int64_t i1) {
    std::vector<float> p(static_cast<size_t>(L));
    std::vector<float> row(fp8 ? size_t(D) : 0);  // one decoded fp8 row; attend_row uses each row before the next
    // Row `s` (a slot·Hkv + head index) of a cache as f32.
    auto read = [&](const Tensor& cache, int64_t s) -> const float* {
      if (!fp8) return cache.ptr<float>() + s * D;
      const uint8_t* b = cache.ptr<uint8_t>() + s * D;
      for (int64_t d = 0; d < D; ++d) row[size_t(d)] = lut[b[d]];
      return row.data();
    };
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, g = h / G;
      const int32_t* table = BT + int64_t(SEQ[t]) * max_blocks;
      auto slot = [&](int64_t j) { return (int64_t(table[j / bs]) * bs + j % bs) * Hkv + g; };
      auto key = [&](int64_t j) { return read(k_cache, slot(j)); };
      auto val = [&](int64_t j) { return read(v_cache, slot(j)); };
      const int64_t pos = POS[t];
      const float l =
          attend_row(Q + i * D, window_start(pos, meta.window), pos + 1, D, scale, key, val, p.data(), O + i * D);
      if (LSE) LSE[h * T + t] = l;
    }
  }, min_items(L, D));
}

}  // namespace grpo::cpu
