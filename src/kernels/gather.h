// Row gather and its scatter-add backward. The embedding lookup (rows of the table by token
// id) and picking rows of an activation (the last token of each sequence before the LM
// head, so that logits are computed only where needed) are this one op.
#pragma once
#include "core/context.h"

#define GRPO_GATHER_OPS                                                                              \
  /* out (R,C) = src (N,C)[idx (R) i32]; idx is validated at the boundary (0 <= idx < N) */          \
  void gather_rows_forward(Context& ctx, Tensor& out, const Tensor& src, const Tensor& idx);          \
  /* dsrc (N,C) += dout (R,C) added at the rows idx, in order r = 0..R-1 on both backends (repeated  \
     rows sum deterministically); accumulate = false zeroes dsrc first. dsrc is f32 or dout's dtype */ \
  void gather_rows_backward(Context& ctx, Tensor& dsrc, const Tensor& dout, const Tensor& idx, bool accumulate);      \
  /* out (R) i32 = table (N) i32 [idx (R) i32], on the context's stream without a wait (a draft     \
     vocabulary's sampled columns to token ids on the device). idx must be in [0, N): not checked.  */ \
  void gather_ids(Context& ctx, Tensor& out, const Tensor& table, const Tensor& idx);

namespace grpo { GRPO_GATHER_OPS }
namespace grpo::cpu { GRPO_GATHER_OPS }
namespace grpo::cuda { GRPO_GATHER_OPS }
