// Bandwidth-oriented bf16 GEMM for decode-sized batches on Hopper's asynchronous tensor cores:
//   out (M,N) = x (M,K) · w (N,K)ᵀ [+ bias] [+ out],  1 <= M <= 64, bf16 in/out, f32 accumulate.
//
// Why: at M = 64 a decode GEMM does 32 MACs per weight byte. Streaming weights at the HBM rate
// (~4.2 TB/s on an H200, ~19 B/clk per SM) needs ~600 MACs/clk per SM, which the mma.sync
// kernel (linear_small_m.cu) cannot issue together with its ldmatrix traffic. One wgmma
// m64nNk16 does 64·N·16 MACs from shared memory with a single instruction per warp, and TMA
// moves a whole 64-wide K chunk of NT weight rows with one instruction, so the SM's issue
// slots stay free and the kernel is left with the memory system as its limit.
//
// Work split. A block owns NT weight rows (NT = wgmma n = 64, 128 or 256) × a 64-row slice of x
// (blockIdx.y; one slice, padded to the wgmma m of 64, for decode) × a range of K. K is cut into 64-wide chunks (128 bytes of a
// row). With split > 1, the `split` blocks of a thread-block cluster share one NT tile and take
// consecutive chunk ranges (rank r: chunks [r·C/split, (r+1)·C/split)), as in linear_small_m.
// With split = 1 a block loops over tiles blockIdx.x, blockIdx.x + gridDim.x, .. (a persistent
// grid of one wave for very wide N such as the LM head; one tile per block otherwise), and
// its TMA ring runs on across tile boundaries.
//
// Block: one warpgroup (128 threads; two for the batch-invariant rows kernel, WG = 2 below,
// with a 128-row x chunk). Stage s of an S-deep ring holds the x chunk (64 rows ×
// 128 bytes; rows >= M are never written, see below) and the w chunk (NT rows × 128 bytes),
// both in the 128-byte-swizzled K-major layout that TMA (CU_TENSOR_MAP_SWIZZLE_128B) writes and
// wgmma reads: within each 1024-byte atom of 8 rows, the 16-byte piece c of row r sits at
// piece c ^ (r & 7). Thread 0 arms the stage's mbarrier with the expected bytes and issues the
// two TMA loads (rows past N and columns past K are zero-filled by TMA); every thread waits on
// the mbarrier's phase, then the warpgroup issues 4 wgmma m64nNTk16 (k advances by 32 bytes
// inside the swizzle atom) as one commit group. After each chunk the warpgroup waits for the
// previous group (wgmma.wait_group 1), synchronises, and thread 0 refills the stage of the
// previous chunk with the chunk S positions ahead: S-1 chunks stay in flight behind the one
// being multiplied. A ring at least as deep as the block's chunk count issues everything in
// the prologue and needs no refill (nor any block barrier in the loop).
//
// Rows of x past M: the x tensor map has M rows and a box of M rows, so TMA writes rows 0..M-1
// only and rows M..63 of the A tile hold stale shared memory. Row m of a wgmma result depends
// on row m of A only, so those rows only produce results that are never stored. Likewise the w
// box has min(NT, N) rows (no box larger than the tensor); with N < NT the rows past N of the
// B tile are stale and only feed columns >= N, which are not stored. Rows past N inside a box
// (the last partial tile) and columns past K (the last partial chunk) are zero-filled by TMA;
// K >= 64 is required so that the 64-column box never exceeds the tensor either.
//
// Programmatic dependent launch: weights never depend on earlier kernels, so the prologue's
// weight chunks are requested before griddepcontrol.wait (they stream in while the previous
// kernel finishes); x, out (when accumulating) and the bias only after it.
//
// Reduction and epilogue, all in fixed order (no atomics, no global scratch, graph safe):
//   split = 1: every thread applies the epilogue to its accumulator fragment directly (2
//     consecutive columns at a time) at the end of each tile;
//   split > 1: each block stores its f32 partial tile (rows < M) to shared memory (reusing
//     the ring), cluster.sync(), then block r sums the float4 groups [r·Q/split, (r+1)·Q/split)
//     of the M × NT tile over ranks 0, 1, .., split-1 through distributed shared memory,
//     applies the epilogue and stores; a second cluster.sync() keeps every block's shared
//     memory alive until its peers have read it.
// An output element is therefore a function of its x row, its w row, N, K and split only.
//
// Epilogue, identical to linear_small_m's (and linear_forward's cuBLASLt path):
// v = Σ x·w [+ out_old] [+ bf16 bias] in f32, one rounding to bf16; an f32 bias is added after
// that rounding and rounded again.
//
// Gated variant (linear_wgmma_swiglu, the decode step's gate/up projection + SwiGLU): the same
// kernel with GATED = true. A block owns H = NT/2 columns of act (M,F); each stage's B tile is
// the H gate rows and the H matching up rows of w_gate_up (two TMA boxes, one mbarrier), so
// a block streams exactly the bytes of a plain NT-wide block (same stage size, ring depth,
// shared memory, registers: one m64nNT accumulator holding gate columns in [0,H) and up
// columns in [H,NT)). Its epilogue rounds gate and up to bf16 as the plain epilogue would
// store them and applies swiglu_forward's arithmetic, so act equals linear_wgmma (same split)
// followed by swiglu_forward bit for bit, and gate_up is never written. Requires F % H == 0.
#include "kernels/cuda/linear_wgmma.h"

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/env_switch.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/linear_epilogue.cuh"
#include "kernels/cuda/mma.cuh"

// wgmma exists on sm_90a only (not on plain sm_90, nor on later architectures).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GRPO_WGMMA_DEVICE 1
#else
#define GRPO_WGMMA_DEVICE 0
#endif

namespace grpo::cuda {

namespace {

namespace cg = cooperative_groups;
using tc::smem_u32;

constexpr int kKC = 64;           // k elements per chunk = per stage (128 bytes of a row)
constexpr int kRowBytes = kKC * 2;
constexpr int kMaxM = 64;         // wgmma m
constexpr int kMaxSplit = 8;      // portable cluster size limit
constexpr int kMaxStages = 16;
constexpr int kThreads = 128;     // one warpgroup
constexpr size_t kAlignSlack = 1024;           // the ring is aligned to the 1024-byte swizzle atom
constexpr size_t kMaxDynSmem = 227u * 1024u;   // sm_90 opt-in limit per block
constexpr size_t kSmPerSm = 228u * 1024u;      // shared memory per SM (occupancy estimate)


struct WgArgs {
  __nv_bfloat16* out;
  float* out_f32;  // f32 output instead of out (linear_wgmma_f32): alpha · Σ x·w, no bias or accumulate
  float alpha;
  const void* bias;
  int bias_kind;
  int accumulate;
  int M, N, K;
  int x_box_rows;  // rows of the x TMA box: min(M, 64); the block's 64-row slice starts at 64·blockIdx.y
  int n_chunks;    // ceil(K / kKC)
  int n_tiles;     // ceil(N / NT); gated: F / (NT/2)
  int w_box_rows;  // rows of the w TMA box: min(NT, N); gated: NT/2 (two boxes per stage)
  int up_row0;     // gated: first w row of the up half (F); unused otherwise
  int split;       // blocks per cluster along K
  int ranges;      // SER kernel: K ranges summed by one block in rank order (the split it stands for)
  int stages;      // ring depth S
  int data_bytes;  // bytes of the ring region (>= the split > 1 partial tile); mbarriers follow it
};

constexpr size_t stage_bytes(int nt, int wg = 1) { return size_t(kMaxM * wg + nt) * kRowBytes; }
constexpr size_t tile_bytes(int nt) { return size_t(kMaxM) * (nt + 8) * sizeof(float); }
size_t data_bytes(int nt, int split, int stages, int wg = 1) {
  return std::max(size_t(stages) * stage_bytes(nt, wg), split > 1 ? tile_bytes(nt) : size_t(0));
}
size_t smem_bytes(int nt, int split, int stages, int wg = 1) {
  return kAlignSlack + data_bytes(nt, split, stages, wg) + size_t(stages) * 8;
}

// ---- sm_90a primitives ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if GRPO_WGMMA_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void fence_barrier_init() {
#if GRPO_WGMMA_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#if GRPO_WGMMA_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if GRPO_WGMMA_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if GRPO_WGMMA_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* m) {
#if GRPO_WGMMA_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
#endif
}
// 2-D TMA tile load global → shared (box at element coordinates {c0 = k, c1 = row}), completing
// `bytes` on the mbarrier; with an L2 cache policy (weights: evict first) or without (x).
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const CUtensorMap* m, uint32_t bar, int c0, int c1,
                                                 uint64_t policy) {
#if GRPO_WGMMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(bar), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
#endif
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* m, uint32_t bar, int c0, int c1) {
#if GRPO_WGMMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if GRPO_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if GRPO_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if GRPO_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma
// (the registers are written by the tensor cores between issue and wait_group).
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle layout whose
// 8-row atoms (1024 bytes) start at 1024-byte aligned addresses: start address >> 4 in bits
// 0–13, leading-dimension byte offset (unused for swizzled K-major, 1 by convention) in bits
// 16–29, stride-dimension byte offset 1024 >> 4 (next 8-row group) in bits 32–45, base offset
// 0 in bits 49–51, swizzle mode 1 (128 B) in bits 62–63. The k16 step j of a chunk starts 32·j
// bytes into the atom: descriptor + 2·j.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFFu) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// D (64 × N, f32, wgmma fragment layout) += A (64 × 16, smem desc) · B (N × 16, smem desc)ᵀ;
// both operands K-major (no transpose), scale-d = 1 (accumulate).
template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 2], uint64_t da, uint64_t db);

#if GRPO_WGMMA_DEVICE
template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<128>(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16<256>(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}
#else
template <int N>
__device__ __forceinline__ void wgmma_bf16(float (&)[N / 2], uint64_t, uint64_t) {}
#endif

// E consecutive outputs (m, n..n+E-1) of the plain kernel: the bf16 epilogue (epilogue_store), or
// with out_f32 alpha·v stored as f32 (linear_wgmma_f32: one f32 product, no bias, no old output).
template <int E>
__device__ __forceinline__ void store_out(const WgArgs& a, float (&v)[E], int m, int n) {
  if (!a.out_f32) {
    epilogue_store<E>(a, v, m, n);
    return;
  }
  float* o = a.out_f32 + int64_t(m) * a.N + n;
  if (a.N % E == 0) {  // n % E == 0 too: an aligned vector
    if constexpr (E == 4)
      *reinterpret_cast<float4*>(o) = make_float4(__fmul_rn(a.alpha, v[0]), __fmul_rn(a.alpha, v[1]),
                                                  __fmul_rn(a.alpha, v[2]), __fmul_rn(a.alpha, v[3]));
    else
      *reinterpret_cast<float2*>(o) = make_float2(__fmul_rn(a.alpha, v[0]), __fmul_rn(a.alpha, v[1]));
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (n + j < a.N) o[j] = __fmul_rn(a.alpha, v[j]);
  }
}

// Accumulator fragment of wgmma m64nNk16 with f32 D (PTX ISA, "Register fragment D"): thread t
// of the warpgroup (warp w = t / 32, lane l) holds, for j = 0 .. N/8-1,
//   d[4j + 0], d[4j + 1]: row 16w + l/4,     columns 8j + 2·(l%4) + {0, 1}
//   d[4j + 2], d[4j + 3]: row 16w + l/4 + 8, the same columns.
//
// GATED (linear_wgmma_swiglu): the B tile of NT rows is two boxes of H = NT/2 rows, gate rows
// tile·H .. and up rows F + tile·H .. of w_gate_up (two TMA loads onto the stage's one
// mbarrier, H·128 bytes apart: a multiple of the 1024-byte swizzle atom, so the pair reads as
// one NT-row operand). One wgmma m64nNTk16 per k16 step then yields gate column c in fragment
// column c and its up column in fragment column c + H, held by the same thread (j and
// j + H/8). Everything else (ring, PDL prefetch, split-K reduction in rank order) is the
// plain kernel's; the epilogue rounds both to bf16 and applies SwiGLU (swiglu_epilogue_store).
// Column c of a wgmma result depends only on row c of B (which is what makes nt change no bit
// in the plain kernel), so gate/up sums are the plain kernel's bit for bit under one split.
//
// SER (serial split, batch-invariant rows mode with many 64-row slices): one block per tile
// sums the K ranges of ranges = split consecutive ranks itself, one after the other, each from a
// zeroed accumulator over the same chunks as cluster rank r, and folds them in rank order
// (sum = p0, then sum += p1, ...: sum_ranks' order), so every output is bit for bit the
// cluster's; no cluster, no partial tiles in shared memory, K streamed by one block.
//
// WG = 2 (batch-invariant rows mode with many row slices, split 1 or SER): two warpgroups share
// each weight chunk, warpgroup g multiplying rows 64·g .. 64·g + 63 of a 128-row x box (stage =
// 128 x rows + NT w rows), so the block pulls (128 + NT)·128 bytes per chunk for 128·NT outputs
// instead of (64 + NT)·128 bytes for 64·NT: the many-slice product is bound by what the SMs can
// pull from L2, and this halves the x share and the w share per output. Each warpgroup issues
// exactly the instructions of a WG = 1 block over its 64 rows (same chunks, same k16 steps, same
// SER folds), so every output bit is the WG = 1 kernel's. The grid is persistent over the
// (slice, tile) pairs, tile fastest (work w: slice w / n_tiles, tile w % n_tiles), and the ring
// runs on across them, so the next pair's chunks load under this pair's last wgmma and epilogue.
// Weights are re-read by every slice, so they are loaded without the evict-first hint.
template <int NT, bool GATED, bool SER = false, int WG = 1>
__global__ void __launch_bounds__(kThreads * WG, 1)
    linear_wgmma_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_x,
                        const WgArgs a_in) {
#if GRPO_WGMMA_DEVICE
  static_assert(!(SER && GATED), "the serial split serves the plain kernel");
  static_assert(WG == 1 || (WG == 2 && !GATED), "two warpgroups serve the plain rows kernel");
  constexpr int kAcc = NT / 2;
  constexpr int kOutCols = GATED ? NT / 2 : NT;         // output columns per tile (act columns when gated)
  constexpr int kWLoads = GATED ? 2 : 1;                // w boxes per stage
  constexpr uint32_t kABytes = kMaxM * WG * kRowBytes;  // x part of a stage (8 KB per warpgroup)
  constexpr uint32_t kStageBytes = (kMaxM * WG + NT) * kRowBytes;
  constexpr int kLdt = NT + 8;                          // f32 partial-tile row stride (floats)
  extern __shared__ __align__(1024) unsigned char smraw[];
  const uint32_t raw = smem_u32(smraw);
  const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
  unsigned char* const base = smraw + pad;
  const uint32_t sbase = raw + pad;
  // This block's 64-row slice of x and out (blockIdx.y): the epilogue sees it as rows 0..63.
  const int row0 = int(blockIdx.y) * kMaxM;
  WgArgs a = a_in;
  const uint32_t bar0 = sbase + uint32_t(a.data_bytes);  // S mbarriers of 8 bytes
  const int S = a.stages;

  const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
  const int wg = WG == 1 ? 0 : tid >> 7;  // this thread's warpgroup: rows 64·wg .. of the x box
  cg::cluster_group cluster = cg::this_cluster();
  if constexpr (WG == 1) {
    a.M = min(kMaxM, a_in.M - row0);
    if (a.out) a.out += int64_t(row0) * a.N;
    if (a.out_f32) a.out_f32 += int64_t(row0) * a.N;
  }
  const int rank = a.split > 1 ? int(cluster.block_rank()) : 0;

  // This block's work: items i = 0 .. n_items-1, each one 64-wide chunk of one tile.
  // split > 1: one tile, chunks c_begin .. c_begin + n_items - 1. split = 1: tiles tile0,
  // tile0 + step, .., all chunks of each (cpt = chunks per tile in this block).
  int tile0, step, c_begin, cpt, n_items;
  if (a.split > 1) {
    tile0 = int(blockIdx.x) / a.split;
    step = 0;
    c_begin = int(int64_t(rank) * a.n_chunks / a.split);
    cpt = int(int64_t(rank + 1) * a.n_chunks / a.split) - c_begin;
    n_items = cpt;
  } else {
    // WG = 2: "tiles" are the (slice, tile) pairs, w = slice · n_tiles + tile.
    const int n_work = WG == 1 ? a.n_tiles : a.n_tiles * ((a_in.M + kMaxM * WG - 1) / (kMaxM * WG));
    tile0 = int(blockIdx.x);
    step = int(gridDim.x);
    c_begin = 0;
    cpt = a.n_chunks;
    const int my_tiles = tile0 < n_work ? (n_work - 1 - tile0) / step + 1 : 0;
    n_items = my_tiles * cpt;
  }
  // WG = 2: the weight tile and first x row of work w.
  auto w_tile = [&](int w) { return WG == 1 ? w : w % a.n_tiles; };
  auto w_row0 = [&](int w) { return WG == 1 ? row0 : (w / a.n_tiles) * (kMaxM * WG); };
  // The w box(es) + the x box (x_box_rows rows: TMA counts a whole box, rows past M zero-filled).
  const uint32_t tx_bytes = uint32_t(kWLoads * a.w_box_rows + a.x_box_rows) * kRowBytes;

  // Thread 0: arm stage st for item j and request its w (and x) chunk.
  uint64_t w_policy = 0;
  auto issue_w = [&](int st, int j) {
    const int tile = w_tile(tile0 + (j / cpt) * step), chunk = c_begin + j % cpt;
    const uint32_t bar = bar0 + 8u * uint32_t(st);
    const uint32_t dst = sbase + uint32_t(st) * kStageBytes + kABytes;
    mbar_arrive_expect_tx(bar, tx_bytes);
    if constexpr (GATED) {
      tma_load_2d_hint(dst, &tm_w, bar, chunk * kKC, tile * kOutCols, w_policy);
      tma_load_2d_hint(dst + uint32_t(kOutCols) * kRowBytes, &tm_w, bar, chunk * kKC, a.up_row0 + tile * kOutCols,
                       w_policy);
    } else if constexpr (WG == 2) {
      tma_load_2d(dst, &tm_w, bar, chunk * kKC, tile * NT);
    } else {
      tma_load_2d_hint(dst, &tm_w, bar, chunk * kKC, tile * NT, w_policy);
    }
  };
  auto issue_x = [&](int st, int j) {
    const int chunk = c_begin + j % cpt;
    tma_load_2d(sbase + uint32_t(st) * kStageBytes, &tm_x, bar0 + 8u * uint32_t(st), chunk * kKC,
                w_row0(tile0 + (j / cpt) * step));
  };

  pdl_trigger();
  const int P = min(n_items, S);  // prologue: the first P items, one per stage
  if (tid == 0) {
    prefetch_tensormap(&tm_w);
    prefetch_tensormap(&tm_x);
    for (int s = 0; s < S; ++s) mbar_init(bar0 + 8u * uint32_t(s), 1);
    fence_barrier_init();
    fence_proxy_async();
    w_policy = tc::l2_evict_first_policy();
    for (int s = 0; s < P; ++s) issue_w(s, s);  // weights never depend on the previous kernel
  }
  pdl_wait();  // every thread: x, out and bias are read after this
  if (tid == 0)
    for (int s = 0; s < P; ++s) issue_x(s, s);
  __syncthreads();  // the mbarriers are initialised before anyone waits on them

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  fence_acc(acc);
  float sum[SER ? kAcc : 1];  // SER: the ranges folded so far
  int range = 0;              // SER: the range of chunk ci, ending before chunk range_end
  int range_end = SER ? int(int64_t(1) * a.n_chunks / a.ranges) : 0;
  auto res = [&](int q) -> float {  // the tile's result in fragment slot q
    if constexpr (SER) return sum[q];
    else return acc[q];
  };

  const int r0 = warp * 16 + (lane >> 2);  // fragment rows r0 and r0 + 8
  const int c0 = 2 * (lane & 3);           // fragment columns 8j + c0, 8j + c0 + 1
  int st = 0;                              // stage of item i
  uint32_t phase = 0;                      // parity of stage st's current use
  int ci = 0;                              // chunk of item i within its tile
  int tile = tile0;                        // tile of item i
  for (int i = 0; i < n_items; ++i) {
    mbar_wait(bar0 + 8u * uint32_t(st), phase);
    const uint32_t sa = sbase + uint32_t(st) * kStageBytes;
    const uint64_t da = sw128_desc(sa + uint32_t(wg) * (kMaxM * kRowBytes)), db = sw128_desc(sa + kABytes);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kKC / 16; ++k) wgmma_bf16<NT>(acc, da + 2 * k, db + 2 * k);
    wgmma_commit();
    // Refill the stage of item i-1 with item i-1+S once every warp is past its wgmma.
    const int j = i - 1 + S;
    const bool refill = i >= 1 && j < n_items;  // uniform over the block
    auto refill_stage = [&] {
      __syncthreads();
      if (tid == 0) {
        const int rs = st == 0 ? S - 1 : st - 1;
        issue_w(rs, j);
        issue_x(rs, j);
      }
      __syncwarp();
    };
    const bool last_of_range = SER && ci + 1 == range_end;  // (the tile's last chunk ends the last range)
    if (ci != cpt - 1 && !last_of_range) {
      wgmma_wait<1>();  // item i-1's wgmma group is complete (this warp's part)
      fence_acc(acc);
      if (refill) refill_stage();
    } else {
      wgmma_wait<0>();  // the tile's (or SER: the range's) last chunk: every group is complete
      fence_acc(acc);
      if (refill) refill_stage();
      if constexpr (SER) {
#pragma unroll
        for (int q = 0; q < kAcc; ++q) {
          sum[q] = range == 0 ? acc[q] : sum[q] + acc[q];
          acc[q] = 0.f;
        }
        fence_acc(acc);
        ++range;
        range_end = int(int64_t(range + 1) * a.n_chunks / a.ranges);
        if (ci != cpt - 1) goto next_item;
        range = 0;
        range_end = int(int64_t(1) * a.n_chunks / a.ranges);
      }
      if (a.split == 1) {
        // Epilogue of this tile straight from the fragment, then a fresh accumulator.
        if constexpr (WG == 2) {  // this warpgroup's 64 rows of the work's slice
          const int64_t r = int64_t(w_row0(tile)) + kMaxM * wg;
          a.M = int(min(int64_t(kMaxM), int64_t(a_in.M) - r));
          if (a_in.out) a.out = a_in.out + r * a.N;
          if (a_in.out_f32) a.out_f32 = a_in.out_f32 + r * a.N;
        }
        const int n0 = w_tile(tile) * kOutCols;
        if constexpr (GATED) {
          // Gate column 8jj + c0 (+1) in acc[4jj..], its up column in acc[4(jj + H/8)..];
          // n < F always (F % H == 0).
          constexpr int kUp = 4 * (kOutCols / 8);
#pragma unroll
          for (int jj = 0; jj < kOutCols / 8; ++jj) {
            const int n = n0 + 8 * jj + c0;
            if (r0 < a.M) {
              const float g[2] = {acc[4 * jj], acc[4 * jj + 1]};
              const float u[2] = {acc[kUp + 4 * jj], acc[kUp + 4 * jj + 1]};
              swiglu_epilogue_store<2>(a, g, u, r0, n);
            }
            if (r0 + 8 < a.M) {
              const float g[2] = {acc[4 * jj + 2], acc[4 * jj + 3]};
              const float u[2] = {acc[kUp + 4 * jj + 2], acc[kUp + 4 * jj + 3]};
              swiglu_epilogue_store<2>(a, g, u, r0 + 8, n);
            }
          }
        } else {
#pragma unroll
          for (int jj = 0; jj < NT / 8; ++jj) {
            const int n = n0 + 8 * jj + c0;
            if (n < a.N) {
              if (r0 < a.M) {
                float v[2] = {res(4 * jj), res(4 * jj + 1)};
                store_out<2>(a, v, r0, n);
              }
              if (r0 + 8 < a.M) {
                float v[2] = {res(4 * jj + 2), res(4 * jj + 3)};
                store_out<2>(a, v, r0 + 8, n);
              }
            }
          }
        }
#pragma unroll
        for (int q = 0; q < kAcc; ++q) acc[q] = 0.f;
        fence_acc(acc);
      }
    }
  next_item:
    if (++st == S) {
      st = 0;
      phase ^= 1u;
    }
    if (++ci == cpt) {
      ci = 0;
      tile += step;
    }
  }
  wgmma_wait<0>();  // (no-op: the last item waited for every group)
  fence_acc(acc);
  if (WG == 2 || a.split == 1) return;

  // split > 1: this block's partial tile (rows < M) into shared memory, over the ring (every
  // TMA write has landed and every wgmma has completed: the last item waited for group 0).
  __syncthreads();
  float* tile_sm = reinterpret_cast<float*>(base);
#pragma unroll
  for (int jj = 0; jj < NT / 8; ++jj) {
    const int col = 8 * jj + c0;
    if (r0 < a.M) *reinterpret_cast<float2*>(tile_sm + r0 * kLdt + col) = make_float2(acc[4 * jj], acc[4 * jj + 1]);
    if (r0 + 8 < a.M)
      *reinterpret_cast<float2*>(tile_sm + (r0 + 8) * kLdt + col) = make_float2(acc[4 * jj + 2], acc[4 * jj + 3]);
  }
  cluster.sync();
  const float* part[kMaxSplit];
#pragma unroll
  for (int q = 0; q < kMaxSplit; ++q) part[q] = q < a.split ? cluster.map_shared_rank(tile_sm, q) : tile_sm;
  // Gated: the quads of the H gate columns; each one's up quad sits H floats to its right.
  constexpr int kQuadsPerRow = kOutCols / 4;
  const int n0 = tile0 * kOutCols;
  const int quads = a.M * kQuadsPerRow;
  const int e_end = int(int64_t(rank + 1) * quads / a.split);
  for (int e = int(int64_t(rank) * quads / a.split) + tid; e < e_end; e += kThreads) {
    const int m = e / kQuadsPerRow, nl = (e % kQuadsPerRow) * 4, n = n0 + nl;
    if (n >= a.N) continue;
    const int off = m * kLdt + nl;
    float v[4];
    sum_ranks(part, a.split, off, v);
    if constexpr (GATED) {
      float u[4];
      sum_ranks(part, a.split, off + kOutCols, u);
      swiglu_epilogue_store<4>(a, v, u, m, n);
    } else {
      store_out<4>(a, v, m, n);
    }
  }
  cluster.sync();  // peers may still be reading this block's tile
#else
  __trap();  // built without sm_90a code: linear_wgmma declines on such builds' devices
#endif
}

// ---- host side ----

int device_index() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// Compute capability 9.0 (the build's sm_90a code runs there only), cached per device.
bool device_is_sm90() {
  static std::atomic<int> cache[64];  // 0 unknown, 1 yes, 2 no
  const int dev = device_index();
  const bool slot = dev >= 0 && dev < 64;
  if (slot) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c) return c == 1;
  }
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const bool yes = major == 9 && minor == 0;
  if (slot) cache[dev].store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

// cuTensorMapEncodeTiled from the driver, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Row-major bf16 matrix (rows × K, row stride K) as a 2-D tensor map with a box of 64 k-columns
// (128 bytes) × box_rows rows, 128-byte swizzle; out-of-range elements read as zero.
CUtensorMap make_tensor_map(const void* ptr, int64_t rows, int64_t K, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(K) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kKC), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides,
                                          box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    const std::string msg = "linear_wgmma: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) +
                            " (rows " + std::to_string(rows) + ", K " + std::to_string(K) + ", box rows " +
                            std::to_string(box_rows) + ")";
    GRPO_CHECK_MSG(false, msg.c_str());
  }
  return m;
}

// The opt-in above 48 KB of dynamic shared memory is per device and kernel; set it once.
template <int NT, bool G, bool SER = false, int WG = 1>
void ensure_smem_attr() {
  static std::atomic<uint64_t> done{0};
  const int dev = device_index();
  const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit == 0 || !(done.load(std::memory_order_acquire) & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(linear_wgmma_kernel<NT, G, SER, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kMaxDynSmem)));
    done.fetch_or(bit, std::memory_order_acq_rel);
  }
}

// Resident blocks per SM of the split = 1 kernel with `stages` (cached; for the persistent grid).
template <int NT, bool G, bool SER = false, int WG = 1>
int blocks_per_sm(int stages) {
  static std::atomic<int> cache[kMaxStages + 1];
  int c = cache[stages].load(std::memory_order_relaxed);
  if (c > 0) return c;
  ensure_smem_attr<NT, G, SER, WG>();
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, linear_wgmma_kernel<NT, G, SER, WG>, kThreads * WG,
                                                           smem_bytes(NT, 1, stages, WG)));
  GRPO_CHECK_MSG(c >= 1, "linear_wgmma: the kernel does not fit an SM with these stages");
  cache[stages].store(c, std::memory_order_relaxed);
  return c;
}

template <int NT, bool G = false, bool SER = false, int WG = 1>
void launch(const CUtensorMap& tw, const CUtensorMap& tx, WgArgs a, cudaStream_t stream) {
  ensure_smem_attr<NT, G, SER, WG>();
  const size_t smem = smem_bytes(NT, a.split, a.stages, WG);
  GRPO_CHECK_MSG(smem <= kMaxDynSmem, "linear_wgmma: stages do not fit shared memory (at most 227 KB per block)");
  a.data_bytes = int(data_bytes(NT, a.split, a.stages, WG));
  // WG = 1: 64-row slices of x along y (1 for decode); WG = 2: one persistent grid over the
  // (128-row slice, tile) pairs.
  const int64_t m_tiles = WG == 1 ? ceil_div(a.M, kMaxM) : 1;
  const int64_t work = WG == 1 ? a.n_tiles : int64_t(a.n_tiles) * ceil_div(a.M, kMaxM * WG);
  int64_t grid = int64_t(a.n_tiles) * a.split;
  if (a.split == 1) grid = std::min<int64_t>(work, int64_t(sm_count()) * blocks_per_sm<NT, G, SER, WG>(a.stages));
  GRPO_CHECK_MSG(grid >= 1 && grid <= INT_MAX && m_tiles <= 65535 && work <= INT_MAX,
                 "linear_wgmma: grid size out of range");
  // Programmatic dependent launch (see the kernel's prologue) and split-K clusters.
  launch_pdl_on(stream, unsigned(a.split), linear_wgmma_kernel<NT, G, SER, WG>,
                dim3(unsigned(grid), unsigned(m_tiles), 1), dim3(unsigned(kThreads * WG), 1, 1), smem, tw, tx, a);
}

// Ring depth for a block that streams `items` chunks (INT_MAX: a persistent block):
//   - all of them in flight at once where that leaves room for two blocks per SM (<= 96 KB:
//     the next kernel's blocks can become resident and start their prologue under PDL);
//   - else a deep ring (<= 200 KB, one block per SM) for persistent blocks, for nt = 256 (whose
//     two-per-SM ring would be only 2 deep) and when the grid has no more blocks than SMs;
//   - else the two-per-SM ring (6 stages at nt = 64, 4 at nt = 128).
int default_stages(int nt, int64_t items, int64_t blocks, int64_t sms) {
  const int64_t sb = int64_t(stage_bytes(nt));
  const int64_t two = (96 * 1024) / sb;
  const int64_t big = std::min<int64_t>(kMaxStages, (200 * 1024) / sb);
  if (items <= two) return int(std::max<int64_t>(2, items));
  if (items == INT_MAX || nt == 256 || blocks <= sms) return int(std::min(items, big));
  return int(two);
}

// Ring depth of the two-warpgroup rows kernel: as deep as 200 KB allows (one block per SM,
// persistent): 4 stages at nt = 256, 6 at 128, 8 at 64.
int rows_wg2_stages(int nt) {
  return int(std::min<size_t>(kMaxStages, (200 * 1024) / stage_bytes(nt, 2)));
}

// default_stages for a grid of n_tiles × split blocks over `chunks` K chunks (split = 1 with
// more than two tiles per SM runs as a persistent grid).
int grid_stages(int nt, int split, int64_t chunks, int64_t n_tiles) {
  const int64_t sms = sm_count();
  const bool persistent = split == 1 && n_tiles > 2 * sms;
  return default_stages(nt, persistent ? int64_t(INT_MAX) : ceil_div(chunks, split), n_tiles * split, sms);
}

// The launch shared by both entry points: a.stages == 0 takes grid_stages; checks the ring
// against shared memory and the grid size, then launches for nt weight rows per block.
template <bool G>
void run_tiles(Context& ctx, const CUtensorMap& tw, const CUtensorMap& tx, WgArgs a, int nt, int wg = 1) {
  constexpr const char* kStagesMsg =
      G ? "linear_wgmma_swiglu: stages must be 2..16" : "linear_wgmma: stages must be 2..16";
  constexpr const char* kSmemMsg =
      G ? "linear_wgmma_swiglu: stages do not fit shared memory (stage = (64 + 2·nt)·128 bytes, at most 227 KB)"
        : "linear_wgmma: stages do not fit shared memory (stage = (64 + nt)·128 bytes, at most 227 KB)";
  constexpr const char* kGridMsg = G ? "linear_wgmma_swiglu: grid too large" : "linear_wgmma: grid too large";
  if (a.stages == 0) a.stages = wg == 2 ? rows_wg2_stages(nt) : grid_stages(nt, a.split, a.n_chunks, a.n_tiles);
  GRPO_CHECK_MSG(a.stages >= 2 && a.stages <= kMaxStages, kStagesMsg);
  GRPO_CHECK_MSG(smem_bytes(nt, a.split, a.stages, wg) <= kMaxDynSmem, kSmemMsg);
  GRPO_CHECK_MSG(int64_t(a.n_tiles) * a.split <= INT_MAX, kGridMsg);
  a.data_bytes = 0;  // set by launch
  const cudaStream_t stream = stream_of(ctx);
  if constexpr (!G) {
    if (wg == 2) {  // the rows mode's two-warpgroup kernel (split 1, or the serial split at nt <= 128)
      GRPO_CHECK_MSG(a.split == 1 && (a.ranges == 1 || nt <= 128), "linear_wgmma: two warpgroups need split 1 "
                                                                   "(the serial split at nt 64/128)");
      if (a.ranges > 1) {
        if (nt == 64) launch<64, false, true, 2>(tw, tx, a, stream);
        else launch<128, false, true, 2>(tw, tx, a, stream);
      } else if (nt == 64) {
        launch<64, false, false, 2>(tw, tx, a, stream);
      } else if (nt == 128) {
        launch<128, false, false, 2>(tw, tx, a, stream);
      } else {
        launch<256, false, false, 2>(tw, tx, a, stream);
      }
      return;
    }
    if (a.ranges > 1) {  // the serial split (nt 64 or 128: two accumulators fit the registers)
      GRPO_CHECK_MSG(a.split == 1 && (nt == 64 || nt == 128), "linear_wgmma: serial split needs split 1, nt 64/128");
      if (nt == 64) launch<64, false, true>(tw, tx, a, stream);
      else launch<128, false, true>(tw, tx, a, stream);
      return;
    }
  }
  switch (nt) {
    case 64: launch<64, G>(tw, tx, a, stream); break;
    case 128: launch<128, G>(tw, tx, a, stream); break;
    default: launch<256, G>(tw, tx, a, stream); break;
  }
}

}  // namespace

// Cost model (ns) over nt ∈ {64, 128, 256} × split ∈ {1, 2, 4, 8} (split <= chunks), at M = 64
// so that the choice never depends on M. Per candidate, with C = ceil(K/64) chunks:
//   blocks = tiles·split (split = 1 and tiles > 2·SMs: a persistent grid of one wave),
//   every block streams cpb = ceil(C/split) chunks per tile, (64 + nt)·128 bytes each (x + w);
//   t = max(weight bytes / 4000 B/ns (HBM),
//           all blocks' x + w bytes / 8000 B/ns (L2 → SM; x is re-read by every tile),
//           busiest SM's bytes / 80 B/ns (what one SM pulls with ~100 KB in flight),
//           busiest SM's wgmma time at 2048 MAC/clk, 1.7 GHz)
//     + 1500 ns per extra wave of blocks (grid larger than the resident slots)
//     + split > 1: the SM's remote partial-tile reads (64·nt·4·(split-1)/split bytes per block)
//       at 60 B/ns + 200 ns of cluster barriers
//     + the last chunk's wgmma (not overlapped with loads).
// Candidates within 0.1% keep the earlier one (nt descending) unless it has more blocks. The
// constants are rough H100/H200 figures; bench_kernels' sweep prints the alternatives.
// Choices on 132 SMs: Qwen2.5 qkv 64/4/4, o 64/8/2, gate_up 64/1, down 64/8/10, LM head
// 128/1/8 (persistent); Qwen3 qkv 64/2/8, o 64/8/4, gate_up 64/1/12, down 64/8/6 (nt/split/stages).
// The gated kernel maps gate_up's choice to H = 32, split 1, the same stages (wgmma_gated_config).
WgmmaGemmConfig wgmma_gemm_config(int64_t N, int64_t K) {
  const int64_t sms = sm_count();
  const int64_t chunks = ceil_div(K, kKC);
  const double wbytes = double(N) * double(K) * 2;
  WgmmaGemmConfig best;
  double best_t = 0;
  int64_t best_blocks = 0;
  for (int nt : {256, 128, 64}) {
    // Wider tiles only where 64-row tiles would make more than two blocks per SM (the LM head):
    // below that, nt = 64 measured as fast or faster on an H200 (gate_up of Qwen2.5-0.5B: 64/1
    // 8.2 µs against 10.1 µs for the model's 128/1; Qwen3-0.6B: 7.9 against 9.5 µs).
    if (nt > 64 && ceil_div(N, 64) <= 2 * sms) continue;
    const int64_t tiles = ceil_div(N, nt);
    const double mma_chunk_ns = 64.0 * nt * kKC / 2048.0 / 1.7;
    for (int split : {1, 2, 4, 8}) {
      if (split > 1 && split > chunks) continue;
      const int64_t cpb = ceil_div(chunks, split);
      const bool persistent = split == 1 && tiles > 2 * sms;
      const int64_t blocks0 = tiles * split;
      const int stages = default_stages(nt, persistent ? int64_t(INT_MAX) : cpb, blocks0, sms);
      const int64_t occ = std::max<int64_t>(1, int64_t(kSmPerSm / (smem_bytes(nt, split, stages) + 1024)));
      const int64_t blocks = persistent ? std::min(tiles, sms * occ) : blocks0;
      const int64_t items = (persistent ? ceil_div(tiles, blocks) : 1) * cpb;
      const int64_t per_sm = ceil_div(blocks, sms);
      const double total = double(blocks * items) * double(stage_bytes(nt));
      double t = std::max({wbytes / 4000.0, total / 8000.0, double(per_sm * items) * double(stage_bytes(nt)) / 80.0,
                           double(per_sm * items) * mma_chunk_ns});
      if (!persistent) t += 1500.0 * double(ceil_div(blocks, sms * occ) - 1);
      if (split > 1) t += double(per_sm) * 64.0 * nt * 4 * (split - 1) / split / 60.0 + 200.0;
      t += mma_chunk_ns;
      if (best.nt == 0 || t < best_t * 0.999 || (t <= best_t * 1.001 && blocks < best_blocks)) {
        best = WgmmaGemmConfig{nt, split, stages};
        best_t = t;
        best_blocks = blocks;
      }
    }
  }
  return best;
}

bool wgmma_gemm_available() { return device_is_sm90() && tensor_map_encoder() != nullptr; }

namespace {

// The plain kernel over x (M,K) · w (N,K)ᵀ for any M >= 1 (64-row slices along the grid's y),
// into out (bf16, with bias / accumulate) or out_f32 (alpha · product). Operands checked by the callers.
void run_plain(Context& ctx, __nv_bfloat16* out, float* out_f32, float alpha, const Tensor& x, const Tensor& w,
               const Tensor* bias, int bias_kind, bool accumulate, WgmmaGemmConfig cfg) {
  const int64_t M = x.shape[0], K = x.shape[1], N = w.shape[0];
  const bool explicit_cfg = cfg.nt != 0 && cfg.split != 0;
  const WgmmaGemmConfig h = explicit_cfg ? WgmmaGemmConfig{} : wgmma_gemm_config(N, K);
  GRPO_CHECK_MSG(cfg.wg >= 0 && cfg.wg <= 2, "linear_wgmma: wg must be 0, 1 or 2");
  static const bool serial = !env_off("GRPO_WGMMA_SERIAL_SPLIT");
  static const int rows_wg = int(env_long("GRPO_WGMMA_ROWS_WG", 0, 0, 2));
  static const int rows_nt = int(env_long("GRPO_WGMMA_ROWS_NT", 0, 0, 256));
  const bool valid_rows_nt = rows_nt == 64 || rows_nt == 128 || rows_nt == 256;
  const int want_split = cfg.split ? cfg.split : h.split;
  // Two warpgroups per block from 256 rows on for weights of 3 Mi elements or more
  // (GRPO_WGMMA_ROWS_WG = 1 or 2 forces one choice); the serial split holds two accumulators, so
  // with split > 1 the weight tile is at most 128 rows. H200, 13,440 rows, one against two
  // (bench_bitwise gemm): gate_up of Qwen2.5-0.5B 0.92 -> 0.56 ms, down 0.32 -> 0.28, Llama-3.2-1B's
  // 3.26 -> 1.91 and 1.28 -> 0.85; the small split-8 products lose (Qwen2.5 o 0.106 -> 0.127 ms,
  // qkv 0.086 -> 0.101, Qwen3 o 0.186 -> 0.197: each K range ends in a drain of the wgmma queue).
  const bool big = int64_t(N) * K >= (int64_t(3) << 20);
  int wg = cfg.wg ? cfg.wg : M >= 4 * kMaxM && (rows_wg == 2 || (rows_wg == 0 && big)) ? 2 : 1;
  if (wg == 2 && (M <= kMaxM || (want_split > 1 && (!serial || cfg.nt == 256)))) wg = 1;
  if (wg == 2 && cfg.nt == 0) {
    const int want = valid_rows_nt && !(want_split > 1 && rows_nt == 256) ? rows_nt : want_split > 1 ? 128 : 256;
    cfg.nt = N >= want ? want : N >= 128 ? 128 : 64;
  }
  if (!explicit_cfg && M > kMaxM && cfg.nt == 0) {
    // Many row slices (nt and stages change no result bit, only split does): 128-row weight
    // tiles (64 for wide weights) and a 3-deep ring, so that three blocks share an SM. H200,
    // Qwen2.5-0.5B at 13,440 rows (bench_bitwise): qkv 0.086 ms, o 0.105, gate_up 0.864 (nt 64),
    // down 0.320, against 0.18-1.31 ms for the decode heuristic's deeper rings.
    const int want = valid_rows_nt ? rows_nt : N >= 8192 ? 64 : 128;
    cfg.nt = N >= want ? want : h.nt;
    if (cfg.stages == 0) cfg.stages = 3;
  }
  const int nt = cfg.nt ? cfg.nt : h.nt, split = cfg.split ? cfg.split : h.split;
  GRPO_CHECK_MSG(nt == 64 || nt == 128 || nt == 256, "linear_wgmma: nt must be 64, 128 or 256");
  GRPO_CHECK_MSG(split == 1 || split == 2 || split == 4 || split == kMaxSplit, "linear_wgmma: split must be 1, 2, 4 or 8");
  const int64_t chunks = ceil_div(K, kKC), n_tiles = ceil_div(N, nt);
  const int w_box_rows = int(std::min<int64_t>(nt, N));
  const CUtensorMap tw = make_tensor_map(w.data, N, K, w_box_rows);
  const int x_box_rows = int(std::min<int64_t>(M, kMaxM * wg));
  const CUtensorMap tx = make_tensor_map(x.data, M, K, x_box_rows);
  WgArgs a{};
  a.out = out;
  a.out_f32 = out_f32;
  a.alpha = alpha;
  a.bias = bias ? bias->data : nullptr;
  a.bias_kind = bias_kind;
  a.accumulate = accumulate ? 1 : 0;
  a.M = int(M);
  a.N = int(N);
  a.K = int(K);
  a.x_box_rows = x_box_rows;
  a.n_chunks = int(chunks);
  a.n_tiles = int(n_tiles);
  a.w_box_rows = w_box_rows;
  a.split = split;
  a.ranges = 1;
  // Explicit stages, else the heuristic's when its (nt, split) runs, else the tile's default.
  a.stages = cfg.stages ? cfg.stages : (!explicit_cfg && nt == h.nt && split == h.split && M <= kMaxM) ? h.stages : 0;
  if (serial && M > kMaxM && split > 1 && nt <= 128) {
    // Many row slices: each block sums its tile's K ranges itself (bit for bit the cluster's
    // reduction, see the kernel), so no block is left with a few chunks and a cluster barrier.
    a.ranges = split;
    a.split = 1;
    a.stages = cfg.stages;
  }
  run_tiles<false>(ctx, tw, tx, a, nt, wg);
}

// decode_gemm_applies for any M up to 64·65535 row slices (the grid's y), on an sm_90 device.
bool rows_gemm_applies(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias, DType out_dtype,
                       int* bias_kind) {
  return decode_gemm_applies(out, x, w, bias, kKC, 256, bias_kind, int64_t(kMaxM) * 65535, out_dtype) &&
         wgmma_gemm_available();
}

}  // namespace

bool linear_wgmma(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias, bool accumulate,
                  WgmmaGemmConfig cfg) {
  int bias_kind = kNoBias;  // K >= one 64-wide chunk: no TMA box exceeds the tensor
  if (!decode_gemm_applies(out, x, w, bias, kKC, 256, &bias_kind) || !wgmma_gemm_available()) return false;
  run_plain(ctx, out.ptr<__nv_bfloat16>(), nullptr, 1.f, x, w, bias, bias_kind, accumulate, cfg);
  return true;
}

bool linear_wgmma_rows(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                       bool accumulate, WgmmaGemmConfig cfg) {
  int bias_kind = kNoBias;
  if (!rows_gemm_applies(out, x, w, bias, DType::bf16, &bias_kind)) return false;
  run_plain(ctx, out.ptr<__nv_bfloat16>(), nullptr, 1.f, x, w, bias, bias_kind, accumulate, cfg);
  return true;
}

bool linear_wgmma_f32(Context& ctx, Tensor& out, const Tensor& x, const Tensor& w, float alpha, int split) {
  int bias_kind = kNoBias;
  if (!rows_gemm_applies(out, x, w, nullptr, DType::f32, &bias_kind)) return false;
  WgmmaGemmConfig cfg{};
  if (split != 0) {  // explicit split: the weight tile the heuristic would take for M rows
    const WgmmaGemmConfig h = wgmma_gemm_config(w.shape[0], x.shape[1]);
    cfg.split = split;
    if (x.shape[0] < 4 * kMaxM) {  // (from 256 rows on, run_plain's two-warpgroup defaults)
      cfg.nt = x.shape[0] > kMaxM && w.shape[0] >= 128 ? 128 : h.nt;
      if (x.shape[0] > kMaxM) cfg.stages = 3;  // as run_plain's rows default
    }
  }
  run_plain(ctx, nullptr, out.ptr<float>(), alpha, x, w, nullptr, bias_kind, false, cfg);
  return true;
}

// The plain path's choice for the (2F, K) product, expressed for the gated kernel: split (the
// only field that changes bits) unchanged, and H = nt/2 act columns per block, so that a block
// streams the same NT = 2H weight rows per chunk as the plain kernel's block (same stage size,
// ring depth, grid size and shared memory). Where F is not a multiple of nt/2, H halves (down
// to 32) and the ring depth is recomputed for the narrower tile; F % 32 != 0 gives nt = 0.
WgmmaGemmConfig wgmma_gated_config(int64_t F, int64_t K) {
  if (F < 32 || F % 32 != 0 || F > (int64_t(INT_MAX) - 256) / 2 || K < 1) return {};
  const WgmmaGemmConfig p = wgmma_gemm_config(2 * F, K);
  int h = p.nt / 2;
  int stages = p.stages;
  while (F % h != 0) {  // ends at h = 32 at the latest
    h /= 2;
    stages = 0;
  }
  if (stages == 0) {
    stages = grid_stages(2 * h, p.split, ceil_div(K, kKC), F / h);
  }
  return WgmmaGemmConfig{h, p.split, stages};
}

bool linear_wgmma_swiglu(Context& ctx, Tensor& act, const Tensor& x, const Tensor& w_gate_up, WgmmaGemmConfig cfg) {
  const Tensor& w = w_gate_up;
  if (x.dtype != DType::bf16 || w.dtype != DType::bf16 || act.dtype != DType::bf16) return false;
  if (x.ndim != 2 || w.ndim != 2 || act.ndim != 2) return false;
  const int64_t M = x.shape[0], K = x.shape[1], F = act.shape[1];
  if (w.shape[0] != 2 * F || w.shape[1] != K || act.shape[0] != M) return false;
  if (M < 1 || M > kMaxM || F < 32 || F % 32 != 0 || K < kKC || K % 8 != 0) return false;
  if (2 * F > int64_t(INT_MAX) - 256 || K > int64_t(INT_MAX) - 64) return false;
  if (!aligned16(x.data) || !aligned16(w.data) || !aligned16(act.data)) return false;
  if (!wgmma_gemm_available()) return false;

  const bool explicit_cfg = cfg.nt != 0 && cfg.split != 0;
  const WgmmaGemmConfig h = explicit_cfg ? WgmmaGemmConfig{} : wgmma_gated_config(F, K);
  if (!explicit_cfg && h.nt == 0) return false;
  const int half = cfg.nt ? cfg.nt : h.nt, split = cfg.split ? cfg.split : h.split;
  GRPO_CHECK_MSG(half == 32 || half == 64 || half == 128, "linear_wgmma_swiglu: nt must be 32, 64 or 128");
  GRPO_CHECK_MSG(split == 1 || split == 2 || split == 4 || split == kMaxSplit,
                 "linear_wgmma_swiglu: split must be 1, 2, 4 or 8");
  if (F % half != 0) return false;  // a tile must not straddle the gate/up boundary
  const int nt = 2 * half;          // weight rows per block = the wgmma n
  const int64_t chunks = ceil_div(K, kKC), n_tiles = F / half;
  const CUtensorMap tw = make_tensor_map(w.data, 2 * F, K, half);  // boxes of `half` rows: gate, then up
  const CUtensorMap tx = make_tensor_map(x.data, M, K, int(M));
  WgArgs a{};
  a.out = act.ptr<__nv_bfloat16>();
  a.bias = nullptr;
  a.bias_kind = kNoBias;
  a.M = int(M);
  a.x_box_rows = int(M);
  a.N = int(F);
  a.K = int(K);
  a.n_chunks = int(chunks);
  a.n_tiles = int(n_tiles);
  a.w_box_rows = half;
  a.up_row0 = int(F);
  a.split = split;
  a.stages = cfg.stages ? cfg.stages : (!explicit_cfg && half == h.nt && split == h.split) ? h.stages : 0;
  run_tiles<true>(ctx, tw, tx, a, nt);
  return true;
}

}  // namespace grpo::cuda
