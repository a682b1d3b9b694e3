// GSM8K gold answers (every line of both shipped splits) and answer extraction
// on hand-made tricky completions. Expected values are written by hand.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "env/gsm8k.h"

namespace grpo {
namespace {

// Independent reading of "#### <int with commas>": strip commas, check the
// shape by hand, convert with stoll.
void check_split(const std::string& file, size_t expected_lines) {
  std::ifstream in(std::string(GRPO_SOURCE_DIR) + "/data/gsm8k/" + file);
  ASSERT_TRUE(in) << file;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    auto row = nlohmann::json::parse(line);
    std::string sol = row.at("answer").get<std::string>();
    size_t h = sol.rfind("#### ");
    ASSERT_NE(h, std::string::npos) << file << ":" << n;
    std::string raw = sol.substr(h + 5), plain;
    for (char c : raw)
      if (c != ',') plain += c;
    ASSERT_FALSE(plain.empty());
    size_t start = plain[0] == '-' ? 1 : 0;
    for (size_t i = start; i < plain.size(); ++i) ASSERT_TRUE(plain[i] >= '0' && plain[i] <= '9') << file << ":" << n << " " << raw;
    long long want = std::stoll(plain);

    auto gold = gsm8k_gold_answer(sol);
    ASSERT_TRUE(gold.has_value()) << file << ":" << n;
    EXPECT_EQ(*gold, plain) << file << ":" << n;
    auto v = answer_to_number(*gold);
    ASSERT_TRUE(v.has_value()) << file << ":" << n << " " << *gold;
    EXPECT_TRUE(v->exact);
    EXPECT_EQ(v->den, 1);
    EXPECT_EQ(v->num, want) << file << ":" << n;
    EXPECT_EQ(number_render(*v), plain) << file << ":" << n;
    // The gold as written (with commas), rendered back in the three answer styles.
    EXPECT_TRUE(gsm8k_is_correct("#### " + raw, *gold)) << file << ":" << n << " " << raw;
    EXPECT_TRUE(gsm8k_is_correct("<answer>" + raw + "</answer>", *gold)) << file << ":" << n;
    EXPECT_TRUE(gsm8k_is_correct("so \\boxed{" + plain + "}.", *gold)) << file << ":" << n;
    EXPECT_TRUE(gsm8k_is_correct(sol, *gold)) << file << ":" << n;  // the reference solution itself
    EXPECT_FALSE(gsm8k_is_correct("<answer>" + std::to_string(want + 1) + "</answer>", *gold));
  }
  EXPECT_EQ(n, expected_lines);
}

TEST(Gsm8kGold, EveryTrainAnswerParses) { check_split("train.jsonl", 7473); }
TEST(Gsm8kGold, EveryTestAnswerParses) { check_split("test.jsonl", 1319); }

TEST(Gsm8kEnv, LoadsBothSplits) {
  Gsm8kPaths p;
  p.train = std::string(GRPO_SOURCE_DIR) + "/data/gsm8k/train.jsonl";
  p.test = std::string(GRPO_SOURCE_DIR) + "/data/gsm8k/test.jsonl";
  auto env = gsm8k_env_load(p);
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ((*env)->size(Split::train), 7473u);
  EXPECT_EQ((*env)->size(Split::test), 1319u);
  Example ex = (*env)->example(Split::train, 0);
  EXPECT_EQ(ex.answer, "72");  // "Natalia sold clips ... #### 72"
  EXPECT_EQ(ex.id, "gsm8k/train/0");
  std::string ref = (*env)->reference_completion(ex);
  EXPECT_EQ(ref.find("<<"), std::string::npos);  // calculator annotations removed
  EXPECT_EQ((*env)->score(ex, ref), 1.0f);
  EXPECT_EQ((*env)->score(ex, "<answer>71</answer>"), 0.0f);
}

TEST(Gsm8kGold, StripsCommasAndSpaces) {
  EXPECT_EQ(*gsm8k_gold_answer("steps\n#### 1,234"), "1234");
  EXPECT_EQ(*gsm8k_gold_answer("#### -5 "), "-5");
  EXPECT_FALSE(gsm8k_gold_answer("no marker").has_value());
  EXPECT_EQ(gsm8k_strip_calculator("48/2 = <<48/2=24>>24 clips"), "48/2 = 24 clips");
}

struct Case {
  const char* completion;
  const char* gold;
  AnswerSource source;
  bool correct;
};

using S = AnswerSource;
const Case kCases[] = {
    {"<think>2+2</think><answer>4</answer>", "4", S::answer_tag, true},
    {"<answer>1,000</answer>", "1000", S::answer_tag, true},
    {"<answer>$18</answer>", "18", S::answer_tag, true},
    {"<answer>18 dollars</answer>", "18", S::answer_tag, true},
    {"<answer>\xE2\x82\xAC" "5</answer>", "5", S::answer_tag, true},  // €5
    {"<answer>18 eggs.</answer>", "18", S::answer_tag, true},
    {"<answer>18.0</answer>", "18", S::answer_tag, true},
    {"<answer>18.50</answer>", "18.5", S::answer_tag, true},
    {"<answer>3/4</answer>", "0.75", S::answer_tag, true},
    {"<answer>\\frac{3}{4}</answer>", "0.75", S::answer_tag, true},
    {"<answer>\\dfrac{3}{4}</answer>", "3/4", S::answer_tag, true},
    {"<answer>50%</answer>", "50", S::answer_tag, true},  // GSM8K percent rule: 50% == 50
    {"<answer>50\\%</answer>", "50", S::answer_tag, true},
    {"<answer>-5</answer>", "-5", S::answer_tag, true},
    {"<answer>\xE2\x88\x92" "5</answer>", "-5", S::answer_tag, true},  // U+2212 minus
    {"<answer>+7</answer>", "7", S::answer_tag, true},
    {"<answer>The total is 18</answer>", "18", S::answer_tag, true},  // last number inside the block
    {"<answer>17</answer> wait, actually 18", "18", S::answer_tag, false},  // the block wins
    {"<answer>5</answer> no: <answer>6</answer>", "6", S::answer_tag, true},  // last block
    {"<answer>5</answer><answer>6", "5", S::answer_tag, true},  // unclosed block ignored
    {"The answer is \\boxed{42}.", "42", S::boxed, true},
    {"\\boxed{1} then \\boxed{2}", "2", S::boxed, true},
    {"\\boxed{\\frac{1}{2}}", "0.5", S::boxed, true},
    {"\\boxed{\\text{18 apples}}", "18", S::boxed, true},
    {"\\boxed{18} and \\boxed{19", "18", S::boxed, true},  // truncated last box
    {"\\boxed{1{,}000}", "1000", S::boxed, true},
    {"\\boxed{5}\n#### 6", "5", S::boxed, true},  // boxed before ####
    {"so 9 + 9 = 18\n#### 18", "18", S::hashes, true},
    {"#### 1,234\nDone", "1234", S::hashes, true},
    {"#### $1,234.00", "1234", S::hashes, true},
    {"#### 6 <answer>5</answer>", "5", S::answer_tag, true},
    {"She has 3 apples and buys 5 more, so 8 apples.", "8", S::last_number, true},
    {"Total: 1,200 eggs.", "1200", S::last_number, true},
    {"It costs $0.75 each, that is 3/4", "0.75", S::last_number, true},
    {"no numbers here", "5", S::none, false},
    {"", "0", S::none, false},
    {"<answer></answer> 0", "0", S::answer_tag, false},  // empty block: no fallback outside it
    {"The result is 5. <answer>seven</answer>", "5", S::answer_tag, false},
    {"<answer>18</answer>", "19", S::answer_tag, false},
    {"<answer>1,00</answer>", "100", S::answer_tag, false},  // malformed thousands
    {"<answer>2^3</answer>", "8", S::answer_tag, true},
    {"<answer>x = 12</answer>", "12", S::answer_tag, true},
    {"<answer>\\$12</answer>", "12", S::answer_tag, true},
    {"<answer>12.</answer>", "12", S::answer_tag, true},
    {"<answer> 12 </answer>", "12", S::answer_tag, true},
    {"Answer: 12.5%", "12.5", S::last_number, true},
    {"<answer>1/0</answer>", "0", S::answer_tag, false},
    {"<answer>\xC2\xA3" "1,000,000</answer>", "1000000", S::answer_tag, true},  // £
    {"<answer>1000000.0001</answer>", "1000000", S::answer_tag, false},  // exact rationals differ
    {"<answer>-0</answer>", "0", S::answer_tag, true},
    {"The answer is 7-3=4", "4", S::last_number, true},
    {"between 3-4 hours", "4", S::last_number, true},  // '-' after a digit is not a sign
    {"<answer>\\frac12</answer>", "0.5", S::answer_tag, true},
    {"The temperature fell to -5 degrees.", "-5", S::last_number, true},
    {"<answer>18.5 eggs</answer>", "18", S::answer_tag, false},
    {"<answer>USD 40</answer>", "40", S::answer_tag, true},
    {"The answer is 36.", "36", S::last_number, true},
    {"about .5 of them", "0.5", S::last_number, true},
    {"<answer>0.3333333</answer>", "1/3", S::answer_tag, true},  // non-terminating gold: 1e-6 relative
    {"<answer>0.33</answer>", "1/3", S::answer_tag, false},
};

TEST(Gsm8kExtract, TrickyCompletions) {
  ASSERT_GE(sizeof(kCases) / sizeof(kCases[0]), 40u);
  for (const Case& c : kCases) {
    ExtractedAnswer e = extract_answer(c.completion);
    EXPECT_EQ(e.source, c.source) << "completion: " << c.completion << " got " << answer_source_name(e.source);
    EXPECT_EQ(gsm8k_is_correct(c.completion, c.gold), c.correct)
        << "completion: " << c.completion << " gold " << c.gold << " extracted '" << e.text << "'";
  }
}

TEST(Gsm8kExtract, ExtractedText) {
  EXPECT_EQ(extract_answer("<answer> 1,200 </answer>").text, "1,200");
  EXPECT_EQ(extract_answer("x \\boxed{\\frac{1}{2}} y").text, "\\frac{1}{2}");
  EXPECT_EQ(extract_answer("#### 72\nmore").text, "72");
  EXPECT_EQ(extract_answer("eggs: 16, sold 3, 1,200 total.").text, "1,200");
  EXPECT_FALSE(extract_answer("<answer>seven</answer>").value.has_value());
}

}  // namespace
}  // namespace grpo
