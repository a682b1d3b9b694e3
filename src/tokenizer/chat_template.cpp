// render_chat(): builds the template variables and runs the Jinja subset (jinja.h).
#include "tokenizer/chat_template.h"

#include <ctime>

#include "tokenizer/jinja.h"

namespace grpo {

nlohmann::ordered_json ChatMessage::to_json() const {
  nlohmann::ordered_json j = {{"role", role}, {"content", content}};
  if (tool_calls) j["tool_calls"] = *tool_calls;
  if (reasoning_content) j["reasoning_content"] = *reasoning_content;
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

Result<ChatMessage> ChatMessage::from_json(const nlohmann::ordered_json& j) {
  if (!j.is_object() || !j.contains("role") || !j["role"].is_string())
    return error_status("chat message needs a string \"role\": " + j.dump());
  ChatMessage m;
  m.role = j["role"].get<std::string>();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "role") continue;
    if (k == "content" && it.value().is_string()) m.content = it.value().get<std::string>();
    else if (k == "tool_calls") m.tool_calls = it.value();
    else if (k == "reasoning_content" && it.value().is_string()) m.reasoning_content = it.value().get<std::string>();
    else m.extra[k] = it.value();  // e.g. content: null, tool_call_id, name
  }
  return m;
}

Result<std::string> render_chat(const std::string& template_src, const std::vector<ChatMessage>& messages,
                                const ChatOptions& opt) {
  try {
    jinja::Body body = jinja::parse_template(template_src);
    jinja::RenderEnv env;
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (auto& m : messages) msgs.push_back(m.to_json());
    env.globals["messages"] = jinja::from_json(msgs);
    env.globals["add_generation_prompt"] = jinja::Value::make_bool(opt.add_generation_prompt);
    env.globals["tools"] = jinja::from_json(opt.tools);
    env.globals["documents"] = jinja::Value::make_none();
    if (opt.enable_thinking) env.globals["enable_thinking"] = jinja::Value::make_bool(*opt.enable_thinking);
    if (!opt.bos_token.empty()) env.globals["bos_token"] = jinja::Value::make_str(opt.bos_token);
    if (!opt.eos_token.empty()) env.globals["eos_token"] = jinja::Value::make_str(opt.eos_token);
    if (!opt.pad_token.empty()) env.globals["pad_token"] = jinja::Value::make_str(opt.pad_token);
    for (auto it = opt.extra.begin(); it != opt.extra.end(); ++it) env.globals[it.key()] = jinja::from_json(it.value());
    env.date_ymd = opt.date;
    if (env.date_ymd.empty()) {
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[16];
      std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
      env.date_ymd = buf;
    }
    return jinja::render(body, env);
  } catch (const jinja::TemplateError& e) {
    return error_status(e.what());
  }
}

}  // namespace grpo
