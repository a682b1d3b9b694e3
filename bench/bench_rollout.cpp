// Rollout benchmark (issue 3): the engine on a randomly initialised model of a
// real architecture with forced lengths (ignore_eos + min_tokens), so the work
// equals that of real weights.
//   grpo      : 8 prompts x 8 samples, prompt 128, 512 new tokens (one GRPO step)
//   nanovllm  : 256 sequences, prompt and output lengths uniform in 100..1024
// Prints tokens/s, peak device memory, the weight-read floor (weight bytes x decode
// steps / measured copy bandwidth) and the floor with the decode steps' KV-cache reads
// added (each generated token reads its sequence's whole context once), and writes
// bench/results/rollout-<preset>-<workload>.json (format: CONTRIBUTING.md). The peer
// (transformers generate) is run by tools/device/gpu_run.sh in the same call and
// merged by bench/merge_peer.py. --kv-cache-dtype fp8 runs the engine with an FP8
// E4M3 KV cache (EngineOptions::kv_cache_dtype); its results go to
// rollout-<preset>-<workload>-kvfp8.json so the default run's file stays as it is.
// --top-p P / --top-k K / --min-p M sample with those filters (the GRPO default is none);
// such runs write rollout-<preset>-<workload>-top_p0.9-top_k50.json (the filters in the name).
// --bitwise runs the engine as train.on_policy = "bitwise" does (a batch-invariant deterministic
// context, the logprob fold of docs/bitwise.md) into rollout-<preset>-<workload>-bitwise.json.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_util.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "model/presets.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace grpo;
using grpo::bench::device_used_bytes;
using grpo::bench::today;

namespace {

double copy_bandwidth_bytes_per_s() {
#ifdef GRPO_HAVE_CUDA
  size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaMemset(a, 1, n);
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < 20; ++i) cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(n) * 20 / (ms / 1e3);
#else
  return 0;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "qwen2.5-0.5b", workload = "grpo", device = "cuda", dtype = "bf16", out_dir = "bench/results";
  std::string kv_cache_dtype = "auto";
  double kv_gb = 24;
  bool graphs = true, bitwise = false;
  int max_seqs = 256, max_batched = 8192, graph_ctx = 0, top_k = 0;
  float top_p = 1.f, min_p = 0.f;
  for (int i = 1; i < argc; ++i) try {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--preset") preset = next();
    else if (a == "--workload") workload = next();
    else if (a == "--device") device = next();
    else if (a == "--dtype") dtype = next();
    else if (a == "--kv-gb") kv_gb = std::stod(next());
    else if (a == "--kv-cache-dtype") kv_cache_dtype = next();
    else if (a == "--no-graphs") graphs = false;
    else if (a == "--bitwise") bitwise = true;
    else if (a == "--max-seqs") max_seqs = std::stoi(next());
    else if (a == "--max-batched") max_batched = std::stoi(next());
    else if (a == "--graph-max-context") graph_ctx = std::stoi(next());
    else if (a == "--out-dir") out_dir = next();
    else if (a == "--top-p") top_p = std::stof(next());
    else if (a == "--top-k") top_k = std::stoi(next());
    else if (a == "--min-p") min_p = std::stof(next());
    else {
      std::fprintf(stderr, "usage: bench_rollout [--preset P] [--workload grpo|nanovllm] [--device cuda|cpu] "
                           "[--dtype bf16|f32] [--kv-gb G] [--kv-cache-dtype auto|fp8] [--no-graphs] [--max-seqs N] "
                           "[--max-batched N] [--graph-max-context N] [--top-p P] [--top-k K] [--min-p M] "
                           "[--bitwise]\n");
      return 2;
    }
  } catch (const std::exception&) {  // std::stoi / stod / stof on a value that is not a number
    std::fprintf(stderr, "bench_rollout: a number is missing or malformed near '%s' (see --help)\n", argv[i]);
    return 2;
  }
  auto cfg = preset_config(preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "bench_rollout: %s\n", cfg.status().message().c_str());
    return 1;
  }
  ContextOptions co;
  co.device = device == "cuda" ? Device::cuda : Device::cpu;
  co.deterministic = co.batch_invariant = bitwise;
  Context ctx(co);
  DType dt = dtype == "bf16" ? DType::bf16 : DType::f32;
  double bw = co.device == Device::cuda ? copy_bandwidth_bytes_per_s() : 0;
  size_t used0 = device_used_bytes();
  ModelWeights w = weights_random(*cfg, co.device, dt, 1234, &ctx);
  // The engine comes from the same EngineConfig as `grpo train`'s [engine] section and `grpo generate`'s flags.
  EngineConfig ec;
  ec.kv_cache_mib = int64_t(kv_gb * 1024.0);
  ec.max_num_seqs = max_seqs;
  ec.max_num_batched_tokens = max_batched;
  ec.cuda_graphs = graphs ? CudaGraphsMode::automatic : CudaGraphsMode::off;
  ec.cuda_graph_max_context = graph_ctx;
  if (auto kv = enum_parse(kv_cache_dtype_names(), kv_cache_dtype)) ec.kv_cache_dtype = *kv;
  else {
    std::fprintf(stderr, "bench_rollout: --kv-cache-dtype %s: must be one of %s\n", kv_cache_dtype.c_str(),
                 enum_allowed(kv_cache_dtype_names()).c_str());
    return 2;
  }
  auto eo_r = engine_options_from_config(ec, co.device, *cfg, dt, MemoryUse{}, max_seqs);
  if (!eo_r.ok()) {
    std::fprintf(stderr, "bench_rollout: %s\n", eo_r.status().message().c_str());
    return 2;
  }
  EngineOptions eo = eo_r.value();
  eo.seed = 7;
  eo.bitwise_logprobs = bitwise;
  auto kv_dtype = engine_kv_cache_dtype(*cfg, dt, eo);
  if (!kv_dtype.ok()) {
    std::fprintf(stderr, "bench_rollout: --kv-cache-dtype: %s\n", kv_dtype.status().message().c_str());
    return 2;
  }
  const bool kv_fp8 = kv_dtype.value() == DType::f8e4m3;
  Engine engine(ctx, w, nullptr, eo);

  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, cfg->vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> out_lens;
  int n_per_prompt = 1;
  if (workload == "grpo") {
    n_per_prompt = 8;
    for (int p = 0; p < 8; ++p) {
      std::vector<int32_t> ids(128);
      for (auto& x : ids) x = tok(rng);
      prompts.push_back(ids);
      out_lens.push_back(512);
    }
  } else {
    std::uniform_int_distribution<int> len(100, 1024);
    for (int p = 0; p < 256; ++p) {
      std::vector<int32_t> ids(size_t(len(rng)));
      for (auto& x : ids) x = tok(rng);
      prompts.push_back(ids);
      out_lens.push_back(len(rng));
    }
  }
  auto run_once = [&](bool warm) -> double {
    size_t n_prompts = warm ? std::min<size_t>(2, prompts.size()) : prompts.size();
    double t0 = now_seconds();
    for (size_t p = 0; p < n_prompts; ++p) {
      SamplingParams sp;
      sp.temperature = 1.0f;
      sp.top_p = top_p;
      sp.top_k = top_k;
      sp.min_p = min_p;
      sp.n = n_per_prompt;
      sp.max_tokens = warm ? 16 : out_lens[p];
      sp.min_tokens = sp.max_tokens;
      sp.ignore_eos = true;
      sp.seed = 100 + p;
      auto r = engine.add_request(prompts[p], sp);
      if (!r.ok()) {
        std::fprintf(stderr, "bench_rollout: %s\n", r.status().message().c_str());
        std::exit(1);
      }
    }
    int n_steps = 0;
    while (engine.has_unfinished()) {
      // GRPO_PROFILE=decode: ncu sees steps 200..202 of the timed run (eager with --no-graphs).
      if (!warm && n_steps == 200) grpo::bench::profile_range("decode", true);
      engine.step();
      if (!warm && ++n_steps == 203) grpo::bench::profile_range("decode", false);
    }
    ctx.synchronize();
    return now_seconds() - t0;
  };
  run_once(true);
  engine.reset_prefix_cache();
  EngineStats before = engine.stats();
  double secs = run_once(false);
  EngineStats after = engine.stats();
  int64_t gen = after.tokens_generated - before.tokens_generated;
  int64_t computed = after.tokens_computed - before.tokens_computed;
  size_t peak = device_used_bytes() - used0;
  double weight_bytes = double(w.arena.nbytes());
  int max_out = *std::max_element(out_lens.begin(), out_lens.end());
  double floor_s = bw > 0 ? weight_bytes * max_out / bw : 0;
  // Decode also reads every sequence's KV cache once per step: the token generated i-th
  // (i >= 2; the first comes from the prefill) attends to prompt + i - 1 positions.
  const double kv_per_token = double(cfg->n_layers) * 2.0 * cfg->kv_dim() * double(dtype_size(kv_dtype.value()));
  double kv_read_bytes = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const double P = double(prompts[p].size()), O = double(out_lens[p]);
    kv_read_bytes += n_per_prompt * kv_per_token * ((O - 1) * P + (O - 1) * O / 2.0);
  }
  const double kv_floor_s = bw > 0 ? (weight_bytes * max_out + kv_read_bytes) / bw : 0;
  std::printf(
      "| preset | workload | device (KV) | seqs | generated tok | time s | tok/s | floor s | x floor | floor+KV s | "
      "x floor+KV | peak GiB |\n");
  // The KV dtype shares the device column, so the column positions (tools/device/ab_run.sh) stay.
  std::printf("| %s | %s | %s %s (KV %s) | %zu | %lld | %.3f | %.0f | %.3f | %.2f | %.3f | %.2f | %.2f |\n",
              preset.c_str(), workload.c_str(), device.c_str(), dtype.c_str(), dtype_name(kv_dtype.value()),
              prompts.size() * size_t(n_per_prompt),
              (long long)gen, secs, gen / secs, floor_s, floor_s > 0 ? secs / floor_s : 0.0, kv_floor_s,
              kv_floor_s > 0 ? secs / kv_floor_s : 0.0, peak / 1073741824.0);
  std::string filter_flags, filter_tag;
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  if (top_p < 1.f) filter_flags += " --top-p " + num(top_p), filter_tag += "-top_p" + num(top_p);
  if (top_k > 0) filter_flags += " --top-k " + num(top_k), filter_tag += "-top_k" + num(top_k);
  if (min_p > 0.f) filter_flags += " --min-p " + num(min_p), filter_tag += "-min_p" + num(min_p);
  nlohmann::json j = {
      {"bench", "rollout"},
      {"date", today()},
      {"device", device},
      {"command", "bench_rollout --preset " + preset + " --workload " + workload + " --device " + device +
                      " --dtype " + dtype + (kv_fp8 ? " --kv-cache-dtype " + kv_cache_dtype : std::string()) +
                      filter_flags + (bitwise ? " --bitwise" : "")},
      {"config",
       {{"preset", preset}, {"workload", workload}, {"dtype", dtype}, {"kv_cache_dtype", kv_cache_dtype},
        {"kv_dtype", dtype_name(kv_dtype.value())}, {"kv_bytes_per_block", engine.kv_bytes_per_block()},
        {"top_p", top_p}, {"top_k", top_k}, {"min_p", min_p},
        {"cuda_graphs", eo.use_cuda_graphs},
        {"kv_gb", kv_gb}, {"max_num_seqs", max_seqs}, {"max_num_batched_tokens", max_batched}}},
      {"metrics",
       {{"seconds", secs}, {"generated_tokens", gen}, {"computed_tokens", computed},
        {"tokens_per_s", gen / secs}, {"prefix_hit_tokens", after.prefix_hit_tokens - before.prefix_hit_tokens},
        {"preemptions", after.preemptions - before.preemptions}, {"peak_device_bytes", peak},
        {"weight_bytes", weight_bytes}, {"copy_bw_bytes_per_s", bw}, {"weight_read_floor_s", floor_s},
        {"ratio_to_floor", floor_s > 0 ? secs / floor_s : 0.0}, {"kv_read_bytes", kv_read_bytes},
        {"weight_and_kv_floor_s", kv_floor_s}, {"ratio_to_weight_and_kv_floor", kv_floor_s > 0 ? secs / kv_floor_s : 0.0}}}};
  std::string path = out_dir + "/rollout-" + preset + "-" + workload + (kv_fp8 ? "-kvfp8" : "") +
                     filter_tag + (bitwise ? "-bitwise" : "") + ".json";
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
