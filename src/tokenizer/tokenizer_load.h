// Internal to the tokenizer loader: what a tokenizer.json or vocab/merges pair
// provides before the BPE model is built, plus file helpers shared by the loaders.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer_impl.h"

namespace grpo {

// Pre-tokenizer regexes of the families we know (as written in their tokenizer.json).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct ModelFiles {
  std::vector<std::pair<std::string, int>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
  std::string unk_token;
  bool decode_byte_level = false, decode_byte_fallback = false;
  std::vector<std::pair<std::string, std::string>> decode_replace;  // per token, in order
};

Result<std::string> read_text_file(const std::string& path);
Result<nlohmann::json> read_json_file(const std::string& path);

// Fills t's normalizer, pre-tokenizer, added tokens, post-processor and mf from a tokenizer.json.
Status load_tokenizer_json(const std::string& file, TokenizerImpl& t, ModelFiles& mf);

}  // namespace grpo
