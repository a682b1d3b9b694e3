// Shared helpers for the engine tests that run a model: the real stories260K
// Llama (llama2.c checkpoint converted to an HF directory once per process) and
// an independent greedy reference that recomputes the whole sequence with
// transformer_forward at every step (no KV reuse, no scheduler, no sampler).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "model/checkpoint.h"
#include "model/llama2c.h"
#include "model/presets.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"

namespace grpo::test {

inline std::string stories_dir() { return std::string(GRPO_SHARED_DIR) + "/data/models/stories260K"; }

// The converted model and its tokenizer, loaded once.
struct Stories {
  ModelWeights w;
  std::unique_ptr<Tokenizer> tok;  // null when the tokenizer failed to load (text tests skip)
  std::string tok_error;
  std::string dir;
};

inline Stories& stories() {
  static Stories* s = [] {
    auto* st = new Stories;
    char tmpl[] = "/tmp/grpo_engine_test_XXXXXX";
    const char* d = mkdtemp(tmpl);
    GRPO_CHECK(d != nullptr);
    st->dir = d;
    Status cs = convert_llama2c(stories_dir() + "/stories260K.bin", stories_dir() + "/tok512.bin", st->dir);
    GRPO_CHECK_MSG(cs.ok(), cs.message().c_str());
    auto w = model_load(st->dir, Device::cpu, DType::f32);
    GRPO_CHECK_MSG(w.ok(), w.status().message().c_str());
    st->w = std::move(w).value();
    auto t = Tokenizer::load(st->dir);
    if (t.ok())
      st->tok = std::make_unique<Tokenizer>(std::move(t).value());
    else
      st->tok_error = t.status().message();
    return st;
  }();
  return *s;
}

inline std::vector<int32_t> read_ids(const std::string& path) {
  std::vector<int32_t> ids;
  FILE* f = std::fopen(path.c_str(), "r");
  GRPO_CHECK(f != nullptr);
  int v;
  while (std::fscanf(f, "%d", &v) == 1) ids.push_back(v);
  std::fclose(f);
  return ids;
}

// Greedy continuation by full recompute; lp_raw receives log_softmax(z)[token] in double.
// kv_dtype: the KV cache the recompute writes and attends over (f32, or f8e4m3).
inline std::vector<int32_t> reference_greedy(Context& ctx, const ModelWeights& w, std::vector<int32_t> seq,
                                             int n_new, std::vector<double>* lp_raw = nullptr,
                                             DType kv_dtype = DType::f32) {
  const ModelConfig& cfg = w.config;
  const int bs = 16, V = cfg.vocab_size;
  std::vector<int32_t> out;
  for (int step = 0; step < n_new; ++step) {
    const int n = int(seq.size()), nb = (n + bs - 1) / bs;
    KVCache cache = kv_cache_allocate(cfg, Device::cpu, kv_dtype, nb, bs);
    RopeTable rope = rope_table_build(cfg, Device::cpu, n);
    ForwardScratch scratch = forward_scratch_allocate(cfg, Device::cpu, DType::f32, n, 1);
    std::vector<int32_t> pos(size_t(n), 0), zeros(size_t(n), 0), table(size_t(nb), 0), last = {n - 1};
    for (int i = 0; i < n; ++i) pos[size_t(i)] = i;
    for (int b = 0; b < nb; ++b) table[size_t(b)] = b;
    ForwardBatch batch;
    batch.tokens = tensor_borrow(seq.data(), DType::i32, Device::cpu, {n});
    batch.positions = tensor_borrow(pos.data(), DType::i32, Device::cpu, {n});
    batch.attn.token_seq = tensor_borrow(zeros.data(), DType::i32, Device::cpu, {n});
    batch.attn.token_pos = batch.positions;
    batch.attn.block_table = tensor_borrow(table.data(), DType::i32, Device::cpu, {1, nb});
    batch.attn.slot_mapping = batch.positions;  // blocks 0..nb-1 in order: slot = position
    batch.attn.block_size = bs;
    batch.attn.max_context = n;
    batch.logit_rows = tensor_borrow(last.data(), DType::i32, Device::cpu, {1});
    Tensor logits = tensor_empty(Device::cpu, DType::f32, {1, V});
    transformer_forward(ctx, w, cache, rope, batch, scratch, logits);
    const float* z = logits.ptr<float>();
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (z[i] > z[best]) best = i;
    if (lp_raw) {
      double m = z[best], s = 0;
      for (int i = 0; i < V; ++i) s += std::exp(double(z[i]) - m);
      lp_raw->push_back(double(z[best]) - m - std::log(s));
    }
    seq.push_back(best);
    out.push_back(best);
  }
  return out;
}

// log_softmax(z_t) at every position t of `seq` from one full forward (no KV reuse).
inline std::vector<std::vector<double>> full_logprobs(Context& ctx, const ModelWeights& w, const std::vector<int32_t>& seq) {
  const ModelConfig& cfg = w.config;
  const int n = int(seq.size()), bs = 16, nb = (n + bs - 1) / bs, V = cfg.vocab_size;
  KVCache cache = kv_cache_allocate(cfg, Device::cpu, DType::f32, nb, bs);
  RopeTable rope = rope_table_build(cfg, Device::cpu, n);
  ForwardScratch scratch = forward_scratch_allocate(cfg, Device::cpu, DType::f32, n, n);
  std::vector<int32_t> pos(static_cast<size_t>(n)), zeros(static_cast<size_t>(n), 0), table(static_cast<size_t>(nb));
  for (int i = 0; i < n; ++i) pos[size_t(i)] = i;
  for (int b = 0; b < nb; ++b) table[size_t(b)] = b;
  ForwardBatch batch;
  batch.tokens = tensor_borrow(const_cast<int32_t*>(seq.data()), DType::i32, Device::cpu, {n});
  batch.positions = tensor_borrow(pos.data(), DType::i32, Device::cpu, {n});
  batch.attn.token_seq = tensor_borrow(zeros.data(), DType::i32, Device::cpu, {n});
  batch.attn.token_pos = batch.positions;
  batch.attn.block_table = tensor_borrow(table.data(), DType::i32, Device::cpu, {1, nb});
  batch.attn.slot_mapping = batch.positions;
  batch.attn.block_size = bs;
  batch.attn.max_context = n;
  batch.logit_rows = batch.positions;
  Tensor logits = tensor_empty(Device::cpu, DType::f32, {n, V});
  transformer_forward(ctx, w, cache, rope, batch, scratch, logits);
  std::vector<std::vector<double>> lp(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(V)));
  for (int t = 0; t < n; ++t) {
    const float* z = logits.ptr<float>() + int64_t(t) * V;
    double m = z[0], s = 0;
    for (int v = 1; v < V; ++v) m = std::max(m, double(z[v]));
    for (int v = 0; v < V; ++v) s += std::exp(double(z[v]) - m);
    for (int v = 0; v < V; ++v) lp[size_t(t)][size_t(v)] = double(z[v]) - m - std::log(s);
  }
  return lp;
}

// A random model with the stories vocabulary but another shape (tiny-llama's layers, heads
// and head_dim), initialised wider than transformers' 0.02 so that its distributions are not
// flat: a tandem partner or a speculative draft that disagrees with stories260K.
inline ModelWeights stories_vocab_random_model(uint64_t seed) {
  PresetOverrides ov;
  ov.vocab_size = stories().w.config.vocab_size;
  auto cfg = preset_config("tiny-llama", ov);
  GRPO_CHECK_MSG(cfg.ok(), cfg.status().message().c_str());
  ModelConfig c = cfg.value();
  c.initializer_range = 0.3f;
  c.max_position_embeddings = stories().w.config.max_position_embeddings;
  ModelWeights w = weights_allocate(c, Device::cpu, DType::f32);
  weights_init_random(w, seed);
  return w;
}

// Three prompts cut from the stories golden continuation (5, 21 and 2 tokens).
inline std::vector<std::vector<int32_t>> stories_prompts() {
  const auto g = read_ids(stories_dir() + "/golden_greedy_t0_200steps.ids.txt");
  std::vector<std::vector<int32_t>> ps;
  ps.push_back({1, g[1], g[2], g[3], g[4]});
  std::vector<int32_t> p2 = {1};
  p2.insert(p2.end(), g.begin() + 30, g.begin() + 50);
  ps.push_back(p2);
  ps.push_back({1, g[60]});
  return ps;
}

}  // namespace grpo::test
