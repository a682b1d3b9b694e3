// Chat templates: renders a conversation through a model's Jinja chat template the way
// transformers' apply_chat_template does (jinja2 with trim_blocks + lstrip_blocks,
// `tools`/`documents` = None unless given, special tokens as variables). A template
// construct outside the supported subset is an error naming it and its line.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace grpo {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool" | ...
  std::string content;
  std::optional<nlohmann::ordered_json> tool_calls;      // list of {"type", "function": {...}}
  std::optional<std::string> reasoning_content;          // Qwen3 thinking, when kept apart
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // other keys, passed through

  // The message as the template sees it: {"role", "content", then the optional keys}.
  nlohmann::ordered_json to_json() const;
  // Accepts {"role": ..., "content": ...(string or null), ...}.
  static Result<ChatMessage> from_json(const nlohmann::ordered_json& j);
};

struct ChatOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // Qwen3; unset = the variable is undefined
  std::string bos_token, eos_token, pad_token;  // exposed to the template when non-empty
  std::string date;  // YYYY-MM-DD for strftime_now(); empty = today (UTC)
  nlohmann::ordered_json tools;  // null = None, as HF passes when no tools are given
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables (e.g. date_string)
};

Result<std::string> render_chat(const std::string& template_src, const std::vector<ChatMessage>& messages,
                                const ChatOptions& opt);

}  // namespace grpo
