// Log-probabilities of given tokens, fused with the LM head and computed in
// vocabulary chunks so that no (N, V) float tensor is materialised.
//   z = (h · wᵀ) / temperature,  logp[i] = z[i, t_i] − logsumexp(z[i, :])
//   entropy[i] = −Σ softmax(z_i) · log softmax(z_i)
#pragma once
#include "core/context.h"

#define GRPO_LOGPROB_OPS                                                                         \
  /* h (N,C), w (V,C), targets (N) i32 -> logp (N) f32, lse (N) f32 (saved for backward),         \
     entropy (N) f32 optional */                                                                  \
  void token_logprobs_forward(Context& ctx, Tensor& logp, Tensor& lse, Tensor* entropy,           \
                              const Tensor& h, const Tensor& w, const Tensor& targets,            \
                              float temperature);                                                 \
  /* dlogp (N) f32 -> dh (N,C) overwritten, dw (V,C) f32 accumulated (may be null) */             \
  void token_logprobs_backward(Context& ctx, Tensor& dh, Tensor* dw, const Tensor& dlogp,         \
                               const Tensor& h, const Tensor& w, const Tensor& targets,           \
                               const Tensor& lse, float temperature);

namespace grpo { GRPO_LOGPROB_OPS }
namespace grpo::cpu { GRPO_LOGPROB_OPS }
namespace grpo::cuda { GRPO_LOGPROB_OPS }

namespace grpo::cuda {
// Bitwise on-policy (docs/bitwise.md): token_logprobs_forward's logp for the rows of logits
// (R,V) f32, the LM head's product h·wᵀ as linear_forward computes it in a batch-invariant
// context. Each chunk of 4096 ids is scaled by 1/temperature (one f32 product per value, as
// the GEMM epilogue scales) and folded exactly as token_logprobs_forward folds its tiles, whose
// product in such a context uses the whole LM head's split: so the result equals, bit for bit,
// token_logprobs_forward on the rows' hidden states, without a second LM-head product.
void logits_token_logprobs(Context& ctx, Tensor& logp, const Tensor& logits, const Tensor& targets,
                           float temperature);
}  // namespace grpo::cuda
