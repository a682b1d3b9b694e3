// `grpo draft-vocab`: the draft vocabulary of speculative decoding (FR-Spec): the N token ids
// that occur most often in a JSONL corpus, for [engine.speculative] draft_vocab. The draft's
// LM head then keeps only those rows, so a draft step reads and scores N rows instead of the
// whole vocabulary; outputs stay exact whatever the ids (the target verifies every id).
// Counts every string value of each line's object (or only --fields), encoded without special
// tokens; the tokenizer's end-of-generation ids are always kept, first. Ties rank by id.
// Output: {"token_ids": [...], "counts": [...], "size", "tokens_counted", "coverage", ...},
// token_ids most frequent first (the engine keeps the first draft_vocab_size of them).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "cli/command.h"
#include "cli/enum_flag.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"
#include "train/run_config.h"

namespace {

using ojson = nlohmann::ordered_json;

struct Args {
  std::string model, tokenizer, preset, out;
  std::vector<std::string> data, fields;
  int64_t size = 32768;
  grpo::BadLinePolicy on_error = grpo::BadLinePolicy::fail;
};

// Every string inside v (objects and arrays walked), or only the named top-level fields.
void strings_of(const ojson& v, std::vector<std::string>& out) {
  if (v.is_string()) out.push_back(v.get<std::string>());
  else if (v.is_structured())
    for (const auto& x : v) strings_of(x, out);
}

int run(const Args& a) {
  const char* cmd = "draft-vocab";
  if (a.model.empty() == a.tokenizer.empty()) return grpo::cli::fail(cmd, "give exactly one of --model DIR or --tokenizer FILE");
  if (a.data.empty()) return grpo::cli::fail(cmd, "give at least one --data FILE.jsonl (text the draft will write)");
  if (a.size < 1) return grpo::cli::fail(cmd, "--size " + std::to_string(a.size) + ": must be >= 1");
  if (a.out.empty()) return grpo::cli::fail(cmd, "give --out FILE.json");
  grpo::TokenizerOptions topt;
  topt.preset = a.preset;
  auto loaded = grpo::Tokenizer::load(a.model.empty() ? a.tokenizer : a.model, topt);
  if (!loaded.ok()) return grpo::cli::fail(cmd, loaded.status().message());
  const grpo::Tokenizer& tok = loaded.value();
  const int V = tok.vocab_size();
  std::vector<int64_t> count(size_t(V), 0);
  int64_t total = 0, lines = 0, skipped = 0;
  for (const std::string& path : a.data) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return grpo::cli::fail(cmd, "--data " + path + ": cannot open");
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::string err;
      ojson row = ojson::parse(line, nullptr, false);
      std::vector<std::string> texts;
      if (row.is_discarded() || !row.is_object()) {
        err = "not a JSON object";
      } else if (a.fields.empty()) {
        strings_of(row, texts);
      } else {
        for (const std::string& f : a.fields)
          if (row.contains(f)) strings_of(row[f], texts);
      }
      std::vector<int> ids;
      for (const std::string& t : texts) {
        if (!err.empty()) break;
        auto r = tok.encode_checked(t, false);
        if (!r.ok()) err = r.status().message();
        else ids.insert(ids.end(), r.value().begin(), r.value().end());
      }
      if (!err.empty()) {
        const std::string where = path + ":" + std::to_string(line_no);
        if (a.on_error == grpo::BadLinePolicy::fail)
          return grpo::cli::fail(cmd, where + ": " + err + " (use --on-error skip to skip such lines)");
        std::fprintf(stderr, "grpo draft-vocab: skipping %s: %s\n", where.c_str(), err.c_str());
        ++skipped;
        continue;
      }
      for (int id : ids)
        if (id >= 0 && id < V) ++count[size_t(id)];
      total += int64_t(ids.size());
      ++lines;
    }
  }
  if (total == 0) return grpo::cli::fail(cmd, "no tokens counted: the --data files hold no text" +
                                                  std::string(a.fields.empty() ? "" : " in the --fields given"));
  // End-of-generation ids first (a draft must be able to propose the end), then by count, then id.
  std::vector<int32_t> order;
  std::unordered_set<int32_t> taken;
  for (int id : tok.eos_ids())
    if (id >= 0 && id < V && taken.insert(id).second) order.push_back(id);
  std::vector<int32_t> seen;
  for (int id = 0; id < V; ++id)
    if (count[size_t(id)] > 0 && !taken.count(id)) seen.push_back(id);
  std::stable_sort(seen.begin(), seen.end(),
                   [&](int32_t x, int32_t y) { return count[size_t(x)] > count[size_t(y)]; });
  for (int32_t id : seen) {
    if (int64_t(order.size()) >= a.size) break;
    order.push_back(id);
  }
  if (int64_t(order.size()) > a.size) order.resize(size_t(a.size));
  int64_t covered = 0;
  ojson counts = ojson::array();
  for (int32_t id : order) {
    covered += count[size_t(id)];
    counts.push_back(count[size_t(id)]);
  }
  ojson j = ojson::object();
  j["token_ids"] = order;
  j["counts"] = counts;
  j["size"] = order.size();
  j["vocab_size"] = V;
  j["tokens_counted"] = total;
  j["coverage"] = double(covered) / double(total);
  j["distinct_ids_seen"] = std::count_if(count.begin(), count.end(), [](int64_t c) { return c > 0; });
  j["data"] = a.data;
  j["tokenizer"] = tok.source();
  if (grpo::Status s = grpo::write_file_atomic(a.out, j.dump(1) + "\n"); !s.ok()) return grpo::cli::fail(cmd, s.message());
  std::printf("[draft-vocab] %zu ids of %d (%lld lines, %lld tokens counted%s): they cover %.2f%% of the tokens; "
              "wrote %s\n",
              order.size(), V, (long long)lines, (long long)total,
              skipped ? (", " + std::to_string(skipped) + " lines skipped").c_str() : "",
              100.0 * double(covered) / double(total), a.out.c_str());
  if (int64_t(order.size()) < a.size)
    std::printf("[draft-vocab] only %zu distinct ids occur in the data (asked for %lld)\n", order.size(),
                (long long)a.size);
  return 0;
}

grpo::cli::CommandRegistrar reg(
    "draft-vocab", "Most frequent token ids of a corpus: a draft vocabulary for speculative decoding (FR-Spec)",
    [](CLI::App* sub) {
      auto a = std::make_shared<Args>();
      sub->add_option("--model", a->model, "model directory (its tokenizer)");
      sub->add_option("--tokenizer", a->tokenizer, "a tokenizer.json file");
      sub->add_option("--preset", a->preset, "pre-tokenizer preset for the vocab/merges form: gpt2, qwen2, llama3");
      sub->add_option("--data", a->data, "JSONL files of text like the outputs the draft will propose (repeatable)");
      sub->add_option("--fields", a->fields, "count only these top-level fields (default: every string)")->delimiter(',');
      sub->add_option("--size", a->size, "ids to keep")->capture_default_str();
      sub->add_option("--out", a->out, "JSON file to write (engine.speculative.draft_vocab)");
      grpo::cli::add_enum(sub, "--on-error", &a->on_error, grpo::bad_line_names(), "Bad JSONL line");
      return [a]() { return run(*a); };
    });

}  // namespace
