// Training-state checkpoints (see checkpoint_state.h).
#include "train/checkpoint_state.h"
#include "train/lora_setup.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "kernels/elementwise.h"
#include "model/safetensors.h"

namespace grpo {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kOptimFile = "optimizer.safetensors";
constexpr const char* kPrefix = "checkpoint-";

// The step of a complete-checkpoint name "checkpoint-<digits>", or -1.
int64_t step_of_name(const std::string& n) {
  const size_t np = std::strlen(kPrefix);
  if (n.size() <= np || n.compare(0, np, kPrefix) != 0 || n.size() - np > 18) return -1;
  int64_t v = 0;
  for (size_t i = np; i < n.size(); ++i) {
    if (n[i] < '0' || n[i] > '9') return -1;
    v = v * 10 + (n[i] - '0');
  }
  return v;
}

bool is_partial_name(const std::string& n) {
  return n.rfind(kPrefix, 0) == 0 && (n.find(".partial-") != std::string::npos || n.find(".tmp-") != std::string::npos ||
                                      n.find(".old-") != std::string::npos);
}

void fsync_path(const fs::path& p, bool dir) {
  int fd = ::open(p.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

template <class T>
Status get_field(const json& j, const char* key, const std::string& src, T* out) {
  auto it = j.find(key);
  if (it == j.end()) return error_status(src + ": missing \"" + key + "\"; the checkpoint is incomplete or from another version");
  try {
    *out = it->get<T>();
  } catch (const json::exception&) {
    return error_status(src + ": \"" + key + "\" has the wrong type");
  }
  return ok_status();
}

}  // namespace

nlohmann::ordered_json trainer_state_to_json(const TrainerState& s) {
  nlohmann::ordered_json j;
  j["format"] = "grpo.cpp trainer_state v1";
  j["step"] = s.step;
  j["generation"] = s.generation;
  j["mid_generation"] = s.mid_generation;
  j["data"] = {{"epoch", s.data_epoch}, {"index", s.data_index}, {"seed", s.data_seed}};
  j["rng"] = {{"rollout_seed", s.rollout_seed}, {"generation", s.generation}};
  j["early_stopping"] = {{"has_best", s.has_best}, {"best_metric", s.has_best ? s.best_metric : 0.0},
                         {"best_step", s.best_step}, {"evals_without_improvement", s.evals_without_improvement},
                         {"stopped", s.stopped_early}};
  j["scheduler"] = {{"type", s.lr_schedule}, {"lr", s.lr}, {"warmup_steps", s.warmup_steps},
                    {"total_steps", s.total_steps}, {"last_lr", s.last_lr}};
  if (!s.curriculum.is_null()) j["curriculum"] = s.curriculum;
  if (!s.trajectory_queue.is_null()) j["trajectory_queue"] = s.trajectory_queue;
  return j;
}

Result<TrainerState> trainer_state_from_json(const json& j, const std::string& src) {
  if (!j.is_object()) return error_status(src + ": not a JSON object");
  TrainerState s;
  GRPO_TRY(get_field(j, "step", src, &s.step));
  GRPO_TRY(get_field(j, "generation", src, &s.generation));
  GRPO_TRY(get_field(j, "mid_generation", src, &s.mid_generation));
  const json* d = j.contains("data") ? &j["data"] : nullptr;
  const json* r = j.contains("rng") ? &j["rng"] : nullptr;
  const json* e = j.contains("early_stopping") ? &j["early_stopping"] : nullptr;
  const json* sc = j.contains("scheduler") ? &j["scheduler"] : nullptr;
  if (!d || !r || !e || !sc) return error_status(src + ": missing a section (data, rng, early_stopping, scheduler)");
  GRPO_TRY(get_field(*d, "epoch", src, &s.data_epoch));
  GRPO_TRY(get_field(*d, "index", src, &s.data_index));
  GRPO_TRY(get_field(*d, "seed", src, &s.data_seed));
  GRPO_TRY(get_field(*r, "rollout_seed", src, &s.rollout_seed));
  GRPO_TRY(get_field(*e, "has_best", src, &s.has_best));
  GRPO_TRY(get_field(*e, "best_metric", src, &s.best_metric));
  GRPO_TRY(get_field(*e, "best_step", src, &s.best_step));
  GRPO_TRY(get_field(*e, "evals_without_improvement", src, &s.evals_without_improvement));
  GRPO_TRY(get_field(*e, "stopped", src, &s.stopped_early));
  GRPO_TRY(get_field(*sc, "type", src, &s.lr_schedule));
  GRPO_TRY(get_field(*sc, "lr", src, &s.lr));
  GRPO_TRY(get_field(*sc, "warmup_steps", src, &s.warmup_steps));
  GRPO_TRY(get_field(*sc, "total_steps", src, &s.total_steps));
  GRPO_TRY(get_field(*sc, "last_lr", src, &s.last_lr));
  if (j.contains("curriculum")) s.curriculum = j["curriculum"];
  if (j.contains("trajectory_queue")) s.trajectory_queue = j["trajectory_queue"];
  if (s.step < 0 || s.generation < 0 || s.data_epoch < 0 || s.data_index < 0)
    return error_status(src + ": negative counters; the file is corrupt");
  return s;
}

std::string checkpoint_dir_name(int64_t step) { return kPrefix + std::to_string(step); }

std::vector<std::pair<int64_t, std::string>> checkpoint_list(const std::string& out_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return out;
  for (const auto& de : fs::directory_iterator(out_dir, ec)) {
    if (!de.is_directory()) continue;
    int64_t step = step_of_name(de.path().filename().string());
    if (step < 0 || !fs::exists(de.path() / kStateFile) || !fs::exists(de.path() / kOptimFile)) continue;
    out.emplace_back(step, de.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string checkpoint_latest(const std::string& out_dir) {
  auto l = checkpoint_list(out_dir);
  return l.empty() ? std::string() : l.back().second;
}

Result<std::string> checkpoint_save(Context& ctx, const std::string& out_dir, const ModelWeights& w,
                                    const Optimizer& opt, const TrainerState& state,
                                    const CheckpointSaveOptions& o) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  // Leftovers of killed saves (ours are recreated below).
  for (const auto& de : fs::directory_iterator(out_dir, ec))
    if (de.is_directory() && is_partial_name(de.path().filename().string())) fs::remove_all(de.path(), ec);

  const fs::path final_dir = fs::path(out_dir) / checkpoint_dir_name(state.step);
  fs::path tmp = final_dir;
  tmp += ".partial-" + std::to_string(::getpid());
  SaveOptions mo = o.model;
  mo.extra_files.emplace_back(kStateFile, trainer_state_to_json(state).dump(2) + "\n");
  ctx.synchronize();
  if (opt.adapters) {  // LoRA: the base is frozen, so the checkpoint is the adapters (PEFT files)
    GRPO_TRY(lora_save_from_optimizer(tmp.string(), opt).with_context("saving the LoRA adapters"));
    for (const auto& [name, content] : mo.extra_files) GRPO_TRY(write_file_atomic((tmp / name).string(), content));
  } else {
    GRPO_TRY(model_save(tmp.string(), w, mo));
  }
  std::vector<SafetensorsWriteItem> items = {
      {"master", opt.master, DType::f32, {}}, {"exp_avg", opt.m, DType::f32, {}}, {"exp_avg_sq", opt.v, DType::f32, {}}};
  Status st = safetensors_write((tmp / kOptimFile).string(), items,
                                {{"optimizer", "adamw"}, {"step", std::to_string(opt.step)}});
  if (!st.ok()) {
    fs::remove_all(tmp, ec);
    return st.with_context("saving the optimizer state");
  }
  for (const auto& de : fs::directory_iterator(tmp, ec))
    if (de.is_regular_file()) fsync_path(de.path(), false);
  fsync_path(tmp, true);

  fs::path old;
  if (fs::exists(final_dir, ec)) {  // the same step saved before (a resumed run): swap it out
    old = final_dir;
    old += ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    if (std::rename(final_dir.c_str(), old.c_str()) != 0)
      return error_status(final_dir.string() + ": cannot move the previous copy aside: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
    return error_status(final_dir.string() + ": rename from " + tmp.string() + " failed: " + std::strerror(errno));
  if (!old.empty()) fs::remove_all(old, ec);
  fsync_path(out_dir, true);

  if (o.keep_last > 0) {
    auto all = checkpoint_list(out_dir);
    for (size_t i = 0; i + size_t(o.keep_last) < all.size(); ++i) fs::remove_all(all[i].second, ec);
  }
  return final_dir.string();
}

namespace {
Tensor flat_slice(const Tensor& t, int64_t off, int64_t n) {
  Tensor v = tensor_borrow(static_cast<char*>(t.data) + size_t(off) * dtype_size(t.dtype), t.dtype, t.device, {n});
  v.owner = t.owner;
  return v;
}
}  // namespace

Result<TrainerState> checkpoint_load(Context& ctx, const std::string& dir, ModelWeights& w, Optimizer& opt) {
  const std::string state_path = (fs::path(dir) / kStateFile).string();
  GRPO_ASSIGN_OR_RETURN(std::string text, read_file(state_path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return error_status(state_path + ": not valid JSON; the checkpoint is damaged, resume from an older one");
  GRPO_ASSIGN_OR_RETURN(TrainerState s, trainer_state_from_json(j, state_path));

  const std::string optim_path = (fs::path(dir) / kOptimFile).string();
  GRPO_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(optim_path));
  const int64_t n = optimizer_numel(opt), lo = opt.state_offset;
  Tensor& params = optimizer_param_arena(opt, w);
  const bool alias = params.data == opt.master.data;
  auto get = [&](const char* name) -> Result<Tensor> {
    GRPO_ASSIGN_OR_RETURN(Tensor t, f.tensor(name));
    if (t.dtype != DType::f32 || t.numel() != n)
      return error_status(optim_path + ": tensor \"" + name + "\" is " + t.shape_str() + ", expected (" +
                          std::to_string(n) + ") f32: the checkpoint belongs to a different model");
    return t;
  };
  // A ZeRO-1 shard reads only its range: the file always holds the full state, so
  // any number of ranks can resume from it.
  auto load = [&](const char* name, Tensor& dst, int64_t off) -> Status {
    GRPO_ASSIGN_OR_RETURN(Tensor t, get(name));
    tensor_copy(dst, flat_slice(t, off, dst.numel()));
    return ok_status();
  };
  GRPO_TRY(load("master", opt.master, alias ? 0 : lo));
  GRPO_TRY(load("exp_avg", opt.m, lo));
  GRPO_TRY(load("exp_avg_sq", opt.v, lo));
  auto it = f.metadata().find("step");
  if (it == f.metadata().end()) return error_status(optim_path + ": metadata has no optimizer \"step\"");
  opt.step = std::stoll(it->second);
  // The compute copy is the rounding of the master weights, exactly what optimizer_step writes.
  if (!alias && !optimizer_is_sharded(opt)) {
    cast(ctx, params, opt.master);
  } else if (!alias) {
    // A shard holds only part of the master: round the file's full master through a
    // bounded staging buffer rather than a full-size f32 copy on the device.
    GRPO_ASSIGN_OR_RETURN(Tensor fm, get("master"));
    const int64_t chunk = std::min<int64_t>(n, int64_t(1) << 24);
    Tensor stage = tensor_empty(params.device, DType::f32, {chunk});
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t len = std::min(chunk, n - c0);
      Tensor st = flat_slice(stage, 0, len);
      tensor_copy(st, flat_slice(fm, c0, len));
      Tensor dst = flat_slice(params, c0, len);
      cast(ctx, dst, st);
      ctx.synchronize();  // the staging buffer is refilled next
    }
  }
  ctx.synchronize();
  optimizer_zero_grad(ctx, opt);
  return s;
}

}  // namespace grpo
