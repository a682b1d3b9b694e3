// The read step of the reload bridge (grpo serve --watch; issue 19, item 3a, target
// <= 1 s for Qwen2.5-0.5B) in isolation, on one model directory whose files are in
// the page cache (the first pass warms it):
//   mmap_1t_fresh : a fresh host arena filled by one thread copying each tensor out
//                   of the file's mapping (page faults on both sides), the way the
//                   reload read its checkpoint before model_read_into
//   pread_<n>t    : model_read_into with n threads into one kept (page-locked when
//                   CUDA is available) staging arena, as the reload now does
//   up_pageable / up_pinned (CUDA only): the copy of the whole arena to the device
//                   from a fresh pageable arena / from the kept page-locked one
// Prints the median of --reps runs of each (seconds) as JSON and checks that every
// way produced the same bytes.
// Usage: bench_reload_read MODEL_DIR [--reps 5] [--dtype bf16|f32]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/timer.h"
#include "model/arch.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

using namespace grpo;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The former single-thread path: fresh arena, per-tensor copy out of the mapping.
ModelWeights read_mmap_fresh(const std::string& dir, const ModelConfig& cfg, DType dt) {
  auto ck = SafetensorsCheckpoint::open(dir);
  GRPO_CHECK_MSG(ck.ok(), ck.status().message().c_str());
  ModelWeights host = weights_allocate(cfg, Device::cpu, dt);
  std::memset(host.arena.data, 0, host.arena.nbytes());  // the old path zeroed the gaps; touch all pages alike
  for (const HfTensorSpec& s : arch_tensors(cfg)) {
    const SafetensorsFile* f = ck.value().file_of(s.name);
    GRPO_CHECK_MSG(f != nullptr, s.name.c_str());
    const SafetensorsEntry* e = f->find(s.name);
    GRPO_CHECK_MSG(e->dtype == dt, "this bench compares same-dtype reads: pass --dtype of the file");
    Tensor dst = arch_view(host, s);
    std::memcpy(dst.data, f->data(*e), dst.nbytes());
  }
  return host;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_reload_read MODEL_DIR [--reps N] [--dtype bf16|f32]\n");
    return 2;
  }
  std::string dir = argv[1];
  int reps = 5;
  DType dt = DType::bf16;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dtype" && i + 1 < argc) {
      std::string d = argv[++i];
      if (d != "bf16" && d != "f32") { std::fprintf(stderr, "--dtype must be bf16 or f32, not %s\n", d.c_str()); return 2; }
      dt = d == "bf16" ? DType::bf16 : DType::f32;
    } else {
      std::fprintf(stderr, "unknown argument %s; usage: bench_reload_read MODEL_DIR [--reps N] [--dtype bf16|f32]\n",
                   a.c_str());
      return 2;
    }
  }
  auto cfg = model_config_load(dir + "/config.json");
  if (!cfg.ok()) { std::fprintf(stderr, "%s\n", cfg.status().message().c_str()); return 1; }
  nlohmann::json out;
  out["model"] = dir;
  out["bytes"] = weights_numel(cfg.value()) * int64_t(dtype_size(dt));

  ModelWeights ref = read_mmap_fresh(dir, cfg.value(), dt);  // warms the page cache
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double t0 = now_seconds();
    ModelWeights w = read_mmap_fresh(dir, cfg.value(), dt);
    t.push_back(now_seconds() - t0);
  }
  out["mmap_1t_fresh_s"] = median(t);

  ModelWeights stage;
  weights_bind(stage, cfg.value(), tensor_empty_pinned(dt, {weights_numel(cfg.value())}));
  for (int n : {1, 2, 4, 8}) {
    t.clear();
    for (int r = 0; r < reps; ++r) {
      double t0 = now_seconds();
      auto got = model_read_into(dir, stage, n);
      t.push_back(now_seconds() - t0);
      if (!got.ok()) { std::fprintf(stderr, "%s\n", got.status().message().c_str()); return 1; }
    }
    out["pread_" + std::to_string(n) + "t_s"] = median(t);
    if (std::memcmp(stage.arena.data, ref.arena.data, ref.arena.nbytes()) != 0) {
      std::fprintf(stderr, "model_read_into with %d threads read other bytes than the mapping holds\n", n);
      return 1;
    }
  }
  if (cuda_available()) {
    Tensor dev = tensor_empty(Device::cuda, dt, {weights_numel(cfg.value())});
    t.clear();
    for (int r = 0; r < reps; ++r) {
      double t0 = now_seconds();
      tensor_copy(dev, ref.arena);
      t.push_back(now_seconds() - t0);
    }
    out["up_pageable_s"] = median(t);
    t.clear();
    for (int r = 0; r < reps; ++r) {
      double t0 = now_seconds();
      tensor_copy(dev, stage.arena);
      t.push_back(now_seconds() - t0);
    }
    out["up_pinned_s"] = median(t);
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
