// Helpers of the transformer tests: random in-memory models, a runner that
// feeds one or more sequences through transformer_forward over a paged cache,
// and greedy decoding.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/context.h"
#include "model/transformer.h"
#include "model/weights.h"

namespace grpo::test {

inline Context& tf_ctx() {
  static Context ctx([] {
    ContextOptions o;
    o.n_threads = 2;
    return o;
  }());
  return ctx;
}

// Tiny config of one architecture flavour (sizes as the fixture script's).
inline ModelConfig tiny_config(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.model_type = arch_name(arch);
  c.vocab_size = 320;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 128;
  c.rope_theta = 10000.f;
  c.rms_norm_eps = 1e-5f;
  if (arch == Arch::qwen2) {
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.rope_theta = 1e6f;
  }
  if (arch == Arch::qwen3) {
    c.qk_norm = true;
    c.head_dim = 32;
    c.rope_theta = 1e6f;
  }
  return c;
}

// Unit-scale random weights: linear ~ N(0, 1/in), embedding ~ N(0, 0.5²),
// norms ~ 1 + N(0, 0.2²), biases ~ N(0, 0.2²).
inline ModelWeights random_model(const ModelConfig& cfg, uint32_t seed) {
  ModelWeights w = weights_allocate(cfg, Device::cpu, DType::f32);
  std::mt19937 g(seed);
  std::normal_distribution<float> n01(0.f, 1.f);
  for (auto& [name, t] : w.params()) {
    float* p = t->ptr<float>();
    const bool norm = name.find("norm") != std::string::npos;
    const float scale = name == "embed" ? 0.5f : (t->ndim == 2 ? 1.f / std::sqrt(float(t->shape[1])) : 0.2f);
    for (int64_t i = 0; i < t->numel(); ++i) p[i] = (norm ? 1.f : 0.f) + scale * n01(g);
  }
  return w;
}

// Feeds sequences through transformer_forward over a paged cache whose
// physical blocks are handed out in reverse order (so the block table matters).
class PagedRunner {
 public:
  PagedRunner(Context& ctx, const ModelWeights& w, int n_seqs, int max_len, int block_size = 16, int max_tokens = 64,
              int lora_r = 0)
      : ctx_(ctx), w_(w), bs_(block_size), max_blocks_((max_len + block_size - 1) / block_size) {
    const int n_blocks = n_seqs * max_blocks_ + 1;
    cache_ = kv_cache_allocate(w.config, Device::cpu, w.dtype, n_blocks, block_size);
    rope_ = rope_table_build(w.config, Device::cpu, max_len);
    scratch_ = forward_scratch_allocate(w.config, Device::cpu, w.dtype, max_tokens, max_tokens, lora_r);
    table_.resize(size_t(n_seqs * max_blocks_));
    for (size_t i = 0; i < table_.size(); ++i) table_[i] = int32_t(n_blocks - 1 - int(i));
    pos_.assign(size_t(n_seqs), 0);
  }

  // One forward over pieces (seq, tokens) batched together; returns the logits
  // (n, V) of every fed token, in feeding order.
  std::vector<float> feed(const std::vector<std::pair<int, std::vector<int32_t>>>& pieces) {
    std::vector<int32_t> toks, pos, seq, slot, rows;
    for (const auto& [s, ts] : pieces)
      for (int32_t t : ts) {
        const int p = pos_[size_t(s)]++;
        toks.push_back(t);
        pos.push_back(p);
        seq.push_back(s);
        slot.push_back(table_[size_t(s * max_blocks_ + p / bs_)] * bs_ + p % bs_);
        rows.push_back(int32_t(rows.size()));
      }
    const int64_t T = int64_t(toks.size()), V = w_.config.vocab_size;
    ForwardBatch b;
    b.tokens = tensor_borrow(toks.data(), DType::i32, Device::cpu, {T});
    b.positions = tensor_borrow(pos.data(), DType::i32, Device::cpu, {T});
    b.logit_rows = tensor_borrow(rows.data(), DType::i32, Device::cpu, {T});
    b.attn.token_seq = tensor_borrow(seq.data(), DType::i32, Device::cpu, {T});
    b.attn.token_pos = b.positions;
    b.attn.slot_mapping = tensor_borrow(slot.data(), DType::i32, Device::cpu, {T});
    b.attn.block_table =
        tensor_borrow(table_.data(), DType::i32, Device::cpu, {int64_t(pos_.size()), int64_t(max_blocks_)});
    b.attn.block_size = bs_;
    for (int32_t p : pos) b.attn.max_context = std::max(b.attn.max_context, p + 1);
    b.lora = lora;
    std::vector<float> logits(size_t(T * V));
    Tensor tl = tensor_borrow(logits.data(), DType::f32, Device::cpu, {T, V});
    transformer_forward(ctx_, w_, cache_, rope_, b, scratch_, tl);
    return logits;
  }
  std::vector<float> feed(int s, const std::vector<int32_t>& toks) { return feed({{s, toks}}); }
  std::vector<ForwardBatch::LoraRows> lora;  // LoRA row groups of the next feed (rows in feeding order)

 private:
  Context& ctx_;
  const ModelWeights& w_;
  int bs_, max_blocks_;
  KVCache cache_;
  RopeTable rope_;
  ForwardScratch scratch_;
  std::vector<int32_t> table_;
  std::vector<int> pos_;
};

inline int32_t argmax_row(const std::vector<float>& logits, int64_t row, int64_t V) {
  const float* r = logits.data() + row * V;
  return int32_t(std::max_element(r, r + V) - r);
}

// Greedy decoding: prompt in one forward, then one token per step.
inline std::vector<int32_t> greedy(Context& ctx, const ModelWeights& w, const std::vector<int32_t>& prompt, int n_new) {
  const int64_t V = w.config.vocab_size;
  PagedRunner run(ctx, w, 1, int(prompt.size()) + n_new, 16, int(prompt.size()) + 1);
  std::vector<float> lg = run.feed(0, prompt);
  std::vector<int32_t> out = {argmax_row(lg, int64_t(prompt.size()) - 1, V)};
  while (int(out.size()) < n_new) {
    lg = run.feed(0, {out.back()});
    out.push_back(argmax_row(lg, 0, V));
  }
  return out;
}

}  // namespace grpo::test
