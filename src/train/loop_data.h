// Data side of the GRPO loop: the environment built from the run config, the
// prompt text and token ids of an example (prompt template, optional chat
// template with a system prompt), and the cursor over the train split whose
// position (epoch, index) is all a checkpoint needs to continue the order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "env/environment.h"
#include "tokenizer/tokenizer.h"
#include "train/run_config.h"

namespace grpo {

// The environment comes from run_config_make_env (train/run_config.h).

struct PromptFormat {
  std::string prompt_template = "{question}";
  bool use_chat_template = false;
  std::string system_prompt;  // chat template only; empty = no system turn
};
PromptFormat prompt_format_from_config(const RunConfig& cfg);

struct PreparedPrompt {
  Example example;
  std::string text;          // what the model sees (after the templates)
  std::vector<int32_t> ids;  // tokenized text
};

// Renders and tokenizes one example. With the chat template the rendered text
// carries its own special tokens; without it the tokenizer's BOS rule applies.
// Errors name the example (template errors, a tokenizer without a chat template).
Result<PreparedPrompt> prompt_prepare(const PromptFormat& fmt, const Tokenizer& tok, Example ex);

// Walks the train split in a seeded order, epoch after epoch. Epoch e uses
// dataset_order(n, seed + e) (identity when !shuffle); the order is rebuilt on
// demand, so (epoch, index) restore the cursor exactly.
class DataCursor {
 public:
  DataCursor(size_t n, uint64_t seed, bool shuffle) : n_(n), seed_(seed), shuffle_(shuffle) {}
  // Example indices of the next `count` prompts (crossing epochs as needed).
  std::vector<size_t> next(size_t count);
  void restore(int64_t epoch, int64_t index);
  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }

 private:
  void build_order();
  size_t n_;
  uint64_t seed_;
  bool shuffle_;
  int64_t epoch_ = 0, index_ = 0;
  int64_t order_epoch_ = -1;
  std::vector<size_t> order_;
};

// Indices of the eval set: the first n examples of the eval split (n from
// eval.n_prompts, else data.eval_size, else the whole split).
std::vector<size_t> loop_eval_indices(const RunConfig& cfg, const Environment& env, Split split);

}  // namespace grpo
