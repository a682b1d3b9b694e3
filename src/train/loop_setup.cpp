// Setup of a `grpo train` run (see loop_setup.h).
#include "train/loop_setup.h"

#include "kernels/linear.h"

#include "train/data_parallel.h"
#include "train/lora_setup.h"

#include "dist/communicator.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "core/log.h"
#include "engine/model_runner.h"
#include "engine/speculative.h"
#include "train/loop_async.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"

namespace grpo {

namespace fs = std::filesystem;

namespace {

Result<ContextOptions> context_options(const RunConfig& cfg, int n_threads) {
  ContextOptions co;
  co.n_threads = n_threads;
  // Bitwise on-policy needs every kernel of both sides batch-invariant (docs/bitwise.md).
  co.deterministic = cfg.run.deterministic || cfg.train.on_policy == OnPolicy::bitwise;
  const DeviceSpec& d = cfg.model.device;
  if (d.kind == Device::cpu) return co;
  if (!cuda_available())
    return error_status("model.device = \"" + device_spec_name(d) +
                        "\": no CUDA device (or built without CUDA); use --set model.device=cpu");
  co.device = Device::cuda;
  if (d.index >= 0) co.cuda_device = d.index;
  co.batch_invariant = cfg.train.on_policy == OnPolicy::bitwise;
  return co;
}

// Loop-specific checks the config validator cannot know about.
Status check_loop_config(const RunConfig& cfg) {
  if (cfg.rollout.prompts_per_step * cfg.rollout.num_generations < cfg.train.steps_per_generation)
    return error_status("train.steps_per_generation = " + std::to_string(cfg.train.steps_per_generation) +
                        ": larger than the generation batch (rollout.prompts_per_step × rollout.num_generations = " +
                        std::to_string(cfg.rollout.prompts_per_step * cfg.rollout.num_generations) + ")");
  if (cfg.model.path.empty())
    return error_status("model.path is empty: point it at a Hugging Face checkpoint directory (e.g. models/arith-tiny)");
  return ok_status();
}

GrpoLossConfig loss_config(const RunConfig& cfg) {
  GrpoLossConfig l;
  l.loss_type = cfg.train.loss_type;
  l.beta = float(cfg.train.beta);
  l.epsilon = float(cfg.train.epsilon);
  l.epsilon_high = float(cfg.train.epsilon_high > 0 ? cfg.train.epsilon_high : cfg.train.epsilon);
  l.is_mode = cfg.train.importance_sampling;
  l.is_level = cfg.train.importance_sampling_level;
  l.is_cap = float(cfg.train.importance_sampling_cap);
  l.is_sequence_geomean = cfg.train.importance_sampling_geomean;
  l.mask_truncated_completions = cfg.train.mask_truncated_completions;
  l.max_completion_length = int(cfg.rollout.max_new_tokens);
  return l;
}

Status prepare_all(const LoopRun& r, const std::vector<size_t>& idx, Split split, std::vector<PreparedPrompt>* out) {
  for (size_t i : idx) {
    GRPO_ASSIGN_OR_RETURN(PreparedPrompt p, prompt_prepare(r.format, *r.tok, r.env->example(split, i)));
    out->push_back(std::move(p));
  }
  return ok_status();
}

// What the process holds on the device besides the KV pool, for the pool's budget:
// weights, optimizer state and reference by size, the trainer's workspace at its
// largest micro-batch (estimated), and whatever else is in use now (measured).
MemoryUse memory_use(const LoopRun& r, size_t longest_prompt) {
  MemoryUse m;
  const RunConfig& c = r.cfg;
  if (r.ctx->device() != Device::cuda) return m;
  size_t used = 0;
  device_memory_in_use(&used, &m.total);
  const Optimizer& o = r.trainer.opt;
  m.weights = r.weights->arena.nbytes();
  m.optimizer = o.m.nbytes() + o.v.nbytes() + o.grad_arena.nbytes() +
                (o.master.data != r.weights->arena.data ? o.master.nbytes() : 0);
  m.reference = r.trainer.ref ? r.trainer.ref->arena.nbytes() : 0;
  // A second model in the engine (tandem partner, speculative draft) counts as weights.
  for (const auto* second : {r.partner.get(), r.draft.get()})
    if (second) m.weights += second->arena.nbytes();
  m.other = used > m.weights + m.optimizer + m.reference ? used - (m.weights + m.optimizer + m.reference) : 0;
  // Prompts may run longer than the ones seen at setup: x2.
  const int64_t seq_len = int64_t(2 * longest_prompt + 16) + std::max(c.rollout.max_new_tokens, c.eval.max_new_tokens);
  const int64_t micro_tokens = std::max(seq_len, std::min(c.train.micro_batch_tokens, c.train.micro_batch * seq_len));
  m.activations = train_model_activation_bytes(r.weights->config, r.weights->dtype, micro_tokens,
                                               c.train.activation_recompute);
  // Asynchronous rollouts score old logprobs with a second model on the engine's side.
  if (r.engine_ctx) m.activations *= 2;
  return m;
}

// The frozen partner of tandem training: tandem.partner (or the initial policy again),
// in the policy's dtype (loaded before the engine's memory budget is set).
Status tandem_load_partner(LoopRun& r, const ContextOptions& co, DType dt) {
  auto pw = model_load(r.paths.tandem_partner, co.device, dt, r.ctx.get());
  if (!pw.ok()) return pw.status().with_context("tandem.partner (" + r.paths.tandem_partner + ")");
  r.partner = std::make_unique<ModelWeights>(std::move(pw).value());
  return ok_status();
}

// The partner checked against the policy (vocabulary, tokenizer, context) and the tandem options.
Result<EngineTandem> tandem_setup(LoopRun& r, const EngineOptions& eo) {
  const RunConfig& c = r.cfg;
  const int max_len = eo.max_model_len > 0 ? eo.max_model_len : r.weights->config.max_position_embeddings;
  GRPO_TRY(tandem_check_partner(r.weights->config, r.partner->config, max_len));
  // Same vocabulary means the same token strings, not just the same count.
  const fs::path pdir(r.paths.tandem_partner);
  if (!c.tandem.partner.empty() && fs::exists(pdir / "tokenizer.json")) {
    auto pt = Tokenizer::load(pdir.string());
    if (!pt.ok()) return pt.status().with_context("tandem.partner tokenizer");
    const int n = std::max(pt.value().vocab_size(), r.tok->vocab_size());
    for (int id = 0; id < n; ++id)
      if (pt.value().token_bytes(id) != r.tok->token_bytes(id))
        return error_status("tandem.partner = \"" + c.tandem.partner + "\": its tokenizer differs from the run's at id " +
                            std::to_string(id) + " (\"" + pt.value().token_bytes(id) + "\" vs \"" +
                            r.tok->token_bytes(id) + "\"); tandem decoding needs one shared vocabulary");
  }
  GRPO_TRY(tandem_kv_blocks(r.weights->config, r.weights->dtype, r.partner->config, r.partner->dtype, eo).status());
  EngineTandem et;
  et.partner = r.partner.get();
  et.opt.strategy = c.tandem.strategy;
  et.opt.p_trained = c.tandem.p_trained;
  et.opt.chunk_size = int(c.tandem.chunk_size);
  et.opt.seed = uint64_t(c.tandem.seed);
  if (et.opt.strategy == TandemStrategy::word) et.opt.token_flags = tandem_word_flags(*r.tok, r.weights->config.vocab_size);
  GRPO_TRY(et.opt.validate(r.weights->config.vocab_size));
  return et;
}

std::string tokenizer_dir(const std::string& p) {
  return fs::is_directory(p) ? p : fs::path(p).parent_path().string();
}

Status write_run_files(const LoopRun& r, const PreparedPrompt* example) {
  GRPO_TRY(write_file_atomic((fs::path(r.out_dir) / "config.toml").string(), run_config_to_toml(r.cfg)));
  const ModelConfig& mc = r.weights->config;
  nlohmann::ordered_json j;
  j["paths"] = {{"model", r.paths.model}, {"tokenizer", r.paths.tokenizer}, {"train_data", r.paths.train_data},
                {"eval_data", r.paths.eval_data}, {"output_dir", r.out_dir}};
  j["device"] = device_name(r.ctx->device());
  j["threads"] = r.ctx->n_threads();
  j["model"] = {{"arch", arch_name(mc.arch)}, {"n_params", mc.n_params()}, {"vocab_size", mc.vocab_size},
                {"hidden_size", mc.hidden_size}, {"n_layers", mc.n_layers}, {"dtype", dtype_name(r.weights->dtype)}};
  j["environment"] = {{"name", r.env->name()}, {"train_size", r.env->size(Split::train)},
                      {"eval_size", r.eval_prompts.size()}};
  const EngineOptions& eo = r.engine->options();
  j["engine"] = {{"n_kv_blocks", r.engine->n_kv_blocks()}, {"block_size", eo.block_size},
                 {"kv_cache_dtype", dtype_name(r.engine->kv_cache_dtype())},
                 {"kv_bytes", size_t(r.engine->n_kv_blocks()) * r.engine->kv_bytes_per_block()},
                 {"kv_budget_bytes", eo.kv_cache_bytes},
                 {"max_num_seqs", eo.max_num_seqs}, {"max_num_batched_tokens", eo.max_num_batched_tokens},
                 {"max_model_len", r.engine->max_model_len()}, {"cuda_graphs", eo.use_cuda_graphs},
                 {"prefix_caching", eo.enable_prefix_caching}, {"chunked_prefill", eo.enable_chunked_prefill},
                 {"eos_token_ids", r.engine->eos_token_ids()}};
  if (r.partner)
    j["tandem"] = {{"partner", r.paths.tandem_partner}, {"partner_params", r.partner->config.n_params()},
                   {"strategy", tandem_strategy_name(r.cfg.tandem.strategy)}, {"p_trained", r.cfg.tandem.p_trained},
                   {"partner_weight", r.cfg.tandem.partner_weight}};
  if (eo.speculative.enabled())
    j["speculative"] = {{"method", spec_method_name(eo.speculative.method)},
                        {"draft_model", eo.speculative.draft_model},
                        {"num_speculative_tokens", eo.speculative.num_speculative_tokens},
                        {"adaptive", eo.speculative.adaptive}};
  const TrainSection& t = r.cfg.train;
  j["loss"] = {{"type", loss_type_name(r.trainer.loss.loss_type)}, {"epsilon", t.epsilon},
               {"epsilon_high", t.epsilon_high > 0 ? t.epsilon_high : t.epsilon}, {"beta", t.beta},
               {"importance_sampling", is_mode_name(r.trainer.loss.is_mode)},
               {"importance_sampling_level", is_level_name(r.trainer.loss.is_level)},
               {"trainer_temperature", r.cfg.rollout.temperature},
               {"rollout_logprobs", logprobs_mode_name(r.rollout_cfg.params.logprobs_mode)},
               {"on_policy", enum_name(on_policy_names(), r.cfg.train.on_policy)}};
  j["trainer"] = {{"micro_batch", r.trainer.micro_batch}, {"micro_batch_tokens", r.trainer.micro_tokens},
                  {"grad_accum", r.trainer.grad_accum}, {"activation_recompute", r.trainer.model.opt.recompute},
                  {"weight_decay_all", r.trainer.opt.cfg.decay_all}};
  j["steps"] = {{"optimizer_steps", t.steps},
                {"steps_per_generation_batch", t.steps_per_generation * t.num_iterations},
                {"sequences_per_generation_batch", r.cfg.rollout.prompts_per_step * r.cfg.rollout.num_generations}};
  if (example) j["example_prompt"] = {{"text", example->text}, {"n_tokens", example->ids.size()}};
  j["resumed_from"] = r.resumed_from;
  return write_file_atomic((fs::path(r.out_dir) / "run_info.json").string(), j.dump(2) + "\n");
}

}  // namespace

Result<SamplingParams> loop_sampling_params(const RunConfig& cfg, bool eval, int vocab_size) {
  const RolloutSection& ro = cfg.rollout;
  SamplingParams sp;
  sp.stop = ro.stop;
  if (eval) {
    sp.n = 1;
    sp.temperature = cfg.eval.greedy ? 0.f : float(cfg.eval.temperature);
    sp.max_tokens = int(cfg.eval.max_new_tokens > 0 ? cfg.eval.max_new_tokens : ro.max_new_tokens);
    GRPO_TRY(sp.validate(vocab_size).with_context("[eval]"));
    return sp;
  }
  sp.n = int(ro.num_generations);
  sp.temperature = float(ro.temperature);
  sp.top_p = float(ro.top_p);
  sp.top_k = int(ro.top_k);
  sp.min_p = float(ro.min_p);
  sp.max_tokens = int(ro.max_new_tokens);
  sp.ignore_eos = ro.ignore_eos;
  sp.min_tokens = int(ro.min_new_tokens);
  // The trainer scores logits / temperature over the full vocabulary: raw logprobs at T = 1, else processed.
  sp.logprobs_mode = ro.temperature == 1.0 ? LogprobsMode::raw : LogprobsMode::processed;
  GRPO_TRY(sp.validate(vocab_size).with_context("[rollout]"));
  return sp;
}

int64_t loop_server_min_version(const LoopRun& r, int64_t version) {
  if (r.cfg.server.bridge == "none") return -1;
  if (r.broadcaster && r.broadcaster->stats().down) return -1;  // on_failure = "continue" lost the servers
  return version;
}

void loop_note_server_version(LoopRun& r, int64_t got, int64_t version) {
  if (r.server_lag_warned || got == version || r.cfg.server.bridge != "none") return;
  r.server_lag_warned = true;
  GRPO_LOG_WARN("rollout.server_url = %s answered from policy version %lld while the trainer's weights are those of "
                "step %lld, and without a weight bridge the loop cannot wait for the server: these rollouts are "
                "off-policy. Keep the server on this run's weights with server.bridge = \"nccl\" + grpo serve --receive "
                "(or follow the checkpoints with grpo serve --watch %s and set train.importance_sampling); "
                "docs/serve.md, Rollouts from a separate server. (Warned once.)",
                r.cfg.rollout.server_url.c_str(), (long long)got, (long long)version, r.out_dir.c_str());
}

std::vector<std::string> loop_plot_metrics(const MetricHistory& h) {
  std::vector<std::string> out;
  for (const char* n : {"reward/mean", "eval/accuracy", "eval/tandem/accuracy", "accuracy", "loss",
                        "completion/mean_length", "entropy", "kl", "grad_norm", "clip_ratio", "logprob_mismatch/max",
                        "eval/reward", "tandem/trained_token_frac", "tokens/s"})
    if (h.series().count(n)) out.push_back(n);
  return out;
}

// The KDE curriculum over the train split, restored from the checkpoint's state when resuming.
static Status loop_setup_curriculum(LoopRun& r) {
  const CurriculumSection& cs = r.cfg.curriculum;
  if (cs.type != CurriculumType::kde_valley) {
    if (!r.state.curriculum.is_null())
      GRPO_LOG_WARN("resume: the checkpoint carries curriculum state but curriculum.type = \"%s\"; it is dropped",
                    enum_name(curriculum_type_names(), cs.type));
    r.state.curriculum = nullptr;
    return ok_status();
  }
  CurriculumOptions o;
  o.ema_init = cs.ema_init;
  o.ema_decay = cs.ema_decay;
  o.bandwidth = cs.bandwidth;
  o.grid_points = int(cs.grid_points);
  o.n_clusters = int(cs.n_clusters);
  o.alpha = cs.alpha;
  o.base = int(r.cfg.rollout.num_generations);
  o.max_generations = int(cs.max_generations);
  std::vector<std::string> ids(r.env->size(Split::train));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = r.env->example(Split::train, i).id;
  auto c = KdeCurriculum::make(o, std::move(ids));
  if (!c.ok()) return c.status();
  r.curriculum = std::make_unique<KdeCurriculum>(std::move(c).value());
  if (r.resumed) {
    if (r.state.curriculum.is_null())
      GRPO_LOG_WARN("resume: %s has no curriculum state; the curriculum starts fresh", r.resumed_from.c_str());
    else
      GRPO_TRY(r.curriculum->restore(r.state.curriculum, r.resumed_from + "/trainer_state.json"));
  }
  return ok_status();
}

void loop_setup_data_parallel(LoopRun& r, Communicator& comm, DataParallel& dp, int64_t request_offset) {
  const RunConfig& cfg = r.cfg;
  dp.comm = &comm;
  dp.zero_stage = int(cfg.dist.zero_stage);
  dp.bucket_elems = std::max<int64_t>(1, int64_t(cfg.dist.bucket_mb * 1048576.0 / 4.0));
  if (dp.zero_stage == 1) dp_adopt_shard(r.trainer.opt, dp);
  if (cfg.dist.overlap_backward && !cfg.lora.enabled)
    dp.reducer = std::make_shared<GradReducer>(*r.ctx, comm, dp.bucket_elems);
  r.trainer.dp = &dp;
  r.rollout_cfg.request_offset = request_offset;
  r.rollout_cfg.comm = &comm;
}

Result<std::unique_ptr<LoopRun>> loop_setup(const RunConfig& cfg_in, const TrainLoopOptions& opt) {
  auto run = std::make_unique<LoopRun>();
  LoopRun& r = *run;
  r.cfg = cfg_in;
  r.out_dir = opt.out_dir.empty() ? cfg_in.run.output_dir : opt.out_dir;
  r.cfg.run.output_dir = r.out_dir;
  const RunConfig& cfg = r.cfg;
  GRPO_TRY(cfg.validate());
  GRPO_TRY(check_loop_config(cfg));
  GRPO_ASSIGN_OR_RETURN(r.paths, run_config_resolve_paths(cfg));

  // Which checkpoint to continue from, decided before any heavy work.
  if (opt.resume) {
    r.resumed_from = opt.resume_from.empty() ? checkpoint_latest(r.out_dir) : opt.resume_from;
    if (!opt.resume_from.empty() && !fs::exists(fs::path(opt.resume_from) / "trainer_state.json"))
      return error_status("--resume " + opt.resume_from + ": not a complete checkpoint (no trainer_state.json)");
    if (r.resumed_from.empty()) GRPO_LOG_WARN("--resume: no checkpoint in %s; starting at step 0", r.out_dir.c_str());
  } else if (!checkpoint_list(r.out_dir).empty()) {
    return error_status("output directory " + r.out_dir +
                        " already holds checkpoints; pass --resume to continue that run or choose another --out");
  }
  r.resumed = !r.resumed_from.empty();

  GRPO_TRY(async_check_config(cfg, opt.comm ? opt.comm->size() : 1));
  // With rollout.server_url the server samples ahead; the in-process engine (evals, and rollouts
  // on the trainer's thread while a server is lost) needs no weight snapshot or context of its own.
  const bool async = cfg.async.max_staleness > 0 && cfg.rollout.server_url.empty();
  GRPO_ASSIGN_OR_RETURN(ContextOptions co, context_options(cfg, opt.n_threads));
  const DType dt = cfg.model.dtype;
  ContextOptions engine_co = co;
  if (async) {
    // The CPU threads are split so that the two sides never queue for one pool; on CUDA
    // the engine's context brings its own stream, so rollout and training overlap on one GPU.
    const int total = co.n_threads > 0 ? co.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    engine_co.n_threads = cfg.async.engine_threads > 0 ? int(cfg.async.engine_threads) : std::max(1, total / 2);
    co.n_threads = std::max(1, total - engine_co.n_threads);
    // The engine's small decode kernels go ahead of the step's large ones on the shared GPU.
    engine_co.high_priority = true;
  }
  r.ctx = std::make_unique<Context>(co);
  if (co.batch_invariant) {  // sm_90 and bf16 (the batch-invariant GEMM), before any model is built
    const std::string why = batch_invariant_gemm_problem(*r.ctx, cfg.model.dtype);
    if (!why.empty()) return error_status("train.on_policy = \"bitwise\" " + why);
  }
  auto w = model_load(r.paths.model, co.device, dt, r.ctx.get());
  if (!w.ok()) return w.status().with_context("model.path");
  r.weights = std::make_unique<ModelWeights>(std::move(w).value());
  auto tok = Tokenizer::load(r.paths.tokenizer);
  if (!tok.ok()) return tok.status().with_context("tokenizer");
  r.tok = std::make_unique<Tokenizer>(std::move(tok).value());
  if (r.tok->vocab_size() > r.weights->config.vocab_size)
    return error_status("tokenizer " + r.tok->source() + " has " + std::to_string(r.tok->vocab_size()) +
                        " ids but the model's vocab_size is " + std::to_string(r.weights->config.vocab_size) +
                        ": model and tokenizer do not belong together");
  GRPO_ASSIGN_OR_RETURN(r.env, run_config_make_env(cfg, r.paths));
  GRPO_ASSIGN_OR_RETURN(RewardComposer rc, RewardComposer::make(cfg.reward));
  r.rewards = std::make_unique<RewardComposer>(std::move(rc));
  r.format = prompt_format_from_config(cfg);

  // Trainer.
  PolicyTrainer& t = r.trainer;
  t.ctx = r.ctx.get();
  t.w = r.weights.get();
  t.loss = loss_config(cfg);
  GRPO_TRY(t.loss.validate());
  t.sched.type = cfg.train.lr_schedule;
  t.sched.lr = cfg.train.lr;
  t.sched.warmup_steps = cfg.train.warmup_steps;
  t.sched.total_steps = cfg.train.steps;
  GRPO_TRY(t.sched.validate());
  t.micro_batch = int(cfg.train.micro_batch);
  t.micro_tokens = int(std::min<int64_t>(cfg.train.micro_batch_tokens, INT32_MAX));
  t.grad_accum = int(cfg.train.grad_accum);
  TrainModelOptions tmo;
  tmo.temperature = float(cfg.rollout.temperature);
  tmo.recompute = cfg.train.activation_recompute;
  t.model = TrainModel(tmo);
  AdamWConfig ac;
  ac.beta1 = float(cfg.train.adam_beta1);
  ac.beta2 = float(cfg.train.adam_beta2);
  ac.eps = float(cfg.train.adam_eps);
  ac.weight_decay = float(cfg.train.weight_decay);
  ac.decay_all = cfg.train.weight_decay_all;
  ac.max_grad_norm = float(cfg.train.max_grad_norm);
  GRPO_TRY(ac.validate());
  // ZeRO-1: this rank's shard of the optimizer state is all it ever allocates.
  const bool zero1 = opt.comm && cfg.dist.zero_stage == 1;
  auto shard_of = [&](int64_t n) {
    if (!zero1) return std::pair<int64_t, int64_t>(0, -1);
    const std::vector<int64_t> b = zero1_shards(n, opt.comm->size());
    return std::pair<int64_t, int64_t>(b[size_t(opt.comm->rank())], b[size_t(opt.comm->rank()) + 1]);
  };
  if (cfg.lora.enabled) {
    GRPO_ASSIGN_OR_RETURN(LoraConfig lc, lora_config_from(cfg.lora, r.paths.model));
    if (cfg.lora.init_from.empty()) {
      t.lora = lora_create_adapters(*r.weights, lc, uint64_t(cfg.lora.seed));
    } else {
      GRPO_ASSIGN_OR_RETURN(t.lora, lora_adapters_from(*r.weights, lc, cfg.lora.init_from));
    }
    t.model.lora = t.lora.get();
    const auto [lo, hi] = shard_of(t.lora->arena.numel());
    t.opt = optimizer_create_lora(*r.ctx, *t.lora, ac, lo, hi);
    const LoraMemory mem = lora_memory(r.weights->config, lc, r.weights->dtype);
    GRPO_LOG_INFO("lora: r=%d alpha=%g, %lld adapter parameters; parameter + optimizer memory %.1f MiB (full "
                  "fine-tuning: %.1f MiB)", lc.r, double(lc.alpha), (long long)mem.adapter_params,
                  double(mem.lora_bytes) / 1048576.0, double(mem.full_bytes) / 1048576.0);
  } else {
    const auto [lo, hi] = shard_of(r.weights->arena.numel());
    t.opt = optimizer_create(*r.ctx, *r.weights, ac, lo, hi);
  }
  if (cfg.train.beta > 0 && !cfg.lora.enabled) {
    auto ref = model_load(r.paths.model, co.device, dt, r.ctx.get());
    if (!ref.ok()) return ref.status().with_context("reference model");
    t.ref = std::make_unique<ModelWeights>(std::move(ref).value());
  }

  // Training state: fresh, or restored (weights, optimizer, counters).
  TrainerState& st = r.state;
  st.data_seed = uint64_t(cfg.data.seed);
  st.rollout_seed = uint64_t(cfg.rollout.seed);
  st.lr_schedule = enum_name(lr_schedule_names(), cfg.train.lr_schedule);
  st.lr = cfg.train.lr;
  st.warmup_steps = cfg.train.warmup_steps;
  st.total_steps = cfg.train.steps;
  if (r.resumed) {
    auto s = checkpoint_load(*r.ctx, r.resumed_from, *r.weights, t.opt);
    if (!s.ok()) return s.status().with_context("resuming from " + r.resumed_from);
    TrainerState ls = s.value();
    if (ls.data_seed != st.data_seed || ls.rollout_seed != st.rollout_seed)
      GRPO_LOG_WARN("resume: data.seed / rollout.seed differ from the checkpoint's; the data order and samples change");
    if (ls.lr_schedule != st.lr_schedule || ls.lr != st.lr || ls.total_steps != st.total_steps ||
        ls.warmup_steps != st.warmup_steps)
      GRPO_LOG_WARN("resume: the learning-rate schedule differs from the checkpoint's; using the config's");
    if (ls.mid_generation)
      GRPO_LOG_WARN("resume: %s was saved inside a generation batch; its remaining steps start a new batch",
                    r.resumed_from.c_str());
    ls.data_seed = st.data_seed;
    ls.rollout_seed = st.rollout_seed;
    ls.lr_schedule = st.lr_schedule;
    ls.lr = st.lr;
    ls.warmup_steps = st.warmup_steps;
    ls.total_steps = st.total_steps;
    ls.stopped_early = false;  // resuming a stopped run means: keep going
    st = ls;
  }
  r.cursor = std::make_unique<DataCursor>(r.env->size(Split::train), uint64_t(cfg.data.seed), cfg.data.shuffle);
  r.cursor->restore(st.data_epoch, st.data_index);
  GRPO_TRY(loop_setup_curriculum(r));

  // Prompts of the eval set, and the longest prompt seen, to size the trainer's workspace.
  const Split es = cfg.data.eval_split;
  if (cfg.eval.every > 0) GRPO_TRY(prepare_all(r, loop_eval_indices(cfg, *r.env, es), es, &r.eval_prompts));
  std::vector<PreparedPrompt> peek;
  DataCursor c2 = *r.cursor;
  // data.env = "remote" has no local prompts; the KV pool is sized for prompts of
  // up to 256 tokens from the environments that sample through [server].
  if (r.env->size(Split::train) > 0)
    GRPO_TRY(prepare_all(r, c2.next(size_t(cfg.rollout.prompts_per_step)), Split::train, &peek));
  size_t longest = cfg.data.env == EnvKind::remote ? 256 : 0;
  for (const auto* v : {&peek, &r.eval_prompts})
    for (const auto& p : *v) longest = std::max(longest, p.ids.size());

  if (async) {
    // Made before the KV budget is set, so that the budget counts the snapshot and the context's workspace.
    r.engine_ctx = std::make_unique<Context>(engine_co);
    r.snapshot = std::make_unique<ModelWeights>(weights_allocate(r.weights->config, co.device, r.weights->dtype));
    tensor_copy(r.snapshot->arena, r.weights->arena);
    r.engine_model = TrainModel(tmo);
  }
  // Second models in the engine's block tables, loaded first so that the KV budget counts their weights.
  if (cfg.tandem.enabled) GRPO_TRY(tandem_load_partner(r, co, dt));
  {
    const SpeculativeOptions so = cfg.engine.speculative.options();
    const int max_len = cfg.engine.max_model_len > 0 ? int(cfg.engine.max_model_len)
                                                    : r.weights->config.max_position_embeddings;
    GRPO_ASSIGN_OR_RETURN(r.draft, spec_load_draft(so, r.weights->config, max_len, *r.ctx, dt));
  }
  // The engine runs every sample of a generation batch at once unless engine.max_num_seqs says otherwise.
  const int64_t n_seqs = cfg.rollout.prompts_per_step * cfg.rollout.num_generations;
  int default_seqs = int(std::clamp<int64_t>(n_seqs, 1, 256));
  EngineConfig engine_cfg = cfg.engine;
  if (!cfg.rollout.server_url.empty() && cfg.rollout.server_on_failure == ServerOnFailure::error) {
    // The server samples the rollouts; this engine only runs evals. Its pool holds the eval batch at
    // full length (unless engine.kv_cache_mib sets it), so the device memory stays the trainer's.
    // With rollout.server_on_failure = "local" it must be able to take the rollouts over: it is
    // sized as without a server.
    const int64_t n_eval = std::clamp<int64_t>(int64_t(r.eval_prompts.size()), 1, 256);
    default_seqs = int(n_eval);
    if (engine_cfg.kv_cache_mib == 0) {
      const int64_t block = engine_cfg.block_size;
      const int64_t len = int64_t(longest) + std::max(cfg.eval.max_new_tokens, cfg.rollout.max_new_tokens) + block;
      const int64_t blocks = n_eval * ((len + block - 1) / block) + 1;
      const size_t bytes = size_t(blocks) * kv_block_bytes(r.weights->config, r.weights->dtype, int(block));
      engine_cfg.kv_cache_mib = std::max<int64_t>(1, int64_t((bytes + (size_t(1) << 20) - 1) >> 20));
    }
  }
  GRPO_ASSIGN_OR_RETURN(EngineOptions eo, engine_options_from_config(engine_cfg, co.device, r.weights->config,
                                                                     r.weights->dtype, memory_use(r, longest),
                                                                     default_seqs));
  eo.seed = uint64_t(cfg.rollout.seed);
  if (!r.tok->eos_ids().empty()) eo.eos_token_ids = r.tok->eos_ids();
  if (cfg.engine.kv_cache_dtype != KvCacheDtype::automatic && cfg.train.importance_sampling == IsMode::none)
    GRPO_LOG_WARN("engine.kv_cache_dtype = \"%s\": rollouts attend over FP8 keys/values but the trainer does not, so "
                  "their logprobs disagree more (logprob_mismatch/*); consider train.importance_sampling = "
                  "\"token_truncate\"", enum_name(kv_cache_dtype_names(), cfg.engine.kv_cache_dtype));
  eo.lora = t.lora.get();
  Context& engine_ctx = async ? *r.engine_ctx : *r.ctx;
  ModelWeights& engine_weights = async ? *r.snapshot : *r.weights;
  eo.bitwise_logprobs = cfg.train.on_policy == OnPolicy::bitwise;
  if (cfg.tandem.enabled) {
    GRPO_ASSIGN_OR_RETURN(EngineTandem et, tandem_setup(r, eo));
    r.engine = std::make_unique<Engine>(engine_ctx, engine_weights, r.tok.get(), eo, &et);
  } else {
    r.engine = std::make_unique<Engine>(engine_ctx, engine_weights, r.tok.get(), eo, nullptr, r.draft.get());
  }

  GRPO_ASSIGN_OR_RETURN(r.rollout_cfg.params, loop_sampling_params(cfg, false, r.weights->config.vocab_size));
  r.rollout_cfg.seed = uint64_t(cfg.rollout.seed);
  r.rollout_cfg.scale = cfg.train.scale_rewards;
  r.rollout_cfg.tandem_partner_weight = float(cfg.tandem.partner_weight);
  GRPO_ASSIGN_OR_RETURN(r.eval_params, loop_sampling_params(cfg, true, r.weights->config.vocab_size));

  r.ckpt_opts.keep_last = cfg.checkpoint.keep_last;
  r.ckpt_opts.model.tokenizer_src_dir = tokenizer_dir(r.paths.tokenizer);
  std::error_code ec;
  fs::create_directories(r.out_dir, ec);
  if (ec) return error_status("output directory " + r.out_dir + ": " + ec.message());
  if (!opt.comm || opt.comm->rank() == 0) GRPO_TRY(write_run_files(r, peek.empty() ? nullptr : &peek.front()));

  if (opt.console && cfg.log.progress != ProgressSetting::off) {
    ProgressOptions po;
    po.mode = cfg.log.progress == ProgressSetting::bar     ? ProgressMode::bar
              : cfg.log.progress == ProgressSetting::plain ? ProgressMode::plain
                                                           : ProgressMode::automatic;
    po.plain_every = cfg.log.every;
    r.progress = std::make_unique<ProgressBar>(cfg.train.steps, opt.console, po);
  }
  if (opt.console)
    std::fprintf(opt.console, "grpo train: %s (%s, %lld params, %s on %s, %d threads), env %s (%zu train, %zu eval)%s%s\n",
                 r.paths.model.c_str(), arch_name(r.weights->config.arch), (long long)r.weights->config.n_params(),
                 dtype_name(r.weights->dtype), device_name(co.device), r.ctx->n_threads(), r.env->name().c_str(),
                 r.env->size(Split::train), r.eval_prompts.size(), r.resumed ? ", resumed from " : "",
                 r.resumed_from.c_str());
  return run;
}

Status loop_bridge_publish(LoopRun& r, int64_t version) {
  GRPO_TRY(r.broadcaster->publish(*r.ctx, version).with_context("after train step " + std::to_string(version)));
  if (!r.broadcaster->stats().down) return ok_status();
  const ServerSection& sv = r.cfg.server;
  if (!r.rejoin) {
    std::string host;
    int port = 0;
    GRPO_TRY(bridge_parse_addr(sv.bridge_addr, "server.bridge_addr", &host, &port));
    GRPO_LOG_WARN("weight bridge: waiting at %s for %lld restarted grpo serve --receive to rejoin", sv.bridge_addr.c_str(),
                  (long long)sv.bridge_servers);
    // The servers still alive see their links close and come back to the rendezvous by
    // themselves (grpo serve --receive waits for a trainer again); only lost ones need a
    // restart. The broadcaster, being down, no longer touches the communicator.
    r.bridge_comm.reset();
    r.rejoin = std::make_unique<BridgeRejoin>(host, port, int(sv.bridge_servers), sv.bridge_timeout_s);
    return ok_status();
  }
  if (!r.rejoin->ready()) return ok_status();
  auto comm = r.rejoin->take();
  r.rejoin.reset();  // a failed attempt starts over at the next step
  if (!comm.ok()) {
    GRPO_LOG_WARN("%s", comm.status().message().c_str());
    return ok_status();
  }
  // The new broadcaster replaces the old one before the old communicator goes.
  Tensor arena = r.trainer.lora ? r.trainer.lora->arena : r.weights->arena;
  BroadcastOptions bo;
  bo.bucket_bytes = sv.bridge_bucket_mib << 20;
  bo.on_failure = sv.bridge_on_failure;
  auto b = std::make_unique<WeightBroadcaster>(*comm.value(), arena, r.broadcaster->plan(), bo);
  r.broadcaster = std::move(b);
  r.bridge_comm = std::move(comm).value();
  GRPO_TRY(r.broadcaster->handshake());
  GRPO_TRY(r.broadcaster->publish(*r.ctx, version));
  if (!r.broadcaster->stats().down)
    GRPO_LOG_INFO("weight bridge: %lld server(s) rejoined at version %lld", (long long)sv.bridge_servers,
                  (long long)version);
  return ok_status();
}

}  // namespace grpo
