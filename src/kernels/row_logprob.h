// Log-probability of one given id per logits row, for rows whose token was not
// sampled from them (tandem decoding: the trained model's logprob of a token the
// partner wrote, which is what the trainer will recompute for it).
//   y = z / T_r (T_r <= 0 is treated as 1, like the sampler's greedy rows)
//   logp[r] = y[id_r] − logsumexp(y)
// No id is banned or filtered: this is the full-vocabulary distribution the
// trainer scores (kernels/logprob.h at the same temperature).
#pragma once
#include "core/context.h"

#define GRPO_ROW_LOGPROB_OPS                                                                   \
  /* logits (R,V) f32, ids (R) i32 in [0, V), temperature (R) f32 -> logp (R) f32 */            \
  void logits_row_logprobs(Context& ctx, Tensor& logp, const Tensor& logits, const Tensor& ids, \
                           const Tensor& temperature);

namespace grpo { GRPO_ROW_LOGPROB_OPS }
namespace grpo::cpu { GRPO_ROW_LOGPROB_OPS }
namespace grpo::cuda { GRPO_ROW_LOGPROB_OPS }
