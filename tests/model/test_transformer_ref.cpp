// transformer_forward on random in-memory models of every architecture
// flavour, against the double-precision reference in ref_forward.h; and the
// paged paths (chunked prefill, decode, several sequences in one batch)
// against the full-prompt forward.
#include <gtest/gtest.h>

#include <cstdio>

#include "../kernels/compare.h"
#include "ref_forward.h"
#include "tf_util.h"

using namespace grpo;
using namespace grpo::test;

namespace {
struct Flavour {
  const char* name;
  ModelConfig cfg;
};
std::vector<Flavour> flavours() {
  std::vector<Flavour> f = {{"llama", tiny_config(Arch::llama)},
                            {"qwen2", tiny_config(Arch::qwen2)},
                            {"qwen3", tiny_config(Arch::qwen3)},
                            {"mistral", tiny_config(Arch::mistral)}};
  ModelConfig l3 = tiny_config(Arch::llama);
  l3.rope_scaling.type = "llama3";
  l3.rope_scaling.factor = 8.f;
  l3.rope_scaling.original_max_position_embeddings = 32;
  l3.tie_word_embeddings = true;
  f.push_back({"llama3", l3});
  ModelConfig lin = tiny_config(Arch::llama);
  lin.rope_scaling.type = "linear";
  lin.rope_scaling.factor = 2.f;
  f.push_back({"llama_linear", lin});
  // Sliding windows shorter than the 21- and 37-token prompts of the tests below:
  // every layer (Mistral), and only the second layer (Qwen2 with max_window_layers=1).
  ModelConfig ms = tiny_config(Arch::mistral);
  ms.sliding_window = 8;
  ms.layer_window = {8, 8};
  f.push_back({"mistral_swa", ms});
  ModelConfig qs = tiny_config(Arch::qwen2);
  qs.sliding_window = 5;
  qs.layer_window = {0, 5};
  f.push_back({"qwen2_swa", qs});
  return f;
}
std::vector<int32_t> tokens(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(3 + g() % 317);
  return t;
}
}  // namespace

TEST(Transformer, MatchesDoubleReferenceForEveryFlavour) {
  for (const Flavour& f : flavours()) {
    SCOPED_TRACE(f.name);
    ModelWeights w = random_model(f.cfg, 7);
    const std::vector<int32_t> toks = tokens(21, 1);
    PagedRunner run(tf_ctx(), w, 1, 64);
    const std::vector<float> got = run.feed(0, toks);
    const std::vector<double> ref = reference_forward(w, toks);
    const double err = max_rel_error(got, ref);
    std::printf("  %-13s max|got-ref|/max|ref| = %.2e\n", f.name, err);
    EXPECT_LT(err, 1e-5) << f.name;
  }
}

TEST(Transformer, ChunkedPrefillAndDecodeEqualFullPrompt) {
  for (const Flavour& f : flavours()) {
    SCOPED_TRACE(f.name);
    ModelWeights w = random_model(f.cfg, 8);
    const std::vector<int32_t> toks = tokens(37, 2);  // crosses two 16-token blocks
    PagedRunner full(tf_ctx(), w, 1, 64);
    const std::vector<float> ref = full.feed(0, toks);
    PagedRunner chunked(tf_ctx(), w, 1, 64);
    std::vector<float> got;
    size_t at = 0;
    for (size_t n : {size_t(9), size_t(14), size_t(1), size_t(1), size_t(12)}) {
      std::vector<int32_t> piece(toks.begin() + long(at), toks.begin() + long(at + n));
      std::vector<float> lg = chunked.feed(0, piece);
      got.insert(got.end(), lg.begin(), lg.end());
      at += n;
    }
    ASSERT_EQ(at, toks.size());
    EXPECT_TRUE(all_close("chunked vs full logits", got, ref, 1e-5, 1e-5));
  }
}

TEST(Transformer, DeterministicModeChunkedEqualsFullBitwise) {
  ContextOptions o;
  o.n_threads = 2;
  o.deterministic = true;
  Context det(o);
  ModelWeights w = random_model(tiny_config(Arch::qwen3), 10);
  const std::vector<int32_t> toks = tokens(20, 5);
  PagedRunner full(det, w, 1, 32), chunked(det, w, 1, 32);
  const std::vector<float> ref = full.feed(0, toks);
  std::vector<float> got = chunked.feed(0, std::vector<int32_t>(toks.begin(), toks.begin() + 11));
  for (size_t i = 11; i < toks.size(); ++i) {
    std::vector<float> lg = chunked.feed(0, {toks[i]});
    got.insert(got.end(), lg.begin(), lg.end());
  }
  EXPECT_TRUE(all_close("chunked vs full, deterministic", got, ref, 0.0, 0.0));
}

TEST(Transformer, SequencesBatchedTogetherEqualAlone) {
  const ModelConfig cfg = tiny_config(Arch::qwen2);
  ModelWeights w = random_model(cfg, 9);
  const std::vector<int32_t> a = tokens(13, 3), b = tokens(8, 4);
  PagedRunner ra(tf_ctx(), w, 1, 32), rb(tf_ctx(), w, 1, 32), both(tf_ctx(), w, 2, 32);
  const std::vector<float> la = ra.feed(0, a), lb = rb.feed(0, b);
  // b's prompt and a's prompt in one forward, then one decode step of each together
  std::vector<float> lab = both.feed({{1, b}, {0, a}});
  std::vector<float> ref = lb;
  ref.insert(ref.end(), la.begin(), la.end());
  EXPECT_TRUE(all_close("batched prefill", lab, ref, 1e-5, 1e-5));
  const int32_t na = 17, nb = 99;
  std::vector<float> step = both.feed({{0, {na}}, {1, {nb}}});
  std::vector<float> sa = ra.feed(0, {na}), sb = rb.feed(0, {nb});
  sa.insert(sa.end(), sb.begin(), sb.end());
  EXPECT_TRUE(all_close("batched decode", step, sa, 1e-5, 1e-5));
}

TEST(Transformer, RopeTableFollowsScalingFormulas) {
  for (const Flavour& f : flavours()) {
    SCOPED_TRACE(f.name);
    const int P = 64, half = f.cfg.head_dim / 2;
    RopeTable t = rope_table_build(f.cfg, Device::cpu, P);
    ASSERT_EQ(t.cos.shape[0], P);
    ASSERT_EQ(t.cos.shape[1], half);
    const std::vector<double> inv = reference_inv_freq(f.cfg);
    std::vector<double> rc, rs;
    for (int p = 0; p < P; ++p)
      for (int i = 0; i < half; ++i) {
        rc.push_back(std::cos(p * inv[size_t(i)]));
        rs.push_back(std::sin(p * inv[size_t(i)]));
      }
    EXPECT_TRUE(all_close("cos", tensor_to_f32(t.cos), rc, 2e-5, 0));
    EXPECT_TRUE(all_close("sin", tensor_to_f32(t.sin), rs, 2e-5, 0));
  }
}

TEST(Transformer, KVCacheSizes) {
  const ModelConfig cfg = tiny_config(Arch::qwen3);
  KVCache c = kv_cache_allocate(cfg, Device::cpu, DType::f32, 5, 16);
  ASSERT_EQ(c.k.size(), size_t(cfg.n_layers));
  EXPECT_EQ(c.k[0].shape[0], 5);
  EXPECT_EQ(c.k[0].shape[3], cfg.head_dim);
  // per block: layers · (K and V) · block_size · Hkv · D · 4 bytes
  EXPECT_EQ(c.bytes_per_block(), size_t(cfg.n_layers) * 2 * 16 * cfg.n_kv_heads * cfg.head_dim * 4);
}
