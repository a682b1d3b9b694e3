// CUDA token sampler (kernels/sampling.h): sample_tokens picks, per batch, the kernels that
// give every row its token and logprobs; the paths live in files by role:
//   unfiltered rows (no top-k/top-p/min-p, no top-n lists: the GRPO default)
//       sampling_split.cu: one pass over the logits in 4096-id chunks, one finishing block per row
//   filtered rows (top-k / top-p / min-p, no top-n lists)
//       sampling_filtered.cu: the same pass, then a radix select over 8-bit key digits with many
//       blocks per row and fixed-point masses (integer sums)
//   every row when top-n lists are asked for, vocabularies above kMaxParts chunks, and filtered
//   rows whose search is not launched (filter hint, GRPO_FILTERED_SPLIT=0)
//       sampling_one_block.cuh: one 1024-thread block per row, bisection over the key bits
// All reductions have a fixed order (no atomics whose order affects a value), so results repeat
// exactly run to run, and a row's results depend only on its logits and parameters, never on
// the batch. A row whose every id is banned gets token −1 (the dispatcher's caller must not send
// one; the CPU aborts).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/env_switch.h"
#include "kernels/cuda/sampling_common.cuh"
#include "kernels/cuda/workspace.cuh"
#include "kernels/sampling.h"

namespace grpo::cuda {

namespace {

// GRPO_FILTERED_SPLIT=0 sends filtered rows to the one-block path: the A/B of the filtered split
// path (docs/BENCHMARKS.md, sampler table) and the way to time the one-block path in isolation.
bool filtered_split_enabled() {
  static const bool on = env_long("GRPO_FILTERED_SPLIT", 1, 0, 1) == 1;
  return on;
}

}  // namespace

void sample_tokens(Context& ctx, SamplingOutputs& out, const Tensor& logits, const SamplingRows& rows,
                   bool top_processed) {
  using namespace sampler;
  GRPO_CHECK_MSG(logits.ndim == 2 && logits.dtype == DType::f32, "sample_tokens: logits must be (R,V) f32");
  const int64_t R = logits.shape[0], V = logits.shape[1];
  GRPO_CHECK_MSG(V < INT32_MAX, "sample_tokens: vocabulary too large");
  if (R == 0) return;
  GRPO_CHECK_MSG(R <= 65535, "sample_tokens: at most 65535 rows per launch");
  const int nb = rows.banned.defined() ? int(rows.banned.shape[1]) : 0;
  const int n_top = out.top_ids.defined() ? int(out.top_ids.shape[1]) : 0;
  const int32_t* bl = nb ? rows.banned.ptr<int32_t>() : nullptr;
  ScratchAlloc sa(ctx);
  SplitArgs a;
  a.logits = logits.ptr<float>();
  a.V = V;
  a.n_chunks = int((V + kPartChunk - 1) / kPartChunk);
  a.temperature = rows.temperature.ptr<float>();
  a.top_p = rows.top_p.ptr<float>();
  a.top_k = rows.top_k.ptr<int32_t>();
  a.min_p = rows.min_p.ptr<float>();
  a.rng_key = rows.rng_key.ptr<int64_t>();
  a.rng_pos = rows.rng_pos.ptr<int64_t>();
  a.banned = bl;
  a.nb = nb;
  a.tokens = out.tokens.ptr<int32_t>();
  a.lp_raw = out.logprob_raw.ptr<float>();
  a.lp_proc = out.logprob_processed.ptr<float>();
  a.top_ids = n_top ? out.top_ids.ptr<int32_t>() : nullptr;
  a.top_lps = n_top ? out.top_logprobs.ptr<float>() : nullptr;
  a.n_top = n_top;
  a.top_processed = top_processed;
  a.probs = out.probs.defined() ? out.probs.ptr<float>() : nullptr;
  // With top-n lists every row is filtered: no part pass. Vocabularies above kMaxParts chunks
  // (4,194,304 ids) also take the one-block path.
  // Dense probs (speculative sampling) also take it: it already holds the kept set per row.
  const bool split = n_top == 0 && a.probs == nullptr && a.n_chunks <= kMaxParts;
  // rows.filter_hint (host): -1 unknown, else which filters some row uses (0: none, so the
  // filtered kernels are not launched). A row whose filter's search is not launched takes the
  // one-block path, so any hint gives correct results.
  const int hint = rows.filter_hint;
  const bool any_k = hint < 0 || (hint & kFilterTopK), any_p = hint < 0 || (hint & kFilterTopP);
  a.filt_stages = split && hint != 0 && filtered_split_enabled() ? 4 | (any_k ? 1 : 0) | (any_p ? 2 : 0) : 0;
  ChunkPart* parts = split ? sa.alloc<ChunkPart>(R * a.n_chunks, "sampler chunk partials") : nullptr;
  launch_split_sampler(ctx, a, R, parts);
  if (a.filt_stages == 0) return;
  launch_filtered_sampler(ctx, sa, a, R, parts, any_k, any_p);
}

}  // namespace grpo::cuda
