// Bandwidth-oriented bf16 GEMM for decode-sized batches: out (M,N) = x (M,K) · w (N,K)ᵀ
// [+ bias] [+ out], M <= 64, on mma.sync m16n8k16 (bf16 in, f32 accumulate).
//
// Why: with M = 64 a decode GEMM reads N·K·2 bytes of weights and does little arithmetic
// on them (64 FLOP per weight byte), so its time should be the weight bytes over the
// memory bandwidth. cuBLASLt picks tiles made for large M: few blocks for N ≈ 1000
// (latency-bound, ~5 µs for 2 MB) and about half the bandwidth for N ≈ 10000.
//
// Work split. A block owns NT weight rows (64, or 128 for huge N) × all M rows (padded
// to MT = 16/32/48/64 by zero rows) × a range of K. K is cut into 64-wide chunks; the
// `split` blocks of one thread-block cluster share an NT tile and take consecutive chunk
// ranges (rank r: chunks [r·C/split, (r+1)·C/split)). split ∈ {1,2,4,8} is chosen from
// (N, K, SM count) only (small_m_config), so that there are about 1.5 blocks or more per SM.
//
// Block: 2·NT threads = NT/32 column groups × 2 k-groups of warps. Every 64-wide chunk of
// W (NT × 64) and x (MT × 64) goes through shared memory by cp.async, 4–6 stages deep
// (more for small MT, see stages()): 16-byte copies, rows padded to 144 bytes so ldmatrix
// is free of bank conflicts, W with an L2 evict-first policy since it is read once (x
// stays in L2 for the other blocks).
// Warp (column group ng, k-group kg) computes the MT × 32 tile of columns ng·32.. over the
// k16 steps 2·kg and 2·kg+1 of every chunk (so the two k-groups read disjoint halves of
// each stage and no smem byte is read twice by one column group).
//
// Reduction, all in fixed order (no atomics, no global scratch, CUDA-graph safe):
//   1. in the block: k-group 0 stores its f32 tile to shared memory (reusing the pipeline
//      buffers, row stride NT+8 floats), k-group 1 adds its own: p = kg0 + kg1;
//   2. in the cluster (split > 1): cluster.sync(), then block r sums the float4 groups
//      [r·Q/split, (r+1)·Q/split) of the MT × NT tile over ranks 0, 1, .., split-1 through
//      distributed shared memory, applies the epilogue and stores; a second cluster.sync()
//      keeps every block's shared memory alive until all peers have read it.
// An output element's value is therefore a function of its x row, its w row, N and K
// (through split) only: not of M, of the other rows, of MT or of NT (tested bitwise).
//
// Epilogue, as linear_forward's cuBLASLt path: v = Σ x·w [+ out_old] [+ bf16 bias] in f32,
// one rounding to bf16; an f32 bias is added after that rounding and rounded again (the
// cuBLASLt path adds an f32 bias with a separate kernel to the rounded product).
#include "kernels/cuda/linear_small_m.h"

#include <cooperative_groups.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/env_switch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/linear_epilogue.cuh"
#include "kernels/cuda/mma.cuh"

namespace grpo::cuda {

namespace {

namespace cg = cooperative_groups;
using tc::cp_async16;
using tc::cp_async16_policy;
using tc::cp_commit;
using tc::cp_wait;
using tc::ldsm4;
using tc::mma16816;

constexpr int kKC = 64;       // k elements per chunk = per pipeline stage (128 bytes of a row)
constexpr int kLds = kKC + 8; // shared-memory row stride in bf16 (144 bytes)
constexpr int kMaxSplit = 8;  // portable cluster size limit
constexpr int kMaxM = 64;


struct SmallMArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  __nv_bfloat16* out;
  const void* bias;
  int bias_kind;
  int accumulate;
  int M, N, K;
  int n_chunks;  // ceil(K / kKC)
  int split;     // blocks per cluster along K
};

// cp.async pipeline depth: as many stages (4..8) as fit a budget that leaves room for 3
// blocks per SM at NT = 64 (2 at NT = 128), so small M keeps more weight bytes in flight
// (M = 64: 4 stages, 3 chunks = 24 KB of W per block in flight; M = 16: 6 stages).
template <int MT, int NT>
constexpr int stages() {
  constexpr int budget = NT == 64 ? 72 * 1024 : 108 * 1024;
  constexpr int n = budget / ((NT + MT) * kLds * int(sizeof(__nv_bfloat16)));
  return n < 4 ? 4 : n > 8 ? 8 : n;
}
template <int MT, int NT>
constexpr size_t smem_bytes() {
  return size_t(stages<MT, NT>()) * (NT + MT) * kLds * sizeof(__nv_bfloat16);
}

template <int MT, int NT>
__global__ void __launch_bounds__(2 * NT) linear_small_m_kernel(SmallMArgs a) {
  constexpr int kThreads = 2 * NT;
  constexpr int kStages = stages<MT, NT>();
  constexpr int kMTiles = MT / 16;
  constexpr int kLdt = NT + 8;  // f32 partial-tile row stride: float2 stores conflict-free
  constexpr int kStageElems = (NT + MT) * kLds;
  static_assert(size_t(MT) * kLdt * sizeof(float) <= smem_bytes<MT, NT>(), "partial tile must fit the stages");
  static_assert((MT * NT / 4) % kMaxSplit == 0, "every split must divide the tile's float4 groups");
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* sm = reinterpret_cast<__nv_bfloat16*>(smraw);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kg = warp & 1, ng = warp >> 1;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = a.split > 1 ? int(cluster.block_rank()) : 0;
  const int n0 = int(blockIdx.x / unsigned(a.split)) * NT;
  const int c_begin = int(int64_t(rank) * a.n_chunks / a.split);
  const int n_ch = int(int64_t(rank + 1) * a.n_chunks / a.split) - c_begin;
  const uint64_t w_policy = tc::l2_evict_first_policy();

  // Chunk `chunk` of W rows n0.. and of x into stage `stage`; rows past N / M and columns
  // past K are zero-filled (K % 8 == 0, so a 16-byte piece is entirely in or out).
  auto load_w = [&](int stage, int chunk) {
    __nv_bfloat16* Ws = sm + stage * kStageElems;
    const int k0 = chunk * kKC;
#pragma unroll
    for (int i = 0; i < NT * 8 / kThreads; ++i) {
      const int e = tid + i * kThreads, r = e >> 3, c = e & 7;
      const int n = n0 + r, k = k0 + c * 8;
      const bool ok = n < a.N && k < a.K;
      cp_async16_policy(Ws + r * kLds + c * 8, a.w + (ok ? int64_t(n) * a.K + k : 0), ok, w_policy);
    }
  };
  auto load_x = [&](int stage, int chunk) {
    __nv_bfloat16* Xs = sm + stage * kStageElems + NT * kLds;
    const int k0 = chunk * kKC;
    constexpr int kXIters = (MT * 8 + kThreads - 1) / kThreads;
#pragma unroll
    for (int i = 0; i < kXIters; ++i) {
      const int e = tid + i * kThreads;
      if ((MT * 8) % kThreads == 0 || e < MT * 8) {
        const int r = e >> 3, c = e & 7, k = k0 + c * 8;
        const bool ok = r < a.M && k < a.K;
        cp_async16(Xs + r * kLds + c * 8, a.x + (ok ? int64_t(r) * a.K + k : 0), ok);
      }
    }
  };

  float acc[kMTiles][4][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;

  // Programmatic dependent launch: the weights never depend on earlier kernels, so the
  // prologue's weight chunks are requested before waiting for the previous grid (they
  // stream in while it finishes); x (and out, when accumulating) only after the wait.
  // The first commit group holds all of them, which the first wait below covers.
  pdl_trigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < n_ch) load_w(s, c_begin + s);
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_ch) load_x(s, c_begin + s);
    cp_commit();
  }
  const int mi = lane >> 3;
  int rd = 0, wr = kStages - 1;  // stage of chunk i, stage that chunk i + kStages - 1 goes to
  for (int i = 0; i < n_ch; ++i) {
    cp_wait<kStages - 2>();  // chunk i has landed (this thread's copies) ...
    __syncthreads();         // ... for every thread, and stage wr (chunk i-1) is free again
    if (i + kStages - 1 < n_ch) {
      load_w(wr, c_begin + i + kStages - 1);
      load_x(wr, c_begin + i + kStages - 1);
    }
    cp_commit();
    const __nv_bfloat16* Ws = sm + rd * kStageElems;
    const __nv_bfloat16* Xs = Ws + NT * kLds;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int kc = (kg * 2 + h) * 16;
      // B fragments of the warp's 32 columns: ldsm4 p covers columns p·16..p·16+15
      // (registers 0,1: first n8 tile, k lo/hi; registers 2,3: second n8 tile).
      uint32_t b[2][4];
#pragma unroll
      for (int p = 0; p < 2; ++p)
        ldsm4(b[p], Ws + (ng * 32 + p * 16 + (lane & 7) + (mi >> 1) * 8) * kLds + kc + (mi & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        uint32_t af[4];
        ldsm4(af, Xs + (mt * 16 + (lane & 15)) * kLds + kc + (lane >> 4) * 8);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma16816(acc[mt][j], af, b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
      }
    }
    rd = rd + 1 == kStages ? 0 : rd + 1;
    wr = wr + 1 == kStages ? 0 : wr + 1;
  }
  cp_wait<0>();
  __syncthreads();  // all warps are done with the stages: the partial tile reuses them

  // 1. Block partial = k-group 0 + k-group 1 (mma C layout: lane (g, t4) holds rows g and
  //    g+8 of each 16-row tile, columns 2·t4 and 2·t4+1 of each n8 tile).
  float* tile = reinterpret_cast<float*>(smraw);
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    if (kg == pass) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            float2* p = reinterpret_cast<float2*>(tile + (mt * 16 + g + hh * 8) * kLdt + ng * 32 + j * 8 + 2 * t4);
            float2 v = make_float2(acc[mt][j][2 * hh], acc[mt][j][2 * hh + 1]);
            if (pass == 1) {
              const float2 q = *p;
              v.x = q.x + v.x;
              v.y = q.y + v.y;
            }
            *p = v;
          }
    }
    if (pass == 0) __syncthreads();
  }

  // 2. Cluster sum in rank order, epilogue, store.
  if (a.split > 1) cluster.sync();
  else __syncthreads();
  const float* part[kMaxSplit];
#pragma unroll
  for (int q = 0; q < kMaxSplit; ++q) part[q] = (a.split > 1 && q < a.split) ? cluster.map_shared_rank(tile, q) : tile;
  constexpr int kQuadsPerRow = NT / 4;
  const int per = (MT * NT / 4) / a.split;
  for (int e = rank * per + tid; e < (rank + 1) * per; e += kThreads) {
    const int m = e / kQuadsPerRow, nl = (e % kQuadsPerRow) * 4, n = n0 + nl;
    if (m >= a.M || n >= a.N) continue;
    const int off = m * kLdt + nl;
    float v[4];
    sum_ranks(part, a.split, off, v);
    epilogue_store(a, v, m, n);
  }
  if (a.split > 1) cluster.sync();  // peers may still be reading this block's tile
}

template <int MT, int NT>
void launch(const SmallMArgs& a, int64_t n_tiles, cudaStream_t stream) {
  auto kernel = linear_small_m_kernel<MT, NT>;
  constexpr size_t smem = smem_bytes<MT, NT>();
  // The opt-in above 48 KB of dynamic shared memory is per device; set it once for each.
  static std::atomic<uint64_t> attr_done{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit == 0 || !(attr_done.load(std::memory_order_acquire) & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_done.fetch_or(bit, std::memory_order_acq_rel);
  }
  // Programmatic dependent launch (see the kernel's prologue) and split-K clusters.
  launch_pdl_on(stream, unsigned(a.split), kernel, dim3(unsigned(n_tiles * a.split), 1, 1), dim3(2 * NT, 1, 1), smem,
                a);
}

template <int NT>
void launch_m(const SmallMArgs& a, int64_t n_tiles, cudaStream_t stream) {
  switch ((a.M + 15) / 16) {
    case 1: launch<16, NT>(a, n_tiles, stream); break;
    case 2: launch<32, NT>(a, n_tiles, stream); break;
    case 3: launch<48, NT>(a, n_tiles, stream); break;
    default: launch<64, NT>(a, n_tiles, stream); break;
  }
}

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{!env_off("GRPO_SMALL_M_GEMM")};
  return flag;
}

}  // namespace

// NT = 128 halves the re-reads of x from L2 (every NT tile reads all of x) but halves the
// number of tiles, so it is used only where there are tiles to spare (≥ 2 per SM, e.g. the
// LM head). split doubles until the grid has ≥ 1.5 blocks per SM (whole waves of 2–3
// resident blocks per SM), while every block keeps ≥ 1 chunk; the reduction through
// distributed shared memory costs M·NT·4 bytes per block against NT·K/split·2 weight bytes.
SmallMConfig small_m_config(int64_t N, int64_t K) {
  const int64_t sms = sm_count();
  const int64_t chunks = ceil_div(K, kKC);
  SmallMConfig c;
  c.nt = ceil_div(N, 128) >= 2 * sms ? 128 : 64;
  const int64_t tiles = ceil_div(N, c.nt);
  c.split = 1;
  while (c.split < kMaxSplit && 2 * c.split <= chunks && tiles * c.split * 2 < 3 * sms) c.split *= 2;
  return c;
}

bool small_m_preferred(int64_t M, int64_t N) {
  // GRPO_SMALL_M_MAX_M / GRPO_SMALL_M_MAX_N move the bounds (A/B runs).
  static const int64_t max_m = env_long("GRPO_SMALL_M_MAX_M", 16, 1, kMaxM);
  static const int64_t max_n = env_long("GRPO_SMALL_M_MAX_N", 4096, 1, INT_MAX);
  return M >= 1 && M <= max_m && N <= max_n;
}

bool small_m_gemm_enabled() { return enabled_flag().load(std::memory_order_relaxed); }
void set_small_m_gemm_enabled(bool on) { enabled_flag().store(on, std::memory_order_relaxed); }

bool linear_small_m(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias, bool accumulate,
                    SmallMConfig cfg) {
  int bias_kind = kNoBias;
  if (!decode_gemm_applies(out, x, w, bias, 8, 128, &bias_kind)) return false;
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];

  const SmallMConfig h = (cfg.nt == 0 || cfg.split == 0) ? small_m_config(N, K) : SmallMConfig{};
  const int nt = cfg.nt ? cfg.nt : h.nt, split = cfg.split ? cfg.split : h.split;
  GRPO_CHECK_MSG(nt == 64 || nt == 128, "linear_small_m: nt must be 64 or 128");
  GRPO_CHECK_MSG(split == 1 || split == 2 || split == 4 || split == kMaxSplit,
                 "linear_small_m: split must be 1, 2, 4 or 8");
  const int64_t n_tiles = ceil_div(N, nt);
  GRPO_CHECK_MSG(n_tiles * split <= INT_MAX, "linear_small_m: grid too large");

  SmallMArgs a;
  a.x = x.ptr<__nv_bfloat16>();
  a.w = w.ptr<__nv_bfloat16>();
  a.out = out.ptr<__nv_bfloat16>();
  a.bias = bias ? bias->data : nullptr;
  a.bias_kind = bias_kind;
  a.accumulate = accumulate ? 1 : 0;
  a.M = int(M);
  a.N = int(N);
  a.K = int(K);
  a.n_chunks = int(ceil_div(K, kKC));
  a.split = split;
  if (nt == 64) launch_m<64>(a, n_tiles, stream_of(ctx));
  else launch_m<128>(a, n_tiles, stream_of(ctx));
  return true;
}

}  // namespace grpo::cuda
