// `grpo sft`: supervised fine-tuning on {"prompt": ..., "completion": ...}
// JSONL with the trainer's machinery (packed micro-batches, AdamW, LR
// schedule, clipping); the loss is the mean cross-entropy of the completion
// tokens (prompt tokens are context only). Saves an HF checkpoint.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "cli/command.h"
#include "cli/enum_flag.h"
#include "core/context.h"
#include "core/log.h"
#include "core/timer.h"
#include "env/jsonl.h"
#include "model/checkpoint.h"
#include "model/train_model.h"
#include "tokenizer/tokenizer.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/train_step.h"

namespace {

struct Args {
  std::string model, data, out, scheduler = "linear";
  grpo::Device device = grpo::Device::cpu;
  std::optional<grpo::DType> dtype;  // default: f32 on cpu, bf16 on cuda
  int epochs = 1, batch_size = 8, micro_tokens = 4096, max_len = 1024, threads = 0, log_every = 1;
  int64_t warmup_steps = -1;
  double lr = 1e-5, warmup_ratio = 0.0, weight_decay = 0.0, max_grad_norm = 1.0;
  uint64_t seed = 0;
  bool no_eos = false, recompute = false;
};

// Tokenized examples; errors name the file and line.
grpo::Result<std::vector<grpo::GrpoSample>> load_examples(const Args& a, const grpo::Tokenizer& tok) {
  GRPO_ASSIGN_OR_RETURN(grpo::JsonlFile f, grpo::jsonl_read(a.data));
  std::vector<grpo::GrpoSample> out;
  size_t n_cut = 0;
  for (size_t r = 0; r < f.rows.size(); ++r) {
    const auto& j = f.rows[r];
    const std::string where = a.data + ":" + std::to_string(f.line_of_row[r]);
    if (!j.contains("prompt") || !j["prompt"].is_string() || !j.contains("completion") || !j["completion"].is_string())
      return grpo::error_status(where + ": each line needs string fields \"prompt\" and \"completion\"");
    grpo::GrpoSample s;
    for (int t : tok.encode(j["prompt"].get<std::string>(), true)) s.prompt.push_back(t);
    for (int t : tok.encode(j["completion"].get<std::string>(), false)) s.completion.push_back(t);
    if (!a.no_eos && tok.eos_id() >= 0) s.completion.push_back(tok.eos_id());
    if (s.prompt.empty() || s.completion.empty())
      return grpo::error_status(where + ": the prompt and the completion must each give at least one token");
    const size_t total = s.prompt.size() + s.completion.size();
    if (int(total) > a.max_len) {  // keep the prompt's tail and the completion's head
      ++n_cut;
      if (int(s.completion.size()) >= a.max_len) {
        s.prompt.erase(s.prompt.begin(), s.prompt.end() - 1);
        s.completion.resize(size_t(a.max_len - 1));
      } else {
        s.prompt.erase(s.prompt.begin(), s.prompt.begin() + long(total - size_t(a.max_len)));
      }
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) return grpo::error_status(a.data + ": no examples");
  if (n_cut) GRPO_LOG_WARN("sft: %zu examples longer than --max-len %d were cut", n_cut, a.max_len);
  return out;
}

int run(const Args& a) {
  using namespace grpo;
  const std::string cmd = "sft";
  ContextOptions co;
  co.device = a.device;
  co.n_threads = a.threads;
  if (co.device == Device::cuda && !cuda_available()) return cli::fail(cmd, "--device cuda: no CUDA device in this build/machine");
  const DType dt = a.dtype.value_or(co.device == Device::cpu ? DType::f32 : DType::bf16);
  if (co.device == Device::cpu && dt != DType::f32) return cli::fail(cmd, "the CPU backend trains in f32 (--dtype f32)");
  Context ctx(co);

  auto tok = Tokenizer::load(a.model);
  if (!tok.ok()) return cli::fail(cmd, tok.status().message() + " (the model directory needs its tokenizer files)");
  auto ex = load_examples(a, *tok);
  if (!ex.ok()) return cli::fail(cmd, ex.status().message());
  auto wr = model_load(a.model, co.device, dt, &ctx);
  if (!wr.ok()) return cli::fail(cmd, wr.status().message());
  ModelWeights w = std::move(wr).value();
  for (auto& s : *ex)
    for (auto* v : {&s.prompt, &s.completion})
      for (int32_t t : *v)
        if (t >= w.config.vocab_size)
          return cli::fail(cmd, "token id " + std::to_string(t) + " from the tokenizer is outside the model's vocabulary (" +
                                    std::to_string(w.config.vocab_size) + ")");

  AdamWConfig oc;
  oc.weight_decay = float(a.weight_decay);
  oc.max_grad_norm = float(a.max_grad_norm);
  if (Status s = oc.validate(); !s.ok()) return cli::fail(cmd, s.message());
  Optimizer opt = optimizer_create(ctx, w, oc);
  const int64_t n = int64_t(ex->size());
  const int64_t steps_per_epoch = (n + a.batch_size - 1) / a.batch_size;
  LrSchedule sched;
  auto st = lr_schedule_from_string(a.scheduler);
  if (!st.ok()) return cli::fail(cmd, st.status().message());
  sched.type = st.value();
  sched.lr = a.lr;
  sched.total_steps = std::max<int64_t>(1, steps_per_epoch * a.epochs);
  sched.warmup_steps = a.warmup_steps >= 0 ? a.warmup_steps : warmup_steps_from_ratio(a.warmup_ratio, sched.total_steps);
  if (Status s = sched.validate(); !s.ok()) return cli::fail(cmd, s.message());
  TrainModelOptions to;
  to.recompute = a.recompute;
  TrainModel tm(to);
  MicroBatchOptions mb;
  mb.max_tokens = a.micro_tokens;

  std::printf("sft: %lld examples, %d epochs, %lld steps of %d, lr %g (%s, warmup %lld), %s %s\n", (long long)n,
              a.epochs, (long long)sched.total_steps, a.batch_size, a.lr, lr_schedule_name(sched.type),
              (long long)sched.warmup_steps, device_name(co.device), dtype_name(dt));
  std::mt19937_64 rng(a.seed);
  std::vector<int64_t> order(static_cast<size_t>(n));
  int64_t step = 0;
  const double t_start = now_seconds();
  for (int ep = 0; ep < a.epochs; ++ep) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t b0 = 0; b0 < n; b0 += a.batch_size) {
      std::vector<GrpoSample> batch;
      for (int64_t i = b0; i < std::min(n, b0 + a.batch_size); ++i) batch.push_back((*ex)[size_t(order[size_t(i)])]);
      const double t0 = now_seconds(), lr = lr_at(sched, step);
      auto r = sft_train_step(ctx, tm, w, opt, lr, batch, mb);
      if (!r.ok()) return cli::fail(cmd, r.status().message());
      ++step;
      if (r->optim.skipped) GRPO_LOG_WARN("sft: step %lld skipped (non-finite gradient norm)", (long long)step);
      if (a.log_every > 0 && (step % a.log_every == 0 || step == sched.total_steps))
        std::printf("step %lld/%lld epoch %d loss %.4f grad_norm %.4f lr %.3g entropy %.3f tok/s %.0f\n", (long long)step,
                    (long long)sched.total_steps, ep + 1, r->metrics.loss, r->optim.grad_norm, lr,
                    r->metrics.entropy_mean(), double(r->n_tokens) / std::max(1e-9, now_seconds() - t0));
    }
  }
  SaveOptions so;
  so.tokenizer_src_dir = a.model;
  if (Status s = model_save(a.out, w, so); !s.ok()) return cli::fail(cmd, s.message());
  std::printf("saved %s after %lld steps in %.1f s\n", a.out.c_str(), (long long)step, now_seconds() - t_start);
  return 0;
}

grpo::cli::CommandRegistrar reg("sft", "Supervised fine-tuning on prompt/completion JSONL (loss on completion tokens)",
                                [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("--model", a->model, "Hugging Face model directory (with tokenizer files)")->required();
  sub->add_option("--data", a->data, "JSONL file, one {\"prompt\": ..., \"completion\": ...} per line")->required();
  sub->add_option("--out", a->out, "Output checkpoint directory")->required();
  sub->add_option("--epochs", a->epochs, "Passes over the data")->check(CLI::PositiveNumber);
  sub->add_option("--batch-size", a->batch_size, "Examples per optimizer step")->check(CLI::PositiveNumber);
  sub->add_option("--micro-tokens", a->micro_tokens, "Packed tokens per micro-batch (gradient accumulation)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--max-len", a->max_len, "Longest prompt+completion in tokens (longer ones are cut)")
      ->check(CLI::Range(2, 1 << 20));
  sub->add_option("--lr", a->lr, "Peak learning rate");
  sub->add_option("--lr-scheduler", a->scheduler, "constant, linear or cosine");
  sub->add_option("--warmup-steps", a->warmup_steps, "Linear warmup steps (overrides --warmup-ratio)");
  sub->add_option("--warmup-ratio", a->warmup_ratio, "Warmup as a fraction of all steps");
  sub->add_option("--weight-decay", a->weight_decay, "AdamW weight decay (not on norms and biases)");
  sub->add_option("--max-grad-norm", a->max_grad_norm, "Global gradient-norm clip (0 = off)");
  sub->add_option("--seed", a->seed, "Shuffle seed");
  grpo::cli::add_enum(sub, "--device", &a->device, grpo::cli::device_flag_names(), "Device");
  grpo::cli::add_enum(sub, "--dtype", &a->dtype, grpo::cli::engine_dtype_flag_names(), "Parameter dtype", "f32 on cpu, bf16 on cuda");
  sub->add_option("--threads", a->threads, "CPU threads (0 = all)");
  sub->add_option("--log-every", a->log_every, "Print every N steps");
  sub->add_flag("--no-eos", a->no_eos, "Do not append EOS to each completion");
  sub->add_flag("--recompute", a->recompute, "Activation checkpointing (less memory, one more forward)");
  return [a]() { return run(*a); };
});

}  // namespace
