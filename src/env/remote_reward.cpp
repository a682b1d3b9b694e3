// Parameter checks, construction and the request item shared by the remote
// reward functions (remote_reward.h).
#include "env/remote_reward.h"

#include <cstdlib>

namespace grpo {

namespace {
using json = nlohmann::json;

Status bad(const std::string& fn, const json& p, const char* key, const std::string& why) {
  return error_status("reward '" + fn + "': " + key + " = " + p[key].dump() + ": " + why);
}
}  // namespace

Result<HttpUrl> http_url_parse(const std::string& url) {
  HttpUrl u;
  u.https = url.rfind("https://", 0) == 0;
  if (u.https) u.port = 443;
  const std::string scheme = u.https ? "https://" : "http://";
  if (url.rfind(scheme, 0) != 0) return error_status("url '" + url + "': must start with http:// or https://");
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) u.path = rest.substr(slash);
  // An IPv6 literal is bracketed ("[::1]:8000"); its own colons are not the port's.
  const size_t close = hostport.rfind(']');
  size_t colon = hostport.rfind(':');
  if (close != std::string::npos && colon < close) colon = std::string::npos;
  if (colon != std::string::npos) {
    std::string port = hostport.substr(colon + 1);
    char* end = nullptr;
    long v = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || v <= 0 || v > 65535)
      return error_status("url '" + url + "': port '" + port + "' is not a number in 1..65535");
    u.port = int(v);
    hostport = hostport.substr(0, colon);
  }
  if (hostport.empty()) return error_status("url '" + url + "': no host (write http://host:port/path)");
  u.host = hostport;
  return u;
}

Status remote_reward_check(const std::string& fn, const json& p) {
  if (!(p["timeout"].get<double>() > 0)) return bad(fn, p, "timeout", "must be > 0 seconds");
  if (fn == "http") {
    if (p["url"].get<std::string>().empty())
      return error_status("reward 'http': missing url (e.g. url = \"http://127.0.0.1:8000/score\")");
    auto u = http_url_parse(p["url"].get<std::string>());
    if (!u.ok()) return error_status("reward 'http': " + u.status().message());
    if (p["batch_size"].get<int64_t>() < 1) return bad(fn, p, "batch_size", "must be >= 1");
    if (p["max_concurrency"].get<int64_t>() < 1 || p["max_concurrency"].get<int64_t>() > 256)
      return bad(fn, p, "max_concurrency", "must be in 1..256");
    if (p["retries"].get<int64_t>() < 0 || p["retries"].get<int64_t>() > 20) return bad(fn, p, "retries", "must be in 0..20");
    if (!(p["backoff"].get<double>() >= 0)) return bad(fn, p, "backoff", "must be >= 0 seconds");
    for (auto it = p["headers"].begin(); it != p["headers"].end(); ++it)
      if (it.key().empty() || it.key().find_first_of(":\r\n ") != std::string::npos ||
          it.value().get<std::string>().find_first_of("\r\n") != std::string::npos)
        return error_status("reward 'http': header '" + it.key() + "' is not a valid HTTP header name/value");
    return ok_status();
  }
  if (p["command"].empty() || p["command"][0].get<std::string>().empty())
    return error_status("reward 'command': missing command, the argv to run (e.g. command = [\"python3\", \"examples/rewards/length_reward.py\"])");
  if (p["max_in_flight"].get<int64_t>() < 1) return bad(fn, p, "max_in_flight", "must be >= 1");
  return ok_status();
}

Result<std::unique_ptr<RewardFunction>> remote_reward_make(const std::string& fn, double weight, const json& p) {
  if (fn == "http") {
    if (!&http_reward_make)
      return error_status("reward 'http' is not built into this program (it links cpp-httplib; only the grpo binary "
                          "and grpo_tests_env link grpo_env_http)");
    std::string key;
    const std::string var = p["api_key_env"].get<std::string>();
    if (!var.empty()) {
      // Read here rather than in the CLI so that a key never has to be written
      // into a config file (configs are copied into every run directory).
      const char* v = std::getenv(var.c_str());
      if (!v || !*v)
        return error_status("reward 'http': api_key_env = \"" + var + "\": environment variable " + var +
                            " is not set; export it or remove api_key_env");
      key = v;
    }
    return http_reward_make(weight, p, std::move(key));
  }
  return command_reward_make(weight, p);
}

json reward_request_item(const RewardInput& in) {
  const Example& ex = *in.example;
  json meta = {{"id", ex.id},
               {"question", ex.question},
               {"n_tokens", in.telemetry->n_tokens},
               {"truncated", in.telemetry->truncated},
               {"row", ex.meta}};
  return json{{"prompt", std::string(in.prompt)},
              {"completion", std::string(in.completion)},
              {"answer", ex.answer},
              {"metadata", std::move(meta)}};
}

std::string reward_json_dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace grpo
