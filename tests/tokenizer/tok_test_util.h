// Shared helpers for the tokenizer tests: data paths, tokenizers loaded once per
// process, llama.cpp parity vectors, GSM8K texts and the fixture FNV-1a hash.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace grpo::test {

inline std::string shared_dir() { return GRPO_SHARED_DIR "/data"; }
inline std::string tok_dir(const std::string& name) { return shared_dir() + "/tokenizers/" + name; }
inline std::string fixture_dir() {
  const char* e = std::getenv("GRPO_TOKENIZER_FIXTURES");  // to try a fresh fixture set before it is copied in
  return e ? e : GRPO_SOURCE_DIR "/tests/fixtures/tokenizer";
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// gpt2 and qwen2 load their tokenizer.json; llama3 has only encoder.json + vocab.bpe
// and needs the explicit preset.
inline const Tokenizer& tok(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  TokenizerOptions opt;
  if (name == "llama3") opt.preset = "llama3";
  auto r = Tokenizer::load(tok_dir(name), opt);
  if (!r.ok()) {
    ADD_FAILURE() << r.status().message();
    std::abort();
  }
  return cache.emplace(name, std::move(r).value()).first->second;
}

struct ParityCase {
  std::string text;
  std::vector<int> ids;
};
inline std::vector<ParityCase> parity_cases(const std::string& name) {
  static const std::map<std::string, std::string> stem = {
      {"gpt2", "ggml-vocab-gpt-2.gguf"}, {"qwen2", "ggml-vocab-qwen2.gguf"}, {"llama3", "ggml-vocab-llama-bpe.gguf"}};
  std::string base = tok_dir(name) + "/parity/" + stem.at(name);
  std::string inp = read_file(base + ".inp"), out = read_file(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<ParityCase> cases;
  for (size_t pos = 0;;) {
    size_t e = inp.find(sep, pos);
    if (e == std::string::npos) break;
    cases.push_back({inp.substr(pos, e - pos), {}});
    pos = e + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (auto& c : cases) {
    std::getline(lines, line);
    std::istringstream ids(line);
    int id;
    while (ids >> id) c.ids.push_back(id);
  }
  return cases;
}

inline uint64_t fnv1a_ids(const std::vector<int>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int id : ids) {
    uint32_t u = uint32_t(id);
    for (int k = 0; k < 4; ++k) {  // little-endian int32 bytes, as the fixture script packs them
      h ^= (u >> (8 * k)) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

inline std::string missing_fixture_msg(const std::string& file) {
  return "fixture " + file + " is missing: run `python3 tools/ref/make_tokenizer_fixtures.py --shared .carry/shared "
         "--out tests/fixtures/tokenizer` on the GPU machine (needs tokenizers, transformers, jinja2)";
}

}  // namespace grpo::test
