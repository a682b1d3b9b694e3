// OpenAI / vLLM request parsing and response shapes (see openai_protocol.h).
#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tokenizer/chat_template.h"

namespace grpo {

namespace {

using Err = std::optional<ApiError>;
constexpr int kMaxJsonDepth = 32;

ApiError bad(const std::string& param, const std::string& msg) { return ApiError{400, msg, "invalid_request_error", param, ""}; }

// Reads an optional integer field; integral floats (2.0) are accepted as pydantic does.
Err get_int(const json& j, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  const json& v = *it;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      return bad(key, std::string("'") + key + "' is out of range (must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "])");
    x = int64_t(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e18) {
    x = int64_t(v.get<double>());
  } else {
    return bad(key, std::string("'") + key + "' must be an integer, got " + (v.is_number() ? "a non-integral or huge number" : std::string("a ") + v.type_name()));
  }
  if (x < lo || x > hi)
    return bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], got " + std::to_string(x));
  out = x;
  return std::nullopt;
}

Err get_float(const json& j, const char* key, double lo, double hi, bool lo_open, std::optional<double>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad(key, std::string("'") + key + "' must be a number");
  const double x = it->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    return bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " +
                        std::to_string(hi) + "], got " + std::to_string(x));
  out = x;
  return std::nullopt;
}

Err get_bool(const json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad(key, std::string("'") + key + "' must be true or false");
  out = it->get<bool>();
  return std::nullopt;
}

Err check_ids(const json& arr, const char* param, const ApiLimits& lim, std::vector<int32_t>& ids) {
  ids.clear();
  for (const auto& v : arr) {
    if (!v.is_number_integer()) return bad(param, std::string("'") + param + "' token ids must be integers");
    const int64_t x = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(1) << 62))
                                             : v.get<int64_t>();
    if (x < 0 || x >= lim.vocab_size)
      return bad(param, std::string("'") + param + "' token id " + std::to_string(x) + " is outside the vocabulary [0, " +
                            std::to_string(lim.vocab_size) + ")");
    ids.push_back(int32_t(x));
  }
  return std::nullopt;
}

Err check_prompt_len(size_t n, const char* param, const ApiLimits& lim) {
  if (n == 0) return bad(param, std::string("'") + param + "' is empty (give at least one token)");
  if (lim.max_prompt_tokens > 0 && n > size_t(lim.max_prompt_tokens))
    return bad(param, "the prompt has " + std::to_string(n) + " tokens, more than this server's limit of " +
                          std::to_string(lim.max_prompt_tokens) + " (--max-prompt-tokens)");
  if (n >= size_t(lim.max_model_len)) {
    ApiError e = bad(param, "this model's maximum context length is " + std::to_string(lim.max_model_len) +
                                " tokens, but the prompt has " + std::to_string(n) + " tokens; shorten it");
    e.code = "context_length_exceeded";
    return e;
  }
  return std::nullopt;
}

Err encode_text(const Tokenizer* tok, const std::string& text, bool add_special, const char* param,
                std::vector<int32_t>& ids) {
  if (!tok) return bad(param, "this server has no tokenizer; send token ids instead of text");
  auto r = tok->encode_checked(text, add_special);
  if (!r.ok()) return bad(param, std::string("'") + param + "': " + r.status().message());
  ids.assign(r.value().begin(), r.value().end());
  return std::nullopt;
}

// Sampling fields shared by every generation endpoint. default_max_tokens < 0: the room
// left in the context.
Err parse_sampling(const json& j, const ApiLimits& lim, int default_max_tokens, const char* max_tokens_key,
                   GenRequest& out) {
  SamplingParams& p = out.params;
  std::optional<int64_t> i;
  std::optional<double> f;
  if (auto e = get_int(j, "n", 1, lim.max_n, i)) {
    if (e->message.find("must be in") != std::string::npos) e->message += " (this server's --max-n is " + std::to_string(lim.max_n) + ")";
    return e;
  }
  if (i) p.n = int(*i);
  i.reset();
  if (j.contains("best_of") && !j["best_of"].is_null()) {
    if (!j["best_of"].is_number_integer() || j["best_of"].get<int64_t>() != p.n)
      return bad("best_of", "'best_of' other than n is not supported by this server; drop it");
  }
  if (auto e = get_float(j, "temperature", 0.0, 1e4, false, f)) return e;
  if (f) p.temperature = float(*f);
  f.reset();
  if (auto e = get_float(j, "top_p", 0.0, 1.0, true, f)) return e;
  if (f) p.top_p = float(*f);
  f.reset();
  if (auto e = get_int(j, "top_k", -1, 1 << 30, i)) return e;
  if (i) p.top_k = *i < 0 ? 0 : int(std::min<int64_t>(*i, lim.vocab_size));
  i.reset();
  if (auto e = get_float(j, "min_p", 0.0, 1.0, false, f)) return e;
  if (f) p.min_p = float(*f);
  f.reset();
  for (const char* k : {"presence_penalty", "frequency_penalty"}) {
    if (auto e = get_float(j, k, -2.0, 2.0, false, f)) return e;
    if (f && *f != 0.0) return bad(k, std::string("'") + k + "' is not supported by this server; drop it or set 0");
    f.reset();
  }
  if (auto e = get_float(j, "repetition_penalty", 0.0, 1e4, true, f)) return e;
  if (f && *f != 1.0) return bad("repetition_penalty", "'repetition_penalty' is not supported by this server; drop it or set 1");
  f.reset();
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() && !(j["logit_bias"].is_object() && j["logit_bias"].empty()))
    return bad("logit_bias", "'logit_bias' is not supported by this server; drop it");
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (it->is_number_unsigned()) p.seed = it->get<uint64_t>();
    else if (it->is_number_integer()) p.seed = uint64_t(it->get<int64_t>());
    else return bad("seed", "'seed' must be an integer");
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    std::vector<std::string> stops;
    if (it->is_string()) stops.push_back(it->get<std::string>());
    else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return bad("stop", "'stop' must be a string or a list of strings");
        stops.push_back(s.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or a list of strings");
    }
    if (stops.size() > 16) return bad("stop", "'stop' has more than 16 strings");
    for (const auto& s : stops) {
      if (s.empty()) return bad("stop", "'stop' strings must not be empty");
      if (s.size() > 1024) return bad("stop", "'stop' strings must be at most 1024 bytes");
    }
    p.stop = std::move(stops);
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 64) return bad("stop_token_ids", "'stop_token_ids' must be a list of at most 64 token ids");
    if (auto e = check_ids(*it, "stop_token_ids", lim, p.stop_token_ids)) return e;
  }
  if (auto e = get_bool(j, "ignore_eos", p.ignore_eos)) return e;
  // grpo.cpp extension (vLLM sets this per server, --logprobs-mode): which distribution the
  // reported logprobs come from. The GRPO loop asks for "processed" when it samples at T != 1.
  if (auto it = j.find("logprobs_mode"); it != j.end() && !it->is_null()) {
    const std::string v = it->is_string() ? it->get<std::string>() : std::string();
    if (v == "raw" || v == "raw_logprobs") p.logprobs_mode = LogprobsMode::raw;
    else if (v == "processed" || v == "processed_logprobs") p.logprobs_mode = LogprobsMode::processed;
    else return bad("logprobs_mode", "'logprobs_mode' must be \"raw\" (log_softmax of the logits, the default) or "
                                     "\"processed\" (the distribution sampled from)");
  }
  if (auto e = get_bool(j, "return_token_ids", out.return_token_ids)) return e;
  if (auto e = get_int(j, max_tokens_key, 1, lim.max_tokens_limit, i)) {
    if (e->message.find("must be in") != std::string::npos)
      e->message += " (this server's --max-tokens-limit is " + std::to_string(lim.max_tokens_limit) + ")";
    return e;
  }
  size_t longest = 0;
  for (const auto& pr : out.prompts) longest = std::max(longest, pr.size());
  const int room = lim.max_model_len - int(longest);
  if (i) {
    if (int64_t(longest) + *i > lim.max_model_len) {
      ApiError e = bad(max_tokens_key, "this model's maximum context length is " + std::to_string(lim.max_model_len) +
                                           " tokens, but " + std::to_string(longest) + " prompt tokens + " +
                                           std::to_string(*i) + " completion tokens were requested; lower '" +
                                           max_tokens_key + "'");
      e.code = "context_length_exceeded";
      return e;
    }
    p.max_tokens = int(*i);
  } else {
    const int want = default_max_tokens < 0 ? lim.max_tokens_limit : default_max_tokens;
    p.max_tokens = std::max(1, std::min(want, room));
  }
  i.reset();
  if (auto e = get_int(j, "min_tokens", 0, p.max_tokens, i)) return e;
  if (i) p.min_tokens = int(*i);
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (auto e = get_bool(*it, "include_usage", out.include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }
  Status st = p.validate(lim.vocab_size);
  if (!st.ok()) return bad("", st.message());
  return std::nullopt;
}

Err parse_model_and_stream(const json& j, GenRequest& out) {
  if (!j.is_object()) return bad("", "the request body must be a JSON object");
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return bad("model", "'model' must be a string");
    out.model = it->get<std::string>();
  }
  return get_bool(j, "stream", out.stream);
}

}  // namespace

json ApiError::to_json() const {
  json e = json::object();
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_body(const std::string& body, ApiError* err) {
  // Nesting is bounded before parsing: later stages (chat templates, dumps) recurse.
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : body) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        *err = bad("", "the request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        return json(nullptr);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *err = bad("", "the request body is not valid JSON; send a JSON object with Content-Type: application/json");
    return json(nullptr);
  }
  if (!j.is_object()) {
    *err = bad("", "the request body must be a JSON object");
    return json(nullptr);
  }
  return j;
}

std::optional<ApiError> parse_completion_request(const json& j, const Tokenizer* tok, const ApiLimits& lim,
                                                 GenRequest& out) {
  out.kind = ApiKind::completion;
  if (auto e = parse_model_and_stream(j, out)) return e;
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return bad("prompt", "'prompt' is required (text, token ids, or a list of either)");
  const json& pr = *it;
  auto add_text = [&](const std::string& s) -> Err {
    std::vector<int32_t> ids;
    if (auto e = encode_text(tok, s, true, "prompt", ids)) return e;
    out.prompts.push_back(std::move(ids));
    out.prompt_texts.push_back(s);
    return std::nullopt;
  };
  auto add_ids = [&](const json& arr) -> Err {
    std::vector<int32_t> ids;
    if (auto e = check_ids(arr, "prompt", lim, ids)) return e;
    out.prompt_texts.push_back(tok ? tok->decode(std::vector<int>(ids.begin(), ids.end())) : std::string());
    out.prompts.push_back(std::move(ids));
    return std::nullopt;
  };
  if (pr.is_string()) {
    if (auto e = add_text(pr.get<std::string>())) return e;
  } else if (pr.is_array() && !pr.empty() && pr[0].is_number()) {
    if (auto e = add_ids(pr)) return e;
  } else if (pr.is_array() && !pr.empty()) {
    if (pr.size() > size_t(lim.max_prompts))
      return bad("prompt", "'prompt' lists " + std::to_string(pr.size()) + " prompts, more than " + std::to_string(lim.max_prompts));
    for (const auto& p : pr) {
      if (p.is_string()) {
        if (auto e = add_text(p.get<std::string>())) return e;
      } else if (p.is_array()) {
        if (auto e = add_ids(p)) return e;
      } else {
        return bad("prompt", "'prompt' list items must be strings or lists of token ids");
      }
    }
  } else {
    return bad("prompt", "'prompt' must be a string, a list of token ids, or a list of either (and not empty)");
  }
  for (const auto& ids : out.prompts)
    if (auto e = check_prompt_len(ids.size(), "prompt", lim)) return e;
  if (auto it2 = j.find("suffix"); it2 != j.end() && !it2->is_null())
    return bad("suffix", "'suffix' is not supported by this server; drop it");
  if (auto e = get_bool(j, "echo", out.echo)) return e;
  std::optional<int64_t> lp;
  if (auto e = get_int(j, "logprobs", 0, lim.max_logprobs, lp)) return e;
  if (lp) out.logprobs = int(*lp);
  if (out.echo && out.logprobs >= 0)
    return bad("echo", "'echo' together with 'logprobs' needs prompt logprobs, which this server does not compute");
  if (auto e = parse_sampling(j, lim, 16, "max_tokens", out)) return e;
  out.params.top_logprobs = std::max(0, out.logprobs);
  if (int64_t(out.prompts.size()) * out.params.n > int64_t(lim.max_prompts) * lim.max_n)
    return bad("n", "too many samples in one request");
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(const json& j, const Tokenizer* tok, const std::string& chat_template,
                                           const ApiLimits& lim, GenRequest& out) {
  out.kind = ApiKind::chat;
  if (auto e = parse_model_and_stream(j, out)) return e;
  const std::string& tmpl = chat_template.empty() && tok ? tok->chat_template() : chat_template;
  if (!tok) return bad("messages", "this server has no tokenizer, so it cannot render chat messages; use /v1/completions with token ids");
  if (tmpl.empty())
    return bad("messages", "the model has no chat template (tokenizer_config.json / chat_template.jinja); "
                           "start the server with --chat-template FILE or use /v1/completions");
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array() || it->empty())
    return bad("messages", "'messages' is required: a non-empty list of {\"role\", \"content\"} objects");
  std::vector<ChatMessage> msgs;
  for (size_t k = 0; k < it->size(); ++k) {
    json m = (*it)[k];
    const std::string param = "messages[" + std::to_string(k) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad(param, "'" + param + "' must be an object with a string 'role'");
    if (m.contains("content") && m["content"].is_array()) {
      // OpenAI content parts: only text parts can be rendered by a text model.
      std::string text;
      for (const auto& part : m["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return bad(param + ".content", "only {\"type\": \"text\", \"text\": ...} content parts are supported");
        text += part["text"].get<std::string>();
      }
      m["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      return bad(param + ".content", "'content' must be a string, a list of text parts, or null");
    }
    auto cm = ChatMessage::from_json(m);
    if (!cm.ok()) return bad(param, cm.status().message());
    msgs.push_back(std::move(cm).value());
  }
  ChatOptions co;
  co.bos_token = tok->bos_token();
  co.eos_token = tok->eos_token();
  if (auto e = get_bool(j, "add_generation_prompt", co.add_generation_prompt)) return e;
  bool cont = false;
  if (auto e = get_bool(j, "continue_final_message", cont)) return e;
  if (cont) return bad("continue_final_message", "'continue_final_message' is not supported by this server");
  if (auto kw = j.find("chat_template_kwargs"); kw != j.end() && !kw->is_null()) {
    if (!kw->is_object()) return bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto k = kw->begin(); k != kw->end(); ++k) {
      if (k.key() == "enable_thinking") {
        if (!k.value().is_boolean()) return bad("chat_template_kwargs.enable_thinking", "'enable_thinking' must be true or false");
        co.enable_thinking = k.value().get<bool>();
      } else if (k.key() == "add_generation_prompt" && k.value().is_boolean()) {
        co.add_generation_prompt = k.value().get<bool>();
      } else {
        co.extra[k.key()] = k.value();
      }
    }
  }
  auto text = render_chat(tmpl, msgs, co);
  if (!text.ok()) return bad("messages", "the chat template failed: " + text.status().message());
  std::vector<int32_t> ids;
  if (auto e = encode_text(tok, text.value(), false, "messages", ids)) return e;
  if (auto e = check_prompt_len(ids.size(), "messages", lim)) return e;
  out.prompts.push_back(std::move(ids));
  out.prompt_texts.push_back(text.value());
  if (auto e = get_bool(j, "logprobs", out.chat_logprobs)) return e;
  std::optional<int64_t> tl;
  if (auto e = get_int(j, "top_logprobs", 0, lim.max_logprobs, tl)) return e;
  if (tl && *tl > 0 && !out.chat_logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  const char* mt = j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null() ? "max_completion_tokens"
                                                                                                  : "max_tokens";
  if (auto e = parse_sampling(j, lim, -1, mt, out)) return e;
  out.params.top_logprobs = tl ? int(*tl) : 0;
  return std::nullopt;
}

std::optional<ApiError> parse_generate_request(const json& j, const Tokenizer* tok, const ApiLimits& lim,
                                               GenRequest& out) {
  out.kind = ApiKind::generate;
  if (auto e = parse_model_and_stream(j, out)) return e;
  if (out.stream) return bad("stream", "streaming is not supported on /generate; use /v1/completions with stream");
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null())
    return bad("prompt", "'prompt' is required: text, or {\"prompt_token_ids\": [...]}");
  std::vector<int32_t> ids;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
    if (auto e = encode_text(tok, text, true, "prompt", ids)) return e;
  } else if (it->is_object() && it->contains("prompt_token_ids") && (*it)["prompt_token_ids"].is_array()) {
    if (auto e = check_ids((*it)["prompt_token_ids"], "prompt.prompt_token_ids", lim, ids)) return e;
    if (tok) text = tok->decode(std::vector<int>(ids.begin(), ids.end()));
  } else if (it->is_array()) {
    if (auto e = check_ids(*it, "prompt", lim, ids)) return e;
    if (tok) text = tok->decode(std::vector<int>(ids.begin(), ids.end()));
  } else {
    return bad("prompt", "'prompt' must be text or {\"prompt_token_ids\": [...]}");
  }
  if (auto e = check_prompt_len(ids.size(), "prompt", lim)) return e;
  out.prompts.push_back(std::move(ids));
  out.prompt_texts.push_back(text);
  std::optional<int64_t> lp;
  if (auto e = get_int(j, "logprobs", 0, lim.max_logprobs, lp)) return e;
  if (lp) out.logprobs = int(*lp);
  // vLLM's SamplingParams default: 16 tokens.
  if (auto e = parse_sampling(j, lim, 16, "max_tokens", out)) return e;
  out.params.top_logprobs = std::max(0, out.logprobs);
  return std::nullopt;
}

const char* api_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    default: return "stop";
  }
}

std::string token_text(const Tokenizer* tok, int32_t id) { return tok ? tok->token_bytes(id) : std::string(); }

json usage_json(const std::vector<RequestOutput>& outs) {
  int64_t p = 0, c = 0;
  for (const auto& o : outs) {
    if (o.sample_index == 0) p += int64_t(o.prompt_ids.size());
    c += int64_t(o.completion_ids.size());
  }
  return json{{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
}

namespace {

json timing_json(const std::vector<RequestOutput>& outs) {
  double ttft = 0, e2e = 0, queue = 0;
  int64_t hits = 0;
  for (const auto& o : outs) {
    ttft = std::max(ttft, o.telemetry.ttft_s);
    e2e = std::max(e2e, o.telemetry.e2e_s);
    queue = std::max(queue, o.telemetry.queue_s);
    hits += o.telemetry.prefix_hit_tokens;
  }
  return json{{"queue_s", queue}, {"ttft_s", ttft}, {"e2e_s", e2e}, {"prefix_hit_tokens", hits}};
}

json ids_json(const std::vector<int32_t>& ids) { return json(ids); }

// Completions logprobs object for tokens [0, n).
json completion_logprobs(const RequestOutput& o, const Tokenizer* tok, int k) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = 0;
  for (size_t t = 0; t < o.completion_ids.size(); ++t) {
    const std::string s = token_text(tok, o.completion_ids[t]);
    tokens.push_back(s);
    lps.push_back(o.logprobs[t]);
    offs.push_back(off);
    off += s.size();
    json top = json::object();
    if (k > 0 && t < o.top_logprobs.size())
      for (const auto& [id, lp] : o.top_logprobs[t]) top[token_text(tok, id)] = lp;
    top[s] = o.logprobs[t];
    tops.push_back(top);
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

json chat_logprob_entry(int32_t id, float lp, const std::vector<std::pair<int32_t, float>>* top, const Tokenizer* tok) {
  const std::string s = token_text(tok, id);
  json e{{"token", s}, {"logprob", lp}, {"bytes", bytes_json(s)}, {"top_logprobs", json::array()}};
  if (top)
    for (const auto& [tid, tlp] : *top) {
      const std::string ts = token_text(tok, tid);
      e["top_logprobs"].push_back(json{{"token", ts}, {"logprob", tlp}, {"bytes", bytes_json(ts)}});
    }
  return e;
}

}  // namespace

json completion_response(const GenRequest& r, const std::vector<RequestOutput>& outs, const Tokenizer* tok,
                         const ResponseMeta& m) {
  json choices = json::array();
  const int n = r.params.n;
  for (size_t k = 0; k < outs.size(); ++k) {
    const RequestOutput& o = outs[k];
    const size_t prompt = k / size_t(n);
    json c{{"index", k}, {"text", (r.echo ? r.prompt_texts[prompt] : std::string()) + o.text}};
    c["logprobs"] = r.logprobs >= 0 ? completion_logprobs(o, tok, r.logprobs) : json(nullptr);
    c["finish_reason"] = api_finish_reason(o.finish_reason);
    if (r.return_token_ids) {
      c["prompt_token_ids"] = ids_json(o.prompt_ids);
      c["token_ids"] = ids_json(o.completion_ids);
    }
    choices.push_back(std::move(c));
  }
  return json{{"id", m.id},          {"object", "text_completion"}, {"created", m.created},
              {"model", m.model},    {"choices", choices},          {"usage", usage_json(outs)},
              {"timing", timing_json(outs)}, {"policy_version", m.policy_version}};
}

json chat_response(const GenRequest& r, const std::vector<RequestOutput>& outs, const Tokenizer* tok,
                   const ResponseMeta& m) {
  json choices = json::array();
  for (size_t k = 0; k < outs.size(); ++k) {
    const RequestOutput& o = outs[k];
    json c{{"index", k}, {"message", json{{"role", "assistant"}, {"content", o.text}}}};
    if (r.chat_logprobs) {
      json content = json::array();
      for (size_t t = 0; t < o.completion_ids.size(); ++t)
        content.push_back(chat_logprob_entry(o.completion_ids[t], o.logprobs[t],
                                             t < o.top_logprobs.size() ? &o.top_logprobs[t] : nullptr, tok));
      c["logprobs"] = json{{"content", content}};
    } else {
      c["logprobs"] = nullptr;
    }
    c["finish_reason"] = api_finish_reason(o.finish_reason);
    if (r.return_token_ids) c["token_ids"] = ids_json(o.completion_ids);
    choices.push_back(std::move(c));
  }
  json j{{"id", m.id}, {"object", "chat.completion"}, {"created", m.created}, {"model", m.model}, {"choices", choices},
         {"usage", usage_json(outs)}};
  if (r.return_token_ids && !outs.empty()) j["prompt_token_ids"] = ids_json(outs[0].prompt_ids);
  j["timing"] = timing_json(outs);
  j["policy_version"] = m.policy_version;
  return j;
}

json generate_response(const GenRequest& r, const std::vector<RequestOutput>& outs, const ResponseMeta& m) {
  json text = json::array(), reasons = json::array();
  for (const auto& o : outs) {
    text.push_back(o.text);
    reasons.push_back(api_finish_reason(o.finish_reason));
  }
  json j{{"text", text}, {"prompt", r.prompt_texts.empty() ? std::string() : r.prompt_texts[0]}, {"finish_reasons", reasons}};
  if (r.logprobs >= 0) {
    // vLLM: per output, per token, [{"<id>": logprob, ...}] with the sampled token first.
    json all = json::array();
    for (const auto& o : outs) {
      json per = json::array();
      for (size_t t = 0; t < o.completion_ids.size(); ++t) {
        json d = json::object();
        d[std::to_string(o.completion_ids[t])] = o.logprobs[t];
        if (t < o.top_logprobs.size())
          for (const auto& [id, lp] : o.top_logprobs[t]) {
            const std::string key = std::to_string(id);
            if (!d.contains(key)) d[key] = lp;
          }
        per.push_back(json::array({d}));
      }
      all.push_back(per);
    }
    j["logprobs"] = all;
  }
  if (r.logprobs >= 0 || r.return_token_ids) {
    j["prompt_token_ids"] = outs.empty() ? json::array() : ids_json(outs[0].prompt_ids);
    json tids = json::array();
    for (const auto& o : outs) tids.push_back(ids_json(o.completion_ids));
    j["token_ids"] = tids;
  }
  j["usage"] = usage_json(outs);
  j["timing"] = timing_json(outs);
  j["policy_version"] = m.policy_version;
  return j;
}

json completion_chunk(const GenRequest& r, int index, const TokenEvent& e, const Tokenizer* tok, const ResponseMeta& m,
                      size_t text_offset) {
  json c{{"index", index}, {"text", e.text_delta}};
  if (r.logprobs >= 0) {
    const std::string s = token_text(tok, e.token);
    json top = json::object();
    for (const auto& [id, lp] : e.top_logprobs) top[token_text(tok, id)] = lp;
    top[s] = e.logprob;
    c["logprobs"] = json{{"tokens", json::array({s})},
                         {"token_logprobs", json::array({e.logprob})},
                         {"top_logprobs", json::array({top})},
                         {"text_offset", json::array({text_offset})}};
  } else {
    c["logprobs"] = nullptr;
  }
  c["finish_reason"] = e.finish_reason == FinishReason::none ? json(nullptr) : json(api_finish_reason(e.finish_reason));
  if (r.return_token_ids) c["token_ids"] = json::array({e.token});
  return json{{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model},
              {"choices", json::array({c})}, {"policy_version", m.policy_version}};
}

json chat_chunk(const GenRequest& r, int index, const TokenEvent* e, bool first, const Tokenizer* tok,
                const ResponseMeta& m) {
  json delta = json::object();
  if (first) {
    delta["role"] = "assistant";
    delta["content"] = "";
  }
  json c{{"index", index}};
  if (e) {
    delta["content"] = e->text_delta;
    if (r.chat_logprobs)
      c["logprobs"] = json{{"content", json::array({chat_logprob_entry(e->token, e->logprob, &e->top_logprobs, tok)})}};
    else
      c["logprobs"] = nullptr;
    if (r.return_token_ids) c["token_ids"] = json::array({e->token});
  } else {
    c["logprobs"] = nullptr;
  }
  c["delta"] = delta;
  c["finish_reason"] = e && e->finish_reason != FinishReason::none ? json(api_finish_reason(e->finish_reason)) : json(nullptr);
  json j{{"id", m.id}, {"object", "chat.completion.chunk"}, {"created", m.created}, {"model", m.model},
         {"choices", json::array({c})}};
  if (first && r.return_token_ids && e == nullptr) j["prompt_token_ids"] = ids_json(r.prompts[0]);
  j["policy_version"] = m.policy_version;
  return j;
}

}  // namespace grpo
