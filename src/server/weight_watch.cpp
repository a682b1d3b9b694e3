// Reload bridge: checkpoint discovery, staging and the paused swap (see weight_watch.h).
#include "server/weight_watch.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/timer.h"
#include "model/checkpoint.h"
#include "train/checkpoint_state.h"

namespace grpo {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The file whose replacement marks new weights: the safetensors (or its shard index).
fs::path weight_file(const fs::path& dir, bool adapter) {
  if (adapter) return dir / "adapter_model.safetensors";
  if (is_file(dir / "model.safetensors.index.json")) return dir / "model.safetensors.index.json";
  return dir / "model.safetensors";
}

// "" when the directory or its weight file is missing (e.g. pruned by keep_last).
std::string identity_of(const fs::path& dir, bool adapter) {
  struct stat sd {}, sf {};
  if (::stat(dir.c_str(), &sd) != 0 || ::stat(weight_file(dir, adapter).c_str(), &sf) != 0) return "";
  return std::to_string(sd.st_dev) + ":" + std::to_string(sd.st_ino) + ":" + std::to_string(sf.st_ino) + ":" +
         std::to_string(sf.st_mtim.tv_sec) + "." + std::to_string(sf.st_mtim.tv_nsec) + ":" +
         std::to_string(sf.st_size);
}

int64_t step_from_state(const fs::path& dir) {
  std::ifstream f(dir / "trainer_state.json");
  if (!f) return -1;
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return -1;
  return j["step"].get<int64_t>();
}

std::optional<WatchedCheckpoint> describe(const fs::path& dir, int64_t name_step) {
  WatchedCheckpoint c;
  c.path = dir.string();
  c.adapter = is_file(dir / "adapter_config.json");
  if (!c.adapter && !is_file(dir / "config.json")) return std::nullopt;
  c.identity = identity_of(dir, c.adapter);
  if (c.identity.empty()) return std::nullopt;
  c.step = step_from_state(dir);
  if (c.step < 0) c.step = name_step;
  return c;
}

}  // namespace

Result<std::optional<WatchedCheckpoint>> watch_find_latest(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return error_status("--watch " + dir + ": not a directory; pass a run's output directory (--out of grpo train) "
                        "or a checkpoint directory");
  // A run directory: the newest complete checkpoint-<step>. One pruned between the
  // listing and describe() is skipped for the next older one.
  auto all = checkpoint_list(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (auto c = describe(it->second, it->first)) return c;
  if (!all.empty()) return std::optional<WatchedCheckpoint>{};
  return describe(dir, -1);
}

Status watch_check_same_model(const ModelConfig& running, const ModelConfig& other, const std::string& source) {
  nlohmann::json a = model_config_to_json(running), b = model_config_to_json(other);
  for (const char* k : {"torch_dtype", "initializer_range"}) {
    a.erase(k);
    b.erase(k);
  }
  for (auto it = a.begin(); it != a.end(); ++it) {
    const nlohmann::json bv = b.contains(it.key()) ? b[it.key()] : nlohmann::json();
    if (bv != it.value())
      return error_status(source + ": a different model: " + it.key() + " is " + bv.dump() + ", the served model has " +
                          it.value().dump() + "; a reload keeps the architecture and shapes, so restart grpo serve "
                          "with --model of this checkpoint's architecture");
  }
  for (auto it = b.begin(); it != b.end(); ++it)
    if (!a.contains(it.key()))
      return error_status(source + ": a different model: it sets " + it.key() + " = " + it.value().dump() +
                          ", which the served model does not have");
  return ok_status();
}

WeightWatcher::WeightWatcher(EngineService& svc, Engine& eng, Context& ctx, ModelWeights& w, LoraWeights* lora,
                             WatchOptions opt)
    : svc_(svc), eng_(eng), ctx_(ctx), w_(w), lora_(lora), opt_(std::move(opt)) {
  stats_.version = svc_.policy_version();
}

WeightWatcher::~WeightWatcher() { stop(); }

Result<bool> WeightWatcher::poll() {
  GRPO_ASSIGN_OR_RETURN(std::optional<WatchedCheckpoint> c, watch_find_latest(opt_.dir));
  if (!c || c->identity == done_identity_) return false;
  Result<bool> r = load(*c);
  if (!r.ok()) {
    // Vanished mid-read (pruned, replaced): not a refusal; the next poll looks again.
    if (identity_of(c->path, c->adapter) != c->identity) return false;
    done_identity_ = c->identity;
    std::lock_guard<std::mutex> lk(mu_);
    stats_.n_refused++;
    stats_.last_error = r.status().message();
  }
  return r;
}

Result<bool> WeightWatcher::load(const WatchedCheckpoint& c) {
  const std::string what = "checkpoint " + c.path;
  const double t0 = now_seconds();
  // Staged without ctx: its thread pool and stream belong to the engine loop.
  std::optional<LoraWeights> adapter;
  if (c.adapter) {
    if (!lora_)
      return error_status(what + " is a LoRA adapter, but this server runs full weights without an adapter; start "
                          "grpo serve with --lora DIR (an adapter of the same rank and targets, e.g. this one)");
    auto l = lora_load(c.path, w_.config, lora_->device, lora_->dtype);
    if (!l.ok()) return l.status().with_context(what);
    const LoraConfig &have = lora_->cfg, &got = l.value().cfg;
    if (got.r != have.r || got.targets != have.targets || l.value().scaling != lora_->scaling ||
        l.value().arena.numel() != lora_->arena.numel())
      return error_status(what + ": adapter r=" + std::to_string(got.r) + " scaling " +
                          std::to_string(l.value().scaling) + " with " + std::to_string(got.targets.size()) +
                          " targets does not fit the served adapter slot (r=" + std::to_string(have.r) + ", scaling " +
                          std::to_string(lora_->scaling) + ", " + std::to_string(have.targets.size()) +
                          " targets); restart grpo serve with --lora of this adapter's shape");
    adapter = std::move(l).value();
  } else {
    if (lora_)
      return error_status(what + " holds full weights, but this server applies a LoRA adapter to its base; "
                          "restart grpo serve without --lora to follow a full fine-tuning run");
    auto cfg = model_config_load((fs::path(c.path) / "config.json").string());
    if (!cfg.ok()) return cfg.status().with_context(what);
    GRPO_TRY(watch_check_same_model(w_.config, cfg.value(), what));  // before reading the weights
    if (!host_stage_) {
      host_stage_.emplace();
      weights_bind(*host_stage_, w_.config, tensor_empty_pinned(w_.dtype, {w_.arena.numel()}));
    }
    auto read = model_read_into(c.path, *host_stage_);
    if (!read.ok()) return read.status().with_context(what);
    GRPO_TRY(watch_check_same_model(w_.config, read.value(), what));
  }
  // Rewritten while we read it: its files may mix two saves. Retry on the next poll.
  if (identity_of(c.path, c.adapter) != c.identity) return false;
  const double t_read = now_seconds();
  if (!c.adapter && w_.device != Device::cpu) {
    // Up to the device beside the serving engine, so that the pause covers only a
    // device-to-device copy.
    if (dev_stage_.empty()) dev_stage_ = tensor_empty(w_.device, w_.dtype, {w_.arena.numel()});
    tensor_copy(dev_stage_, host_stage_->arena);
  }
  const double t1 = now_seconds();

  svc_.pause_and_drain();
  const double t2 = now_seconds();
  if (c.adapter) tensor_copy(lora_->arena, adapter->arena);
  else tensor_copy(w_.arena, w_.device != Device::cpu ? dev_stage_ : host_stage_->arena);
  ctx_.synchronize();
  eng_.reset_prefix_cache();  // cached KV was computed by the old weights
  const int64_t version = c.step >= 0 ? c.step : svc_.policy_version() + 1;
  svc_.set_policy_version(version);
  svc_.resume();
  const double t3 = now_seconds();

  done_identity_ = c.identity;
  std::lock_guard<std::mutex> lk(mu_);
  stats_.n_loaded++;
  stats_.version = version;
  stats_.loaded_path = c.path;
  stats_.last_stage_s = t1 - t0;
  stats_.last_upload_s = t1 - t_read;
  stats_.last_pause_s = t2 - t1;
  stats_.last_swap_s = t3 - t2;
  return true;
}

void WeightWatcher::start() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      lk.unlock();
      Result<bool> r = poll();
      WatchStats s = stats();
      if (!r.ok())
        ::grpo::log_msg(LogLevel::error, "serve --watch: refused %s; still serving policy version %lld", r.status().message().c_str(),
                       (long long)s.version);
      else if (r.value())
        GRPO_LOG_INFO("serve --watch: loaded %s as policy version %lld in %.3f s (read %.3f s, wait for in-flight "
                      "requests %.3f s, swap %.4f s); the read's copy to the device %.3f s",
                      s.loaded_path.c_str(), (long long)s.version, s.last_stage_s + s.last_pause_s + s.last_swap_s,
                      s.last_stage_s, s.last_pause_s, s.last_swap_s, s.last_upload_s);
      lk.lock();
      cv_.wait_for(lk, std::chrono::duration<double>(opt_.poll_interval_s), [&] { return stop_; });
    }
  });
}

void WeightWatcher::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

WatchStats WeightWatcher::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace grpo
