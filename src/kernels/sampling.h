// Token sampling over a batch of logits rows, with per-row parameters, a
// counter-based RNG and the logprobs the trainer needs. The CPU version is the
// reference; the CUDA version follows the same definition step by step.
//
// Per row r (logits z (V) f32, the model's raw output):
//   raw logprob       lr = z[t] - logsumexp(z)              (temperature 1, nothing masked)
//   processed logits  y  = z with banned ids set to -inf, then
//                          y / temperature                   (temperature 0 -> treated as 1)
//   ranking           ids sorted by (y desc, id asc)
//   top-k             keep the first top_k ids of the ranking (top_k <= 0: off)
//   top-p             over the kept ids, with q = exp(y - max y) and Q = Σ_kept q:
//                     keep the shortest ranking prefix whose Σ q >= top_p·Q (at least one id;
//                     top_p >= 1: off)
//   min-p             drop kept ids with q < min_p (q is relative to the most likely id, whose
//                     q is 1; the top id is always kept; min_p <= 0: off)
//   processed logprob lp = y[t] - max y - log(Σ_kept q)     (−inf for ids not kept)
//   token             temperature == 0: the top id of the ranking (argmax of the
//                     non-banned logits, lowest id on ties).
//                     Otherwise inverse CDF in ASCENDING ID ORDER over the kept ids:
//                     u = sampling_uniform(rng_key[r], rng_pos[r]); t = the first kept id
//                     (ascending) whose running sum of q exceeds u·Σ_kept q; if rounding
//                     leaves none, the last kept id. (Id order, not rank order, so that no
//                     sort is needed when no filter is active; the CPU sums in double, a
//                     GPU may sum in f32: the two agree unless u falls within rounding of a
//                     bucket edge.)
// Top-n logprobs (n = top_ids.shape[1], optional): the n best ids by the selected
// distribution (raw: z; processed: lp, where not-kept ids are −inf), ties by lower id,
// with their logprobs under that distribution, best first.
// A row whose every id is banned is a caller bug (GRPO_CHECK).
#pragma once
#include <cstdint>

#include "core/context.h"

#if defined(__CUDACC__)
#define GRPO_HD __host__ __device__ __forceinline__
#else
#define GRPO_HD inline
#endif

namespace grpo {

// splitmix64 finaliser: a bijective 64-bit mixer.
GRPO_HD uint64_t sampling_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Per-request key: from the user's seed and the sample index j in [0, n). The
// engine derives seed-less requests' keys from its own seed and the request id.
GRPO_HD uint64_t sampling_row_key(uint64_t seed, uint64_t sample_index) {
  return sampling_mix64(seed ^ sampling_mix64(sample_index ^ 0x5851F42D4C957F2Dull));
}

// Uniform in [0, 1) with 24 random bits (exactly representable in f32), for the
// token at counter `pos` (the engine passes the index of the completion token
// being sampled, so a sample does not depend on batch composition or preemption).
GRPO_HD float sampling_uniform(uint64_t key, uint64_t pos) {
  uint64_t h = sampling_mix64(key ^ sampling_mix64(pos + 0x2545F4914F6CDD1Dull));
  return float(h >> 40) * (1.0f / 16777216.0f);
}

// Per-row parameters, all (R) on ctx.device() (persistent buffers in the engine).
struct SamplingRows {
  Tensor temperature;  // (R) f32, >= 0; 0 = greedy
  Tensor top_p;        // (R) f32 in (0, 1]; 1 = off
  Tensor top_k;        // (R) i32; <= 0 = off
  Tensor min_p;        // (R) f32 in [0, 1]; 0 = off
  Tensor rng_key;      // (R) i64: bits of the u64 key (sampling_row_key)
  Tensor rng_pos;      // (R) i64: RNG counter (index of the completion token being sampled)
  Tensor banned;       // (R, NB) i32: ids masked before sampling, -1 = padding; may be empty
                       // (used for EOS/stop ids while min_tokens is not reached)
  // Host-side hint: which filters some row uses (kFilterTopK | kFilterTopP | kFilterMinP;
  // 0: none), or -1 when the caller does not know. It only selects which kernels a backend
  // launches; a hint that leaves out a filter some row uses is a caller bug.
  int filter_hint = -1;
};
inline constexpr int kFilterTopK = 1, kFilterTopP = 2, kFilterMinP = 4;

struct SamplingOutputs {
  Tensor tokens;             // (R) i32: sampled ids
  Tensor logprob_raw;        // (R) f32: lr of the sampled id
  Tensor logprob_processed;  // (R) f32: lp of the sampled id
  Tensor top_ids;            // (R, n) i32, optional (empty: no top-n)
  Tensor top_logprobs;       // (R, n) f32, with top_ids
  // (R, V) f32, optional: the processed distribution itself, q / Σ_kept q for kept ids and 0
  // for the others (speculative sampling's p and q, kernels/spec_verify.h). CUDA serves rows
  // that want it on the one-block path.
  Tensor probs;
};

}  // namespace grpo

#define GRPO_SAMPLING_OPS                                                                        \
  /* logits (R,V) f32 -> out (see above). top_processed selects the distribution of the         \
     top-n lists (false: raw, true: processed). CUDA may use ctx.workspace() as scratch. */     \
  void sample_tokens(Context& ctx, SamplingOutputs& out, const Tensor& logits,                  \
                     const SamplingRows& rows, bool top_processed);

namespace grpo { GRPO_SAMPLING_OPS }
namespace grpo::cpu { GRPO_SAMPLING_OPS }
namespace grpo::cuda { GRPO_SAMPLING_OPS }
