// Comparisons with HF tokenizers' output (fixtures written by
// tools/ref/make_tokenizer_fixtures.py on the GPU machine): parity and stress ids,
// HF's decode of the stress set, and every GSM8K question and answer (train + test) as
// token count + FNV-1a-64 of the ids. A missing fixture is a failure naming the script.
#include <nlohmann/json.hpp>

#include "tok_test_util.h"

namespace grpo::test {

using json = nlohmann::json;

static json load_fixture(const std::string& name, bool* ok) {
  std::string path = fixture_dir() + "/" + name + ".json";
  std::string text = read_file(path);
  *ok = !text.empty();
  if (!*ok) {
    ADD_FAILURE() << missing_fixture_msg(path);
    return json();
  }
  json j = json::parse(text);
  EXPECT_EQ(j["version"].get<int>(), 1) << path;
  return j;
}

class Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Fixture, ParityAndStressIds) {
  bool ok;
  json fx = load_fixture(GetParam(), &ok);
  if (!ok) return;
  const Tokenizer& t = tok(GetParam());
  EXPECT_EQ(fx["vocab_size"].get<int>(), t.vocab_size());
  int n = 0;
  for (const char* set : {"parity", "stress"}) {
    for (const json& c : fx[set]) {
      std::string text = c["text"].get<std::string>();
      auto ids = t.encode(text);
      EXPECT_EQ(ids, c["ids"].get<std::vector<int>>()) << GetParam() << " " << set << ": " << text;
      if (c.contains("decoded")) EXPECT_EQ(t.decode(ids), c["decoded"].get<std::string>()) << text;
      ++n;
    }
  }
  EXPECT_GE(n, 46 + 40);
}

// Same order as the script: train then test, per line question then answer.
static std::vector<std::string> gsm8k_texts() {
  std::vector<std::string> out;
  for (const char* split : {"train", "test"}) {
    std::istringstream lines(read_file(shared_dir() + "/gsm8k/" + split + ".jsonl"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json row = json::parse(line);
      out.push_back(row["question"].get<std::string>());
      out.push_back(row["answer"].get<std::string>());
    }
  }
  return out;
}

TEST_P(Fixture, Gsm8kAllTextsMatchHashes) {
  bool ok;
  json fx = load_fixture(GetParam(), &ok);
  if (!ok) return;
  std::string bin_path = fixture_dir() + "/" + fx["gsm8k"]["file"].get<std::string>();
  std::string bin = read_file(bin_path);
  ASSERT_GE(bin.size(), 12u) << missing_fixture_msg(bin_path);
  ASSERT_EQ(bin.substr(0, 4), "GTKH") << bin_path;
  uint32_t version, n;
  std::memcpy(&version, bin.data() + 4, 4);
  std::memcpy(&n, bin.data() + 8, 4);
  ASSERT_EQ(version, 1u);
  ASSERT_EQ(bin.size(), 12 + size_t(n) * 12) << bin_path;
  std::vector<std::string> texts = gsm8k_texts();
  ASSERT_EQ(texts.size(), n) << "GSM8K line count differs from the fixture's";
  ASSERT_EQ(texts.size(), 2u * (7473 + 1319));
  const Tokenizer& t = tok(GetParam());
  const json& first = fx["gsm8k"]["first"];
  size_t bad = 0, total_tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto ids = t.encode(texts[i]);
    uint32_t want_n;
    uint64_t want_h;
    std::memcpy(&want_n, bin.data() + 12 + i * 12, 4);
    std::memcpy(&want_h, bin.data() + 16 + i * 12, 8);
    total_tokens += ids.size();
    if (ids.size() != want_n || fnv1a_ids(ids) != want_h) {
      if (++bad <= 5) ADD_FAILURE() << GetParam() << " gsm8k text #" << i << " differs (" << ids.size() << " vs " << want_n
                                    << " tokens): " << texts[i];
    }
    if (i < first.size()) {
      EXPECT_EQ(first[i]["text"].get<std::string>(), texts[i]);
      EXPECT_EQ(ids, first[i]["ids"].get<std::vector<int>>()) << texts[i];
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << texts.size() << " texts";
  EXPECT_EQ(total_tokens, fx["gsm8k"]["total_tokens"].get<size_t>());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Fixture, ::testing::Values("gpt2", "qwen2", "llama3"));

}  // namespace grpo::test
