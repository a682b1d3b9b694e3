// CPU dense layers: out = x·wᵀ (+ bias) through OpenBLAS, split into fixed
// blocks of output columns across the thread pool (results do not depend on
// the thread count). Decode-sized inputs, and every input in deterministic
// mode, go row by row through sgemv so that a row's output does not depend on
// the other rows of the batch. On that path an accumulating product is
// computed on its own and then added (out + fl(x·wᵀ)), never folded into the
// sgemv's beta: the trainer forms the same residual as fl(x·wᵀ) + out, and f32
// addition commutes, so the engine's x += o·Woᵀ equals it bit for bit
// (docs/bitwise.md).
#include "kernels/linear.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/cpu/blas.h"

namespace grpo::cpu {

// Up to this many rows, linear_forward uses sgemv per row instead of sgemm
// (measured: sgemm with M = 1 is ~3x slower than sgemv on (9728 x 896)).
constexpr int64_t kGemvRows = 2;
// Output columns are split into fixed blocks (not per thread), so each output
// element is computed by the same BLAS call shape for any thread count.
constexpr int64_t kColBlock = 128;

void blas_init() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void linear_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                    bool accumulate) {
  blas_init();
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  const float* X = x.ptr<float>();
  const float* W = w.ptr<float>();
  const float* b = bias ? bias->ptr<float>() : nullptr;
  float* O = out.ptr<float>();
  if (M == 0) return;
  // Row-at-a-time products make every output row independent of the others in
  // the batch (batch-invariant): used for decode, and always in deterministic mode.
  const bool per_row = M <= kGemvRows || ctx.deterministic();
  const int64_t n_blocks = (N + kColBlock - 1) / kColBlock;
  ctx.parallel_for(n_blocks, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * kColBlock, n1 = std::min(N, b1 * kColBlock);
    if (per_row) {
      std::vector<float> acc(accumulate ? size_t(n1 - n0) : 0);
      for (int64_t m = 0; m < M; ++m) {
        float* y = accumulate ? acc.data() : O + m * N + n0;
        cblas_sgemv(CblasRowMajor, CblasNoTrans, int(n1 - n0), int(K), 1.f, W + n0 * K, int(K), X + m * K, 1, 0.f,
                    y, 1);
        if (accumulate)
          for (int64_t n = n0; n < n1; ++n) O[m * N + n] += acc[size_t(n - n0)];
      }
    } else {
      // out[:, n0:n1] (M, n1-n0) = x (M,K) · w[n0:n1]ᵀ (K, n1-n0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(n1 - n0), int(K), 1.f, X, int(K),
                  W + n0 * K, int(K), accumulate ? 1.f : 0.f, O + n0, int(N));
    }
    if (b)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) O[m * N + n] += b[n];
  }, std::max<int64_t>(1, gemm_min_cols(M, K) / kColBlock));
}

void linear_backward(Context& ctx, Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dout, const Tensor& x,
                     const Tensor& w, bool accumulate_dx) {
  blas_init();
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  const float* G = dout.ptr<float>();
  const float* X = x.ptr<float>();
  const float* W = w.ptr<float>();
  if (M == 0) return;  // nothing to add; dx (0, K) is empty
  if (dx) {
    float* DX = dx->ptr<float>();
    // dx[:, k0:k1] (M, k1-k0) = dout (M,N) · w[:, k0:k1] (N, k1-k0)
    ctx.parallel_for((K + kColBlock - 1) / kColBlock, [&](int64_t b0, int64_t b1) {
      const int64_t k0 = b0 * kColBlock, k1 = std::min(K, b1 * kColBlock);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(k1 - k0), int(N), 1.f, G, int(N),
                  W + k0, int(K), accumulate_dx ? 1.f : 0.f, DX + k0, int(K));
    }, std::max<int64_t>(1, gemm_min_cols(M, N) / kColBlock));
  }
  if (dw) {
    float* DW = dw->ptr<float>();
    // dw[n0:n1] (n1-n0, K) += dout[:, n0:n1]ᵀ (n1-n0, M) · x (M, K)
    ctx.parallel_for((N + kColBlock - 1) / kColBlock, [&](int64_t b0, int64_t b1) {
      const int64_t n0 = b0 * kColBlock, n1 = std::min(N, b1 * kColBlock);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(n1 - n0), int(K), int(M), 1.f, G + n0, int(N),
                  X, int(K), 1.f, DW + n0 * K, int(K));
    }, std::max<int64_t>(1, gemm_min_cols(M, K) / kColBlock));
  }
  if (db) {
    float* DB = db->ptr<float>();
    ctx.parallel_for(N, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        float s = 0.f;
        for (int64_t m = 0; m < M; ++m) s += G[m * N + n];
        DB[n] += s;
      }
    }, 64);
  }
}

}  // namespace grpo::cpu
