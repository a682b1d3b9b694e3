// Synthetic arithmetic environment: determinism, disjoint splits, answers
// checked by an independent evaluator of the problem text, lengths.
#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "env/arithmetic.h"

namespace grpo {
namespace {

// Independent evaluation of the generated text (reads the numbers back from
// the words, does not reuse the generator's arithmetic).
int64_t eval_text(const std::string& t, ArithmeticStyle style) {
  if (style == ArithmeticStyle::expression) {
    std::smatch m;
    std::regex head(R"(^(\d+)(\*(\d+))?)");
    EXPECT_TRUE(std::regex_search(t, m, head)) << t;
    int64_t v = std::stoll(m[1]) * (m[3].matched ? std::stoll(m[3]) : 1);
    std::string rest = m.suffix();
    std::regex step(R"(([+-])(\d+))");
    for (std::sregex_iterator it(rest.begin(), rest.end(), step), end; it != end; ++it)
      v += ((*it)[1] == "+" ? 1 : -1) * std::stoll((*it)[2]);
    return v;
  }
  std::smatch m;
  std::regex start(R"(has (\d+) (boxes (of|with) (\d+) )?)");
  EXPECT_TRUE(std::regex_search(t, m, start)) << t;
  int64_t v = std::stoll(m[1]) * (m[2].matched ? std::stoll(m[4]) : 1);
  std::string rest = m.suffix();
  std::regex step(R"((gets|buys|gives away|loses|gives) (\d+))");
  for (std::sregex_iterator it(rest.begin(), rest.end(), step), end; it != end; ++it) {
    std::string verb = (*it)[1];
    int64_t n = std::stoll((*it)[2]);
    v += (verb == "gets" || verb == "buys") ? n : -n;
  }
  return v;
}

TEST(Arithmetic, DeterministicFromSeed) {
  ArithmeticConfig c;
  c.seed = 42;
  c.test_size = 50;
  ArithmeticEnv a(c), b(c);
  c.seed = 43;
  ArithmeticEnv d(c);
  int differ = 0;
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(a.example(Split::train, i).question, b.example(Split::train, i).question);
    EXPECT_EQ(a.example(Split::test, i).question, b.example(Split::test, i).question);
    differ += a.example(Split::train, i).question != d.example(Split::train, i).question;
  }
  EXPECT_GT(differ, 40);
  // Example i does not depend on which examples were asked for before.
  EXPECT_EQ(a.example(Split::train, 1234).question, b.example(Split::train, 1234).question);
}

TEST(Arithmetic, SplitsNeverOverlap) {
  for (int diff = 0; diff <= 3; ++diff) {
    ArithmeticConfig c;
    c.difficulty = diff;
    c.test_size = 300;
    ArithmeticEnv env(c);
    ASSERT_EQ(env.size(Split::test), 300u) << diff;
    std::set<std::string> test;
    for (size_t i = 0; i < env.size(Split::test); ++i) test.insert(env.example(Split::test, i).question);
    EXPECT_EQ(test.size(), 300u);  // distinct
    // Train streams of this seed and of another seed never produce a test problem.
    c.seed = 99;
    ArithmeticEnv other(c);
    for (size_t i = 0; i < 20000; ++i) {
      ASSERT_EQ(test.count(env.example(Split::train, i).question), 0u) << diff << " " << i;
      ASSERT_EQ(test.count(other.example(Split::train, i).question), 0u) << diff << " " << i;
    }
  }
}

TEST(Arithmetic, AnswersMatchTextAndDifficulty) {
  for (auto style : {ArithmeticStyle::compact, ArithmeticStyle::verbose, ArithmeticStyle::expression}) {
    for (int diff = 0; diff <= 3; ++diff) {
      ArithmeticConfig c;
      c.difficulty = diff;
      c.style = style;
      c.test_size = 100;
      ArithmeticEnv env(c);
      size_t max_len = 0;
      for (size_t i = 0; i < 600; ++i) {
        Example ex = env.example(Split::train, i);
        int64_t want = eval_text(ex.question, style);
        ASSERT_EQ(ex.answer, std::to_string(want)) << ex.question;
        ASSERT_GE(want, 0) << ex.question;
        int n_ops = ex.meta["n_ops"];
        ASSERT_EQ(n_ops, diff <= 1 ? 1 : 2) << ex.question;
        if (diff == 0) ASSERT_EQ(ex.question.find("boxes"), std::string::npos);
        max_len = std::max(max_len, ex.question.size());
        ASSERT_EQ(env.score(ex, env.reference_completion(ex)), 1.0f);
        ASSERT_EQ(env.score(ex, "<answer>" + std::to_string(want + 1) + "</answer>"), 0.0f);
      }
      if (style == ArithmeticStyle::compact) EXPECT_LE(max_len, diff <= 2 ? 60u : 64u) << diff;
      if (style == ArithmeticStyle::expression) EXPECT_LE(max_len, 16u) << diff;
    }
  }
}

TEST(Arithmetic, ExampleShape) {
  ArithmeticConfig c;
  c.difficulty = 0;
  ArithmeticEnv env(c);
  Example ex = env.example(Split::train, 0);
  EXPECT_EQ(ex.id, "arith/train/0");
  EXPECT_EQ(env.reference_completion(ex), "<answer>" + ex.answer + "</answer>");
  EXPECT_NE(ex.question.find("How many now?"), std::string::npos) << ex.question;
}

TEST(Arithmetic, ConfigValidation) {
  ArithmeticConfig c;
  c.difficulty = 4;
  Status s = c.validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("difficulty"), std::string::npos);
  c.difficulty = 1;
  c.test_permille = 0;
  EXPECT_FALSE(c.validate().ok());
}

TEST(Arithmetic, Fnv1aKnownVectors) {
  // Published FNV-1a 64 test vectors: "" and "a".
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
}

}  // namespace
}  // namespace grpo
