// Synthetic arithmetic word problems. Contract in arithmetic.h.
#include "env/arithmetic.h"

#include <unordered_set>

#include "core/check.h"
#include "env/gsm8k.h"

namespace grpo {

namespace {

const char* const kNames[] = {"Tom", "Ann", "Sam", "Mia", "Ben", "Zoe", "Max", "Eva", "Leo", "Amy"};
const char* const kItems[] = {"apples", "pens", "cards", "eggs", "books", "coins", "toys", "cups"};
constexpr uint64_t kTrainSalt = 0x747261696eull;  // "train"
constexpr uint64_t kTestSalt = 0x74657374ull;     // "test"

// Uniform integer in [lo, hi] from the stream (modulo bias < 2^-50, irrelevant here).
int64_t draw(uint64_t* st, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(splitmix64_next(st) % static_cast<uint64_t>(hi - lo + 1));
}

struct Level {
  int min_ops, max_ops;
  int64_t max_operand;
  int64_t max_factor;  // for x; 0 = no multiplication
};

Level level_of(int difficulty) {
  switch (difficulty) {
    case 0: return {1, 1, 9, 0};
    case 1: return {1, 1, 12, 9};
    case 2: return {2, 2, 20, 12};
    default: return {2, 2, 50, 12};
  }
}

}  // namespace

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

Status ArithmeticConfig::validate() const {
  if (difficulty < 0 || difficulty > 3)
    return error_status("data.arithmetic.difficulty = " + std::to_string(difficulty) + ": must be 0..3");
  if (test_permille < 1 || test_permille > 900)
    return error_status("data.arithmetic.test_permille = " + std::to_string(test_permille) + ": must be 1..900");
  if (train_size == 0) return error_status("data.arithmetic.train_size must be > 0");
  return ok_status();
}

// The problem is a start value followed by 0-2 "+b" / "-b" steps, evaluated in
// order. The start is either "a" or, with multiplication, "a boxes of b" (a*b),
// which counts as one operation. Subtractions never go below zero.
ArithmeticProblem arithmetic_generate(uint64_t* st, int difficulty, ArithmeticStyle style) {
  Level lv = level_of(difficulty);
  ArithmeticProblem p;
  p.n_ops = static_cast<int>(draw(st, lv.min_ops, lv.max_ops));
  const std::string name = kNames[draw(st, 0, 9)];
  const std::string item = kItems[draw(st, 0, 7)];
  bool product = lv.max_factor > 0 && draw(st, 0, 2) == 0;
  int64_t a = draw(st, 2, product ? lv.max_factor : lv.max_operand);
  int64_t b = product ? draw(st, 2, lv.max_factor) : 0;
  int64_t value = product ? a * b : a;
  std::string text, expr;
  if (style == ArithmeticStyle::expression) {
    expr = product ? std::to_string(a) + "*" + std::to_string(b) : std::to_string(a);
  } else if (style == ArithmeticStyle::compact) {
    text = product ? name + " has " + std::to_string(a) + " boxes of " + std::to_string(b) + " " + item
                   : name + " has " + std::to_string(a) + " " + item;
  } else {
    text = product ? name + " has " + std::to_string(a) + " boxes with " + std::to_string(b) + " " + item + " in each box."
                   : name + " has " + std::to_string(a) + " " + item + ".";
  }
  int steps = p.n_ops - (product ? 1 : 0);
  if (steps == 0 && !product) steps = 1;
  for (int s = 0; s < steps; ++s) {
    bool plus = value == 0 || draw(st, 0, 1) == 0;
    int64_t c = plus ? draw(st, 1, lv.max_operand) : draw(st, 1, std::min(value, lv.max_operand));
    value += plus ? c : -c;
    std::string cs = std::to_string(c);
    if (style == ArithmeticStyle::expression) {
      expr += (plus ? "+" : "-") + cs;
    } else if (style == ArithmeticStyle::compact) {
      if (steps == 1) text += plus ? ", gets " + cs + " more" : ", gives away " + cs;
      else text += plus ? ", gets " + cs : ", loses " + cs;
    } else {
      text += plus ? " Then " + name + " buys " + cs + " more." : " Then " + name + " gives " + cs + " away.";
    }
  }
  p.n_ops = steps + (product ? 1 : 0);
  if (style == ArithmeticStyle::expression) p.text = expr + "=?";
  else if (style == ArithmeticStyle::compact) p.text = text + ". How many now?";
  else p.text = text + " How many " + item + " does " + name + " have now?";
  p.answer = value;
  return p;
}

ArithmeticEnv::ArithmeticEnv(const ArithmeticConfig& cfg) : cfg_(cfg) {
  GRPO_CHECK_MSG(cfg.validate().ok(), "ArithmeticConfig must be validated before use");
  uint64_t st = cfg_.seed ^ kTestSalt;
  std::unordered_set<std::string> seen;
  // The space may hold fewer distinct test problems than asked: stop after a
  // bounded number of draws instead of looping forever.
  size_t budget = 1000 * cfg_.test_size + 10000;
  for (size_t tries = 0; test_.size() < cfg_.test_size && tries < budget; ++tries) {
    ArithmeticProblem p = arithmetic_generate(&st, cfg_.difficulty, cfg_.style);
    if (!in_test_bucket(p.text) || !seen.insert(p.text).second) continue;
    test_.push_back(std::move(p));
  }
}

bool ArithmeticEnv::in_test_bucket(std::string_view text) const {
  return fnv1a64(text) % 1000 < static_cast<uint64_t>(cfg_.test_permille);
}

Example ArithmeticEnv::make_example(Split s, size_t i, const ArithmeticProblem& p) const {
  Example ex;
  ex.id = std::string("arith/") + split_name(s) + "/" + std::to_string(i);
  ex.question = p.text;
  ex.answer = std::to_string(p.answer);
  ex.meta["n_ops"] = p.n_ops;
  ex.meta["difficulty"] = cfg_.difficulty;
  return ex;
}

Example ArithmeticEnv::example(Split s, size_t i) const {
  GRPO_CHECK(i < size(s));
  if (s == Split::test) return make_example(s, i, test_[i]);
  // Stream i: its own RNG state, so example i does not depend on earlier ones.
  uint64_t st = cfg_.seed ^ kTrainSalt;
  st = splitmix64_next(&st) ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
  while (true) {
    ArithmeticProblem p = arithmetic_generate(&st, cfg_.difficulty, cfg_.style);
    if (!in_test_bucket(p.text)) return make_example(s, i, p);
  }
}

float ArithmeticEnv::score(const Example& ex, std::string_view completion) const {
  return gsm8k_is_correct(completion, ex.answer) ? 1.0f : 0.0f;
}

std::string ArithmeticEnv::reference_completion(const Example& ex) const {
  return "<answer>" + ex.answer + "</answer>";
}

}  // namespace grpo
