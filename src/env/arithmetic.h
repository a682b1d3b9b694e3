// Synthetic arithmetic word problems: the environment of the embedded demo.
// A seeded generator writes short problems ("Tom has 3 apples, gets 4 more.
// How many now?") with integer gold answers; the reference completion is
// "<answer>N</answer>".
//
// Determinism: everything derives from ArithmeticConfig::seed through
// splitmix64 (dataset.h), never from std:: distributions, so the same seed
// gives the same problems on every platform and standard library.
//
// Splits never overlap: a problem belongs to the test split iff the FNV-1a
// 64-bit hash of its text falls in the test bucket (hash % 1000 <
// test_permille). This holds for every seed, so even train and test sets made
// from different seeds are disjoint. Train example i is the first problem of
// stream i that hashes to train; the test set is a fixed list of distinct
// problems that hash to test.
//
// Difficulty: 0: one + or - with operands 1..9; 1: one operation of + - x,
// operands up to 12; 2: two operations, operands up to 20; 3: two operations,
// operands up to 50 (x factors stay <= 12). Answers are never negative.
#pragma once
#include <cstdint>
#include <string>

#include "env/environment.h"

namespace grpo {

enum class ArithmeticStyle {
  compact,     // "Tom has 3 apples, gets 4 more. How many now?" (<= ~60 chars)
  verbose,     // full sentences, "How many apples does Tom have now?"
  expression,  // "3+4*2=?"
};

struct ArithmeticConfig {
  uint64_t seed = 1;
  int difficulty = 1;                // 0..3
  ArithmeticStyle style = ArithmeticStyle::compact;
  size_t train_size = 100000;        // examples addressable in the train split
  size_t test_size = 500;            // distinct test problems (fewer if the space is smaller)
  int test_permille = 100;           // share of the problem space reserved for test
  Status validate() const;
};

struct ArithmeticProblem {
  std::string text;
  int64_t answer = 0;
  int n_ops = 0;
};

// FNV-1a 64-bit hash of a string (the split criterion).
uint64_t fnv1a64(std::string_view s);

// One problem from an RNG state (advances *state). Exposed for tests/tools.
ArithmeticProblem arithmetic_generate(uint64_t* state, int difficulty, ArithmeticStyle style);

class ArithmeticEnv : public Environment {
 public:
  // cfg must satisfy cfg.validate().
  explicit ArithmeticEnv(const ArithmeticConfig& cfg);
  std::string name() const override { return "arithmetic"; }
  size_t size(Split s) const override { return s == Split::train ? cfg_.train_size : test_.size(); }
  Example example(Split s, size_t i) const override;
  float score(const Example& ex, std::string_view completion) const override;
  std::string reference_completion(const Example& ex) const override;
  bool in_test_bucket(std::string_view text) const;

 private:
  Example make_example(Split s, size_t i, const ArithmeticProblem& p) const;
  ArithmeticConfig cfg_;
  std::vector<ArithmeticProblem> test_;
};

}  // namespace grpo
