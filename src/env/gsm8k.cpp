// GSM8K answer extraction and environment. Contract in gsm8k.h.
#include "env/gsm8k.h"

#include "core/check.h"

namespace grpo {

namespace {

std::string trim_copy(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// Content of the last closed <answer>...</answer>; the opening tag paired with
// the last closing tag is the nearest "<answer>" before it.
std::optional<std::string> last_answer_block(std::string_view t) {
  size_t close = t.rfind("</answer>");
  if (close == std::string_view::npos) return std::nullopt;
  size_t open = t.rfind("<answer>", close);
  if (open == std::string_view::npos) return std::nullopt;
  return std::string(t.substr(open + 8, close - open - 8));
}

}  // namespace

const char* answer_source_name(AnswerSource s) {
  switch (s) {
    case AnswerSource::none: return "none";
    case AnswerSource::answer_tag: return "answer_tag";
    case AnswerSource::boxed: return "boxed";
    case AnswerSource::hashes: return "hashes";
    case AnswerSource::last_number: return "last_number";
  }
  return "?";
}

const char* split_name(Split s) { return s == Split::train ? "train" : "test"; }

ExtractedAnswer extract_answer(std::string_view c) {
  ExtractedAnswer r;
  if (auto a = last_answer_block(c)) {
    r.source = AnswerSource::answer_tag;
    r.text = trim_copy(*a);
  } else if (auto b = last_boxed_content(c)) {
    r.source = AnswerSource::boxed;
    r.text = trim_copy(*b);
  } else if (size_t h = c.rfind("####"); h != std::string_view::npos) {
    size_t eol = c.find('\n', h);
    r.source = AnswerSource::hashes;
    r.text = trim_copy(c.substr(h + 4, eol == std::string_view::npos ? std::string_view::npos : eol - h - 4));
  } else if (auto n = last_number_in(c)) {
    r.source = AnswerSource::last_number;
    r.text = *n;
  } else {
    return r;
  }
  r.value = answer_to_number(r.text);
  if (!r.value) {
    if (auto n = last_number_in(r.text)) r.value = answer_to_number(*n);
  }
  return r;
}

std::optional<std::string> gsm8k_gold_answer(std::string_view solution) {
  size_t h = solution.rfind("####");
  if (h == std::string_view::npos) return std::nullopt;
  std::string t = trim_copy(solution.substr(h + 4));
  std::string out;
  for (char ch : t)
    if (ch != ',') out += ch;
  if (out.empty()) return std::nullopt;
  return out;
}

bool gsm8k_is_correct(std::string_view completion, std::string_view gold) {
  auto g = answer_to_number(gold);
  if (!g) return false;
  ExtractedAnswer e = extract_answer(completion);
  return e.value && numbers_equal(*e.value, *g);
}

std::string gsm8k_strip_calculator(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t open = s.find("<<", i);
    if (open == std::string_view::npos) break;
    size_t close = s.find(">>", open + 2);
    if (close == std::string_view::npos) break;
    out.append(s.substr(i, open - i));
    i = close + 2;
  }
  out.append(s.substr(i));
  return out;
}

Example NumericQaEnv::example(Split s, size_t i) const {
  const Dataset& d = dataset(s);
  GRPO_CHECK(i < d.size());
  return d.examples[i];
}

float NumericQaEnv::score(const Example& ex, std::string_view completion) const {
  return gsm8k_is_correct(completion, ex.answer) ? 1.0f : 0.0f;
}

std::string NumericQaEnv::reference_completion(const Example& ex) const {
  if (ex.solution.empty()) return "<answer>" + ex.answer + "</answer>";
  std::string steps = gsm8k_strip_calculator(ex.solution);
  size_t h = steps.rfind("####");
  if (h != std::string::npos) steps = trim_copy(std::string_view(steps).substr(0, h));
  return "<think>" + steps + "</think><answer>" + ex.answer + "</answer>";
}

Result<std::unique_ptr<NumericQaEnv>> gsm8k_env_load(const Gsm8kPaths& paths, const JsonlOptions& opt) {
  FieldMap map;
  map.prompt_field = "question";
  map.answer_field = "answer";
  map.answer_is_solution = true;
  GRPO_ASSIGN_OR_RETURN(Dataset train, dataset_load_jsonl(paths.train, "gsm8k/train", map, opt));
  GRPO_ASSIGN_OR_RETURN(Dataset test, dataset_load_jsonl(paths.test, "gsm8k/test", map, opt));
  return std::make_unique<NumericQaEnv>("gsm8k", std::move(train), std::move(test));
}

}  // namespace grpo
