// `grpo tokenize`: text -> token ids with a model's tokenizer, one JSON object per
// input on stdout: {"ids": [...], "n_tokens": N[, "tokens": [...]]}. Input is --text,
// --jsonl FILE ("-" = stdin) of {"text": ...} objects, or else all of stdin as one text.
// A bad JSONL line is reported with its line number and either stops the run
// (--on-error fail, the default) or is skipped with a message and a final count.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "cli/enum_flag.h"
#include "train/run_config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using ojson = nlohmann::ordered_json;

struct Args {
  std::string model, tokenizer, preset, text, jsonl, system, date, chat_template;
  bool tokens = false, chat = false, add_special = false, no_thinking = false;
  grpo::BadLinePolicy on_error = grpo::BadLinePolicy::fail;
};

// Text -> output object, or an error message.
grpo::Result<ojson> tokenize_one(const grpo::Tokenizer& tok, const Args& a, const std::string& text) {
  std::string input = text;
  if (a.chat) {
    const std::string& tmpl = a.chat_template.empty() ? tok.chat_template() : a.chat_template;
    if (tmpl.empty())
      return grpo::error_status("--chat: " + tok.source() + " has no chat template (tokenizer_config.json / chat_template.jinja); pass --chat-template FILE");
    std::vector<grpo::ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", text});
    grpo::ChatOptions opt;
    opt.add_generation_prompt = true;
    opt.bos_token = tok.bos_token();
    opt.eos_token = tok.eos_token();
    opt.date = a.date;
    if (a.no_thinking) opt.enable_thinking = false;
    auto r = grpo::render_chat(tmpl, msgs, opt);
    if (!r.ok()) return r.status();
    input = r.value();
  }
  // Chat prompts carry their special tokens already (HF apply_chat_template does the same).
  auto ids = tok.encode_checked(input, a.add_special && !a.chat);
  if (!ids.ok()) return ids.status();
  ojson out = ojson::object();
  out["ids"] = ids.value();
  out["n_tokens"] = ids.value().size();
  if (a.tokens) {
    ojson t = ojson::array();
    for (int id : ids.value()) t.push_back(tok.id_to_token(id));
    out["tokens"] = t;
  }
  return out;
}

void emit(const ojson& j) {
  std::string s = j.dump(-1, ' ', false, ojson::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

int run(const Args& a) {
  const char* cmd = "tokenize";
  if (a.model.empty() == a.tokenizer.empty()) return grpo::cli::fail(cmd, "give exactly one of --model DIR or --tokenizer FILE");
  if (!a.text.empty() && !a.jsonl.empty()) return grpo::cli::fail(cmd, "give --text or --jsonl, not both");
  grpo::TokenizerOptions opt;
  opt.preset = a.preset;
  auto loaded = grpo::Tokenizer::load(a.model.empty() ? a.tokenizer : a.model, opt);
  if (!loaded.ok()) return grpo::cli::fail(cmd, loaded.status().message());
  const grpo::Tokenizer& tok = loaded.value();
  Args args = a;
  if (!a.chat_template.empty()) {  // the option holds a path; keep the template text instead
    std::ifstream f(a.chat_template, std::ios::binary);
    if (!f) return grpo::cli::fail(cmd, "cannot open chat template " + a.chat_template);
    std::ostringstream ss;
    ss << f.rdbuf();
    args.chat_template = ss.str();
  }

  if (a.jsonl.empty()) {  // one text: --text or all of stdin
    std::string text = a.text;
    if (text.empty()) {
      std::ostringstream ss;
      ss << std::cin.rdbuf();
      text = ss.str();
    }
    auto r = tokenize_one(tok, args, text);
    if (!r.ok()) return grpo::cli::fail(cmd, r.status().message());
    emit(r.value());
    return 0;
  }

  std::ifstream file;
  std::istream* in = &std::cin;
  if (a.jsonl != "-") {
    file.open(a.jsonl, std::ios::binary);
    if (!file) return grpo::cli::fail(cmd, "cannot open " + a.jsonl);
    in = &file;
  }
  std::string line;
  size_t line_no = 0, n_ok = 0, n_skipped = 0;
  while (std::getline(*in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string err;
    ojson row = ojson::parse(line, nullptr, false);
    ojson out;
    if (row.is_discarded()) {
      err = "not valid JSON";
    } else if (!row.is_object() || !row.contains("text") || !row["text"].is_string()) {
      err = "expected an object with a string \"text\"";
    } else {
      auto r = tokenize_one(tok, args, row["text"].get<std::string>());
      if (r.ok()) out = std::move(r.value());
      else err = r.status().message();
    }
    std::string where = a.jsonl + ":" + std::to_string(line_no);
    if (!err.empty()) {
      if (a.on_error == grpo::BadLinePolicy::fail) return grpo::cli::fail(cmd, where + ": " + err + " (use --on-error skip to skip such lines)");
      std::fprintf(stderr, "grpo tokenize: skipping %s: %s\n", where.c_str(), err.c_str());
      ++n_skipped;
      continue;
    }
    ojson tagged = ojson::object();
    tagged["line"] = line_no;  // keeps outputs traceable to inputs when lines are skipped
    if (row.contains("id")) tagged["id"] = row["id"];
    tagged.update(out);
    emit(tagged);
    ++n_ok;
  }
  if (n_skipped) std::fprintf(stderr, "grpo tokenize: %zu lines tokenized, %zu skipped\n", n_ok, n_skipped);
  return 0;
}

grpo::cli::CommandRegistrar reg("tokenize", "Tokenize text with a model's tokenizer (JSON lines out)", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("--model", a->model, "model directory (tokenizer.json, or vocab/merges + --preset)");
  sub->add_option("--tokenizer", a->tokenizer, "a tokenizer.json file");
  sub->add_option("--preset", a->preset, "pre-tokenizer preset for the vocab/merges form: gpt2, qwen2, llama3");
  sub->add_option("--text", a->text, "text to tokenize (default: all of stdin)");
  sub->add_option("--jsonl", a->jsonl, "JSONL file of {\"text\": ...} objects, '-' for stdin");
  sub->add_flag("--tokens", a->tokens, "also print the token strings");
  sub->add_flag("--chat", a->chat, "render the text as a user message through the chat template first");
  sub->add_option("--system", a->system, "with --chat: a system message");
  sub->add_option("--date", a->date, "with --chat: date for strftime_now (YYYY-MM-DD; default today)");
  sub->add_option("--chat-template", a->chat_template, "with --chat: a .jinja file instead of the tokenizer's template");
  sub->add_flag("--no-thinking", a->no_thinking, "with --chat: enable_thinking=false (Qwen3)");
  sub->add_flag("--add-special", a->add_special, "add the tokenizer's bos/eos (post-processor) tokens");
  grpo::cli::add_enum(sub, "--on-error", &a->on_error, grpo::bad_line_names(), "Bad JSONL line");
  return [a]() { return run(*a); };
});

}  // namespace
