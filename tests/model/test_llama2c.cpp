// llama2.c conversion of the real stories260K checkpoint: the converted HF
// directory loads, every weight equals the .bin values (read here by an
// independent reader), and the wq/wk row permutation turns llama2.c's
// interleaved RoPE into HF's rotate_half RoPE (checked on rotated q·k scores,
// computed with each convention's own formula).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "model/checkpoint.h"
#include "model/llama2c.h"
#include "model/safetensors.h"
#include "test_util.h"

using namespace grpo;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(GRPO_SHARED_DIR) + "/data/models/stories260K";

struct Bin {  // stories260K.bin as float arrays (PROVENANCE.md: header 64,172,5,8,4,512,512)
  std::vector<int32_t> hdr;
  std::vector<float> f;
  const float* at(size_t off) const { return f.data() + off; }
};

Bin read_bin() {
  Bin b;
  std::string d = read_file(kDir + "/stories260K.bin").value();
  b.hdr.resize(7);
  std::memcpy(b.hdr.data(), d.data(), 28);
  b.f.resize((d.size() - 28) / 4);
  std::memcpy(b.f.data(), d.data() + 28, b.f.size() * 4);
  return b;
}

// llama2.c run.c RoPE: pairs (v[i], v[i+1]), i even, frequency 10000^(-(i % hs) / hs).
void rope_llama2c(std::vector<float>& v, int hs, int pos) {
  for (size_t i = 0; i < v.size(); i += 2) {
    float freq = 1.0f / std::pow(10000.0f, float(i % size_t(hs)) / float(hs));
    float c = std::cos(pos * freq), s = std::sin(pos * freq);
    float v0 = v[i], v1 = v[i + 1];
    v[i] = v0 * c - v1 * s;
    v[i + 1] = v0 * s + v1 * c;
  }
}

// transformers' apply_rotary_pos_emb: x·cos + rotate_half(x)·sin per head, inv_freq[j] = 10000^(-2j/D).
void rope_hf(std::vector<float>& v, int D, int pos) {
  for (size_t h = 0; h < v.size() / size_t(D); ++h) {
    float* x = v.data() + h * size_t(D);
    for (int j = 0; j < D / 2; ++j) {
      float inv = 1.0f / std::pow(10000.0f, float(2 * j) / float(D));
      float c = std::cos(pos * inv), s = std::sin(pos * inv);
      float a = x[j], b = x[j + D / 2];
      x[j] = a * c - b * s;
      x[j + D / 2] = b * c + a * s;
    }
  }
}

std::vector<float> matvec(const float* W, int rows, int cols, const std::vector<float>& x) {
  std::vector<float> y(size_t(rows), 0.f);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[size_t(r)] += W[size_t(r) * cols + c] * x[size_t(c)];
  return y;
}

}  // namespace

TEST(Llama2c, ConvertStories260K) {
  if (!fs::exists(kDir + "/stories260K.bin")) GTEST_SKIP() << "no stories260K in " << kDir;
  TempDir tmp;
  const std::string out = tmp.path + "/stories260K";
  Status s = convert_llama2c(kDir + "/stories260K.bin", kDir + "/tok512.bin", out);
  ASSERT_TRUE(s.ok()) << s.message();
  auto r = model_load(out, Device::cpu, DType::f32);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelWeights& w = r.value();
  const ModelConfig& c = w.config;
  EXPECT_EQ(c.arch, Arch::llama);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.f);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.torch_dtype, "float32");

  // Offsets of the legacy layout (floats): C=64, F=172, L=5, Q=64, KV=32, V=512.
  Bin b = read_bin();
  ASSERT_EQ(b.hdr, (std::vector<int32_t>{64, 172, 5, 8, 4, 512, 512}));
  const size_t C = 64, F = 172, L = 5, Q = 64, KV = 32, V = 512, D = 8;
  const size_t o_emb = 0, o_rms_att = V * C, o_wq = o_rms_att + L * C, o_wk = o_wq + L * Q * C, o_wv = o_wk + L * KV * C,
               o_wo = o_wv + L * KV * C, o_rms_ffn = o_wo + L * C * Q, o_w1 = o_rms_ffn + L * C, o_w2 = o_w1 + L * F * C,
               o_w3 = o_w2 + L * C * F, o_rms_final = o_w3 + L * F * C;
  ASSERT_EQ(o_rms_final + C + 512 * D, b.f.size());  // + freq_cis_real/imag (512 × 4 each)
  auto same = [](const Tensor& t, const float* ref, size_t n) {
    for (size_t i = 0; i < n; ++i)
      if (t.ptr<float>()[i] != ref[i]) return false;
    return true;
  };
  EXPECT_TRUE(same(w.embed, b.at(o_emb), V * C));
  EXPECT_EQ(w.lm_head.data, w.embed.data);  // tied
  EXPECT_TRUE(same(w.final_norm, b.at(o_rms_final), C));
  for (size_t l = 0; l < L; ++l) {
    const LayerWeights& lw = w.layers[l];
    EXPECT_TRUE(same(lw.attn_norm, b.at(o_rms_att + l * C), C));
    EXPECT_TRUE(same(lw.mlp_norm, b.at(o_rms_ffn + l * C), C));
    EXPECT_TRUE(same(lw.wqkv.slice0(Q + KV, Q + 2 * KV), b.at(o_wv + l * KV * C), KV * C));  // v not permuted
    EXPECT_TRUE(same(lw.wo, b.at(o_wo + l * C * Q), C * Q));
    EXPECT_TRUE(same(lw.w_gate_up.slice0(0, F), b.at(o_w1 + l * F * C), F * C));  // w1 = gate_proj
    EXPECT_TRUE(same(lw.w_gate_up.slice0(F, 2 * F), b.at(o_w3 + l * F * C), F * C));  // w3 = up_proj
    EXPECT_TRUE(same(lw.w_down, b.at(o_w2 + l * C * F), C * F));  // w2 = down_proj
  }
  // Spot entries: HF q row h·D + j holds llama2.c row h·D + 2j, and row h·D + D/2 + j holds h·D + 2j + 1
  // (layer 2, head 5, j = 3, column 10; k: layer 4, kv head 3, j = 1, column 63).
  EXPECT_EQ(w.layers[2].wqkv.ptr<float>()[(5 * D + 3) * C + 10], b.at(o_wq + 2 * Q * C)[(5 * D + 6) * C + 10]);
  EXPECT_EQ(w.layers[2].wqkv.ptr<float>()[(5 * D + 4 + 3) * C + 10], b.at(o_wq + 2 * Q * C)[(5 * D + 7) * C + 10]);
  EXPECT_EQ(w.layers[4].wqkv.ptr<float>()[(Q + 3 * D + 1) * C + 63], b.at(o_wk + 4 * KV * C)[(3 * D + 2) * C + 63]);

  // Functional check: rotated attention scores agree between the two conventions.
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (size_t l : {size_t(0), size_t(3)}) {
    std::vector<float> x(C), x2(C);
    for (auto& v : x) v = nd(gen);
    for (auto& v : x2) v = nd(gen);
    for (int pq : {0, 7, 300})
      for (int pk : {0, 5, 511}) {
        auto q_old = matvec(b.at(o_wq + l * Q * C), int(Q), int(C), x);
        auto k_old = matvec(b.at(o_wk + l * KV * C), int(KV), int(C), x2);
        auto q_new = matvec(w.layers[l].wqkv.ptr<float>(), int(Q), int(C), x);
        auto k_new = matvec(w.layers[l].wqkv.ptr<float>() + Q * C, int(KV), int(C), x2);
        rope_llama2c(q_old, int(D), pq);
        rope_llama2c(k_old, int(D), pk);
        rope_hf(q_new, int(D), pq);
        rope_hf(k_new, int(D), pk);
        for (size_t h = 0; h < 8; ++h) {
          size_t g = h / 2;  // GQA: 2 query heads per KV head
          float so = 0, sn = 0;
          for (size_t d = 0; d < D; ++d) {
            so += q_old[h * D + d] * k_old[g * D + d];
            sn += q_new[h * D + d] * k_new[g * D + d];
          }
          ASSERT_NEAR(so, sn, 1e-4f * (1 + std::fabs(so))) << "layer " << l << " head " << h << " pos " << pq << "," << pk;
        }
      }
  }
}

TEST(Llama2c, TokenizerJson) {
  if (!fs::exists(kDir + "/tok512.bin")) GTEST_SKIP();
  auto tok = llama2c_read_tokenizer(kDir + "/tok512.bin", 512);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok.value().max_token_length, 7);  // PROVENANCE.md
  EXPECT_EQ(tok.value().pieces[1], "\n<s>\n");
  json j = json::parse(llama2c_tokenizer_json(tok.value()));
  const json& m = j["model"];
  EXPECT_EQ(m["type"], "BPE");
  EXPECT_EQ(m["byte_fallback"], true);
  EXPECT_EQ(m["unk_token"], "<unk>");
  const json& vocab = m["vocab"];
  EXPECT_EQ(vocab.size(), 512u);
  EXPECT_EQ(vocab["<unk>"], 0);
  EXPECT_EQ(vocab["<s>"], 1);
  EXPECT_EQ(vocab["</s>"], 2);
  EXPECT_EQ(vocab["<0x0A>"], 3 + 10);
  EXPECT_EQ(vocab["\u2581t"], 259);    // " t", score 0
  EXPECT_EQ(vocab["\u2581the"], 265);  // " the", score -6
  EXPECT_EQ(vocab["he"], 260);
  // Merges: each joins two vocabulary pieces into a vocabulary piece, ranked by
  // the merged piece's score (= -(id - 259) for ids >= 259 in this vocabulary).
  const json& merges = m["merges"];
  // tools/ref/make_model_file_fixtures.py: transformers' generate_merges ported to Python.
  json fx = json::parse(read_file(std::string(GRPO_SOURCE_DIR) + "/tests/fixtures/model_files/tok512_reference.json").value());
  ASSERT_EQ(merges.size(), fx["merges"].size());
  for (size_t i = 0; i < merges.size(); ++i) ASSERT_EQ(merges[i], fx["merges"][i]) << "merge " << i;
  EXPECT_EQ(merges[0], json::array({"\u2581", "t"}));
  EXPECT_EQ(merges[1], json::array({"h", "e"}));
  int prev = 0;
  for (const auto& mg : merges) {
    std::string a = mg[0], bb = mg[1];
    ASSERT_TRUE(vocab.contains(a) && vocab.contains(bb) && vocab.contains(a + bb)) << a << " + " << bb;
    int id = vocab[a + bb];
    ASSERT_GE(id, prev) << a << " + " << bb;  // scores strictly fall with id from 259 on
    prev = id;
  }
  // "▁the" = "▁t" + "he" or "▁th" + "e": both splits are listed, by (id(left), id(right)).
  EXPECT_EQ(j["normalizer"]["normalizers"][0]["type"], "Prepend");
  EXPECT_EQ(j["normalizer"]["normalizers"][1]["content"], "\u2581");
  EXPECT_TRUE(j["pre_tokenizer"].is_null());
  EXPECT_EQ(j["decoder"]["decoders"][1]["type"], "ByteFallback");
  EXPECT_EQ(j["decoder"]["decoders"][3]["start"], 1);
  EXPECT_EQ(j["added_tokens"].size(), 3u);
  EXPECT_EQ(j["added_tokens"][2]["content"], "</s>");
  json tc = json::parse(llama2c_tokenizer_config_json(512));
  EXPECT_EQ(tc["add_bos_token"], true);
  EXPECT_EQ(tc["bos_token"], "<s>");
  EXPECT_EQ(tc["eos_token"], "</s>");
}

TEST(Llama2c, BadInputs) {
  TempDir tmp;
  std::string d = read_file(kDir + "/stories260K.bin").value();
  std::string cut = tmp.write("cut.bin", d.substr(0, d.size() - 100));
  Status s = convert_llama2c(cut, kDir + "/tok512.bin", tmp.path + "/o1");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1056440 bytes"), std::string::npos) << s.message();
  std::string v1 = d;
  v1[0] = 0x32; v1[1] = 0x34; v1[2] = 0x6b; v1[3] = 0x61;  // "24ka": little-endian 0x616b3432
  s = convert_llama2c(tmp.write("v1.bin", v1), kDir + "/tok512.bin", tmp.path + "/o2");
  EXPECT_NE(s.message().find("ak42"), std::string::npos) << s.message();
  std::string t = read_file(kDir + "/tok512.bin").value();
  s = convert_llama2c(kDir + "/stories260K.bin", tmp.write("t.bin", t.substr(0, 3000)), tmp.path + "/o3");
  EXPECT_NE(s.message().find("truncated at token"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(tmp.path + "/o1") || fs::exists(tmp.path + "/o2") || fs::exists(tmp.path + "/o3"));
}

TEST(Llama2c, Cli) {
  TempDir tmp;
  std::string cmd = std::string(GRPO_BINARY_PATH) + " convert llama2c --model " + kDir + "/stories260K.bin --tokenizer " +
                    kDir + "/tok512.bin --out " + tmp.path + "/m > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(tmp.path + "/m/" + f)) << f;
  EXPECT_TRUE(model_load(tmp.path + "/m", Device::cpu, DType::bf16).ok());
  // The converted tokenizer ships with a tiny preset: vocab 512, <s> = 1, </s> = 2.
  std::string init = std::string(GRPO_BINARY_PATH) + " init-model --preset tiny-llama --out " + tmp.path +
                     "/t --tokenizer-dir " + tmp.path + "/m > /dev/null";
  ASSERT_EQ(std::system(init.c_str()), 0);
  json cj = json::parse(read_file(tmp.path + "/t/config.json").value());
  EXPECT_EQ(cj["vocab_size"], 512);
  EXPECT_EQ(cj["bos_token_id"], 1);
  EXPECT_EQ(cj["eos_token_id"], 2);
  EXPECT_EQ(read_file(tmp.path + "/t/tokenizer.json").value(), read_file(tmp.path + "/m/tokenizer.json").value());
}
