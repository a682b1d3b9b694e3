// Speculative sampling's per-position test (Leviathan et al. 2023, Chen et al. 2023): the
// target keeps a draft token x ~ q with probability min(1, p(x)/q(x)), else draws from
// normalize(max(0, p − q)); the emitted token then follows p exactly, whatever q is.
//
// Per row i (all inputs on ctx.device()):
//   p      row p_rows[i] of P (R_p, V) f32: the target's processed distribution
//          (sample_tokens' `probs` output: 0 for ids not kept)
//   q      row q_rows[i] of Q (R_q, V) f32: the draft's processed distribution, or, when
//          q_rows[i] < 0, the point mass at x (a deterministic proposer such as prompt lookup).
//          With q_index (a draft over a subset of the vocabulary, SpeculativeOptions::
//          draft_vocab_ids) Q is (R_q, V_q) and q(j) = Q[q_rows[i], q_index[j]], 0 where
//          q_index[j] < 0
//   x      draft[i] in [0, V)
//   accept u_a · q(x) < p(x), u_a = sampling_uniform(spec_accept_key(key[i]), pos[i])
//   token  x when accepted, else the inverse CDF in ascending id order over
//          w = max(0, p − q) at u_r · Σw, u_r = sampling_uniform(spec_residual_key(key[i]), pos[i])
//          (if rounding leaves no id, the last id with w > 0; x itself if Σw is 0)
//   lp_raw[i]  = z[token] − logsumexp(z), z = row p_rows[i] of logits (R_p, V) f32
//   lp_proc[i] = log p(token)
// The two uniforms come from streams of the request's key other than the sampler's, so they
// are independent of the draft's own sample and of every other position; a row's results
// depend only on its inputs, never on the batch. Sums are in double (CUDA: f64 partial sums
// in a fixed order), so CPU and CUDA agree unless a uniform falls within rounding of an edge.
#pragma once
#include <cstdint>

#include "core/context.h"
#include "kernels/sampling.h"

namespace grpo {

GRPO_HD uint64_t spec_accept_key(uint64_t key) { return sampling_mix64(key ^ 0x6A09E667F3BCC909ull); }
GRPO_HD uint64_t spec_residual_key(uint64_t key) { return sampling_mix64(key ^ 0xBB67AE8584CAA73Bull); }

struct SpecVerifyRows {
  Tensor p_rows;  // (N) i32: row of P / logits
  Tensor q_rows;  // (N) i32: row of Q, < 0 = point mass at the draft token
  Tensor draft;   // (N) i32
  Tensor rng_key; // (N) i64: the request's sampling key (sampling_row_key)
  Tensor rng_pos; // (N) i64: completion index of the position
  Tensor q_index; // (V) i32: column of Q of each id, < 0 = not in the draft's vocabulary (empty: Q is (R_q, V))
};

struct SpecVerifyOutputs {
  Tensor token;     // (N) i32
  Tensor accepted;  // (N) i32: 1 = the draft token was kept
  Tensor lp_raw;    // (N) f32
  Tensor lp_proc;   // (N) f32
};

}  // namespace grpo

#define GRPO_SPEC_VERIFY_OPS                                                                      \
  /* logits, P (R_p, V) f32; Q (R_q, V or V_q) f32 (may be empty when every q_rows < 0) -> out (N) */   \
  void spec_verify(Context& ctx, SpecVerifyOutputs& out, const Tensor& logits, const Tensor& P, \
                   const Tensor& Q, const SpecVerifyRows& rows);

namespace grpo { GRPO_SPEC_VERIFY_OPS }
namespace grpo::cpu { GRPO_SPEC_VERIFY_OPS }
namespace grpo::cuda { GRPO_SPEC_VERIFY_OPS }
