// Data side of the GRPO loop (see loop_data.h).
#include "train/loop_data.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "env/arithmetic.h"
#include "env/gsm8k.h"
#include "tokenizer/chat_template.h"

namespace grpo {

PromptFormat prompt_format_from_config(const RunConfig& cfg) {
  PromptFormat f;
  f.prompt_template = cfg.data.prompt_template;
  f.use_chat_template = cfg.data.use_chat_template;
  f.system_prompt = cfg.data.system_prompt;
  return f;
}

Result<PreparedPrompt> prompt_prepare(const PromptFormat& fmt, const Tokenizer& tok, Example ex) {
  PreparedPrompt p;
  auto user = prompt_render(fmt.prompt_template, ex);
  if (!user.ok()) return user.status().with_context("example " + ex.id);
  if (fmt.use_chat_template) {
    if (tok.chat_template().empty())
      return error_status("data.use_chat_template = true but the tokenizer (" + tok.source() +
                          ") has no chat template; set it to false or use an instruct model's tokenizer");
    std::vector<ChatMessage> msgs;
    auto message = [](const char* role, const std::string& content) {
      ChatMessage m;
      m.role = role;
      m.content = content;
      return m;
    };
    if (!fmt.system_prompt.empty()) msgs.push_back(message("system", fmt.system_prompt));
    msgs.push_back(message("user", user.value()));
    ChatOptions co;
    co.add_generation_prompt = true;
    co.bos_token = tok.bos_token();
    co.eos_token = tok.eos_token();
    co.date = "2026-01-01";  // fixed: the prompt must not depend on the day of the run
    auto text = render_chat(tok.chat_template(), msgs, co);
    if (!text.ok()) return text.status().with_context("chat template, example " + ex.id);
    p.text = std::move(text).value();
    auto ids = tok.encode(p.text, /*add_special_tokens=*/false);
    p.ids.assign(ids.begin(), ids.end());
  } else {
    p.text = std::move(user).value();
    auto ids = tok.encode(p.text, /*add_special_tokens=*/true);
    p.ids.assign(ids.begin(), ids.end());
  }
  if (p.ids.empty()) return error_status("example " + ex.id + ": the prompt tokenizes to nothing");
  p.example = std::move(ex);
  return p;
}

void DataCursor::build_order() {
  if (order_epoch_ == epoch_) return;
  if (shuffle_) {
    order_ = dataset_order(n_, seed_ + uint64_t(epoch_));
  } else {
    order_.resize(n_);
    for (size_t i = 0; i < n_; ++i) order_[i] = i;
  }
  order_epoch_ = epoch_;
}

std::vector<size_t> DataCursor::next(size_t count) {
  GRPO_CHECK(n_ > 0);
  std::vector<size_t> out;
  out.reserve(count);
  while (out.size() < count) {
    if (index_ >= int64_t(n_)) {
      ++epoch_;
      index_ = 0;
    }
    build_order();
    out.push_back(order_[size_t(index_++)]);
  }
  return out;
}

void DataCursor::restore(int64_t epoch, int64_t index) {
  epoch_ = epoch;
  index_ = index;
}

std::vector<size_t> loop_eval_indices(const RunConfig& cfg, const Environment& env, Split split) {
  size_t n = env.size(split);
  int64_t want = cfg.eval.n_prompts > 0 ? cfg.eval.n_prompts : cfg.data.eval_size;
  if (want > 0) n = std::min(n, size_t(want));
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  return idx;
}

}  // namespace grpo
