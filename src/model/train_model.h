// Training forward and backward of the decoder-only transformer over packed
// variable-length sequences (no padding): the same ops as the inference
// forward (kernels/), with varlen attention, logprobs fused with the LM head
// (only for completion tokens, never an (N, V) logits tensor) and parameter
// gradients accumulated (+=) into an f32 ModelWeights bound over a gradient
// arena of the weights' layout (tied lm_head: both uses add into embed).
//
// Memory: by default forward keeps every layer's activations for backward.
// With recompute (activation checkpointing) it keeps only each layer's input
// and backward re-runs that layer's forward just before its backward; the
// kernels are deterministic, so gradients are identical either way.
// A forward invalidates what the previous forward kept: compute reference /
// old logprobs (keep_for_backward = false) before the forward that backward follows.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/context.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "model/lora.h"
#include "model/weights.h"

namespace grpo {

// One sequence of a packed batch: tokens [start, start + total_len); the first
// prompt_len are the prompt, the rest the completion whose logprobs are computed.
struct TrainSeq {
  int32_t start = 0;
  int32_t prompt_len = 0;  // >= 1
  int32_t total_len = 0;   // > prompt_len
};

// Sequences back to back (T tokens). Completion token i of a sequence
// (prompt_len <= i < total_len) is predicted by row start + i − 1; the T'
// completion tokens are ordered sequence after sequence.
struct TrainBatch {
  std::vector<int32_t> tokens_host;         // (T)
  std::vector<TrainSeq> seqs;               // (S)
  std::vector<int32_t> completion_offsets;  // (S+1): sequence s owns [off[s], off[s+1]) of T'
  int n_tokens = 0;                         // T
  int n_completion = 0;                     // T'
  Tensor tokens;     // (T) i32 on the device
  Tensor positions;  // (T) i32: position within its sequence
  Tensor rows;       // (T') i32: predicting row of each completion token
  Tensor targets;    // (T') i32: the completion tokens
  AttnVarlen attn;   // cu_seqlens over the S sequences
};

// sequences[s] = prompt + completion token ids; prompt_lens[s] >= 1 and less
// than the sequence length. Ids must lie in [0, vocab_size). Uploads to ctx.device().
Result<TrainBatch> train_batch_build(Context& ctx, const std::vector<std::vector<int32_t>>& sequences,
                                     const std::vector<int32_t>& prompt_lens, int vocab_size);

struct TrainModelOptions {
  bool recompute = false;    // activation checkpointing (keep only each layer's input)
  float temperature = 1.f;   // logits / temperature, as TRL (the sampling temperature)
};

struct TrainState;  // buffers (grow to the largest batch seen) and what forward kept

struct TrainModel {
  explicit TrainModel(const TrainModelOptions& opt = {});
  ~TrainModel();
  TrainModel(TrainModel&&) noexcept;
  TrainModel& operator=(TrainModel&&) noexcept;
  TrainModelOptions opt;
  std::unique_ptr<TrainState> state;
  // LoRA (model/lora.h): with `lora` set, forward adds the adapters to their
  // projections. With `lora_grads` set too (f32, lora_bind over a gradient arena of
  // the adapters' layout), backward accumulates only the adapters' gradients: the
  // base weights are frozen and its `grads` argument is neither read nor written.
  const LoraWeights* lora = nullptr;
  LoraWeights* lora_grads = nullptr;
};

// Upper estimate of the device bytes a TrainModel's buffers reach for micro-batches of
// up to max_tokens packed tokens (weights of dtype dt): stored activations (every
// layer, or one layer's plus each layer's input with recompute), backward scratch and
// batch inputs. Used to leave the trainer room when the KV pool is sized.
size_t train_model_activation_bytes(const ModelConfig& cfg, DType dt, int64_t max_tokens, bool recompute);

// logp (T') f32 and entropy (T') f32 (optional) on ctx.device(). With
// keep_for_backward, activations are kept for train_model_backward.
void train_model_forward(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b, Tensor& logp,
                         Tensor* entropy, bool keep_for_backward);
// Backward of the last forward (which must have kept activations, for the same
// w and b): dlogp (T') f32 -> parameter gradients added into `grads` (f32,
// bound with weights_bind over a gradient arena of w's config), or into
// *m.lora_grads only when that is set (see TrainModel).
// layer_done, when set, is called on the host as soon as this backward has
// enqueued its last write to a part of the gradients: n_layers after the LM
// head and final norm, l after layer l, -1 after the embedding (everything).
// Data parallelism starts the all-reduce of finished buckets from it.
void train_model_backward(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b,
                          const Tensor& dlogp, ModelWeights& grads,
                          const std::function<void(int)>& layer_done = {});


// Activation memory of a forward kept for backward, for T tokens (sizing budgets).
int64_t train_activation_bytes(const ModelConfig& cfg, DType dt, int64_t T, bool recompute);

}  // namespace grpo
