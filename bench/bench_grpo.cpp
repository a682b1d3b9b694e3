// GRPO step benchmark (issues 4 and 5): on a randomly initialised model of a
// real architecture with forced lengths, one full GRPO step in one process:
//   rollout  : the engine generates B prompts x G samples (prompt P, N new tokens,
//              ignore_eos + min_tokens) reading the bf16 weights
//   train    : forward + backward + AdamW over the B*G sequences (micro-batched),
//              writing the same bf16 weights in place (fp32 master, fp32 moments)
//   sync     : prefix-cache reset (the only weight-sync cost in single-copy mode)
// It prints the time split, training MFU against the bf16 matmul rate measured
// in the same run, the weight-read + 6·N·tokens floor, and the rollout-vs-trainer
// logprob mismatch on the same batch (max / mean |Δ|, k3 KL). Writes
// bench/results/grpo_step-<preset>.json and train_step-<preset>.json
// (format: CONTRIBUTING.md); tools/device/gpu_run.sh adds the PyTorch peer. With
// --kv-cache-dtype fp8 the engine keeps an FP8 E4M3 KV cache (the mismatch line then
// shows what that costs in sampler/trainer agreement) and the files get a -kvfp8 suffix.
//
// --config RUN.toml [--set k=v ...] [--steps S] instead runs `grpo train`'s own setup
// (train/loop_setup.h: model, data, rewards, [engine], trainer from the config) and
// times the loop's step (rollout_generate, policy_train_step, prefix-cache reset), so
// the figure is the one `grpo train` gets; see examples/bench-*.toml and
// tools/device/step_compare.sh. Writes bench/results/loop_step-<config stem>.json.
// --async K with --config times the synchronous loop and asynchronous rollouts with
// async.max_staleness = K in the same call (tools/device/async_bench.sh) and writes
// bench/results/loop_async-<config stem>.json with the synchronous loop as the peer.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_util.h"
#include "core/timer.h"
#include "engine/engine.h"
#include "engine/engine_config.h"
#include "kernels/linear.h"
#include "model/presets.h"
#include "model/train_model.h"
#include "train/loop_async.h"
#include "dist/bootstrap.h"
#include "train/data_parallel.h"
#include "train/loop_setup.h"
#include "train/optimizer.h"
#include "train/train_step.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

using namespace grpo;
using grpo::bench::device_used_bytes;
using grpo::bench::today;

namespace {

// bf16 GEMM rate through our own linear op (cuBLASLt), 8192^3, in FLOP/s.
double matmul_rate(Context& ctx) {
  if (ctx.device() != Device::cuda) return 0;
  const int64_t n = 8192;
  std::vector<float> host(size_t(n * n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : host) x = nd(rng);
  Tensor a = tensor_from_f32(Device::cuda, DType::bf16, host, {n, n});
  Tensor b = tensor_from_f32(Device::cuda, DType::bf16, host, {n, n});
  Tensor c = tensor_empty(Device::cuda, DType::bf16, {n, n});
  for (int i = 0; i < 3; ++i) linear_forward(ctx, c, a, b, nullptr, false);
  ctx.synchronize();
  double t0 = now_seconds();
  for (int i = 0; i < 10; ++i) linear_forward(ctx, c, a, b, nullptr, false);
  ctx.synchronize();
  return 2.0 * double(n) * n * n * 10 / (now_seconds() - t0);
}

double metric_of(const MetricList& m, const std::string& name) {
  for (const auto& kv : m)
    if (kv.first == name) return kv.second;
  return 0.0;
}

// The loop's step from a run config: what `grpo train CONFIG` runs, without its logging.
int run_config_bench(const std::string& config_path, const std::vector<std::string>& sets, int steps,
                     const std::string& out_dir, bool dist) {
  auto cfg = run_config_load(config_path, sets);
  if (!cfg.ok()) {
    std::fprintf(stderr, "bench_grpo: %s\n", cfg.status().message().c_str());
    return 1;
  }
  if (steps <= 0) steps = int(cfg->train.steps);
  cfg->train.steps = std::max<int64_t>(cfg->train.steps, steps);
  TrainLoopOptions lo;
  lo.out_dir = cfg->run.output_dir + "-bench";
  // --dist: the data-parallel path (communicator, bucketed all-reduce, [dist] zero_stage)
  // at whatever world size mpirun gives, to measure its cost against the plain step.
  std::unique_ptr<Communicator> comm;
  if (dist) {
    DistLaunch dl;
    dl.kind = LaunchKind::mpi;
    dl.timeout_s = cfg->dist.timeout_s;
    auto c = dist_init(dl, cfg->model.device.kind);
    if (!c.ok()) {
      std::fprintf(stderr, "bench_grpo: %s\n", c.status().message().c_str());
      return 1;
    }
    comm = std::move(c).value();
    if (comm->size() != 1) {
      std::fprintf(stderr, "bench_grpo: --dist measures world size 1 (mpirun -np 1); got %d ranks\n", comm->size());
      return 1;
    }
    lo.comm = comm.get();
  }
  std::error_code ec;
  std::filesystem::remove_all(lo.out_dir, ec);  // loop_setup refuses a directory that holds checkpoints
  auto setup = loop_setup(cfg.value(), lo);
  if (!setup.ok()) {
    std::fprintf(stderr, "bench_grpo: %s\n", setup.status().message().c_str());
    return 1;
  }
  LoopRun& r = *setup.value();
  DataParallel dp;
  if (comm) {
    loop_setup_data_parallel(r, *comm, dp, 0);
    std::printf("dist: %s backend, world size %d, zero_stage %d, overlap %s\n", comm->backend(), comm->size(),
                dp.zero_stage, dp.reducer ? "on" : "off");
  }
  const EngineOptions& eo = r.engine->options();
  std::printf("engine: %d KV blocks of %d (%.2f GiB), max_num_seqs %d, max_num_batched_tokens %d, cuda graphs %s\n",
              r.engine->n_kv_blocks(), eo.block_size,
              double(size_t(r.engine->n_kv_blocks()) * r.engine->kv_bytes_per_block()) / double(1ull << 30),
              eo.max_num_seqs, eo.max_num_batched_tokens, eo.use_cuda_graphs ? "on" : "off");
  const bool use_old = cfg->train.num_iterations > 1 || cfg->train.steps_per_generation > 1;
  std::vector<double> step_s, rollout_s, train_s;
  nlohmann::json last;
  for (int step = 0; step < steps; ++step) {
    const double t0 = now_seconds();
    std::vector<PreparedPrompt> prompts;
    for (size_t i : r.cursor->next(size_t(cfg->rollout.prompts_per_step))) {
      auto p = prompt_prepare(r.format, *r.tok, r.env->example(Split::train, i));
      if (!p.ok()) {
        std::fprintf(stderr, "bench_grpo: %s\n", p.status().message().c_str());
        return 1;
      }
      prompts.push_back(std::move(p).value());
    }
    auto b = rollout_generate(*r.engine, *r.env, *r.rewards, std::move(prompts), r.rollout_cfg, step);
    if (!b.ok()) {
      std::fprintf(stderr, "bench_grpo: %s\n", b.status().message().c_str());
      return 1;
    }
    r.ctx->synchronize();
    const double t1 = now_seconds();
    auto tm = policy_train_step(r.trainer, b.value(), 0, b->completions.size(), use_old);
    if (!tm.ok()) {
      std::fprintf(stderr, "bench_grpo: %s\n", tm.status().message().c_str());
      return 1;
    }
    r.engine->reset_prefix_cache();
    r.ctx->synchronize();
    const double t2 = now_seconds();
    step_s.push_back(t2 - t0);
    rollout_s.push_back(t1 - t0);
    train_s.push_back(t2 - t1);
    const double gen = double(b->n_completion_tokens);
    std::printf("step %d: rollout %.3f s (%.0f tok/s, prefix hits %.0f tokens)  train %.3f s  total %.3f s  "
                "logprob mismatch max %.3g mean %.3g\n",
                step, t1 - t0, gen / (t1 - t0), metric_of(b->metrics, "rollout/prefix_hit_tokens"), t2 - t1, t2 - t0,
                metric_of(tm.value(), "logprob_mismatch/max"), metric_of(tm.value(), "logprob_mismatch/mean"));
    last = {{"generated_tokens", gen}, {"rollout_tokens_per_s", gen / (t1 - t0)},
            {"prefix_hit_tokens", metric_of(b->metrics, "rollout/prefix_hit_tokens")},
            {"logprob_mismatch_max", metric_of(tm.value(), "logprob_mismatch/max")},
            {"logprob_mismatch_mean", metric_of(tm.value(), "logprob_mismatch/mean")},
            {"grad_norm", metric_of(tm.value(), "grad_norm")},
            {"allreduce_s", metric_of(tm.value(), "time/allreduce")},
            {"allreduce_exposed_s", metric_of(tm.value(), "time/allreduce_exposed")}};
  }
  // The first step pays one-time costs (trainer buffers, allocator warm-up): report the mean of the others.
  auto mean_after_first = [](const std::vector<double>& v) {
    if (v.size() < 2) return v.empty() ? 0.0 : v[0];
    double s = 0;
    for (size_t i = 1; i < v.size(); ++i) s += v[i];
    return s / double(v.size() - 1);
  };
  last["seconds"] = mean_after_first(step_s);
  last["rollout_s"] = mean_after_first(rollout_s);
  last["train_s"] = mean_after_first(train_s);
  last["first_step_s"] = step_s.empty() ? 0.0 : step_s[0];
  std::printf("mean of steps 1..%d: step %.3f s (rollout %.3f s, train %.3f s)\n", steps - 1,
              last["seconds"].get<double>(), last["rollout_s"].get<double>(), last["train_s"].get<double>());
  const std::string stem = std::filesystem::path(config_path).stem().string() + (dist ? "-dist" : "") +
                           (r.cfg.train.on_policy == OnPolicy::bitwise ? "-bitwise" : "");
  std::string cmdline = std::string(dist ? "mpirun -np 1 " : "") + "bench_grpo --config " + config_path +
                        (dist ? " --dist" : "");
  for (const auto& x : sets) cmdline += " --set " + x;
  nlohmann::json conf = run_config_to_json(r.cfg);
  conf["engine_resolved"] = {{"n_kv_blocks", r.engine->n_kv_blocks()}, {"block_size", eo.block_size},
                             {"max_num_seqs", eo.max_num_seqs}, {"max_num_batched_tokens", eo.max_num_batched_tokens},
                             {"cuda_graphs", eo.use_cuda_graphs}, {"kv_dtype", dtype_name(r.engine->kv_cache_dtype())}};
  nlohmann::json j = {{"bench", "loop_step"}, {"date", today()}, {"device", device_name(r.ctx->device())},
                      {"command", cmdline}, {"config", conf}, {"metrics", last}};
  const std::string path = out_dir + "/loop_step-" + stem + ".json";
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

// Mean of v[1..]: the first step pays one-time costs (buffers, allocator warm-up, the prime).
double mean_after_first(const std::vector<double>& v) {
  if (v.size() < 2) return v.empty() ? 0.0 : v[0];
  double s = 0;
  for (size_t i = 1; i < v.size(); ++i) s += v[i];
  return s / double(v.size() - 1);
}

// `steps` loop steps of the config with async.max_staleness = k (0: the synchronous
// step as run_config_bench times it; k > 0: train/loop_async.h, as `grpo train` runs it).
Result<nlohmann::json> measure_loop(const std::string& config_path, std::vector<std::string> sets, int steps, int64_t k) {
  sets.push_back("async.max_staleness=" + std::to_string(k));
  GRPO_ASSIGN_OR_RETURN(RunConfig cfg, run_config_load(config_path, sets));
  // k more generations than steps, so that every timed step has a rollout in flight.
  cfg.train.steps = std::max<int64_t>(cfg.train.steps, steps + k);
  TrainLoopOptions lo;
  lo.out_dir = cfg.run.output_dir + "-bench-async" + std::to_string(k);
  std::error_code ec;
  std::filesystem::remove_all(lo.out_dir, ec);
  GRPO_ASSIGN_OR_RETURN(std::unique_ptr<LoopRun> run, loop_setup(cfg, lo));
  LoopRun& r = *run;
  std::unique_ptr<AsyncRollouts> async;
  if (k > 0) async = std::make_unique<AsyncRollouts>(r);
  std::vector<double> step_s, wait_s, idle_s;
  double tokens = 0;
  for (int step = 0; step < steps; ++step) {
    const double t0 = now_seconds();
    MetricList rec;
    RolloutBatch b;
    if (async) {
      if (!async->primed()) GRPO_TRY(async->prime());
      b = async->pop(&rec);
      async->launch();
    } else {
      std::vector<PreparedPrompt> prompts;
      for (size_t i : r.cursor->next(size_t(cfg.rollout.prompts_per_step))) {
        GRPO_ASSIGN_OR_RETURN(PreparedPrompt p, prompt_prepare(r.format, *r.tok, r.env->example(Split::train, i)));
        prompts.push_back(std::move(p));
      }
      GRPO_ASSIGN_OR_RETURN(b, rollout_generate(*r.engine, *r.env, *r.rewards, std::move(prompts), r.rollout_cfg, step));
    }
    auto tm = policy_train_step(r.trainer, b, 0, b.completions.size(), bool(async));
    if (async) GRPO_TRY(async->join(now_seconds(), r.state.step + 1, &rec));
    GRPO_TRY(tm.status());
    ++r.state.step;  // as the loop counts versions
    r.engine->reset_prefix_cache();
    r.ctx->synchronize();
    const double t1 = now_seconds();
    step_s.push_back(t1 - t0);
    wait_s.push_back(metric_of(rec, "time/trainer_wait"));
    idle_s.push_back(metric_of(rec, "time/engine_idle"));
    tokens = double(b.n_completion_tokens);
    std::printf("max_staleness %lld step %d: %.3f s (train %.3f s, trainer waited %.3f s, engine idle %.3f s, lag %.0f)\n",
                (long long)k, step, t1 - t0, metric_of(tm.value(), "time/train"), wait_s.back(), idle_s.back(),
                metric_of(rec, "async/version_lag"));
  }
  const double mean = mean_after_first(step_s);
  return nlohmann::json{{"max_staleness", k},
                        {"seconds_per_step", mean},
                        {"trainer_wait_s", mean_after_first(wait_s)},
                        {"engine_idle_s", mean_after_first(idle_s)},
                        {"first_step_s", step_s.empty() ? 0.0 : step_s[0]},
                        {"generated_tokens_per_step", tokens},
                        {"tokens_per_s", mean > 0 ? tokens / mean : 0.0},
                        {"device", device_name(r.ctx->device())}};
}

// --async K: the synchronous loop and max_staleness = K in one call, one setup after the other.
int async_config_bench(const std::string& config_path, const std::vector<std::string>& sets, int steps, int64_t k,
                       const std::string& out_dir) {
  if (steps < 2) steps = 4;
  auto sync = measure_loop(config_path, sets, steps, 0);
  if (!sync.ok()) {
    std::fprintf(stderr, "bench_grpo: synchronous run: %s\n", sync.status().message().c_str());
    return 1;
  }
  auto async = measure_loop(config_path, sets, steps, k);
  if (!async.ok()) {
    std::fprintf(stderr, "bench_grpo: async.max_staleness = %lld: %s\n", (long long)k, async.status().message().c_str());
    return 1;
  }
  const double ts = sync.value()["seconds_per_step"].get<double>(), ta = async.value()["seconds_per_step"].get<double>();
  std::printf("\n%-22s %12s %14s %14s\n", "loop", "s/step", "trainer wait", "engine idle");
  for (const auto* j : {&sync.value(), &async.value()})
    std::printf("max_staleness = %-6lld %12.3f %14.3f %14.3f\n", (long long)(*j)["max_staleness"].get<int64_t>(),
                (*j)["seconds_per_step"].get<double>(), (*j)["trainer_wait_s"].get<double>(),
                (*j)["engine_idle_s"].get<double>());
  std::printf("async / sync step throughput: %.3fx\n", ta > 0 ? ts / ta : 0.0);
  const std::string stem = std::filesystem::path(config_path).stem().string();
  std::string cmdline = "bench_grpo --config " + config_path + " --async " + std::to_string(k) + " --steps " +
                        std::to_string(steps);
  for (const auto& x : sets) cmdline += " --set " + x;
  nlohmann::json j = {{"bench", "loop_async"},
                      {"date", today()},
                      {"device", async.value()["device"]},
                      {"command", cmdline},
                      {"config", {{"config", config_path}, {"sets", sets}, {"steps", steps}, {"max_staleness", k}}},
                      {"metrics", async.value()},
                      {"peer", {{"name", "synchronous loop (async.max_staleness = 0)"}, {"metrics", sync.value()}}},
                      {"ratios", {{"step_throughput_async_over_sync", ta > 0 ? ts / ta : 0.0}}}};
  const std::string path = out_dir + "/loop_async-" + stem + ".json";
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "qwen2.5-0.5b", device = "cuda", out_dir = "bench/results", kv_cache_dtype = "auto";
  int n_prompts = 8, group = 8, prompt_len = 128, new_tokens = 512, micro_tokens = 16384, steps = 2;
  double kv_gb = 16;
  bool recompute = false, graphs = true;
  std::string config_path;
  std::vector<std::string> sets;
  bool steps_given = false, dist = false;
  int64_t async_k = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--preset") preset = next();
    else if (a == "--device") device = next();
    else if (a == "--prompts") n_prompts = std::stoi(next());
    else if (a == "--group") group = std::stoi(next());
    else if (a == "--prompt-len") prompt_len = std::stoi(next());
    else if (a == "--new") new_tokens = std::stoi(next());
    else if (a == "--micro-tokens") micro_tokens = std::stoi(next());
    else if (a == "--steps") steps = std::stoi(next()), steps_given = true;
    else if (a == "--config") config_path = next();
    else if (a == "--dist") dist = true;
    else if (a == "--set") sets.push_back(next());
    else if (a == "--async") async_k = std::stoll(next());
    else if (a == "--kv-gb") kv_gb = std::stod(next());
    else if (a == "--kv-cache-dtype") kv_cache_dtype = next();
    else if (a == "--recompute") recompute = true;
    else if (a == "--no-graphs") graphs = false;
    else if (a == "--out-dir") out_dir = next();
    else {
      std::fprintf(stderr, "usage: bench_grpo [--preset P] [--device cuda|cpu] [--prompts B] [--group G] "
                           "[--prompt-len P] [--new N] [--micro-tokens T] [--steps S] [--kv-gb G] "
                           "[--kv-cache-dtype auto|fp8] [--recompute] [--no-graphs]\n"
                           "       bench_grpo --config RUN.toml [--set key=value ...] [--steps S] [--async K] [--out-dir DIR] "
                           "[--dist (under mpirun -np 1)]\n");
      return 2;
    }
  }
  if (async_k < 0 || (async_k > 0 && config_path.empty())) {
    std::fprintf(stderr, "bench_grpo: --async %lld: needs --config RUN.toml and K >= 1 (the max_staleness to compare "
                         "with the synchronous loop)\n", (long long)async_k);
    return 2;
  }
  if (async_k > 0 && dist) {
    std::fprintf(stderr, "bench_grpo: --async and --dist cannot be combined ([async] runs on one rank)\n");
    return 2;
  }
  if (async_k > 0) return async_config_bench(config_path, sets, steps_given ? steps : 4, async_k, out_dir);
  if (!config_path.empty()) return run_config_bench(config_path, sets, steps_given ? steps : 0, out_dir, dist);
  auto cfg = preset_config(preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "bench_grpo: %s\n", cfg.status().message().c_str());
    return 1;
  }
  ContextOptions co;
  co.device = device == "cuda" ? Device::cuda : Device::cpu;
  Context ctx(co);
  DType dt = co.device == Device::cuda ? DType::bf16 : DType::f32;
  double flops_rate = matmul_rate(ctx);
  size_t used0 = device_used_bytes();
  ModelWeights w = weights_random(*cfg, co.device, dt, 1234, &ctx);
  EngineConfig ec;
  ec.kv_cache_mib = int64_t(kv_gb * 1024.0);
  ec.max_num_seqs = n_prompts * group;
  ec.max_num_batched_tokens = std::max(8192, n_prompts * group);
  ec.cuda_graphs = graphs ? CudaGraphsMode::automatic : CudaGraphsMode::off;
  if (auto kv = enum_parse(kv_cache_dtype_names(), kv_cache_dtype)) ec.kv_cache_dtype = *kv;
  else {
    std::fprintf(stderr, "bench_grpo: --kv-cache-dtype %s: must be one of %s\n", kv_cache_dtype.c_str(),
                 enum_allowed(kv_cache_dtype_names()).c_str());
    return 2;
  }
  auto eo_r = engine_options_from_config(ec, co.device, *cfg, dt, MemoryUse{}, n_prompts * group);
  if (!eo_r.ok()) {
    std::fprintf(stderr, "bench_grpo: %s\n", eo_r.status().message().c_str());
    return 2;
  }
  const EngineOptions eo = eo_r.value();
  auto kv_dtype = engine_kv_cache_dtype(*cfg, dt, eo);
  if (!kv_dtype.ok()) {
    std::fprintf(stderr, "bench_grpo: --kv-cache-dtype: %s\n", kv_dtype.status().message().c_str());
    return 2;
  }
  // An fp8 run writes *-kvfp8.json, next to (not over) the default run's files.
  const std::string suffix = kv_dtype.value() == DType::f8e4m3 ? "-kvfp8" : "";
  Engine engine(ctx, w, nullptr, eo);
  AdamWConfig ac;
  ac.weight_decay = 0.0f;
  ac.max_grad_norm = 1.0f;
  Optimizer opt = optimizer_create(ctx, w, ac);
  TrainModelOptions to;
  to.recompute = recompute;
  TrainModel tm(to);
  GrpoStepOptions so;
  so.loss.loss_type = LossType::dapo;
  so.loss.epsilon = 0.2f;
  so.loss.epsilon_high = 0.28f;
  so.loss.max_completion_length = new_tokens;
  so.micro.max_tokens = micro_tokens;

  std::mt19937 rng(42);
  std::uniform_int_distribution<int> tok(0, cfg->vocab_size - 1);
  std::normal_distribution<float> nd(0.f, 1.f);
  nlohmann::json last;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n_prompts), std::vector<int32_t>(static_cast<size_t>(prompt_len)));
    for (auto& p : prompts)
      for (auto& x : p) x = tok(rng);
    SamplingParams sp;
    sp.n = group;
    sp.max_tokens = new_tokens;
    sp.min_tokens = new_tokens;
    sp.ignore_eos = true;
    sp.seed = uint64_t(step + 1);
    ctx.synchronize();
    double t0 = now_seconds();
    auto outs = engine.generate(prompts, sp);
    if (!outs.ok()) {
      std::fprintf(stderr, "bench_grpo: %s\n", outs.status().message().c_str());
      return 1;
    }
    ctx.synchronize();
    double t1 = now_seconds();
    std::vector<GrpoSample> samples;
    int64_t gen_tokens = 0;
    for (auto& o : *outs) {
      GrpoSample s;
      s.prompt = o.prompt_ids;
      s.completion = o.completion_ids;
      s.rollout_logp = o.logprobs_raw;
      s.advantage = nd(rng);
      gen_tokens += int64_t(o.completion_ids.size());
      samples.push_back(std::move(s));
    }
    grpo::bench::profile_range("train", true);
    auto st = grpo_train_step(ctx, tm, w, opt, 1e-6, samples, so);
    grpo::bench::profile_range("train", false);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_grpo: %s\n", st.status().message().c_str());
      return 1;
    }
    ctx.synchronize();
    double t2 = now_seconds();
    engine.reset_prefix_cache();
    double t3 = now_seconds();
    const GrpoMetrics& m = st->metrics;
    double train_tokens = double(st->n_tokens);
    double n_params = double(cfg->n_params());
    double mfu = flops_rate > 0 ? 6.0 * n_params * train_tokens / (t2 - t1) / flops_rate : 0;
    std::printf("step %d: rollout %.3f s (%.0f tok/s)  train %.3f s (MFU %.1f%%)  sync %.6f s  total %.3f s  "
                "mismatch max %.4g mean %.4g kl %.3g  grad_norm %.3g\n",
                step, t1 - t0, gen_tokens / (t1 - t0), t2 - t1, 100 * mfu, t3 - t2, t3 - t0,
                m.roll_abs_max, m.rollout_abs_diff_mean(), m.rollout_kl(), st->optim.grad_norm);
    last = {{"rollout_s", t1 - t0}, {"train_s", t2 - t1}, {"sync_s", t3 - t2}, {"seconds", t3 - t0},
            {"generated_tokens", gen_tokens}, {"rollout_tokens_per_s", gen_tokens / (t1 - t0)},
            {"train_tokens", train_tokens}, {"train_mfu", mfu}, {"bf16_matmul_flops", flops_rate},
            {"logprob_mismatch_max", m.roll_abs_max}, {"logprob_mismatch_mean", m.rollout_abs_diff_mean()},
            {"logprob_mismatch_kl", m.rollout_kl()}, {"grad_norm", st->optim.grad_norm},
            {"peak_device_bytes", device_used_bytes() - used0}, {"n_params", n_params}};
  }
  std::string cmdline = "bench_grpo --preset " + preset + " --device " + device +
                        (suffix.empty() ? std::string() : " --kv-cache-dtype " + kv_cache_dtype);
  nlohmann::json conf = {{"preset", preset}, {"prompts", n_prompts}, {"group", group},
                         {"kv_cache_dtype", kv_cache_dtype}, {"kv_dtype", dtype_name(kv_dtype.value())},
                         {"prompt_len", prompt_len}, {"new_tokens", new_tokens}, {"micro_tokens", micro_tokens},
                         {"recompute", recompute}, {"cuda_graphs", eo.use_cuda_graphs}, {"loss", "dapo"}};
  nlohmann::json step_j = {{"bench", "grpo_step"}, {"date", today()}, {"device", device},
                           {"command", cmdline}, {"config", conf}, {"metrics", last}};
  nlohmann::json train_j = step_j;
  train_j["bench"] = "train_step";
  train_j["metrics"]["seconds"] = last["train_s"];
  std::ofstream(out_dir + "/grpo_step-" + preset + suffix + ".json") << step_j.dump(2) << "\n";
  std::ofstream(out_dir + "/train_step-" + preset + suffix + ".json") << train_j.dump(2) << "\n";
  std::printf("wrote %s/grpo_step-%s%s.json and train_step-%s%s.json\n", out_dir.c_str(), preset.c_str(),
              suffix.c_str(), preset.c_str(), suffix.c_str());
  return 0;
}
