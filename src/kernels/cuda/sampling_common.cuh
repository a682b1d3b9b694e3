// Private to the CUDA sampler (sampling*.cu): block sizes, the chunk partials and the argument
// block every sampler kernel takes, and the per-id helpers the paths share.
//   sampling.cu              sample_tokens: picks the path per batch and launches it
//   sampling_one_block.cuh   one 1024-thread block per row (top-n lists; the reference path)
//   sampling_split.cu        unfiltered rows: one pass over the logits, one finishing block per row
//   sampling_filtered.cu     top-k / top-p / min-p rows: radix select, many blocks per row
// The types live in grpo::cuda::sampler so that the launchers can be called across files; the
// device helpers sit in an unnamed namespace, as each file's own kernels' helpers.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/context.h"
#include "kernels/cuda/workspace.cuh"

namespace grpo::cuda::sampler {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBannedSmem = 256;
constexpr int kPartThreads = 256;
constexpr int kPartWarps = kPartThreads / 32;
constexpr int kPer = 16;                         // contiguous ids per thread
constexpr int kPartChunk = kPartThreads * kPer;  // ids per part block
constexpr int kMaxParts = kThreads;              // chunks per row the finish block holds (one per thread)

struct ChunkPart {
  float m0;        // raw max (−inf: every raw logit −inf)
  float m;         // processed max (−inf: no valid id)
  int32_t best;    // processed argmax, lowest id on ties (INT32_MAX: none)
  int32_t n_valid;
  double s0;       // Σ exp(z − m0) over the chunk
  double q;        // Σ exp(y − m) over the chunk's valid ids, in the order of the file header
};

// Everything the sampler kernels read or write, by value.
struct SplitArgs {
  const float* logits;
  int64_t V;
  int n_chunks;
  const float* temperature;
  const float* top_p;
  const int32_t* top_k;
  const float* min_p;
  const int64_t* rng_key;
  const int64_t* rng_pos;
  const int32_t* banned;  // (R, nb) or null
  int nb;
  int32_t* tokens;
  float* lp_raw;
  float* lp_proc;
  int32_t* top_ids;
  float* top_lps;
  int n_top;
  bool top_processed;
  float* probs;     // (R, V) or null: the processed distribution (one-block path only)
  int filt_stages;  // 0: filtered rows take the one-block path; else 4 | 1 (top-k stages
                    // launched) | 2 (top-p stages launched)
};

namespace {

__device__ __forceinline__ uint32_t okey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Warp argmax of (v, id): larger v wins, then lower id. Every lane gets the winner.
__device__ __forceinline__ void warp_argmax(float& v, int32_t& id) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
  }
}

__device__ __forceinline__ bool row_filtered(int64_t r, const float* top_p, const int32_t* top_k, const float* min_p,
                                             int n_top) {
  return n_top > 0 || top_k[r] > 0 || top_p[r] < 1.f || min_p[r] > 0.f;
}

// Row r takes the filtered split path: it is filtered and every search it needs was launched.
__device__ __forceinline__ bool filt_split_row(const SplitArgs& a, int64_t r) {
  if (a.filt_stages == 0 || !row_filtered(r, a.top_p, a.top_k, a.min_p, 0)) return false;
  return (a.top_k[r] <= 0 || (a.filt_stages & 1)) && (!(a.top_p[r] < 1.f) || (a.filt_stages & 2));
}

// Processed logit of a loaded z: −inf when banned or −inf, else z / temp (temp 1: z itself).
__device__ __forceinline__ float proc_val(float v, bool is_banned, float temp) {
  if (is_banned || v == -INFINITY) return -INFINITY;
  return temp == 1.f ? v : v / temp;
}

// The kPer logits from id i0 (a multiple of kPer), −inf past V. Vector and scalar loads give
// the same values, so a row's results do not depend on its alignment inside the batch.
__device__ __forceinline__ void load_ids(const float* __restrict__ z, int64_t V, int64_t i0, float (&v)[kPer]) {
  if (i0 + kPer <= V && (reinterpret_cast<uintptr_t>(z + i0) & 15u) == 0) {
    const float4* p = reinterpret_cast<const float4*>(z + i0);
#pragma unroll
    for (int j = 0; j < kPer / 4; ++j) {
      const float4 a = p[j];
      v[4 * j] = a.x;
      v[4 * j + 1] = a.y;
      v[4 * j + 2] = a.z;
      v[4 * j + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = i0 + k < V ? z[i0 + k] : -INFINITY;
  }
}

// Bit k of the result: id cb + kPer·threadIdx.x + k is banned (threads >= kPartThreads get 0).
// Call from every thread of the block (barriers unless nb == 0); ORs commute, so the order in
// which threads set bits does not matter. sh_ban holds kPartThreads words.
__device__ uint32_t ban_mask(uint32_t* sh_ban, const int32_t* __restrict__ bl, int nb, int64_t cb) {
  if (nb == 0) return 0u;
  if (threadIdx.x < kPartThreads) sh_ban[threadIdx.x] = 0u;
  __syncthreads();
  for (int k = threadIdx.x; k < nb; k += blockDim.x) {
    const int32_t id = bl[k];
    const int64_t d = int64_t(id) - cb;
    if (id >= 0 && d >= 0 && d < kPartChunk) atomicOr(&sh_ban[d / kPer], 1u << unsigned(d % kPer));
  }
  __syncthreads();
  return threadIdx.x < kPartThreads ? sh_ban[threadIdx.x] : 0u;
}

}  // namespace

// Part and finishing kernels of the split path (sampling_split.cu). parts == nullptr: no part
// pass, every row unfiltered or filtered takes the one-block path inside the finishing kernel.
void launch_split_sampler(Context& ctx, const SplitArgs& a, int64_t R, ChunkPart* parts);

// The filtered split path's kernels (sampling_filtered.cu) after the part and finishing kernels,
// for the rows filt_split_row selects; any_k / any_p: which searches to launch.
void launch_filtered_sampler(Context& ctx, ScratchAlloc& sa, const SplitArgs& a, int64_t R,
                             const ChunkPart* parts, bool any_k, bool any_p);

}  // namespace grpo::cuda::sampler
