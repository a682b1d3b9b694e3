// `grpo draft-vocab` (cli/cmd_draft_vocab.cpp) on the Qwen2 tokenizer: the ids it keeps are
// the end-of-generation ids, then the most frequent ids of the data by count (ties by id),
// with counts and coverage that match a count made here from the tokenizer's own encoding
// (the tokenizer is checked against Hugging Face tokenizers in tests/tokenizer); the file
// round-trips through engine.speculative.draft_vocab; bad input gets an error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/speculative.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace grpo;

namespace {

const std::string kTok = std::string(GRPO_SHARED_DIR) + "/data/tokenizers/qwen2";

int run_grpo(const std::string& args, const std::string& log) {
  const std::string cmd = std::string(GRPO_BINARY_PATH) + " draft-vocab " + args + " > " + log + " 2>&1";
  return std::system(cmd.c_str());
}

}  // namespace

TEST(DraftVocabCli, KeepsTheMostFrequentIdsAfterTheEndIds) {
  TempDir tmp;
  const std::string data = tmp.path + "/d.jsonl";
  {
    std::ofstream f(data);
    f << R"({"prompt": "Natalia sold 48 clips in April.", "completion": "She sold 48 / 2 = 24 clips in May."})" << "\n";
    f << R"({"prompt": "How many clips did she sell?", "completion": "48 + 24 = 72 clips. #### 72", "id": 7})" << "\n";
    f << "\n";
    f << R"({"messages": [{"role": "user", "content": "clips clips clips"}]})" << "\n";
  }
  const std::string out = tmp.path + "/v.json";
  ASSERT_EQ(run_grpo("--model " + kTok + " --data " + data + " --size 6 --out " + out, tmp.path + "/log"), 0)
      << read_file(tmp.path + "/log").value();
  const nlohmann::json j = nlohmann::json::parse(read_file(out).value());

  // The count made here: every string value of every line (the keys are not text).
  auto tok = Tokenizer::load(kTok).value();
  std::map<int, int64_t> count;
  int64_t total = 0;
  for (const char* text : {"Natalia sold 48 clips in April.", "She sold 48 / 2 = 24 clips in May.",
                           "How many clips did she sell?", "48 + 24 = 72 clips. #### 72", "user",
                           "clips clips clips"})
    for (int id : tok.encode(text)) {
      ++count[id];
      ++total;
    }
  std::vector<std::pair<int64_t, int>> ranked;  // (−count, id)
  const std::vector<int> eos = tok.eos_ids();
  for (auto [id, c] : count)
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) ranked.push_back({-c, id});
  std::sort(ranked.begin(), ranked.end());
  std::vector<int32_t> expect(eos.begin(), eos.end());
  std::vector<int64_t> expect_counts;
  for (int id : eos) expect_counts.push_back(count.count(id) ? count[id] : 0);
  for (auto [neg, id] : ranked) {
    if (expect.size() >= 6) break;
    expect.push_back(id);
    expect_counts.push_back(-neg);
  }
  ASSERT_FALSE(eos.empty());
  EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), expect);
  EXPECT_EQ(j["counts"].get<std::vector<int64_t>>(), expect_counts);
  EXPECT_EQ(j["tokens_counted"].get<int64_t>(), total);
  int64_t covered = 0;
  for (int64_t c : expect_counts) covered += c;
  EXPECT_NEAR(j["coverage"].get<double>(), double(covered) / double(total), 1e-12);
  EXPECT_EQ(j["distinct_ids_seen"].get<int64_t>(), int64_t(count.size()));

  // The engine reads it: the first N ids, ascending.
  SpeculativeOptions o;
  o.method = SpecMethod::draft;
  o.draft_vocab = out;
  o.draft_vocab_size = 3;
  ASSERT_TRUE(spec_resolve_draft_vocab(o, tok.vocab_size()).ok());
  std::vector<int32_t> first3(expect.begin(), expect.begin() + 3);
  std::sort(first3.begin(), first3.end());
  EXPECT_EQ(o.draft_vocab_ids, first3);

  // --fields counts only those fields.
  ASSERT_EQ(run_grpo("--model " + kTok + " --data " + data + " --fields completion --size 100 --out " + out,
                     tmp.path + "/log"),
            0);
  const nlohmann::json jc = nlohmann::json::parse(read_file(out).value());
  int64_t n_completion = 0;
  for (const char* text : {"She sold 48 / 2 = 24 clips in May.", "48 + 24 = 72 clips. #### 72"})
    n_completion += int64_t(tok.encode(text).size());
  EXPECT_EQ(jc["tokens_counted"].get<int64_t>(), n_completion);
  EXPECT_NE(read_file(tmp.path + "/log").value().find("only"), std::string::npos) << "fewer distinct ids than --size";
}

TEST(DraftVocabCli, BadInputNamesTheProblem) {
  TempDir tmp;
  const std::string bad = tmp.path + "/bad.jsonl", log = tmp.path + "/log";
  std::ofstream(bad) << "{\"text\": \"fine\"}\nnot json\n";
  EXPECT_NE(run_grpo("--model " + kTok + " --data " + bad + " --out " + tmp.path + "/v.json", log), 0);
  EXPECT_NE(read_file(log).value().find(bad + ":2: not a JSON object"), std::string::npos) << read_file(log).value();
  EXPECT_EQ(run_grpo("--model " + kTok + " --data " + bad + " --on-error skip --out " + tmp.path + "/v.json", log), 0)
      << read_file(log).value();
  EXPECT_NE(read_file(log).value().find("1 lines skipped"), std::string::npos) << read_file(log).value();
  EXPECT_NE(run_grpo("--model " + kTok + " --data " + tmp.path + "/none.jsonl --out " + tmp.path + "/v.json", log), 0);
  EXPECT_NE(read_file(log).value().find("cannot open"), std::string::npos);
  EXPECT_NE(run_grpo("--model " + kTok + " --out " + tmp.path + "/v.json", log), 0);
  EXPECT_NE(read_file(log).value().find("--data"), std::string::npos);
}
