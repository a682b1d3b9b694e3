// The "command" reward: a long-lived subprocess scoring JSON lines
// (protocol in remote_reward.h and docs/rewards.md). Requests are pipelined up
// to max_in_flight; answers are matched by id, so they may come in any order.
#include <cmath>
#include <mutex>

#include "core/check.h"
#include "core/log.h"
#include "env/remote_reward.h"
#include "env/remote_reward_proc.h"

namespace grpo {

namespace {
using json = nlohmann::json;

std::string clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

class CommandReward : public RewardFunction {
 public:
  CommandReward(double w, const json& p)
      : RewardFunction("command", w), argv_(p["command"].get<std::vector<std::string>>()),
        timeout_s_(p["timeout"].get<double>()), restart_(p["restart"].get<bool>()),
        max_in_flight_(size_t(p["max_in_flight"].get<int64_t>())), zero_on_failure_(reward_param_enum(p, "on_failure", on_failure_names()) == OnFailure::zero) {
    for (const auto& a : argv_) shown_ += (shown_.empty() ? "" : " ") + a;
    shown_ = clip(shown_, 120);
  }

  bool is_remote() const override { return true; }

  float compute(std::string_view, std::string_view, const Example&, const Telemetry&) const override {
    GRPO_CHECK_MSG(false, "the command reward scores through compute_batch");
    return 0;
  }

  Status start() override {
    std::lock_guard<std::mutex> lock(mu_);
    return spawn();
  }

  Status compute_batch(const std::vector<RewardInput>& in, std::vector<float>* out, int64_t* n_failed) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = in.size();
    out->assign(n, 0.0f);
    std::vector<char> done(n, 0);
    size_t n_done = 0;
    // Fails every completion not yet answered: an error, or (zero mode) a
    // warning and a count.
    auto fail_rest = [&](const std::string& why) -> Status {
      if (!zero_on_failure_) return error_status(who() + ": " + why);
      const size_t k = n - n_done;
      *n_failed += int64_t(k);
      GRPO_LOG_WARN("%s: %s; %zu completion(s) scored 0 (on_failure = \"zero\")", who().c_str(), why.c_str(), k);
      return ok_status();
    };
    if (n == 0) return ok_status();
    if (!proc_.check_alive()) {
      if (started_ && !restart_)
        return fail_rest("the process " + proc_.exit_reason() + " earlier and restart = false" + tail());
      Status st = spawn();
      if (!st.ok()) return fail_rest(st.message());
    }
    const int64_t base = next_id_;
    next_id_ += int64_t(n);
    std::string pending;
    size_t next = 0, outstanding = 0;
    auto refill = [&] {
      for (; next < n && outstanding < max_in_flight_; ++next, ++outstanding) {
        json req = reward_request_item(in[next]);
        req["id"] = base + int64_t(next);
        pending += reward_json_dump(req);
        pending += '\n';
      }
    };
    refill();
    while (n_done < n) {
      std::string line;
      const LineProcess::Event ev = proc_.pump(&pending, timeout_s_, &line);
      const std::string progress = " (" + std::to_string(n_done) + " of " + std::to_string(n) + " answered)";
      if (ev == LineProcess::Event::timeout) {
        proc_.stop(0);
        return fail_rest("no answer within timeout = " + fmt_seconds(timeout_s_) + progress +
                         "; the process was killed" + (restart_ ? " and restarts on the next batch" : "") + tail());
      }
      if (ev == LineProcess::Event::exited)
        return fail_rest("the process " + proc_.exit_reason() + " while scoring" + progress + tail());
      json a = json::parse(line, nullptr, false);
      std::string bad;
      int64_t id = -1;
      if (a.is_discarded() || !a.is_object()) bad = "is not a JSON object";
      else if (!a.contains("id") || !a["id"].is_number_integer()) bad = "has no integer \"id\"";
      else {
        id = a["id"].get<int64_t>();
        if (id < base) continue;  // a late answer to a batch that already ended
        if (id >= base + int64_t(n) || done[size_t(id - base)]) bad = "answers id " + std::to_string(id) + ", which is not waiting";
        else if (a.contains("error")) {
          const std::string msg = a["error"].is_string() ? a["error"].get<std::string>() : a["error"].dump();
          if (!zero_on_failure_)
            return error_status(who() + ": the process reported an error for completion " + std::to_string(id - base) +
                                ": " + clip(msg, 500));
          GRPO_LOG_WARN("%s: error for completion %lld: %s; scored 0 (on_failure = \"zero\")", who().c_str(),
                        (long long)(id - base), clip(msg, 500).c_str());
          ++*n_failed;
        } else if (!a.contains("score") || !a["score"].is_number() || !std::isfinite(a["score"].get<double>()))
          bad = "has no finite number \"score\" (and no \"error\")";
        else (*out)[size_t(id - base)] = a["score"].get<float>();
      }
      if (!bad.empty()) {
        // The stream can no longer be trusted to line up with requests.
        proc_.stop(0);
        return fail_rest("malformed answer line '" + clip(line, 200) + "': " + bad +
                         "; expected {\"id\": <request id>, \"score\": <number>} or {\"id\": ..., \"error\": \"...\"}" + progress);
      }
      done[size_t(id - base)] = 1;
      ++n_done;
      --outstanding;
      refill();
    }
    return ok_status();
  }

 private:
  std::string who() const { return "reward 'command' (" + shown_ + ")"; }
  static std::string fmt_seconds(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g s", s);
    return b;
  }
  std::string tail() const {
    std::string t = proc_.stderr_tail();
    if (t.empty()) return "";
    std::string out = "; last lines of its stderr:";
    size_t start = 0;
    while (start <= t.size()) {
      size_t e = t.find('\n', start);
      out += "\n  | " + t.substr(start, e == std::string::npos ? std::string::npos : e - start);
      if (e == std::string::npos) break;
      start = e + 1;
    }
    return out;
  }
  Status spawn() const {
    started_ = true;
    Status st = proc_.start(argv_);
    if (!st.ok()) return error_status(who() + ": " + st.message());
    return ok_status();
  }

  std::vector<std::string> argv_;
  std::string shown_;
  double timeout_s_;
  bool restart_;
  size_t max_in_flight_;
  bool zero_on_failure_;
  mutable std::mutex mu_;
  mutable LineProcess proc_;
  mutable bool started_ = false;
  mutable int64_t next_id_ = 0;
};

}  // namespace

std::unique_ptr<RewardFunction> command_reward_make(double weight, const json& p) {
  return std::make_unique<CommandReward>(weight, p);
}

}  // namespace grpo
