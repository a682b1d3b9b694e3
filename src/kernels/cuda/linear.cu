// CUDA dense layers through cuBLASLt, and the shared row-major gemm() helper
// (declared in cuda_check.cuh) that the fused logprob op also uses. bf16 forwards with
// M <= 64 (decode) go to linear_small_m (linear_small_m.cu) when it applies.
//   forward      out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias]      (TN in cuBLAS terms)
//   backward dx  dx (M,K) = dout (M,N) · w (N,K)               (NN)
//            dw  dw (N,K) f32 += doutᵀ · x                      (NT, beta = 1)
//            db  db (N) f32 += Σ_rows dout                      (own kernel, fixed order)
// bf16 operands accumulate in f32 (CUBLAS_COMPUTE_32F); f32 operands use
// CUBLAS_COMPUTE_32F as well, which never uses TF32.
// linear_swiglu_forward (gate/up projection + SwiGLU) runs linear_wgmma_swiglu where
// linear_forward would have used linear_wgmma, else linear_forward + swiglu_forward.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/convert.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/env_switch.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/workspace.cuh"
#include "kernels/cuda/linear_small_m.h"
#include "kernels/cuda/linear_wgmma.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"

namespace grpo::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: GRPO_CHECK_MSG(false, "gemm: dtype must be f32, bf16 or f16");
  }
  return CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt assumes 256 unless told.
uint32_t alignment_of(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

// Heuristic results are cached per problem (pure function of the key on one device).
// The last field: the query was for this exact m (else for m's bucket, gemm_row_bucket).
using AlgoKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int, int, uint32_t,
                           uint32_t, uint32_t, size_t, int, bool>;
std::mutex g_algo_mu;

std::map<AlgoKey, cublasLtMatmulAlgo_t> g_algo_cache;

template <class T>
__global__ void add_bias_kernel(T* __restrict__ out, const float* __restrict__ bias, int64_t M, int64_t N) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(out[i]) + bias[i % N]);
}

template <class T>
__global__ void add_bias_bf16_kernel(T* __restrict__ out, const __nv_bfloat16* __restrict__ bias, int64_t M,
                                     int64_t N) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(to_f32(out[i]) + __bfloat162float(bias[i % N]));
}

// db (N) += Σ_m dout (M,N). Block = 32 columns × 8 row groups; fixed summation order.
template <class T>
__global__ void __launch_bounds__(256) bias_grad_kernel(float* __restrict__ db, const T* __restrict__ dout, int64_t M,
                                                        int64_t N) {
  __shared__ float part[8][33];
  const int cx = threadIdx.x & 31, rg = threadIdx.x >> 5;
  const int64_t col = blockIdx.x * 32 + cx;
  float s = 0.f;
  if (col < N)
    for (int64_t m = rg; m < M; m += 8) s += to_f32(dout[m * N + col]);
  part[rg][cx] = s;
  __syncthreads();
  if (rg == 0 && col < N) {
    float t = 0.f;
#pragma unroll
    for (int g = 0; g < 8; ++g) t += part[g][cx];
    db[col] += t;
  }
}

std::atomic<bool>& wgmma_flag() {
  static std::atomic<bool> f{!env_off("GRPO_WGMMA_GEMM")};
  return f;
}

bool wgmma_preferred() { return wgmma_flag().load(std::memory_order_relaxed); }

std::atomic<bool>& fused_gate_flag() {
  static std::atomic<bool> f{!env_off("GRPO_FUSED_GATE_SWIGLU")};
  return f;
}

}  // namespace

void gemm(Context& ctx, void* D, DType dt_d, int64_t ldd, const void* A, int64_t lda, bool trans_a, const void* B,
          int64_t ldb, bool trans_b, DType dt_ab, int64_t m, int64_t n, int64_t k, float alpha, float beta,
          const void* bias) {
  if (m == 0 || n == 0) return;
  GRPO_CHECK_MSG(k > 0, "gemm: k must be positive");
  GRPO_CHECK_MSG(dt_ab == DType::f32 || dt_ab == DType::bf16, "gemm: operands must be f32 or bf16");
  GRPO_CHECK_MSG(dt_d == DType::f32 || dt_d == dt_ab, "gemm: output must be f32 or the operand dtype");
  auto lt = static_cast<cublasLtHandle_t>(ctx.cublaslt());
  Workspace ws = workspace_of(ctx);
  const cudaDataType_t tab = cuda_type(dt_ab), td = cuda_type(dt_d);

  // Column-major view: Dᵀ (n,m) = op(B)ᵀ-side · op(A)ᵀ-side, i.e. swap the operands.
  const cublasOperation_t opa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // first cuBLAS operand = B
  const cublasOperation_t opb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // second cuBLAS operand = A
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, tab, uint64_t(trans_b ? k : n), uint64_t(trans_b ? n : k), ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, tab, uint64_t(trans_a ? m : k), uint64_t(trans_a ? k : m), lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, td, uint64_t(n), uint64_t(m), ldd));

  const uint32_t al_a = alignment_of(B), al_b = alignment_of(A), al_d = alignment_of(D);
  const bool det = ctx.deterministic();
  // The heuristic is asked once per bucket of m (four per octave above 64, at the bucket's
  // top), not per m: token counts of prefill chunks and speculative catch-ups vary every step,
  // and each new m cost a heuristic query plus, often, the lazy load of another cuBLAS kernel
  // (about a millisecond a GEMM). Where the bucket's algorithm does not run this problem
  // (cublasLtMatmulAlgoCheck), the exact m is asked. Either way the algorithm is a function of
  // the problem alone, so results stay run-to-run identical. Only m of a non-transposed A:
  // there its leading dimension does not bound m.
  const int64_t m_bucket = !trans_a && m > 64 ? gemm_row_bucket(m) : m;
  auto choose = [&](int64_t mq, bool exact) {
    AlgoKey key{mq, n, k, lda, ldb, ldd, int(trans_a), int(trans_b), int(dt_ab), int(dt_d), bias != nullptr, int(det),
                al_a, al_b, al_d, ws.lt_bytes, beta != 0.f, exact};
    {
      std::lock_guard<std::mutex> lk(g_algo_mu);
      auto it = g_algo_cache.find(key);
      if (it != g_algo_cache.end()) return it->second;
    }
    cublasLtMatrixLayout_t lbq = lb, ldq = ld;
    if (mq != m) {
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lbq, tab, uint64_t(k), uint64_t(mq), lda));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ldq, td, uint64_t(n), uint64_t(mq), ldd));
    }
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = ws.lt_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
    cublasLtMatmulHeuristicResult_t res[8];
    int n_res = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lbq, ldq, ldq, pref, 8, res, &n_res));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (mq != m) {
      cublasLtMatrixLayoutDestroy(lbq);
      cublasLtMatrixLayoutDestroy(ldq);
    }
    if (n_res <= 0) {
      std::fprintf(stderr, "gemm: no cuBLASLt algorithm for m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldd=%lld ta=%d tb=%d\n",
                   (long long)mq, (long long)n, (long long)k, (long long)lda, (long long)ldb, (long long)ldd,
                   int(trans_a), int(trans_b));
      GRPO_CHECK_MSG(false, "cuBLASLt heuristic found no algorithm");
    }
    int pick = 0;
    if (det) {  // prefer an algorithm whose reduction over k is not split (fixed order)
      for (int i = 0; i < n_res; ++i) {
        int splitk = 1;
        size_t written = 0;
        if (cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                 sizeof(splitk), &written) == CUBLAS_STATUS_SUCCESS &&
            splitk <= 1) {
          pick = i;
          break;
        }
      }
    }
    std::lock_guard<std::mutex> lk(g_algo_mu);
    g_algo_cache[key] = res[pick].algo;
    return res[pick].algo;
  };
  cublasLtMatmulAlgo_t algo = choose(m_bucket, m_bucket == m);
  if (m_bucket != m) {
    cublasLtMatmulHeuristicResult_t chk{};
    if (cublasLtMatmulAlgoCheck(lt, op, la, lb, ld, ld, &algo, &chk) != CUBLAS_STATUS_SUCCESS ||
        chk.workspaceSize > ws.lt_bytes)
      algo = choose(m, true);
  }
  CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, B, la, A, lb, &beta, D, ld, D, ld, &algo, ws.lt, ws.lt_bytes,
                              stream_of(ctx)));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
}

void linear_forward(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                    bool accumulate) {
  GRPO_CHECK_MSG(x.ndim == 2 && w.ndim == 2 && out.ndim == 2, "linear_forward: x, w, out must be 2-D");
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  GRPO_CHECK_MSG(w.shape[1] == K && out.shape[0] == M && out.shape[1] == N, "linear_forward: shape mismatch");
  GRPO_CHECK_MSG(x.dtype == w.dtype, "linear_forward: x and w must share a dtype");
  if (M == 0 || N == 0) return;
  const void* epi_bias = nullptr;
  if (bias) {
    GRPO_CHECK_MSG(bias->numel() == N, "linear_forward: bias must have N elements");
    if (bias->dtype == out.dtype) epi_bias = bias->data;
  }
  if (ctx.batch_invariant()) {
    // Bitwise on-policy: one kernel for every M (linear_wgmma_rows: a row's bits never depend on
    // the batch), f32 outputs (the LM head's logits) through its f32 epilogue.
    const bool ok = out.dtype == DType::bf16 ? linear_wgmma_rows(ctx, out, x, w, bias, accumulate)
                    : (out.dtype == DType::f32 && !bias && !accumulate) ? linear_wgmma_f32(ctx, out, x, w, 1.f)
                                                                         : false;
    GRPO_CHECK_MSG(ok, "linear_forward: the batch-invariant GEMM of train.on_policy = \"bitwise\" needs bf16 weights "
                       "with K a multiple of 8 and at least 64, 16-byte aligned operands and an sm_90 (Hopper) GPU");
    return;
  }
  // Small decode-sized bf16 products: the weight-streaming kernel of linear_small_m.cu where it
  // measured faster (small_m_preferred), unless GRPO_SMALL_M_GEMM=0 or it does not apply.
  if (out.dtype == DType::bf16 && small_m_gemm_enabled() && small_m_preferred(M, N) &&
      linear_small_m(ctx, out, x, w, bias, accumulate))
    return;
  // The wgmma + TMA kernel of linear_wgmma.cu for the other decode-sized bf16 products
  // (GRPO_WGMMA_GEMM=0 turns it off, for A/B runs).
  if (out.dtype == DType::bf16 && M <= 64 && wgmma_preferred() && linear_wgmma(ctx, out, x, w, bias, accumulate))
    return;
  gemm(ctx, out.data, out.dtype, N, x.data, K, false, w.data, K, true, x.dtype, M, N, K, 1.f,
       accumulate ? 1.f : 0.f, epi_bias);
  if (bias && !epi_bias) {
    const int threads = 256;
    const unsigned grid = flat_grid(M * N, threads);
    GRPO_CHECK_MSG(bias->dtype == DType::f32 || bias->dtype == DType::bf16, "linear_forward: bias must be f32 or bf16");
    GRPO_DISPATCH_FLOAT(out.dtype, T, {
      if (bias->dtype == DType::f32)
        add_bias_kernel<T><<<grid, threads, 0, stream_of(ctx)>>>(out.ptr<T>(), bias->ptr<float>(), M, N);
      else
        add_bias_bf16_kernel<T><<<grid, threads, 0, stream_of(ctx)>>>(out.ptr<T>(), bias->ptr<__nv_bfloat16>(), M, N);
    });
    CUDA_CHECK_LAUNCH();
  }
}

bool wgmma_gemm_enabled() { return wgmma_flag().load(std::memory_order_relaxed); }
void set_wgmma_gemm_enabled(bool on) { wgmma_flag().store(on, std::memory_order_relaxed); }
bool fused_gate_swiglu_enabled() { return fused_gate_flag().load(std::memory_order_relaxed); }
void set_fused_gate_swiglu_enabled(bool on) { fused_gate_flag().store(on, std::memory_order_relaxed); }

void linear_swiglu_forward(Context& ctx, Tensor& act, Tensor& gate_up_scratch, const Tensor& x,
                           const Tensor& w_gate_up) {
  const int64_t M = x.shape[0], N = w_gate_up.shape[0];  // N = 2F
  if (ctx.batch_invariant()) {
    // The fused kernel where it applies (decode-sized M; bit for bit the plain kernel + SwiGLU
    // under the same split), else linear_forward's batch-invariant kernel + SwiGLU.
    if (M <= 64 && fused_gate_swiglu_enabled() && aligned16(gate_up_scratch.data) &&
        linear_wgmma_swiglu(ctx, act, x, w_gate_up))
      return;
    cuda::linear_forward(ctx, gate_up_scratch, x, w_gate_up, nullptr, false);
    cuda::swiglu_forward(ctx, act, gate_up_scratch);
    return;
  }
  // The fused kernel only where linear_forward would run linear_wgmma on (M, N): bf16, M <= 64,
  // not sent to linear_small_m (small_m_preferred; where that kernel would decline, the
  // unfused path is taken anyway, which is still exact), the wgmma switches allow N, and
  // linear_wgmma applies (linear_wgmma_swiglu checks the same conditions on x, w and act,
  // plus F % 32 == 0; the alignment linear_wgmma requires of its `out` is checked here). The
  // gated heuristic keeps wgmma_gemm_config(N, K)'s split, so the bits are the same either way.
  const bool plain_uses_wgmma = x.dtype == DType::bf16 && M >= 1 && M <= 64 &&
                                !(small_m_gemm_enabled() && small_m_preferred(M, N)) && wgmma_preferred() &&
                                aligned16(gate_up_scratch.data);
  if (fused_gate_swiglu_enabled() && plain_uses_wgmma && linear_wgmma_swiglu(ctx, act, x, w_gate_up)) return;
  cuda::linear_forward(ctx, gate_up_scratch, x, w_gate_up, nullptr, false);
  cuda::swiglu_forward(ctx, act, gate_up_scratch);
}

void linear_backward(Context& ctx, Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dout, const Tensor& x,
                     const Tensor& w, bool accumulate_dx) {
  GRPO_CHECK_MSG(x.ndim == 2 && w.ndim == 2 && dout.ndim == 2, "linear_backward: x, w, dout must be 2-D");
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  GRPO_CHECK_MSG(w.shape[1] == K && dout.shape[0] == M && dout.shape[1] == N, "linear_backward: shape mismatch");
  GRPO_CHECK_MSG(dout.dtype == w.dtype && x.dtype == w.dtype, "linear_backward: dout, x and w must share a dtype");
  if (M == 0) return;
  if (dx) {
    GRPO_CHECK_MSG(dx->numel() == M * K, "linear_backward: dx must be (M,K)");
    gemm(ctx, dx->data, dx->dtype, K, dout.data, N, false, w.data, K, false, w.dtype, M, K, N, 1.f,
         accumulate_dx ? 1.f : 0.f);
  }
  if (dw) {
    GRPO_CHECK_MSG(dw->numel() == N * K && dw->dtype == DType::f32, "linear_backward: dw must be (N,K) f32");
    gemm(ctx, dw->data, DType::f32, K, dout.data, N, true, x.data, K, false, x.dtype, N, K, M, 1.f, 1.f);
  }
  if (db) {
    GRPO_CHECK_MSG(db->numel() == N && db->dtype == DType::f32, "linear_backward: db must be (N) f32");
    GRPO_DISPATCH_FLOAT(dout.dtype, T, {
      bias_grad_kernel<T><<<unsigned(ceil_div(N, 32)), 256, 0, stream_of(ctx)>>>(db->ptr<float>(), dout.ptr<T>(), M, N);
    });
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace grpo::cuda
