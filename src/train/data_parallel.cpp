// Data-parallel gradient reduction, ZeRO-1 and metric reductions (see data_parallel.h).
#include "train/data_parallel.h"

#include <cstring>

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace grpo {

namespace {

Tensor slice_of(const Tensor& arena, int64_t off, int64_t n) {
  Tensor t = tensor_borrow(static_cast<char*>(arena.data) + size_t(off) * dtype_size(arena.dtype), arena.dtype,
                           arena.device, {n});
  t.owner = arena.owner;
  return t;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const char* p) {
  const std::string q = p;
  return s.size() >= q.size() && s.compare(s.size() - q.size(), q.size(), q) == 0;
}

// The tensor the optimizer steps: the adapters' arena in LoRA training, else the weights'.
const Tensor& param_arena(const Optimizer& opt, const ModelWeights& params) {
  return opt.adapters ? opt.adapters->arena : params.arena;
}

}  // namespace

Status dp_all_reduce_grads(Context& ctx, Optimizer& opt, const DataParallel& dp) {
  if (!dp.comm) return ok_status();
  const int64_t n = opt.grad_arena.numel(), b = std::max<int64_t>(1, dp.bucket_elems);
  for (int64_t off = 0; off < n; off += b) {
    Tensor bucket = slice_of(opt.grad_arena, off, std::min(b, n - off));
    GRPO_TRY(dp.comm->all_reduce_sum(ctx, bucket).with_context("gradient all-reduce"));
  }
  return ok_status();
}

std::vector<int64_t> zero1_shards(int64_t n, int world) { return split_even(n, world); }

void dp_adopt_shard(const Optimizer& opt, DataParallel& dp) {
  dp.shard = zero1_shards(optimizer_numel(opt), dp.size());
  GRPO_CHECK_MSG(opt.state_offset == dp.shard_begin() && opt.m.numel() == dp.shard_end() - dp.shard_begin(),
                 "ZeRO-1: the optimizer was not created over this rank's shard (optimizer_create with zero1_shards)");
}

Result<OptimStepStats> dp_optimizer_step(Context& ctx, Optimizer& opt, ModelWeights& params, double lr,
                                         const DataParallel& dp, bool grads_reduced) {
  if (!grads_reduced) GRPO_TRY(dp_all_reduce_grads(ctx, opt, dp));
  if (dp.zero_stage == 0) return optimizer_step(ctx, opt, params, lr);
  const int64_t lo = dp.shard_begin(), hi = dp.shard_end();
  GRPO_CHECK_MSG(opt.m.numel() == hi - lo, "ZeRO-1 step on an optimizer that was not sharded");
  OptimStepStats st;
  st.lr = lr;
  st.grad_norm = grad_global_norm(ctx, opt);  // the full reduced gradient: every rank gets the same norm
  if (!std::isfinite(st.grad_norm)) {
    st.skipped = true;
    return st;
  }
  if (opt.cfg.max_grad_norm > 0) st.clip_scale = std::min(1.0, double(opt.cfg.max_grad_norm) / (st.grad_norm + 1e-6));
  opt.step += 1;
  Tensor& arena = optimizer_param_arena(opt, params);
  const bool alias = arena.data == opt.master.data;
  for (const ParamSlot& s : opt.slots) {
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.numel);
    if (a >= b) continue;
    AdamWParams p;
    p.lr = float(lr);
    p.beta1 = opt.cfg.beta1;
    p.beta2 = opt.cfg.beta2;
    p.eps = opt.cfg.eps;
    p.weight_decay = s.decay ? opt.cfg.weight_decay : 0.f;
    p.step = opt.step;
    p.grad_scale = float(st.clip_scale);
    // AdamW is element-wise, so a parameter cut by a shard boundary updates exactly as whole.
    Tensor master = alias ? slice_of(arena, a, b - a) : slice_of(opt.master, a - lo, b - a);
    Tensor param = alias ? master : slice_of(arena, a, b - a);
    Tensor grad = slice_of(opt.grad_arena, a, b - a);
    Tensor m = slice_of(opt.m, a - lo, b - a), v = slice_of(opt.v, a - lo, b - a);
    adamw_step(ctx, master, param, grad, m, v, p);
  }
  GRPO_TRY(dp.comm->all_gather_ranges(ctx, arena, dp.shard).with_context("ZeRO-1 weight all-gather"));
  return st;
}

Optimizer optimizer_gather_for_checkpoint(Context& ctx, const Optimizer& opt, const ModelWeights& params,
                                          const DataParallel& dp, Status* st) {
  *st = ok_status();
  const int64_t n = optimizer_numel(opt);
  const bool lead = dp.rank() == 0;
  Optimizer full;
  full.cfg = opt.cfg;
  full.slots = opt.slots;
  full.step = opt.step;
  full.adapters = opt.adapters;  // LoRA: the checkpoint holds the adapters (full.master)
  // Chunk by chunk through one bounded device buffer, so that no rank ever holds a
  // full-length copy of the state on the device; rank 0 assembles host copies.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, int64_t(1) << 24));
  Tensor buf = tensor_empty(opt.m.device, DType::f32, {chunk});
  const int64_t lo = dp.shard_begin(), hi = dp.shard_end();
  auto gather = [&](const Tensor& shard) -> Tensor {
    Tensor host = lead ? tensor_empty(Device::cpu, DType::f32, {n}) : Tensor{};
    for (int64_t c0 = 0; c0 < n && st->ok(); c0 += chunk) {
      const int64_t c1 = std::min(n, c0 + chunk);
      std::vector<int64_t> b(dp.shard.size());
      for (size_t r = 0; r < b.size(); ++r) b[r] = std::clamp(dp.shard[r], c0, c1) - c0;
      const int64_t a0 = std::clamp(lo, c0, c1), a1 = std::clamp(hi, c0, c1);
      if (a1 > a0) {
        Tensor dst = slice_of(buf, a0 - c0, a1 - a0);
        tensor_copy(dst, slice_of(shard, a0 - lo, a1 - a0));
      }
      Tensor view = slice_of(buf, 0, c1 - c0);
      *st = dp.comm->all_gather_ranges(ctx, view, b);
      ctx.synchronize();
      if (lead && st->ok()) {
        Tensor dst = slice_of(host, c0, c1 - c0);
        tensor_copy(dst, view);
      }
    }
    return host;
  };
  full.m = gather(opt.m);
  full.v = gather(opt.v);
  const Tensor& arena = param_arena(opt, params);
  full.master = opt.master.data == arena.data ? arena : gather(opt.master);
  return full;
}

Status dp_reduce_step_metrics(Communicator& comm, MetricList& m) {
  if (comm.size() <= 1) return ok_status();
  std::vector<double> sum, mx, mn;
  std::vector<int> kind(m.size());  // 0 mean, 1 sum, 2 max, 3 min
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string& k = m[i].first;
    if (k == "loss" || k == "tokens/generated" || k == "train/micro_batches" || ends_with(k, "tokens_per_s"))
      kind[i] = 1;
    else if (ends_with(k, "/max") || ends_with(k, "max_length") || starts_with(k, "time/"))
      kind[i] = 2;
    else if (ends_with(k, "/min"))
      kind[i] = 3;
    (kind[i] == 2 ? mx : kind[i] == 3 ? mn : sum).push_back(m[i].second);
  }
  GRPO_TRY(comm.all_reduce_host(sum, HostReduce::sum));
  GRPO_TRY(comm.all_reduce_host(mx, HostReduce::max));
  GRPO_TRY(comm.all_reduce_host(mn, HostReduce::min));
  size_t is = 0, ix = 0, in = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    if (kind[i] == 2) m[i].second = mx[ix++];
    else if (kind[i] == 3) m[i].second = mn[in++];
    else m[i].second = kind[i] == 1 ? sum[is++] : sum[is++] / comm.size();
  }
  return ok_status();
}

Status dp_reduce_eval_metrics(Communicator& comm, MetricList& m) {
  if (comm.size() <= 1) return ok_status();
  // Counts (".../n") are summed, times (".../time") maxed, the rest are means over eval/n samples.
  auto ends = [](const std::string& k, const char* suf) {
    const size_t n = std::strlen(suf);
    return k.size() >= n && k.compare(k.size() - n, n, suf) == 0;
  };
  auto is_time = [&](const std::string& k) { return ends(k, "/time"); };
  auto is_n = [&](const std::string& k) { return ends(k, "/n"); };
  double n = 0;
  for (auto& [k, v] : m)
    if (k == "eval/n") n = v;
  std::vector<double> sum, mx;
  for (auto& [k, v] : m) {
    if (is_time(k)) mx.push_back(v);
    else sum.push_back(is_n(k) ? v : v * n);
  }
  GRPO_TRY(comm.all_reduce_host(sum, HostReduce::sum));
  GRPO_TRY(comm.all_reduce_host(mx, HostReduce::max));
  double total_n = 0;
  size_t is = 0, ix = 0;
  for (auto& [k, v] : m)
    if (!is_time(k)) {
      if (k == "eval/n") total_n = sum[is];
      ++is;
    }
  is = 0;
  for (auto& [k, v] : m) {
    if (is_time(k)) v = mx[ix++];
    else if (is_n(k)) v = sum[is++];
    else v = total_n > 0 ? sum[is++] / total_n : 0.0;
  }
  return ok_status();
}

}  // namespace grpo
