// GSM8K: gold answers, extraction of a model's final answer, correctness, and
// loading the GSM8K environment from its JSONL files (data/gsm8k/ ships them).
//
// Extraction order (first rule that finds something wins; later rules are not
// consulted even if the found text has no number, because the model committed
// to that answer):
//   1. the last closed <answer>...</answer> block;
//   2. the last \boxed{...} (or \fbox{...}) with balanced braces;
//   3. the text after the last "####" up to the end of its line;
//   4. the last number anywhere in the completion.
// The found text is parsed with answer_to_number (math_answer.h); if it is not
// exactly one number (e.g. "<answer>The total is 18</answer>") the last number
// inside it is used instead.
// Only closed blocks count. The engine cuts a completion's text before a
// matched stop string, so with stop = ["</answer>"] the caller must append
// the matched stop string before scoring (or not stop on it); otherwise rule 1
// never fires and format_strict never matches.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "env/environment.h"
#include "env/math_answer.h"

namespace grpo {

enum class AnswerSource { none, answer_tag, boxed, hashes, last_number };
const char* answer_source_name(AnswerSource s);

struct ExtractedAnswer {
  AnswerSource source = AnswerSource::none;
  std::string text;             // raw text found by the winning rule (trimmed)
  std::optional<Number> value;  // parsed value; nullopt when no number was found
};

ExtractedAnswer extract_answer(std::string_view completion);

// Gold answer of a GSM8K solution: the text after the last "#### ", trimmed,
// with thousands commas removed ("#### 1,200" -> "1200"); nullopt if absent.
std::optional<std::string> gsm8k_gold_answer(std::string_view solution);

// True iff the extracted answer equals the gold answer numerically
// (numbers_equal); a gold that is not a number never matches.
bool gsm8k_is_correct(std::string_view completion, std::string_view gold);

// Removes the calculator annotations "<<48/2=24>>" from a GSM8K solution.
std::string gsm8k_strip_calculator(std::string_view solution);

struct Gsm8kPaths {
  std::string train = "data/gsm8k/train.jsonl";
  std::string test = "data/gsm8k/test.jsonl";
};

// Loads both splits (fields "question" and "answer"; gold = text after "####").
Result<std::unique_ptr<NumericQaEnv>> gsm8k_env_load(const Gsm8kPaths& paths, const JsonlOptions& opt = {});

}  // namespace grpo
