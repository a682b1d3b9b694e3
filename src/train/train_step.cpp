#include "train/train_step.h"

#include <algorithm>

#include <functional>

#include "core/timer.h"
#include "train/data_parallel.h"

namespace grpo {

std::vector<std::pair<int, int>> plan_micro_batches(const std::vector<int>& seq_tokens, const MicroBatchOptions& mb) {
  std::vector<std::pair<int, int>> out;
  const int n = int(seq_tokens.size());
  int begin = 0, tokens = 0;
  for (int i = 0; i < n; ++i) {
    const bool full_tokens = i > begin && tokens + seq_tokens[size_t(i)] > mb.max_tokens;
    const bool full_seqs = mb.max_seqs > 0 && i - begin >= mb.max_seqs;
    if (full_tokens || full_seqs) {
      out.emplace_back(begin, i);
      begin = i;
      tokens = 0;
    }
    tokens += seq_tokens[size_t(i)];
  }
  if (begin < n) out.emplace_back(begin, n);
  return out;
}

namespace {

std::vector<int> sample_tokens(const std::vector<GrpoSample>& s) {
  std::vector<int> n;
  for (auto& x : s) n.push_back(int(x.prompt.size() + x.completion.size()));
  return n;
}

Result<TrainBatch> batch_of(Context& ctx, const std::vector<GrpoSample>& s, int b, int e, int vocab) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> pl;
  for (int i = b; i < e; ++i) {
    std::vector<int32_t> q = s[size_t(i)].prompt;
    q.insert(q.end(), s[size_t(i)].completion.begin(), s[size_t(i)].completion.end());
    seqs.push_back(std::move(q));
    pl.push_back(int32_t(s[size_t(i)].prompt.size()));
  }
  auto r = train_batch_build(ctx, seqs, pl, vocab);
  if (!r.ok()) return r.status().with_context("samples [" + std::to_string(b) + ", " + std::to_string(e) + ")");
  return r;
}

// Concatenates a per-token field over samples [b, e): empty when no sample has
// it; an error when only some have it or a length is wrong.
Result<std::vector<float>> gather_field(const std::vector<GrpoSample>& s, int b, int e,
                                        std::vector<float> GrpoSample::*field, const char* name) {
  std::vector<float> out;
  int n_with = 0;
  for (int i = b; i < e; ++i) n_with += !(s[size_t(i)].*field).empty();
  if (n_with == 0) return out;
  for (int i = b; i < e; ++i) {
    const auto& v = s[size_t(i)].*field;
    if (v.size() != s[size_t(i)].completion.size())
      return error_status(std::string("sample ") + std::to_string(i) + ": " + name + " has " +
                          std::to_string(v.size()) + " entries for " + std::to_string(s[size_t(i)].completion.size()) +
                          " completion tokens (give it for every sample or for none)");
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Forward (keeping activations) of one micro-batch; returns its logprobs on the host.
std::vector<float> forward_keep(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b,
                                std::vector<float>* entropy) {
  Tensor lp = tensor_empty(ctx.device(), DType::f32, {b.n_completion});
  Tensor ent;
  if (entropy) ent = tensor_empty(ctx.device(), DType::f32, {b.n_completion});
  train_model_forward(ctx, m, w, b, lp, entropy ? &ent : nullptr, true);
  ctx.synchronize();  // the copies below are not on ctx's stream
  if (entropy) *entropy = tensor_to_f32(ent);
  return tensor_to_f32(lp);
}

void backward_host(Context& ctx, TrainModel& m, const ModelWeights& w, const TrainBatch& b,
                   const std::vector<float>& dlogp, Optimizer& opt, GradReducer* reducer = nullptr) {
  Tensor d = tensor_from_f32(ctx.device(), DType::f32, dlogp, {int64_t(dlogp.size())});
  GRPO_CHECK_MSG(m.lora == opt.adapters, "train step: the TrainModel's LoRA adapters are not the optimizer's");
  m.lora_grads = opt.adapters ? &opt.lora_grads : nullptr;
  std::function<void(int)> hook;
  if (reducer) hook = [reducer](int l) { reducer->on_layer_done(l); };
  train_model_backward(ctx, m, w, b, d, opt.grads, hook);
}

}  // namespace

Result<std::vector<std::vector<float>>> compute_logprobs(Context& ctx, TrainModel& m, const ModelWeights& w,
                                                         const std::vector<GrpoSample>& samples,
                                                         const MicroBatchOptions& mb) {
  std::vector<std::vector<float>> out;
  for (auto [b, e] : plan_micro_batches(sample_tokens(samples), mb)) {
    GRPO_ASSIGN_OR_RETURN(TrainBatch tb, batch_of(ctx, samples, b, e, w.config.vocab_size));
    Tensor lp = tensor_empty(ctx.device(), DType::f32, {tb.n_completion});
    train_model_forward(ctx, m, w, tb, lp, nullptr, false);
    ctx.synchronize();
    const std::vector<float> h = tensor_to_f32(lp);
    for (int i = b; i < e; ++i) {
      const int32_t o0 = tb.completion_offsets[size_t(i - b)], o1 = tb.completion_offsets[size_t(i - b + 1)];
      out.emplace_back(h.begin() + o0, h.begin() + o1);
    }
  }
  return out;
}

double grpo_count_loss_tokens(const std::vector<GrpoSample>& samples, bool mask_truncated_completions) {
  double n = 0;
  for (auto& s : samples) {
    if (mask_truncated_completions && s.truncated) continue;
    // Mis-sized mask / weights are reported by gather_field in the step; they only must not be read past here.
    for (size_t t = 0; t < s.completion.size(); ++t)
      n += (t < s.mask.size() ? double(s.mask[t]) : 1.0) * (t < s.weights.size() ? double(s.weights[t]) : 1.0);
  }
  return n;
}

Result<StepStats> grpo_train_step(Context& ctx, TrainModel& m, ModelWeights& w, Optimizer& opt, double lr,
                                  const std::vector<GrpoSample>& samples, const GrpoStepOptions& so) {
  if (samples.empty()) return error_status("grpo_train_step: no samples");
  GRPO_TRY(so.loss.validate());
  const auto plan = plan_micro_batches(sample_tokens(samples), so.micro);
  GrpoLossNorm norm;
  norm.n_micro = int(plan.size());
  norm.n_seqs_total = so.n_seqs_total > 0 ? so.n_seqs_total : int(samples.size());
  norm.dapo_num_items = so.dapo_num_items;
  if ((so.loss.loss_type == LossType::dapo || so.loss.loss_type == LossType::cispo) && norm.dapo_num_items <= 0)
    norm.dapo_num_items = std::max(1.0, grpo_count_loss_tokens(samples, so.loss.mask_truncated_completions));
  StepStats st;
  optimizer_zero_grad(ctx, opt);
  // Gradients are final during the last micro-batch's backward: its layer hooks start the all-reduce.
  GradReducer* reducer = so.dp && so.dp->reducer && !opt.adapters ? so.dp->reducer.get() : nullptr;
  if (reducer) reducer->begin_step(opt);
  for (auto [b, e] : plan) {
    const bool last = b == plan.back().first;
    GRPO_ASSIGN_OR_RETURN(TrainBatch tb, batch_of(ctx, samples, b, e, w.config.vocab_size));
    GRPO_ASSIGN_OR_RETURN(auto old, gather_field(samples, b, e, &GrpoSample::old_logp, "old_logp"));
    GRPO_ASSIGN_OR_RETURN(auto ref, gather_field(samples, b, e, &GrpoSample::ref_logp, "ref_logp"));
    GRPO_ASSIGN_OR_RETURN(auto roll, gather_field(samples, b, e, &GrpoSample::rollout_logp, "rollout_logp"));
    GRPO_ASSIGN_OR_RETURN(auto wts, gather_field(samples, b, e, &GrpoSample::weights, "weights"));
    GRPO_ASSIGN_OR_RETURN(auto mask, gather_field(samples, b, e, &GrpoSample::mask, "mask"));
    std::vector<float> adv;
    std::vector<uint8_t> trunc;
    for (int i = b; i < e; ++i) {
      adv.push_back(samples[size_t(i)].advantage);
      trunc.push_back(samples[size_t(i)].truncated);
    }
    std::vector<float> ent;
    const std::vector<float> logp = forward_keep(ctx, m, w, tb, &ent);
    GrpoLossInput in;
    in.seq_offsets = tb.completion_offsets;
    in.logp = logp;
    in.advantages = adv;
    in.old_logp = old;
    in.ref_logp = ref;
    in.rollout_logp = roll;
    in.mask = mask;
    in.weights = wts;
    in.truncated = trunc;
    in.entropy = ent;
    GRPO_TRY(grpo_loss_check(so.loss, in));
    GrpoLossOutput out = grpo_loss(so.loss, in, norm);
    backward_host(ctx, m, w, tb, out.dlogp, opt, last ? reducer : nullptr);
    st.metrics.merge(out.metrics);
    st.n_micro += 1;
    st.n_tokens += tb.n_tokens;
  }
  if (so.dp) {
    if (reducer) {
      GRPO_TRY(reducer->finish());
      st.allreduce_s = reducer->busy_s();
      st.allreduce_exposed_s = reducer->exposed_s();
    } else {
      ctx.synchronize();
      const double t0 = now_seconds();
      GRPO_TRY(dp_all_reduce_grads(ctx, opt, *so.dp));
      ctx.synchronize();
      st.allreduce_s = st.allreduce_exposed_s = now_seconds() - t0;
    }
    GRPO_ASSIGN_OR_RETURN(st.optim, dp_optimizer_step(ctx, opt, w, lr, *so.dp, true));
  } else {
    st.optim = optimizer_step(ctx, opt, w, lr);
  }
  return st;
}

Result<StepStats> sft_train_step(Context& ctx, TrainModel& m, ModelWeights& w, Optimizer& opt, double lr,
                                 const std::vector<GrpoSample>& samples, const MicroBatchOptions& mb) {
  if (samples.empty()) return error_status("sft_train_step: no samples");
  double n_norm = 0;
  for (auto& s : samples) {
    if (s.mask.empty()) n_norm += double(s.completion.size());
    else for (float x : s.mask) n_norm += x;
  }
  if (n_norm <= 0) return error_status("sft_train_step: every completion token is masked");
  StepStats st;
  optimizer_zero_grad(ctx, opt);
  for (auto [b, e] : plan_micro_batches(sample_tokens(samples), mb)) {
    GRPO_ASSIGN_OR_RETURN(TrainBatch tb, batch_of(ctx, samples, b, e, w.config.vocab_size));
    GRPO_ASSIGN_OR_RETURN(auto mask, gather_field(samples, b, e, &GrpoSample::mask, "mask"));
    std::vector<float> ent;
    const std::vector<float> logp = forward_keep(ctx, m, w, tb, &ent);
    std::vector<float> dlogp;
    st.metrics.loss += sft_loss(logp, mask, n_norm, dlogp);
    for (size_t t = 0; t < ent.size(); ++t) {
      const double mt = mask.empty() ? 1.0 : mask[t];
      st.metrics.entropy_sum += mt * ent[t];
      st.metrics.n_tokens += mt;
    }
    backward_host(ctx, m, w, tb, dlogp, opt);
    st.n_micro += 1;
    st.n_tokens += tb.n_tokens;
  }
  st.optim = optimizer_step(ctx, opt, w, lr);
  return st;
}

}  // namespace grpo
