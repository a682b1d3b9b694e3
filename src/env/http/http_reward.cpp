// The "http" reward (a separate object library, see CMakeLists.txt): completions POSTed in chunks (batch mode) or one by one
// (single mode) by up to max_concurrency worker threads, each with its own
// keep-alive connection (protocol in remote_reward.h and docs/rewards.md).
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "env/remote_reward.h"

namespace grpo {

namespace {
using json = nlohmann::json;

std::string clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

void set_timeout(double s, void (httplib::Client::*fn)(time_t, time_t), httplib::Client* c) {
  const time_t sec = time_t(s);
  (c->*fn)(sec, time_t((s - double(sec)) * 1e6));
}

class HttpReward : public RewardFunction {
 public:
  HttpReward(double w, const json& p, std::string api_key)
      : RewardFunction("http", w), url_text_(p["url"].get<std::string>()), url_(http_url_parse(url_text_).value()),
        batch_(reward_param_enum(p, "mode", remote_mode_names()) == RemoteMode::batch), batch_size_(size_t(p["batch_size"].get<int64_t>())),
        max_concurrency_(size_t(p["max_concurrency"].get<int64_t>())), timeout_s_(p["timeout"].get<double>()),
        retries_(int(p["retries"].get<int64_t>())), backoff_s_(p["backoff"].get<double>()),
        zero_on_failure_(reward_param_enum(p, "on_failure", on_failure_names()) == OnFailure::zero) {
    for (auto it = p["headers"].begin(); it != p["headers"].end(); ++it) headers_.emplace(it.key(), it.value().get<std::string>());
    if (!api_key.empty()) headers_.emplace("Authorization", "Bearer " + api_key);
  }

  bool is_remote() const override { return true; }

  float compute(std::string_view, std::string_view, const Example&, const Telemetry&) const override {
    GRPO_CHECK_MSG(false, "the http reward scores through compute_batch");
    return 0;
  }

  Status compute_batch(const std::vector<RewardInput>& in, std::vector<float>* out, int64_t* n_failed) const override {
    const size_t n = in.size(), per = batch_ ? batch_size_ : 1, n_chunks = (n + per - 1) / per;
    out->assign(n, 0.0f);
    std::atomic<size_t> next_chunk{0};
    std::atomic<bool> stop{false};
    std::atomic<int64_t> failed{0};
    std::mutex mu;
    std::string first_error;
    auto worker = [&] {
      httplib::Client cli((url_.https ? "https://" : "http://") + url_.host + ":" + std::to_string(url_.port));
      set_timeout(timeout_s_, &httplib::Client::set_connection_timeout, &cli);
      set_timeout(timeout_s_, &httplib::Client::set_read_timeout, &cli);
      set_timeout(timeout_s_, &httplib::Client::set_write_timeout, &cli);
      cli.set_keep_alive(true);
      for (;;) {
        const size_t c = next_chunk.fetch_add(1);
        if (c >= n_chunks || stop.load()) return;
        const size_t b = c * per, e = std::min(n, b + per);
        std::string err;
        if (post_chunk(&cli, in, b, e, out, &err)) continue;
        const std::string where = "completions " + std::to_string(b) + ".." + std::to_string(e - 1) + ": " + err;
        if (zero_on_failure_) {
          failed += int64_t(e - b);
          GRPO_LOG_WARN("%s: %s; scored 0 (on_failure = \"zero\")", who().c_str(), where.c_str());
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.empty()) first_error = where;
        stop = true;
      }
    };
    const size_t n_workers = std::min(max_concurrency_, n_chunks);
    if (n_workers == 1) {
      worker();
    } else {
      std::vector<std::thread> ts;
      for (size_t i = 0; i < n_workers; ++i) ts.emplace_back(worker);
      for (auto& t : ts) t.join();
    }
    if (!first_error.empty())
      return error_status(who() + ": " + first_error +
                          " (set on_failure = \"zero\" to score failed completions 0 and go on)");
    *n_failed += failed.load();
    return ok_status();
  }

 private:
  std::string who() const { return "reward 'http' (POST " + url_text_ + ")"; }

  // One chunk [b, e) with retries; false with *err on failure.
  bool post_chunk(httplib::Client* cli, const std::vector<RewardInput>& in, size_t b, size_t e, std::vector<float>* out,
                  std::string* err) const {
    json body;
    if (batch_) {
      body = {{"items", json::array()}};
      for (size_t i = b; i < e; ++i) body["items"].push_back(reward_request_item(in[i]));
    } else {
      body = reward_request_item(in[b]);
    }
    const std::string text = reward_json_dump(body);
    for (int attempt = 0; attempt <= retries_; ++attempt) {
      if (attempt > 0) {
        const double wait = backoff_s_ * std::pow(2.0, attempt - 1);
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 60.0)));
      }
      const std::string tries = " (attempt " + std::to_string(attempt + 1) + " of " + std::to_string(retries_ + 1) + ")";
      auto res = cli->Post(url_.path, headers_, text, "application/json");
      if (!res) {
        *err = "no response: " + httplib::to_string(res.error()) +
               (res.error() == httplib::Error::Read ? " (timeout = " + std::to_string(timeout_s_) + " s?)" : "") + tries;
        continue;
      }
      const int st = res->status;
      if (st == 429 || st >= 500) {
        *err = "HTTP " + std::to_string(st) + ": " + clip(res->body, 300) + tries;
        continue;
      }
      if (st < 200 || st >= 300) {
        *err = "HTTP " + std::to_string(st) + ": " + clip(res->body, 300) + " (not retried: fix the request or the server)";
        return false;
      }
      return parse_scores(res->body, b, e, out, err);
    }
    return false;
  }

  bool parse_scores(const std::string& body, size_t b, size_t e, std::vector<float>* out, std::string* err) const {
    json j = json::parse(body, nullptr, false);
    const char* expect = batch_ ? "expected {\"scores\": [number, ...]} with one score per item"
                                : "expected {\"score\": number}";
    auto fail = [&](const std::string& why) {
      *err = "malformed response '" + clip(body, 200) + "': " + why + "; " + expect;
      return false;
    };
    auto number = [](const json& v) { return v.is_number() && std::isfinite(v.get<double>()); };
    if (j.is_discarded()) return fail("not JSON");
    if (!j.is_object()) return fail("not a JSON object");
    if (!batch_) {
      if (!j.contains("score") || !number(j["score"])) return fail("no finite number \"score\"");
      (*out)[b] = j["score"].get<float>();
      return true;
    }
    if (!j.contains("scores") || !j["scores"].is_array()) return fail("no array \"scores\"");
    const json& s = j["scores"];
    if (s.size() != e - b) return fail(std::to_string(s.size()) + " scores for " + std::to_string(e - b) + " items");
    for (size_t i = 0; i < s.size(); ++i)
      if (!number(s[i])) return fail("scores[" + std::to_string(i) + "] = " + s[i].dump() + " is not a finite number");
    for (size_t i = 0; i < s.size(); ++i) (*out)[b + i] = s[i].get<float>();
    return true;
  }

  std::string url_text_;
  HttpUrl url_;
  bool batch_;
  size_t batch_size_, max_concurrency_;
  double timeout_s_;
  int retries_;
  double backoff_s_;
  bool zero_on_failure_;
  httplib::Headers headers_;
};

}  // namespace

std::unique_ptr<RewardFunction> http_reward_make(double weight, const json& p, std::string api_key) {
  return std::make_unique<HttpReward>(weight, p, std::move(api_key));
}

}  // namespace grpo
