// CUDA token logprobs fused with the LM head, in vocabulary chunks (no (N,V) tensor):
//   z = (h·wᵀ)·(1/temperature) per (row tile × kVocab chunk) by cuBLASLt into an f32
//   scratch tile (alpha = 1/temperature, as the CPU reference), then one block per row
//   folds the chunk into a running (max m, Σ e^(z−m), Σ e^(z−m)·z, z[target]) state,
//   chunks in vocabulary order. lse = m + log s, logp = z_t − lse, entropy = lse − sz/s.
// Backward recomputes each tile, writes da = dlogp·([j = t] − e^(z − lse))/temperature in
// the operand dtype, and runs two GEMMs: dh (f32 accumulator) += da·w_chunk and
// dw_chunk += daᵀ·h_tile. Chunk boundaries are fixed (kVocab), so a row's result does not
// depend on which other rows are in the batch, apart from the GEMM itself.
// Targets outside [0, V) contribute no z_t (logp = −lse), as on the CPU.
#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/linear_wgmma.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/workspace.cuh"
#include "kernels/logprob.h"

namespace grpo::cuda {

namespace {

constexpr int64_t kVocab = 4096;  // vocabulary entries per GEMM tile
constexpr int64_t kMaxRows = 4096;
constexpr int kThreads = 256;

struct RowState {
  float m, s, sz, zt;
};

// The statistics of one vocabulary chunk of a row, block-wide (one block per row and chunk):
// max mx, s = Σ e^(z−mx), sz = Σ e^(z−mx)·z over its nv values z_j = zr[j] (SCALE = false: a
// logits tile already scaled by 1/temperature) or __fmul_rn(zr[j], scale) (SCALE = true: raw
// logits, scaled here exactly as the GEMM epilogue scales its sum). Valid in thread 0.
struct ChunkStat {
  float mx, s, sz;
};
template <bool SCALE>
__device__ __forceinline__ float chunk_value(const float* __restrict__ zr, float scale, int64_t j) {
  return SCALE ? __fmul_rn(zr[j], scale) : zr[j];
}
template <bool SCALE>
__device__ __forceinline__ ChunkStat chunk_stat(const float* __restrict__ zr, float scale, int64_t nv) {
  __shared__ float sh[32];
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < nv; j += kThreads) mx = fmaxf(mx, chunk_value<SCALE>(zr, scale, j));
  mx = block_max(mx, sh);
  float s = 0.f, sz = 0.f;
  for (int64_t j = threadIdx.x; j < nv; j += kThreads) {
    const float z = chunk_value<SCALE>(zr, scale, j);
    const float e = expf(z - mx);
    s += e;
    sz += e * z;
  }
  s = block_sum(s, sh);
  sz = block_sum(sz, sh);
  return ChunkStat{mx, s, sz};
}

// A row's running state after one more chunk, in vocabulary order; explicit roundings (no
// contraction), so that both kernels that fold give the same bits.
__device__ __forceinline__ void fold_state(RowState& cur, const ChunkStat& c) {
  const float M = fmaxf(cur.m, c.mx);
  const float a = cur.m == -INFINITY ? 0.f : expf(__fsub_rn(cur.m, M));
  const float b = expf(__fsub_rn(c.mx, M));
  cur.s = __fadd_rn(__fmul_rn(cur.s, a), __fmul_rn(c.s, b));
  cur.sz = __fadd_rn(__fmul_rn(cur.sz, a), __fmul_rn(c.sz, b));
  cur.m = M;
}

// z (R, nv) f32 -> state[r0 + r] updated. One block per row.
__global__ void __launch_bounds__(kThreads) chunk_stats_kernel(RowState* __restrict__ st, const float* __restrict__ z,
                                                               const int32_t* __restrict__ tgt, int64_t r0,
                                                               int64_t v0, int64_t nv, bool first) {
  const int64_t r = blockIdx.x, i = r0 + r;
  const float* zr = z + r * nv;
  const ChunkStat c = chunk_stat<false>(zr, 1.f, nv);
  if (threadIdx.x == 0) {
    RowState cur = first ? RowState{-INFINITY, 0.f, 0.f, 0.f} : st[i];
    const int64_t t = tgt[i];
    if (t >= v0 && t < v0 + nv) cur.zt = zr[t - v0];
    fold_state(cur, c);
    st[i] = cur;
  }
}

// logits (R, V) f32, unscaled: the statistics of chunk blockIdx.y (kVocab ids, the chunks
// token_logprobs_forward folds one GEMM tile at a time) of row blockIdx.x, and the row's target
// value when the chunk holds it. All chunks of all rows at once; logits_fold_kernel folds them.
__global__ void __launch_bounds__(kThreads) logits_chunk_kernel(ChunkStat* __restrict__ stats, float* __restrict__ zt,
                                                                const float* __restrict__ logits,
                                                                const int32_t* __restrict__ tgt, int64_t V,
                                                                float inv_temp) {
  const int64_t r = blockIdx.x, c = blockIdx.y, v0 = c * kVocab;
  const int64_t nv = V - v0 < kVocab ? V - v0 : kVocab;
  const float* zr = logits + r * V + v0;
  const ChunkStat st = chunk_stat<true>(zr, inv_temp, nv);
  if (threadIdx.x == 0) {
    stats[r * gridDim.y + c] = st;
    const int64_t t = tgt[r];
    if (t >= v0 && t < v0 + nv) zt[r] = chunk_value<true>(zr, inv_temp, t - v0);
  }
}

// state[r] = the chunks of row r folded in vocabulary order (thread per row).
__global__ void logits_fold_kernel(RowState* __restrict__ st, const ChunkStat* __restrict__ stats,
                                   const float* __restrict__ zt, int64_t R, int n_chunks) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= R) return;
  RowState cur{-INFINITY, 0.f, 0.f, zt[r]};
  for (int c = 0; c < n_chunks; ++c) fold_state(cur, stats[r * n_chunks + c]);
  st[r] = cur;
}

__global__ void finalize_kernel(float* __restrict__ logp, float* __restrict__ lse, float* __restrict__ ent,
                                const RowState* __restrict__ st, int64_t N) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const RowState s = st[i];
  const float l = s.m + logf(s.s);
  lse[i] = l;
  logp[i] = s.zt - l;
  if (ent) ent[i] = l - s.sz / s.s;
}

// da (R, nv) = dlogp·(onehot − exp(z − lse))·inv_temp, in the operand dtype.
template <class T>
__global__ void chunk_grad_kernel(T* __restrict__ da, const float* __restrict__ z, const float* __restrict__ dlogp,
                                  const int32_t* __restrict__ tgt, const float* __restrict__ lse, int64_t r0,
                                  int64_t v0, int64_t nv, float inv_temp) {
  const int64_t r = blockIdx.x, i = r0 + r;
  const float g = dlogp[i], l = lse[i];
  const int64_t t = tgt[i];
  for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
    const float p = expf(z[r * nv + j] - l);
    const float onehot = (v0 + j == t) ? 1.f : 0.f;
    da[r * nv + j] = from_f32<T>(g * (onehot - p) * inv_temp);
  }
}

template <class T>
__global__ void store_rows_kernel(T* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f32<T>(src[i]);
}

void check_args(const Tensor& h, const Tensor& w, const Tensor& targets, float temperature, const char* what) {
  GRPO_CHECK_MSG(h.ndim == 2 && w.ndim == 2 && h.shape[1] == w.shape[1], what);
  GRPO_CHECK_MSG(h.dtype == w.dtype && (h.dtype == DType::f32 || h.dtype == DType::bf16), what);
  GRPO_CHECK_MSG(targets.dtype == DType::i32 && targets.numel() == h.shape[0], what);
  GRPO_CHECK_MSG(temperature > 0.f, "token_logprobs: temperature must be positive");
}

}  // namespace

void token_logprobs_forward(Context& ctx, Tensor& logp, Tensor& lse, Tensor* entropy, const Tensor& h,
                            const Tensor& w, const Tensor& targets, float temperature) {
  check_args(h, w, targets, temperature, "token_logprobs_forward: h (N,C), w (V,C) same dtype, targets (N) i32");
  const int64_t N = h.shape[0], C = h.shape[1], V = w.shape[0];
  GRPO_CHECK_MSG(logp.numel() == N && lse.numel() == N && logp.dtype == DType::f32 && lse.dtype == DType::f32,
                 "token_logprobs_forward: logp, lse must be (N) f32");
  if (entropy) GRPO_CHECK_MSG(entropy->numel() == N && entropy->dtype == DType::f32, "token_logprobs_forward: entropy (N) f32");
  if (N == 0) return;
  GRPO_CHECK_MSG(V > 0, "token_logprobs_forward: empty vocabulary");
  const float inv_temp = 1.f / temperature;
  ScratchAlloc sa(ctx);
  RowState* st = sa.alloc<RowState>(N, "token_logprobs state");
  const int64_t vc = V < kVocab ? V : kVocab;
  int64_t R = int64_t(sa.left()) / (vc * 4 + 64);
  if (R > kMaxRows) R = kMaxRows;
  if (R > N) R = N;
  GRPO_CHECK_MSG(R >= 1, "token_logprobs_forward: workspace too small for one row");
  float* z = sa.alloc<float>(R * vc, "token_logprobs logits tile");
  cudaStream_t s = stream_of(ctx);
  const size_t es = dtype_size(h.dtype);
  const int lm_head_split = ctx.batch_invariant() ? wgmma_gemm_config(V, C).split : 0;
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t nr = N - r0 < R ? N - r0 : R;
    for (int64_t v0 = 0; v0 < V; v0 += kVocab) {
      const int64_t nv = V - v0 < kVocab ? V - v0 : kVocab;
      // z (nr, nv) = h[r0:] (nr, C) · w[v0:]ᵀ · inv_temp; batch-invariant contexts (bitwise
      // on-policy): the wgmma kernel whose result for a row does not depend on the other rows.
      if (ctx.batch_invariant()) {
        // The split of the whole LM head's product (linear_forward's, which the engine's
        // logits come from), so that z is the engine's logits · (1/T) bit for bit.
        Tensor zt = tensor_borrow(z, DType::f32, Device::cuda, {nr, nv});
        const bool ok =
            linear_wgmma_f32(ctx, zt, h.slice0(r0, r0 + nr), w.slice0(v0, v0 + nv), inv_temp, lm_head_split);
        GRPO_CHECK_MSG(ok, "token_logprobs_forward: the batch-invariant GEMM (train.on_policy = \"bitwise\") needs "
                           "bf16 h and w with C a multiple of 8 and at least 64 on an sm_90 GPU");
      } else {
        gemm(ctx, z, DType::f32, nv, static_cast<const char*>(h.data) + size_t(r0 * C) * es, C, false,
             static_cast<const char*>(w.data) + size_t(v0 * C) * es, C, true, h.dtype, nr, nv, C, inv_temp, 0.f);
      }
      chunk_stats_kernel<<<unsigned(nr), kThreads, 0, s>>>(st, z, targets.ptr<int32_t>(), r0, v0, nv, v0 == 0);
      CUDA_CHECK_LAUNCH();
    }
  }
  finalize_kernel<<<unsigned(ceil_div(N, 256)), 256, 0, s>>>(logp.ptr<float>(), lse.ptr<float>(),
                                                              entropy ? entropy->ptr<float>() : nullptr, st, N);
  CUDA_CHECK_LAUNCH();
}

void logits_token_logprobs(Context& ctx, Tensor& logp, const Tensor& logits, const Tensor& targets,
                           float temperature) {
  GRPO_CHECK_MSG(logits.ndim == 2 && logits.dtype == DType::f32 && logits.device == Device::cuda,
                 "logits_token_logprobs: logits (R,V) f32 on the device");
  const int64_t R = logits.shape[0], V = logits.shape[1];
  GRPO_CHECK_MSG(logp.numel() == R && logp.dtype == DType::f32 && targets.dtype == DType::i32 && targets.numel() == R,
                 "logits_token_logprobs: logp (R) f32, targets (R) i32");
  GRPO_CHECK_MSG(temperature > 0.f, "logits_token_logprobs: temperature must be positive");
  if (R == 0) return;
  ScratchAlloc sa(ctx);
  const int n_chunks = int(ceil_div(V, kVocab));
  RowState* st = sa.alloc<RowState>(R, "logits_token_logprobs state");
  ChunkStat* stats = sa.alloc<ChunkStat>(R * n_chunks, "logits_token_logprobs chunk stats");
  float* zt = sa.alloc<float>(R, "logits_token_logprobs target values");
  float* lse = sa.alloc<float>(R, "logits_token_logprobs lse");
  cudaStream_t s = stream_of(ctx);
  // Targets outside [0, V) keep zt = 0 (no chunk holds them), as token_logprobs_forward.
  CUDA_CHECK(cudaMemsetAsync(zt, 0, size_t(R) * sizeof(float), s));
  logits_chunk_kernel<<<dim3(unsigned(R), unsigned(n_chunks)), kThreads, 0, s>>>(
      stats, zt, logits.ptr<float>(), targets.ptr<int32_t>(), V, 1.f / temperature);
  CUDA_CHECK_LAUNCH();
  logits_fold_kernel<<<unsigned(ceil_div(R, 128)), 128, 0, s>>>(st, stats, zt, R, n_chunks);
  CUDA_CHECK_LAUNCH();
  finalize_kernel<<<unsigned(ceil_div(R, 256)), 256, 0, s>>>(logp.ptr<float>(), lse, nullptr, st, R);
  CUDA_CHECK_LAUNCH();
}

void token_logprobs_backward(Context& ctx, Tensor& dh, Tensor* dw, const Tensor& dlogp, const Tensor& h,
                             const Tensor& w, const Tensor& targets, const Tensor& lse, float temperature) {
  check_args(h, w, targets, temperature, "token_logprobs_backward: h (N,C), w (V,C) same dtype, targets (N) i32");
  const int64_t N = h.shape[0], C = h.shape[1], V = w.shape[0];
  GRPO_CHECK_MSG(dh.numel() == N * C && (dh.dtype == DType::f32 || dh.dtype == h.dtype), "token_logprobs_backward: dh (N,C)");
  GRPO_CHECK_MSG(dlogp.numel() == N && dlogp.dtype == DType::f32 && lse.numel() == N && lse.dtype == DType::f32,
                 "token_logprobs_backward: dlogp, lse must be (N) f32");
  if (dw) GRPO_CHECK_MSG(dw->numel() == V * C && dw->dtype == DType::f32, "token_logprobs_backward: dw (V,C) f32");
  if (N == 0) return;
  const float inv_temp = 1.f / temperature;
  const DType dt = h.dtype;
  const size_t es = dtype_size(dt);
  const bool direct = dh.dtype == DType::f32;  // accumulate straight into dh
  ScratchAlloc sa(ctx);
  const int64_t vc = V < kVocab ? V : kVocab;
  int64_t R = int64_t(sa.left()) / (vc * int64_t(4 + es) + (direct ? 0 : C * 4) + 1024);
  if (R > kMaxRows) R = kMaxRows;
  if (R > N) R = N;
  GRPO_CHECK_MSG(R >= 1, "token_logprobs_backward: workspace too small for one row");
  float* z = sa.alloc<float>(R * vc, "token_logprobs logits tile");
  void* da = sa.alloc<char>(R * vc * int64_t(es), "token_logprobs grad tile");
  float* dh_acc = direct ? nullptr : sa.alloc<float>(R * C, "token_logprobs dh accumulator");
  cudaStream_t s = stream_of(ctx);
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t nr = N - r0 < R ? N - r0 : R;
    const void* h_tile = static_cast<const char*>(h.data) + size_t(r0 * C) * es;
    float* acc = direct ? dh.ptr<float>() + r0 * C : dh_acc;
    for (int64_t v0 = 0; v0 < V; v0 += kVocab) {
      const int64_t nv = V - v0 < kVocab ? V - v0 : kVocab;
      const void* w_chunk = static_cast<const char*>(w.data) + size_t(v0 * C) * es;
      gemm(ctx, z, DType::f32, nv, h_tile, C, false, w_chunk, C, true, dt, nr, nv, C, inv_temp, 0.f);
      GRPO_DISPATCH_FLOAT(dt, T, {
        chunk_grad_kernel<T><<<unsigned(nr), kThreads, 0, s>>>(static_cast<T*>(da), z, dlogp.ptr<float>(),
                                                               targets.ptr<int32_t>(), lse.ptr<float>(), r0, v0, nv,
                                                               inv_temp);
      });
      CUDA_CHECK_LAUNCH();
      // acc (nr, C) (+)= da (nr, nv) · w_chunk (nv, C)
      gemm(ctx, acc, DType::f32, C, da, nv, false, w_chunk, C, false, dt, nr, C, nv, 1.f, v0 == 0 ? 0.f : 1.f);
      // dw_chunk (nv, C) += daᵀ (nv, nr) · h_tile (nr, C)
      if (dw)
        gemm(ctx, dw->ptr<float>() + v0 * C, DType::f32, C, da, nv, true, h_tile, C, false, dt, nv, C, nr, 1.f, 1.f);
    }
    if (!direct) {
      GRPO_DISPATCH_FLOAT(dh.dtype, T, {
        store_rows_kernel<T><<<flat_grid(nr * C, 256), 256, 0, s>>>(dh.ptr<T>() + r0 * C, dh_acc, nr * C);
      });
      CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace grpo::cuda
