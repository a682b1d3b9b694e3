// Request parsing and response shapes of the OpenAI / vLLM HTTP API:
// /v1/completions, /v1/chat/completions, vLLM's /generate, /tokenize, /detokenize.
//
// Parsing validates every field once, at the boundary, and reports the first bad
// one as an ApiError naming it (the OpenAI error object's `param`). Unknown fields
// are ignored, as the OpenAI and vLLM servers do. JSON is dumped with invalid UTF-8
// replaced (U+FFFD), so a token that splits a character never breaks a response.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace grpo {

using json = nlohmann::ordered_json;

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  json to_json() const;
};

// Server-side limits and context the parsers check requests against.
struct ApiLimits {
  int max_prompt_tokens = 0;  // 0: only the model's context length limits prompts
  int max_tokens_limit = 4096;  // most completion tokens one sample may ask for
  int max_n = 16;               // most samples per prompt
  int max_logprobs = 20;        // most top logprobs per token
  int max_prompts = 64;         // most prompts in one /v1/completions list
  int max_model_len = 0;        // the engine's context length
  int vocab_size = 0;
};

enum class ApiKind { completion, chat, generate };

// A parsed generation request of any endpoint.
struct GenRequest {
  ApiKind kind = ApiKind::completion;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;  // one per prompt (completions may have several)
  std::vector<std::string> prompt_texts;      // the text of each prompt (decoded when given as ids)
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool echo = false;              // completions: prepend the prompt text
  int logprobs = -1;              // completions/generate: top count (0 = chosen token only); -1: none
  bool chat_logprobs = false;     // chat: logprobs = true
  bool return_token_ids = false;  // vLLM's return_token_ids
};

json parse_body(const std::string& body, ApiError* err);  // null json + err on failure

// Each fills `out` or returns an error naming the field. The chat template comes
// from the tokenizer unless chat_template is non-empty.
std::optional<ApiError> parse_completion_request(const json& j, const Tokenizer* tok, const ApiLimits& lim,
                                                 GenRequest& out);
std::optional<ApiError> parse_chat_request(const json& j, const Tokenizer* tok, const std::string& chat_template,
                                           const ApiLimits& lim, GenRequest& out);
std::optional<ApiError> parse_generate_request(const json& j, const Tokenizer* tok, const ApiLimits& lim,
                                               GenRequest& out);

// Response bodies (non-streaming). outs: prompt-major, n samples per prompt.
struct ResponseMeta {
  std::string id, model;
  int64_t created = 0;
  int64_t policy_version = 0;
};
json completion_response(const GenRequest& r, const std::vector<RequestOutput>& outs, const Tokenizer* tok,
                         const ResponseMeta& m);
json chat_response(const GenRequest& r, const std::vector<RequestOutput>& outs, const Tokenizer* tok,
                   const ResponseMeta& m);
json generate_response(const GenRequest& r, const std::vector<RequestOutput>& outs, const ResponseMeta& m);
json usage_json(const std::vector<RequestOutput>& outs);

// Streaming pieces: one chunk per token event (choice index = prompt * n + sample).
// text_offset: bytes of token text of this choice before this token (logprobs.text_offset).
json completion_chunk(const GenRequest& r, int index, const TokenEvent& e, const Tokenizer* tok,
                      const ResponseMeta& m, size_t text_offset = 0);
json chat_chunk(const GenRequest& r, int index, const TokenEvent* e, bool first, const Tokenizer* tok,
                const ResponseMeta& m);

// vLLM's finish reasons: EOS and stop strings/ids are "stop".
const char* api_finish_reason(FinishReason r);
// The text a token contributes (its raw bytes; may be part of a UTF-8 character).
std::string token_text(const Tokenizer* tok, int32_t id);
std::string dump_json(const json& j);

}  // namespace grpo
