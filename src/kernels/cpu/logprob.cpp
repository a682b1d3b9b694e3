// CPU fused LM head + log-softmax in vocabulary chunks. Never materialises
// (N, V): work is tiled into (64 rows × 1024 vocab) blocks, each one GEMM into a
// small buffer. Per block we keep (max m, Σ exp(z−m), Σ exp(z−m)·z) per row;
// blocks are merged per row in vocabulary order, so the result does not depend
// on the thread count. In deterministic mode every tile row is its own sgemv
// (sgemm's result for a row may depend on the tile height, i.e. on the other
// rows), so a row's logprob is a function of that row alone: the engine calls this
// kernel on one sampled row and gets the trainer's bits (docs/bitwise.md).
//   z = (h·wᵀ)·(1/temperature), lse = log Σ exp z, logp = z[target] − lse,
//   entropy = lse − Σ softmax(z)·z.
// Backward: da_ij = dlogp_i·([j = t_i] − p_ij)/temperature with p = exp(z − lse);
//   dh = da·w (rows in parallel, chunks in order), dw += daᵀ·h (chunks in parallel, rows in order).
#include "kernels/logprob.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/blas.h"

namespace grpo::cpu {

namespace {
constexpr int64_t kRows = 64;     // rows per tile
constexpr int64_t kVocab = 1024;  // vocabulary entries per tile

struct Tile {
  int64_t r0, nr, v0, nv;
};
inline Tile tile(int64_t rb, int64_t ch, int64_t N, int64_t V) {
  Tile t{rb * kRows, 0, ch * kVocab, 0};
  t.nr = std::min(kRows, N - t.r0);
  t.nv = std::min(kVocab, V - t.v0);
  return t;
}

// z (nr, nv) = h[r0:] · w[v0:]ᵀ / temperature; per_row: one sgemv per row.
void tile_logits(const Tile& t, const float* H, const float* W, int64_t C, float inv_temp, float* z, bool per_row) {
  if (per_row) {
    for (int64_t r = 0; r < t.nr; ++r)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(t.nv), int(C), inv_temp, W + t.v0 * C, int(C),
                  H + (t.r0 + r) * C, 1, 0.f, z + r * t.nv, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(t.nr), int(t.nv), int(C), inv_temp, H + t.r0 * C,
              int(C), W + t.v0 * C, int(C), 0.f, z, int(t.nv));
}

// z (nr, nv) -> da (nr, nv) in place
void tile_grad(const Tile& t, float* z, const float* dlogp, const int32_t* tgt, const float* lse, float inv_temp) {
  for (int64_t r = 0; r < t.nr; ++r) {
    const int64_t i = t.r0 + r;
    float* zr = z + r * t.nv;
    for (int64_t j = 0; j < t.nv; ++j) {
      const float p = std::exp(zr[j] - lse[i]);
      const float onehot = (t.v0 + j == tgt[i]) ? 1.f : 0.f;
      zr[j] = dlogp[i] * (onehot - p) * inv_temp;
    }
  }
}
}  // namespace

void token_logprobs_forward(Context& ctx, Tensor& logp, Tensor& lse, Tensor* entropy, const Tensor& h,
                            const Tensor& w, const Tensor& targets, float temperature) {
  blas_init();
  const int64_t N = h.shape[0], C = h.shape[1], V = w.shape[0];
  const int64_t n_rb = (N + kRows - 1) / kRows, n_ch = (V + kVocab - 1) / kVocab;
  const float inv_temp = 1.f / temperature;
  const float *H = h.ptr<float>(), *W = w.ptr<float>();
  const int32_t* TG = targets.ptr<int32_t>();
  const bool per_row = ctx.deterministic();
  // per (row, chunk) partial statistics
  std::vector<float> pm(size_t(N * n_ch)), ps(size_t(N * n_ch)), pz(size_t(N * n_ch)), zt(size_t(N), 0.f);
  ctx.parallel_for(n_rb * n_ch, [&](int64_t k0, int64_t k1) {
    std::vector<float> z(size_t(kRows * kVocab));
    for (int64_t k = k0; k < k1; ++k) {
      const Tile t = tile(k / n_ch, k % n_ch, N, V);
      tile_logits(t, H, W, C, inv_temp, z.data(), per_row);
      for (int64_t r = 0; r < t.nr; ++r) {
        const int64_t i = t.r0 + r;
        const float* zr = z.data() + r * t.nv;
        float m = -INFINITY;
        for (int64_t j = 0; j < t.nv; ++j) m = std::max(m, zr[j]);
        float s = 0.f, sz = 0.f;
        for (int64_t j = 0; j < t.nv; ++j) {
          const float e = std::exp(zr[j] - m);
          s += e;
          sz += e * zr[j];
        }
        const size_t at = size_t(i * n_ch + k % n_ch);
        pm[at] = m;
        ps[at] = s;
        pz[at] = sz;
        if (TG[i] >= t.v0 && TG[i] < t.v0 + t.nv) zt[size_t(i)] = zr[TG[i] - t.v0];
      }
    }
  }, 1);
  float *LP = logp.ptr<float>(), *LSE = lse.ptr<float>();
  float* ENT = entropy ? entropy->ptr<float>() : nullptr;
  for (int64_t i = 0; i < N; ++i) {
    const float* m = pm.data() + i * n_ch;
    float M = -INFINITY;
    for (int64_t c = 0; c < n_ch; ++c) M = std::max(M, m[c]);
    float S = 0.f, SZ = 0.f;
    for (int64_t c = 0; c < n_ch; ++c) {
      const float f = std::exp(m[c] - M);
      S += ps[size_t(i * n_ch + c)] * f;
      SZ += pz[size_t(i * n_ch + c)] * f;
    }
    LSE[i] = M + std::log(S);
    LP[i] = zt[size_t(i)] - LSE[i];
    if (ENT) ENT[i] = LSE[i] - SZ / S;
  }
}

void token_logprobs_backward(Context& ctx, Tensor& dh, Tensor* dw, const Tensor& dlogp, const Tensor& h,
                             const Tensor& w, const Tensor& targets, const Tensor& lse, float temperature) {
  blas_init();
  const int64_t N = h.shape[0], C = h.shape[1], V = w.shape[0];
  const int64_t n_rb = (N + kRows - 1) / kRows, n_ch = (V + kVocab - 1) / kVocab;
  const float inv_temp = 1.f / temperature;
  const float *H = h.ptr<float>(), *W = w.ptr<float>(), *DLP = dlogp.ptr<float>(), *LSE = lse.ptr<float>();
  const int32_t* TG = targets.ptr<int32_t>();
  const bool per_row = ctx.deterministic();  // z exactly as the forward formed it
  float* DH = dh.ptr<float>();
  // dh: one task per row block, vocabulary chunks in order
  ctx.parallel_for(n_rb, [&](int64_t b0, int64_t b1) {
    std::vector<float> z(size_t(kRows * kVocab));
    for (int64_t rb = b0; rb < b1; ++rb) {
      for (int64_t ch = 0; ch < n_ch; ++ch) {
        const Tile t = tile(rb, ch, N, V);
        tile_logits(t, H, W, C, inv_temp, z.data(), per_row);
        tile_grad(t, z.data(), DLP, TG, LSE, inv_temp);
        // dh[r0:] (nr, C) (+)= da (nr, nv) · w[v0:] (nv, C)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(t.nr), int(C), int(t.nv), 1.f, z.data(),
                    int(t.nv), W + t.v0 * C, int(C), ch == 0 ? 0.f : 1.f, DH + t.r0 * C, int(C));
      }
    }
  }, 1);
  if (!dw) return;
  float* DW = dw->ptr<float>();
  // dw: one task per vocabulary chunk, row blocks in order
  ctx.parallel_for(n_ch, [&](int64_t c0, int64_t c1) {
    std::vector<float> z(size_t(kRows * kVocab));
    for (int64_t ch = c0; ch < c1; ++ch) {
      for (int64_t rb = 0; rb < n_rb; ++rb) {
        const Tile t = tile(rb, ch, N, V);
        tile_logits(t, H, W, C, inv_temp, z.data(), per_row);
        tile_grad(t, z.data(), DLP, TG, LSE, inv_temp);
        // dw[v0:] (nv, C) += daᵀ (nv, nr) · h[r0:] (nr, C)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(t.nv), int(C), int(t.nr), 1.f, z.data(),
                    int(t.nv), H + t.r0 * C, int(C), 1.f, DW + t.v0 * C, int(C));
      }
    }
  }, 1);
}

}  // namespace grpo::cpu
