// HTTP client of rollout.server_url (see rollout_client.h).
#include "server/rollout_client.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/timer.h"
#include "env/remote_reward.h"

namespace grpo {

namespace {

using njson = nlohmann::json;

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g s", s);
  return b;
}

std::string clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

void set_timeouts(httplib::Client& c, double s) {
  const time_t sec = time_t(s);
  const time_t usec = time_t((s - double(sec)) * 1e6);
  c.set_connection_timeout(std::min<time_t>(sec, 30), sec >= 30 ? 0 : usec);
  c.set_read_timeout(sec, usec);
  c.set_write_timeout(sec, usec);
}

std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "connection refused or host unreachable";
    case httplib::Error::Read: return "the connection closed or timed out before an answer";
    case httplib::Error::Write: return "the connection closed while sending";
    case httplib::Error::ConnectionTimeout: return "connection timed out";
    default: return httplib::to_string(e);
  }
}

const char* mode_name(LogprobsMode m) { return m == LogprobsMode::raw ? "raw" : "processed"; }

class HttpRolloutServer : public RolloutServer {
 public:
  HttpRolloutServer(RolloutClientOptions o, std::string base) : o_(std::move(o)), base_(std::move(base)) {}

  const std::string& url() const override { return o_.url; }

  Result<int64_t> health() override { return health_within(std::min(o_.timeout_s, 30.0)); }
  Result<int64_t> probe(double timeout_s) override { return health_within(std::min(o_.timeout_s, timeout_s)); }

  Result<RemoteGeneration> generate(const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<SamplingParams>& params, int64_t min_version) override {
    GRPO_CHECK(prompts.size() == params.size());
    const size_t n = prompts.size();
    std::vector<std::vector<RequestOutput>> per(n);
    std::vector<int64_t> versions(n, -1);
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::atomic<int64_t> resent{0};
    std::mutex mu;
    Status first_error;
    auto worker = [&] {
      httplib::Client cli(base_);
      set_timeouts(cli, o_.timeout_s);
      cli.set_keep_alive(true);
      while (!stop.load()) {
        const size_t k = next.fetch_add(1);
        if (k >= n) break;
        Status st = one(cli, prompts[k], params[k], min_version, &per[k], &versions[k], &resent);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) first_error = st.with_context("prompt " + std::to_string(k) + " of the batch");
          stop = true;
          break;
        }
      }
    };
    const size_t n_threads = std::min<size_t>(n, size_t(std::max(1, o_.max_concurrency)));
    std::vector<std::thread> threads;
    for (size_t i = 1; i < n_threads; ++i) threads.emplace_back(worker);
    if (n_threads > 0) worker();
    for (auto& t : threads) t.join();
    if (!first_error.ok()) return first_error;
    RemoteGeneration g;
    for (size_t k = 0; k < n; ++k) {
      for (auto& o : per[k]) {
        o.request_id = int64_t(k);
        g.outs.push_back(std::move(o));
      }
      g.policy_version_min = k == 0 ? versions[k] : std::min(g.policy_version_min, versions[k]);
      g.policy_version_max = k == 0 ? versions[k] : std::max(g.policy_version_max, versions[k]);
    }
    g.n_resent = resent.load();
    return g;
  }

 private:
  Result<int64_t> health_within(double timeout_s) {
    httplib::Client cli(base_);
    set_timeouts(cli, timeout_s);
    auto r = cli.Get("/health");
    const std::string start = "start one with `grpo serve --model " +
                              (o_.model_path.empty() ? std::string("MODEL_DIR") : o_.model_path) + " --port " + port_of() +
                              "` (docs/serve.md, Rollouts from a separate server), or set rollout.server_url = \"\" "
                              "to sample with the in-process engine";
    if (!r)
      return error_status("rollout.server_url = " + o_.url + ": no server answers GET /health (" +
                          describe(r.error()) + "); " + start);
    if (r->status == 503)
      return error_status("rollout.server_url = " + o_.url + ": the server is shutting down (GET /health: 503); " + start);
    if (r->status != 200)
      return error_status("rollout.server_url = " + o_.url + ": GET /health answered HTTP " + std::to_string(r->status) +
                          ": " + clip(r->body, 300) + "; is it a grpo serve (or vLLM) server? " + start);
    const njson j = njson::parse(r->body, nullptr, false);
    if (j.is_object() && j.contains("policy_version") && j["policy_version"].is_number_integer())
      return j["policy_version"].get<int64_t>();
    return int64_t(-1);  // vLLM's /health has no body
  }

  std::string port_of() const {
    auto u = http_url_parse(o_.url);
    return u.ok() ? std::to_string(u.value().port) : std::string("PORT");
  }

  // One prompt: POST until an answer from an acceptable version arrives or the deadline passes.
  Status one(httplib::Client& cli, const std::vector<int32_t>& prompt, const SamplingParams& p, int64_t min_version,
             std::vector<RequestOutput>* outs, int64_t* version, std::atomic<int64_t>* resent) const {
    const std::string body = rollout_request_body(prompt, p).dump(-1, ' ', false, njson::error_handler_t::replace);
    const double t0 = now_seconds(), deadline = t0 + o_.timeout_s;
    const std::string where = "rollout.server_url = " + o_.url + ": POST /v1/completions";
    for (;;) {
      auto r = cli.Post("/v1/completions", body, "application/json");
      if (!r) {
        const double waited = now_seconds() - t0;
        const bool timed_out = r.error() == httplib::Error::Read && waited >= o_.timeout_s * 0.9;
        return error_status(where + ": " +
                            (timed_out ? "no answer within rollout.server_timeout_s = " + secs(o_.timeout_s)
                                       : describe(r.error()) + " after " + secs(waited)) +
                            " (is the server still running? raise rollout.server_timeout_s for longer generations)");
      }
      if (r->status == 429 && now_seconds() + 1.0 < deadline) {  // its queue is full: wait for a slot
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      if (r->status != 200)
        return error_status(where + " answered HTTP " + std::to_string(r->status) + ": " + clip(r->body, 500));
      const njson j = njson::parse(r->body, nullptr, false);
      if (j.is_discarded()) return error_status(where + ": the answer is not JSON: " + clip(r->body, 200));
      outs->clear();
      Status st = rollout_answer_parse(j, prompt, p, outs, version);
      if (!st.ok()) return st.with_context(where);
      if (min_version >= 0 && *version < min_version) {
        // The bridge sent version min_version; the server applies it between requests.
        if (now_seconds() < deadline) {
          resent->fetch_add(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          continue;
        }
        return error_status(where + ": the answer came from policy version " + std::to_string(*version) +
                            ", but the trainer sent version " + std::to_string(min_version) +
                            " over the weight bridge and the server did not load it within rollout.server_timeout_s = " +
                            secs(o_.timeout_s) + " (is it the grpo serve --receive of this run?)");
      }
      return ok_status();
    }
  }

  RolloutClientOptions o_;
  std::string base_;  // scheme://host:port
};

}  // namespace

njson rollout_request_body(const std::vector<int32_t>& prompt, const SamplingParams& p) {
  njson j = {{"prompt", prompt},
             {"n", p.n},
             {"max_tokens", p.max_tokens},
             {"temperature", p.temperature},
             {"top_p", p.top_p},
             {"top_k", p.top_k},
             {"min_p", p.min_p},
             {"min_tokens", p.min_tokens},
             {"ignore_eos", p.ignore_eos},
             {"logprobs", 0},
             {"logprobs_mode", mode_name(p.logprobs_mode)},
             {"return_token_ids", true}};
  if (p.seed) j["seed"] = *p.seed;
  if (!p.stop.empty()) j["stop"] = p.stop;
  if (!p.stop_token_ids.empty()) j["stop_token_ids"] = p.stop_token_ids;
  return j;
}

Status rollout_answer_parse(const njson& j, const std::vector<int32_t>& prompt, const SamplingParams& p,
                            std::vector<RequestOutput>* outs, int64_t* policy_version) {
  if (!j.is_object()) return error_status("the answer is not a JSON object");
  *policy_version = -1;
  if (auto it = j.find("policy_version"); it != j.end() && it->is_number_integer()) *policy_version = it->get<int64_t>();
  auto cit = j.find("choices");
  if (cit == j.end() || !cit->is_array())
    return error_status("the answer has no 'choices' list");
  if (cit->size() != size_t(p.n))
    return error_status("the answer has " + std::to_string(cit->size()) + " choices for n = " + std::to_string(p.n));
  const njson* timing = j.contains("timing") && j["timing"].is_object() ? &j["timing"] : nullptr;
  auto tnum = [&](const char* k) { return timing && (*timing)[k].is_number() ? (*timing)[k].get<double>() : 0.0; };
  outs->assign(size_t(p.n), RequestOutput{});
  std::vector<bool> seen(size_t(p.n), false);
  for (const njson& c : *cit) {
    if (!c.is_object() || !c.contains("index") || !c["index"].is_number_integer())
      return error_status("a choice has no integer 'index'");
    const int64_t idx = c["index"].get<int64_t>();
    if (idx < 0 || idx >= p.n || seen[size_t(idx)])
      return error_status("choice index " + std::to_string(idx) + " is out of range or repeated");
    seen[size_t(idx)] = true;
    const std::string at = "choice " + std::to_string(idx);
    auto ids = c.find("token_ids");
    if (ids == c.end() || !ids->is_array())
      return error_status(at + " has no 'token_ids' (the server must support vLLM's return_token_ids)");
    auto lp = c.find("logprobs");
    if (lp == c.end() || !lp->is_object() || !lp->contains("token_logprobs") || !(*lp)["token_logprobs"].is_array())
      return error_status(at + " has no 'logprobs.token_logprobs' (the request asked for logprobs: 0)");
    const njson& lps = (*lp)["token_logprobs"];
    if (lps.size() != ids->size())
      return error_status(at + " has " + std::to_string(ids->size()) + " token ids but " + std::to_string(lps.size()) +
                          " logprobs");
    if (auto pit = c.find("prompt_token_ids"); pit != c.end() && pit->is_array() && *pit != njson(prompt))
      return error_status(at + "'s prompt_token_ids differ from the prompt sent (did the server add special tokens?)");
    RequestOutput& o = (*outs)[size_t(idx)];
    o.sample_index = int(idx);
    o.prompt_ids = prompt;
    o.completion_ids.reserve(ids->size());
    o.logprobs.reserve(ids->size());
    for (size_t t = 0; t < ids->size(); ++t) {
      const njson& id = (*ids)[t];
      const njson& l = lps[t];
      if (!id.is_number_integer()) return error_status(at + ": token id " + std::to_string(t) + " is not an integer");
      if (!l.is_number()) return error_status(at + ": logprob " + std::to_string(t) + " is not a number");
      o.completion_ids.push_back(int32_t(id.get<int64_t>()));
      o.logprobs.push_back(float(l.get<double>()));  // printed with round-trip precision: the sampler's float exactly
    }
    if (p.logprobs_mode == LogprobsMode::raw) o.logprobs_raw = o.logprobs;
    else o.logprobs_processed = o.logprobs;
    if (!c.contains("text") || !c["text"].is_string()) return error_status(at + " has no 'text'");
    o.text = c["text"].get<std::string>();
    const std::string fr = c.contains("finish_reason") && c["finish_reason"].is_string() ? c["finish_reason"].get<std::string>() : "";
    if (fr == "length") o.finish_reason = FinishReason::length;
    else if (fr == "stop") o.finish_reason = FinishReason::stop;
    else return error_status(at + " finished with '" + fr + "' (expected \"stop\" or \"length\")");
    RequestTelemetry& tel = o.telemetry;
    tel.queue_s = tnum("queue_s");  // the request's (its slowest sample's), not this sample's
    tel.ttft_s = tnum("ttft_s");
    tel.e2e_s = tnum("e2e_s");
    tel.prompt_tokens = int(prompt.size());
    tel.generated_tokens = int(o.completion_ids.size());
    tel.engine_steps = int64_t(o.completion_ids.size());
    // The request's prefix hits (summed over its samples) count once, on sample 0.
    if (idx == 0) tel.prefix_hit_tokens = int(tnum("prefix_hit_tokens"));
  }
  return ok_status();
}

RolloutClientOptions rollout_client_options(const RunConfig& cfg) {
  RolloutClientOptions o;
  o.url = cfg.rollout.server_url;
  o.timeout_s = cfg.rollout.server_timeout_s;
  o.max_concurrency = int(cfg.rollout.server_max_concurrency);
  o.model_path = cfg.model.path;
  return o;
}

Result<std::unique_ptr<RolloutServer>> rollout_client_make(const RolloutClientOptions& o) {
  GRPO_ASSIGN_OR_RETURN(HttpUrl u, http_url_parse(o.url));
  if (u.https) return error_status("rollout.server_url = " + o.url + ": https is not supported; use http://");
  const std::string base = "http://" + u.host + ":" + std::to_string(u.port);
  return std::unique_ptr<RolloutServer>(std::make_unique<HttpRolloutServer>(o, base));
}

}  // namespace grpo
