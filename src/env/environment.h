// Environment interface: a source of Examples with a task score. The GRPO loop
// asks for prompts by split and index and scores completions; reward
// functions (rewards.h) build on the same answer checking.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "env/dataset.h"

namespace grpo {

enum class Split { train, test };
const char* split_name(Split s);

class Environment {
 public:
  virtual ~Environment() = default;
  virtual std::string name() const = 0;
  // Number of distinct examples in a split.
  virtual size_t size(Split s) const = 0;
  // Example i of a split; precondition i < size(s).
  virtual Example example(Split s, size_t i) const = 0;
  // Task score of a completion in [0, 1] (1 = correct final answer).
  virtual float score(const Example& ex, std::string_view completion) const = 0;
  // Completion text an SFT warm-up would train on for this example.
  virtual std::string reference_completion(const Example& ex) const = 0;
};

// Environment over a loaded train/test pair whose gold answers are numbers
// (GSM8K, or any JSONL with prompt/answer fields). Scoring: gsm8k_is_correct.
class NumericQaEnv : public Environment {
 public:
  NumericQaEnv(std::string name, Dataset train, Dataset test)
      : name_(std::move(name)), train_(std::move(train)), test_(std::move(test)) {}
  std::string name() const override { return name_; }
  size_t size(Split s) const override { return (s == Split::train ? train_ : test_).size(); }
  Example example(Split s, size_t i) const override;
  float score(const Example& ex, std::string_view completion) const override;
  std::string reference_completion(const Example& ex) const override;
  const Dataset& dataset(Split s) const { return s == Split::train ? train_ : test_; }

 private:
  std::string name_;
  Dataset train_, test_;
};

}  // namespace grpo
