// Examples and datasets: what an environment hands the GRPO loop.
// An Example is one prompt with its gold answer and free-form metadata; a
// Dataset is an in-memory list of them, loaded from JSONL with a field mapping.
// Prompts here are plain text; the chat template and tokenization are applied
// by the caller (tokenizer layer), not here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "env/jsonl.h"

namespace grpo {

struct Example {
  std::string id;        // stable id, e.g. "gsm8k/train/17" or "arith/test/3"
  std::string question;  // user-facing problem text (before any template)
  std::string answer;    // gold final answer as text, e.g. "72" (already extracted)
  std::string solution;  // full reference solution when the data has one (may be empty)
  nlohmann::json meta = nlohmann::json::object();  // extra fields of the source row
};

// How to read an Example from a JSON object. Field names may be dotted paths
// into nested objects ("data.question"). The answer value may be a string or
// a number. When `answer_is_solution` is set, the field holds a GSM8K-style
// worked solution and the gold answer is the text after its last "#### ".
struct FieldMap {
  std::string prompt_field = "question";
  std::string answer_field = "answer";
  std::string id_field;  // empty: ids are "<name>/<row index>"
  bool answer_is_solution = false;
};

struct Dataset {
  std::string name;  // e.g. "gsm8k/train"
  std::vector<Example> examples;
  JsonlReport report;  // what the reader saw (bad lines skipped, ...)
  size_t size() const { return examples.size(); }
};

// Loads a JSONL file and maps each row to an Example. A row that lacks a
// mapped field (or has the wrong type) is a bad row: it fails the load, or
// under BadLinePolicy::skip is counted in report.n_bad with "file:line: ...".
Result<Dataset> dataset_load_jsonl(const std::string& path, const std::string& name,
                                   const FieldMap& map, const JsonlOptions& opt = {});

// Looks up a dotted path ("a.b.c") in a JSON object; nullptr if absent.
const nlohmann::json* json_find_path(const nlohmann::json& obj, const std::string& path);

// Substitutes {question}, {answer} and {id} in a prompt template. "{{" and "}}"
// are literal braces. Unknown placeholders are an error naming the placeholder.
Result<std::string> prompt_render(const std::string& tmpl, const Example& ex);

// Deterministic shuffled order of [0, n) from a seed (Fisher-Yates over a
// splitmix64 stream, so the order is the same on every platform).
std::vector<size_t> dataset_order(size_t n, uint64_t seed);

// splitmix64 step: the project-independent PRNG used by environments so that
// generated data does not depend on the standard library's distributions.
uint64_t splitmix64_next(uint64_t* state);

}  // namespace grpo
