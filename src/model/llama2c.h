// Karpathy's llama2.c checkpoints (legacy "v0" .bin + tokenizer .bin) -> a
// Hugging Face Llama directory. llama2.c's RoPE rotates interleaved pairs
// (x[2i], x[2i+1]); HF Llama rotates halves (x[i], x[i+D/2]). The converter
// permutes the rows of wq and wk within each head (new row i <- old row 2i,
// new row D/2+i <- old row 2i+1), as transformers' Llama conversion script
// does, so that the HF-convention forward gives llama2.c's outputs.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace grpo {

struct Llama2cHeader {
  int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0;
  int vocab_size = 0;  // as stored: negative means an unshared classifier follows the weights
  int seq_len = 0;
};

struct Llama2cTokenizer {
  int max_token_length = 0;
  std::vector<std::string> pieces;  // raw bytes as stored (spaces are real spaces)
  std::vector<float> scores;
};

Result<Llama2cHeader> llama2c_read_header(const std::string& bin_path);
Result<Llama2cTokenizer> llama2c_read_tokenizer(const std::string& tok_path, int vocab_size);

// The HF tokenizer.json / tokenizer_config.json for a llama2.c (SentencePiece
// BPE) vocabulary, as transformers' LlamaConverter builds them: BPE with
// byte_fallback, merges from every two-piece split of each piece ranked by the
// merged piece's score, "▁" for spaces, <unk>/<s>/</s> at ids 0/1/2.
std::string llama2c_tokenizer_json(const Llama2cTokenizer& tok);
std::string llama2c_tokenizer_config_json(int max_len);

// Converts `bin` + `tok` into `out_dir` (config.json, model.safetensors in f32,
// tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json).
Status convert_llama2c(const std::string& bin, const std::string& tok, const std::string& out_dir);

}  // namespace grpo
