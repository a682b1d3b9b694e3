// llama2.c legacy checkpoint + tokenizer -> HF Llama directory.
// Layout (run.c, legacy v0): 7 × int32 header, then float32 tok_emb (V,C),
// rms_att (L,C), wq (L,Q,C), wk (L,KV,C), wv (L,KV,C), wo (L,C,Q), rms_ffn
// (L,C), w1 (L,F,C), w2 (L,C,F), w3 (L,F,C), rms_final (C), freq_cis_real and
// freq_cis_imag (T, D/2) each, then wcls (V,C) when vocab_size < 0.
#include "model/llama2c.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "model/checkpoint.h"
#include "model/safetensors.h"

namespace grpo {

using ojson = nlohmann::ordered_json;

namespace {
int32_t read_i32(const char* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Bytes of a UTF-8 character starting with lead byte c (1 for stray bytes).
size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1; }

// Copies `rows` rows of width `cols` from src into dst, permuting within each
// head of `hd` rows: dst row h·hd + i <- src row h·hd + 2i, dst row h·hd + hd/2 + i <- src row h·hd + 2i + 1.
void permute_rope_rows(float* dst, const float* src, int n_heads, int hd, int cols) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      for (int half = 0; half < 2; ++half) {
        const float* s = src + (size_t(h) * hd + 2 * i + half) * cols;
        float* d = dst + (size_t(h) * hd + size_t(half) * (hd / 2) + i) * cols;
        std::memcpy(d, s, sizeof(float) * size_t(cols));
      }
    }
}
}  // namespace

Result<Llama2cHeader> llama2c_read_header(const std::string& bin_path) {
  GRPO_ASSIGN_OR_RETURN(std::string data, read_file(bin_path));
  if (data.size() < 28) return error_status(bin_path + ": too short for a llama2.c header (truncated?)");
  if (read_i32(data.data()) == 0x616b3432)
    return error_status(bin_path + ": this is a llama2.c version-1/2 export (magic \"ak42\"); re-export with "
                        "export.py --version 0 (legacy format)");
  Llama2cHeader h;
  int* f[] = {&h.dim, &h.hidden_dim, &h.n_layers, &h.n_heads, &h.n_kv_heads, &h.vocab_size, &h.seq_len};
  for (int i = 0; i < 7; ++i) *f[i] = read_i32(data.data() + 4 * i);
  if (h.dim <= 0 || h.hidden_dim <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 || h.vocab_size == 0 ||
      h.seq_len <= 0 || h.dim % h.n_heads != 0 || h.n_heads % h.n_kv_heads != 0 || (h.dim / h.n_heads) % 2 != 0)
    return error_status(bin_path + ": implausible llama2.c header (dim " + std::to_string(h.dim) + ", heads " +
                        std::to_string(h.n_heads) + ", kv heads " + std::to_string(h.n_kv_heads) +
                        "); not a llama2.c legacy checkpoint?");
  return h;
}

Result<Llama2cTokenizer> llama2c_read_tokenizer(const std::string& tok_path, int vocab_size) {
  GRPO_ASSIGN_OR_RETURN(std::string d, read_file(tok_path));
  Llama2cTokenizer t;
  size_t o = 0;
  auto need = [&](size_t n) { return o + n <= d.size(); };
  if (!need(4)) return error_status(tok_path + ": too short for a llama2.c tokenizer");
  t.max_token_length = read_i32(d.data());
  o = 4;
  for (int i = 0; i < vocab_size; ++i) {
    if (!need(8)) return error_status(tok_path + ": truncated at token " + std::to_string(i) + " of " + std::to_string(vocab_size));
    float score;
    std::memcpy(&score, d.data() + o, 4);
    int32_t len = read_i32(d.data() + o + 4);
    o += 8;
    if (len < 0 || !need(size_t(len)))
      return error_status(tok_path + ": token " + std::to_string(i) + " has a bad length " + std::to_string(len));
    t.pieces.emplace_back(d.data() + o, size_t(len));
    t.scores.push_back(score);
    o += size_t(len);
  }
  if (o != d.size())
    return error_status(tok_path + ": " + std::to_string(d.size() - o) + " bytes left after " + std::to_string(vocab_size) +
                        " tokens; the tokenizer does not match the model's vocab_size");
  return t;
}

std::string llama2c_tokenizer_json(const Llama2cTokenizer& tok) {
  const std::string sp = "\xe2\x96\x81";  // "▁"
  const size_t V = tok.pieces.size();
  // HF pieces: specials renamed, spaces as "▁" (SentencePiece's own spelling).
  std::vector<std::string> piece(V);
  for (size_t i = 0; i < V; ++i) {
    if (i == 0) piece[i] = "<unk>";
    else if (i == 1) piece[i] = "<s>";
    else if (i == 2) piece[i] = "</s>";
    else
      for (char c : tok.pieces[i]) piece[i] += c == ' ' ? sp : std::string(1, c);
  }
  std::map<std::string, int> id;
  for (size_t i = 0; i < V; ++i) id.emplace(piece[i], int(i));  // first id wins on duplicates

  // Merges (transformers' SentencePieceExtractor): for every piece, each split at a
  // character boundary into two vocabulary pieces; within a piece ordered by
  // (id(left), id(right)); then all stably sorted by the merged piece's score, descending.
  struct M { std::string l, r; float score; size_t order; };
  std::vector<M> merges;
  for (size_t i = 0; i < V; ++i) {
    const std::string& s = piece[i];
    std::vector<std::pair<std::string, std::string>> local;
    for (size_t at = utf8_len(uint8_t(s[0])); s.size() > 1 && at < s.size(); at += utf8_len(uint8_t(s[at]))) {
      std::string l = s.substr(0, at), r = s.substr(at);
      if (id.count(l) && id.count(r)) local.emplace_back(l, r);
    }
    std::stable_sort(local.begin(), local.end(), [&](const auto& a, const auto& b) {
      return std::make_pair(id[a.first], id[a.second]) < std::make_pair(id[b.first], id[b.second]);
    });
    for (auto& [l, r] : local) merges.push_back({l, r, tok.scores[i], merges.size()});
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) { return a.score > b.score; });

  ojson vocab = ojson::object();
  for (size_t i = 0; i < V; ++i)
    if (!vocab.contains(piece[i])) vocab[piece[i]] = int(i);
  ojson mj = ojson::array();
  for (const M& m : merges) mj.push_back({m.l, m.r});
  auto added = [](int i, const char* s) {
    return ojson{{"id", i}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                 {"normalized", false}, {"special", true}};
  };
  ojson special = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")};
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", sp}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}};
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {special, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {special, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "<s>"}, {"type_id", 1}}}},
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},
                {"unk_token", "<unk>"},   {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
                {"byte_fallback", true},  {"ignore_merges", false},
                {"vocab", vocab},         {"merges", mj}};
  return j.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
}

std::string llama2c_tokenizer_config_json(int max_len) {
  auto dec = [](const char* s) {
    return ojson{{"content", s}, {"lstrip", false}, {"normalized", false}, {"rstrip", false}, {"single_word", false},
                 {"special", true}};
  };
  ojson j;
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  j["added_tokens_decoder"] = {{"0", dec("<unk>")}, {"1", dec("<s>")}, {"2", dec("</s>")}};
  j["bos_token"] = "<s>";
  j["clean_up_tokenization_spaces"] = false;
  j["eos_token"] = "</s>";
  j["legacy"] = true;
  j["model_max_length"] = max_len;
  j["pad_token"] = nullptr;
  // PreTrainedTokenizerFast uses tokenizer.json as is (BOS comes from its post_processor).
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["unk_token"] = "<unk>";
  return j.dump(2) + "\n";
}

Status convert_llama2c(const std::string& bin, const std::string& tok_path, const std::string& out_dir) {
  GRPO_ASSIGN_OR_RETURN(Llama2cHeader h, llama2c_read_header(bin));
  GRPO_ASSIGN_OR_RETURN(std::string data, read_file(bin));
  const bool shared = h.vocab_size > 0;
  const int64_t V = shared ? h.vocab_size : -int64_t(h.vocab_size), C = h.dim, F = h.hidden_dim, L = h.n_layers;
  const int64_t D = C / h.n_heads, Q = C, KV = int64_t(h.n_kv_heads) * D, T = h.seq_len;
  const int64_t n_floats = V * C + L * C + L * Q * C + 2 * L * KV * C + L * C * Q + L * C + 3 * L * F * C + C +
                           T * D + (shared ? 0 : V * C);
  const size_t want = 28 + size_t(n_floats) * 4;
  if (data.size() != want)
    return error_status(bin + ": " + std::to_string(data.size()) + " bytes, but the header (dim " + std::to_string(C) +
                        ", hidden " + std::to_string(F) + ", layers " + std::to_string(L) + ", vocab " +
                        std::to_string(h.vocab_size) + ", seq_len " + std::to_string(T) + ") implies " +
                        std::to_string(want) + "; the file is truncated or not a legacy llama2.c checkpoint");
  GRPO_ASSIGN_OR_RETURN(Llama2cTokenizer tok, llama2c_read_tokenizer(tok_path, int(V)));

  nlohmann::json cj = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_act", "silu"},
                       {"hidden_size", C}, {"intermediate_size", F}, {"num_hidden_layers", L},
                       {"num_attention_heads", h.n_heads}, {"num_key_value_heads", h.n_kv_heads}, {"head_dim", D},
                       {"vocab_size", V}, {"max_position_embeddings", T}, {"rms_norm_eps", 1e-5},
                       {"rope_theta", 10000.0}, {"rope_scaling", nullptr}, {"tie_word_embeddings", shared},
                       {"attention_bias", false}, {"mlp_bias", false}, {"initializer_range", 0.02},
                       // llama2.c stops generation at BOS (1): TinyStories separates stories with it.
                       {"bos_token_id", 1}, {"eos_token_id", {2, 1}}, {"torch_dtype", "float32"}, {"use_cache", true}};
  GRPO_ASSIGN_OR_RETURN(ModelConfig cfg, model_config_from_json(cj));
  ModelWeights w = weights_allocate(cfg, Device::cpu, DType::f32);
  tensor_fill_zero(w.arena);
  const float* p = reinterpret_cast<const float*>(data.data() + 28);  // read_file's buffer is malloc-aligned
  auto take = [&](int64_t n) { const float* q = p; p += n; return q; };
  auto put = [](Tensor dst, const float* src) { std::memcpy(dst.data, src, dst.nbytes()); };
  put(w.embed, take(V * C));
  const float* rms_att = take(L * C);
  const float* wq = take(L * Q * C);
  const float* wk = take(L * KV * C);
  const float* wv = take(L * KV * C);
  const float* wo = take(L * C * Q);
  const float* rms_ffn = take(L * C);
  const float* w1 = take(L * F * C);
  const float* w2 = take(L * C * F);
  const float* w3 = take(L * F * C);
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& lw = w.layers[size_t(l)];
    put(lw.attn_norm, rms_att + l * C);
    permute_rope_rows(lw.wqkv.ptr<float>(), wq + l * Q * C, h.n_heads, int(D), int(C));
    permute_rope_rows(lw.wqkv.ptr<float>() + Q * C, wk + l * KV * C, h.n_kv_heads, int(D), int(C));
    put(lw.wqkv.slice0(Q + KV, Q + 2 * KV), wv + l * KV * C);
    put(lw.wo, wo + l * C * Q);
    put(lw.mlp_norm, rms_ffn + l * C);
    put(lw.w_gate_up.slice0(0, F), w1 + l * F * C);
    put(lw.w_gate_up.slice0(F, 2 * F), w3 + l * F * C);
    put(lw.w_down, w2 + l * C * F);
  }
  put(w.final_norm, take(C));
  take(T * D);  // freq_cis_real and freq_cis_imag, (T, D/2) each: recomputed from rope_theta
  if (!shared) put(w.lm_head, take(V * C));

  SaveOptions so;
  so.dtype = SaveDType::f32;
  so.extra_files = {
      {"tokenizer.json", llama2c_tokenizer_json(tok)},
      {"tokenizer_config.json", llama2c_tokenizer_config_json(int(T))},
      {"special_tokens_map.json", R"({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})" "\n"},
      {"generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 1]})" "\n"}};
  return model_save(out_dir, w, so).with_context("converting " + bin);
}

}  // namespace grpo
