#include "train/grpo_loss.h"

#include "core/check.h"

#include <algorithm>
#include <cmath>

namespace grpo {

std::span<const EnumName<LossType>> loss_type_names() {
  static constexpr EnumName<LossType> n[] = {{"grpo", LossType::grpo}, {"bnpo", LossType::bnpo},
                                             {"dr_grpo", LossType::dr_grpo}, {"dapo", LossType::dapo},
                                             {"cispo", LossType::cispo}};
  return n;
}
std::span<const EnumName<IsLevel>> is_level_names() {
  static constexpr EnumName<IsLevel> n[] = {{"token", IsLevel::token}, {"sequence", IsLevel::sequence}};
  return n;
}
std::span<const EnumName<IsMode>> is_mode_names() {
  static constexpr EnumName<IsMode> n[] = {{"none", IsMode::none}, {"token_truncate", IsMode::token_truncate},
                                           {"token_mask", IsMode::token_mask},
                                           {"sequence_truncate", IsMode::sequence_truncate},
                                           {"sequence_mask", IsMode::sequence_mask}};
  return n;
}

namespace {
template <class E>
Result<E> parse_named(std::span<const EnumName<E>> table, const std::string& what, const std::string& s) {
  if (auto v = enum_parse(table, s)) return *v;
  return error_status(what + " = \"" + s + "\": must be one of " + enum_allowed(table));
}
}  // namespace

Result<LossType> loss_type_from_string(const std::string& s) { return parse_named(loss_type_names(), "loss_type", s); }
const char* loss_type_name(LossType t) { return enum_name(loss_type_names(), t); }
Result<IsLevel> is_level_from_string(const std::string& s) {
  return parse_named(is_level_names(), "importance_sampling_level", s);
}
const char* is_level_name(IsLevel l) { return enum_name(is_level_names(), l); }
Result<IsMode> is_mode_from_string(const std::string& s) { return parse_named(is_mode_names(), "importance_sampling", s); }
const char* is_mode_name(IsMode m) { return enum_name(is_mode_names(), m); }

Status GrpoLossConfig::validate() const {
  if (!(beta >= 0.f)) return error_status("beta must be >= 0");
  if (!(epsilon >= 0.f && epsilon < 1.f)) return error_status("epsilon must be in [0, 1)");
  if (!(epsilon_high >= 0.f)) return error_status("epsilon_high must be >= 0");
  if (loss_type == LossType::cispo && !(epsilon_high > 0.f))
    return error_status("loss_type cispo caps the importance weight at epsilon_high, which must be > 0");
  if (is_mode != IsMode::none && !(is_cap > 0.f)) return error_status("importance-sampling cap must be > 0");
  if (loss_type == LossType::dr_grpo && max_completion_length < 1)
    return error_status("max_completion_length must be >= 1 for loss_type dr_grpo");
  return ok_status();
}

void GrpoMetrics::merge(const GrpoMetrics& o) {
  loss += o.loss;
  n_tokens += o.n_tokens;
  kl_sum += o.kl_sum;
  entropy_sum += o.entropy_sum;
  clip_low += o.clip_low;
  clip_high += o.clip_high;
  clip_region += o.clip_region;
  n_clip += o.n_clip;
  is_sum += o.is_sum;
  is_min = std::min(is_min, o.is_min);
  is_max = std::max(is_max, o.is_max);
  is_capped += o.is_capped;
  n_is += o.n_is;
  roll_abs_sum += o.roll_abs_sum;
  roll_abs_max = std::max(roll_abs_max, o.roll_abs_max);
  roll_kl_sum += o.roll_kl_sum;
  n_roll += o.n_roll;
}

Status grpo_loss_check(const GrpoLossConfig& cfg, const GrpoLossInput& in) {
  GRPO_TRY(cfg.validate());
  if (in.seq_offsets.size() < 2) return error_status("grpo_loss: seq_offsets needs S+1 >= 2 entries");
  const size_t S = in.seq_offsets.size() - 1;
  if (in.seq_offsets[0] != 0) return error_status("grpo_loss: seq_offsets[0] must be 0");
  for (size_t s = 0; s < S; ++s)
    if (in.seq_offsets[s + 1] < in.seq_offsets[s]) return error_status("grpo_loss: seq_offsets must not decrease");
  const size_t T = size_t(in.seq_offsets[S]);
  auto tok = [&](std::span<const float> x, const char* name, bool required) -> Status {
    if (x.empty() && !required) return ok_status();
    if (x.size() != T)
      return error_status(std::string("grpo_loss: ") + name + " has " + std::to_string(x.size()) +
                          " entries, expected one per completion token (" + std::to_string(T) + ")");
    return ok_status();
  };
  GRPO_TRY(tok(in.logp, "logp", true));
  GRPO_TRY(tok(in.old_logp, "old_logp", false));
  GRPO_TRY(tok(in.ref_logp, "ref_logp", cfg.beta != 0.f));
  GRPO_TRY(tok(in.rollout_logp, "rollout_logp", cfg.is_mode != IsMode::none));
  GRPO_TRY(tok(in.mask, "mask", false));
  GRPO_TRY(tok(in.weights, "weights", false));
  GRPO_TRY(tok(in.entropy, "entropy", false));
  if (in.advantages.size() != S)
    return error_status("grpo_loss: advantages has " + std::to_string(in.advantages.size()) +
                        " entries, expected one per sequence (" + std::to_string(S) + ")");
  if (!in.truncated.empty() && in.truncated.size() != S)
    return error_status("grpo_loss: truncated must have one entry per sequence");
  return ok_status();
}

GrpoLossOutput grpo_loss(const GrpoLossConfig& cfg, const GrpoLossInput& in, const GrpoLossNorm& norm) {
  const size_t S = in.seq_offsets.size() - 1;
  const size_t T = in.logp.size();
  GRPO_CHECK(norm.n_micro >= 1);
  GrpoLossOutput out;
  out.dlogp.assign(T, 0.f);
  GrpoMetrics& M = out.metrics;

  // Effective mask m_t (truncated completions dropped) and its per-sequence counts;
  // the token means divide by the weighted counts Σ m_t·w_t (seq_wn, wn_tok).
  std::vector<double> m(T), seq_n(S, 0.0), seq_wn(S, 0.0);
  double n_tok = 0, wn_tok = 0;
  for (size_t s = 0; s < S; ++s) {
    const bool drop = cfg.mask_truncated_completions && !in.truncated.empty() && in.truncated[s];
    for (int32_t t = in.seq_offsets[s]; t < in.seq_offsets[s + 1]; ++t) {
      m[size_t(t)] = drop ? 0.0 : (in.mask.empty() ? 1.0 : double(in.mask[size_t(t)]));
      seq_n[s] += m[size_t(t)];
      seq_wn[s] += m[size_t(t)] * (in.weights.empty() ? 1.0 : double(in.weights[size_t(t)]));
    }
    n_tok += seq_n[s];
    wn_tok += seq_wn[s];
  }
  const double k = norm.n_micro;
  const double S_tot = norm.n_seqs_total > 0 ? double(norm.n_seqs_total) : double(S) * k;

  auto old_of = [&](size_t t) { return in.old_logp.empty() ? double(in.logp[t]) : double(in.old_logp[t]); };
  const bool seq_is = cfg.is_mode == IsMode::sequence_truncate || cfg.is_mode == IsMode::sequence_mask;
  const bool tok_is = cfg.is_mode == IsMode::token_truncate || cfg.is_mode == IsMode::token_mask;
  const bool is_trunc = cfg.is_mode == IsMode::token_truncate || cfg.is_mode == IsMode::sequence_truncate;
  const bool seq_level = cfg.is_level == IsLevel::sequence;
  const bool cispo = cfg.loss_type == LossType::cispo;
  const double lo = 1.0 - cfg.epsilon, hi = 1.0 + double(cfg.epsilon_high);
  auto cap = [&](double r) {
    const bool over = r > double(cfg.is_cap);
    if (over) M.is_capped += 1;
    return over ? (is_trunc ? double(cfg.is_cap) : 0.0) : r;
  };
  auto is_stat = [&](double r) {
    M.is_sum += r;
    M.n_is += 1;
    M.is_min = std::min(M.is_min, r);
    M.is_max = std::max(M.is_max, r);
  };
  // The ratio part of one token's loss for ratio `rho`: its value per unit of
  // the token's weight, d value / d rho (zero on the clipped branch), and
  // whether it was clipped low / high (TRL's metrics).
  struct Pg {
    double value, d_rho;
    bool low, high;
  };
  auto pg_of = [&](double rho, double A) -> Pg {
    if (cispo) return {0, 0, false, rho > double(cfg.epsilon_high) && A > 0};
    const bool low = rho < lo && A < 0, high = rho > hi && A > 0;
    return {-std::min(rho * A, std::clamp(rho, lo, hi) * A), (low || high) ? 0.0 : -A, low, high};
  };

  std::vector<double> isw(T, 1.0);
  double loss = 0;
  for (size_t s = 0; s < S; ++s) {
    const int32_t b = in.seq_offsets[s], e = in.seq_offsets[s + 1];
    const double A = in.advantages[s];
    const double n_s = std::max(1.0, seq_n[s]);
    // Normaliser of this sequence's tokens.
    double c = 0;
    switch (cfg.loss_type) {
      case LossType::grpo: c = 1.0 / (std::max(1.0, seq_wn[s]) * S_tot); break;
      case LossType::bnpo: c = 1.0 / (std::max(1.0, wn_tok) * k); break;
      case LossType::dr_grpo: c = 1.0 / (S_tot * double(cfg.max_completion_length)); break;
      case LossType::dapo:
      case LossType::cispo: c = 1.0 / (norm.dapo_num_items > 0 ? norm.dapo_num_items : std::max(1.0, wn_tok)); break;
    }
    // IS correction weights of this sequence's tokens (detached).
    if (seq_is) {
      double sum = 0;
      for (int32_t t = b; t < e; ++t) sum += m[size_t(t)] * (old_of(size_t(t)) - in.rollout_logp[size_t(t)]);
      if (cfg.is_sequence_geomean) sum /= n_s;
      const double r = std::exp(sum);
      is_stat(r);
      const double wgt = cap(r);
      for (int32_t t = b; t < e; ++t) isw[size_t(t)] = wgt;
    } else if (tok_is) {
      for (int32_t t = b; t < e; ++t) {
        const double mt = m[size_t(t)];
        const double r = std::exp(mt * (old_of(size_t(t)) - in.rollout_logp[size_t(t)]));
        if (mt != 0) is_stat(r);
        isw[size_t(t)] = cap(r);
      }
    }
    // GSPO: one ratio for the sequence, from the mean log-ratio over its tokens.
    double rho_s = 1.0, K_s = 0.0;
    Pg pg_s{};
    if (seq_level) {
      double lr = 0;
      for (int32_t t = b; t < e; ++t) lr += m[size_t(t)] * (double(in.logp[size_t(t)]) - old_of(size_t(t)));
      rho_s = std::exp(lr / n_s);
      pg_s = pg_of(rho_s, A);
      for (int32_t t = b; t < e; ++t) {
        const double w = in.weights.empty() ? 1.0 : double(in.weights[size_t(t)]);
        K_s += c * m[size_t(t)] * w * isw[size_t(t)];
      }
      M.clip_low += pg_s.low;
      M.clip_high += pg_s.high;
      M.clip_region += pg_s.low || pg_s.high;
      M.n_clip += 1;
    }
    for (int32_t ti = b; ti < e; ++ti) {
      const size_t t = size_t(ti);
      const double lp = in.logp[t], mt = m[t];
      const double w = in.weights.empty() ? 1.0 : double(in.weights[t]);
      const double rho = seq_level ? rho_s : std::exp(lp - old_of(t));
      const Pg pg = seq_level ? pg_s : pg_of(rho, A);
      double term, dterm;
      if (cispo) {
        const double cw = std::min(rho, double(cfg.epsilon_high));  // detached: no d/d rho
        term = -isw[t] * cw * A * lp;
        dterm = -isw[t] * cw * A;
      } else {
        term = isw[t] * pg.value;
        // Token level: d rho_t / d logp_t = rho_t. Sequence level: added below through K_s.
        dterm = seq_level ? 0.0 : isw[t] * pg.d_rho * rho;
      }
      double kl = 0;
      if (cfg.beta != 0.f) {
        const double d = in.ref_logp[t] - lp, ed = std::exp(d);
        kl = ed - d - 1.0;
        term += cfg.beta * kl;
        dterm += cfg.beta * (1.0 - ed);
      }
      loss += c * mt * w * term;
      double g = c * mt * w * dterm;
      if (seq_level && !cispo) g += K_s * pg.d_rho * rho_s * mt / n_s;
      out.dlogp[t] = float(g);

      M.kl_sum += mt * kl;
      if (!in.entropy.empty()) M.entropy_sum += mt * in.entropy[t];
      if (!seq_level) {
        M.clip_low += mt * pg.low;
        M.clip_high += mt * pg.high;
        M.clip_region += mt * (pg.low || pg.high);
      }
      if (!in.rollout_logp.empty() && mt != 0) {
        const double dd = lp - in.rollout_logp[t];
        M.roll_abs_sum += std::fabs(dd);
        M.roll_abs_max = std::max(M.roll_abs_max, std::fabs(dd));
        M.roll_kl_sum += std::exp(dd) - dd - 1.0;
        M.n_roll += 1;
      }
    }
  }
  M.n_tokens = n_tok;
  if (!seq_level) M.n_clip = n_tok;
  M.loss = loss;
  out.loss = loss;
  return out;
}

double sft_loss(std::span<const float> logp, std::span<const float> mask, double n_norm, std::vector<float>& dlogp) {
  GRPO_CHECK(mask.empty() || mask.size() == logp.size());
  GRPO_CHECK(n_norm > 0);
  dlogp.assign(logp.size(), 0.f);
  double loss = 0;
  for (size_t t = 0; t < logp.size(); ++t) {
    const double mt = mask.empty() ? 1.0 : mask[t];
    loss -= mt * logp[t] / n_norm;
    dlogp[t] = float(-mt / n_norm);
  }
  return loss;
}

}  // namespace grpo
