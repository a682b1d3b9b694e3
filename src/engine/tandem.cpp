// Tandem decoding (see tandem.h).
#include "engine/tandem.h"

#include <algorithm>
#include <cmath>

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/check.h"
#include "engine/engine.h"
#include "kernels/sampling.h"
#include "tokenizer/tokenizer.h"

namespace grpo {

namespace {

// Salts keep the decision streams apart from each other and from the sampler's
// uniforms, which use the sequence's own rng_key.
constexpr uint64_t kSaltKey = 0x7A3D1F5E2B4C6981ull;
constexpr uint64_t kSaltOffset = 0x1C6B8E2F4D7A9305ull;
constexpr uint64_t kSaltChunk = 0x5E9F2A7C3B1D4860ull;

// Uniform in [0, 1) with 53 random bits.
double tandem_uniform(uint64_t key, uint64_t pos) {
  const uint64_t h = sampling_mix64(key ^ sampling_mix64(pos));
  return double(h >> 11) * (1.0 / 9007199254740992.0);
}

bool draw(const TandemOptions& o, uint64_t key, uint64_t pos) { return tandem_uniform(key, pos) < o.p_trained; }

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

std::span<const EnumName<TandemStrategy>> tandem_strategy_names() {
  static constexpr EnumName<TandemStrategy> names[] = {
      {"token", TandemStrategy::token}, {"chunk", TandemStrategy::chunk}, {"word", TandemStrategy::word}};
  return names;
}

Result<TandemStrategy> tandem_strategy_from_string(const std::string& s) {
  if (auto v = enum_parse(tandem_strategy_names(), s)) return *v;
  return error_status("tandem.strategy = \"" + s + "\": must be one of " + enum_allowed(tandem_strategy_names()));
}

const char* tandem_strategy_name(TandemStrategy s) { return enum_name(tandem_strategy_names(), s); }

Status TandemOptions::validate(int vocab_size) const {
  if (!(p_trained >= 0.0 && p_trained <= 1.0))
    return error_status("tandem.p_trained = " + std::to_string(p_trained) + ": must be in [0, 1]");
  if (chunk_size < 1) return error_status("tandem.chunk_size = " + std::to_string(chunk_size) + ": must be >= 1");
  if (strategy == TandemStrategy::word && int(token_flags.size()) != vocab_size)
    return error_status("tandem.strategy = \"word\" needs the tokenizer's word-start flags for all " +
                        std::to_string(vocab_size) + " ids (got " + std::to_string(token_flags.size()) +
                        "); build them with tandem_word_flags from the run's tokenizer");
  return ok_status();
}

std::vector<uint8_t> tandem_word_flags(const Tokenizer& tok, int vocab_size) {
  std::vector<uint8_t> f(size_t(std::max(vocab_size, 0)), 0);
  for (int id = 0; id < vocab_size; ++id) {
    uint8_t b = 0;
    if (tok.is_special(id)) b |= kTokSpecial;
    const std::string& s = tok.token_bytes(id);
    if (!s.empty() && is_space(s.front())) b |= kTokSpaceStart;
    if (!s.empty() && s.back() == '\n') b |= kTokNewlineEnd;
    f[size_t(id)] = b;
  }
  return f;
}

bool tandem_word_start(const std::vector<uint8_t>& flags, int32_t prev, int32_t tok) {
  auto at = [&](int32_t id) -> uint8_t { return id >= 0 && size_t(id) < flags.size() ? flags[size_t(id)] : 0; };
  return (at(tok) & (kTokSpaceStart | kTokSpecial)) != 0 || (at(prev) & (kTokNewlineEnd | kTokSpecial)) != 0;
}

uint64_t tandem_key(uint64_t seed, uint64_t rng_key) { return sampling_mix64(seed ^ sampling_mix64(rng_key ^ kSaltKey)); }

bool tandem_pick(const TandemOptions& o, uint64_t key, int i, int prev_owner, int32_t prev_token,
                 int32_t tok_trained, int32_t tok_partner) {
  switch (o.strategy) {
    case TandemStrategy::token: return draw(o, key, uint64_t(i));
    case TandemStrategy::chunk: {
      const uint64_t k = uint64_t(o.chunk_size);
      const uint64_t off = sampling_mix64(key ^ kSaltOffset) % k;
      return draw(o, key ^ kSaltChunk, (uint64_t(i) + off) / k);
    }
    case TandemStrategy::word: {
      const bool c = draw(o, key, uint64_t(i));
      if (prev_owner < 0 || int(c) == prev_owner) return c;
      return tandem_word_start(o.token_flags, prev_token, c ? tok_trained : tok_partner) ? c : prev_owner != 0;
    }
  }
  return true;
}

Result<int> tandem_kv_blocks(const ModelConfig& cfg, DType dtype, const ModelConfig& partner_cfg, DType partner_dtype,
                             const EngineOptions& opt) {
  GRPO_ASSIGN_OR_RETURN(int n, engine_kv_blocks(cfg, dtype, opt));
  auto pdt = engine_kv_cache_dtype(partner_cfg, partner_dtype, opt);
  if (!pdt.ok()) return pdt.status().with_context("tandem partner");
  if (opt.n_kv_blocks > 0) return n;
  const DType kv = engine_kv_cache_dtype(cfg, dtype, opt).value();
  const size_t per_block =
      kv_block_bytes(cfg, kv, opt.block_size) + kv_block_bytes(partner_cfg, pdt.value(), opt.block_size);
  const size_t nb = opt.kv_cache_bytes / per_block;
  if (nb < 1)
    return error_status("engine options: kv_cache_bytes (" + std::to_string(opt.kv_cache_bytes) +
                        ") is smaller than one KV block of the trained model and the tandem partner together (" +
                        std::to_string(per_block) + " bytes); raise it");
  return int(std::min<size_t>(nb, size_t(1) << 30));
}

Status tandem_check_partner(const ModelConfig& trained, const ModelConfig& partner, int max_model_len) {
  if (trained.vocab_size != partner.vocab_size)
    return error_status("tandem.partner: its vocab_size is " + std::to_string(partner.vocab_size) +
                        " but the trained model's is " + std::to_string(trained.vocab_size) +
                        "; tandem decoding needs two models with the same vocabulary (same tokenizer)");
  if (partner.max_position_embeddings > 0 && partner.max_position_embeddings < max_model_len)
    return error_status("tandem.partner: its max_position_embeddings (" +
                        std::to_string(partner.max_position_embeddings) + ") is shorter than the engine's context (" +
                        std::to_string(max_model_len) + " tokens); use a partner with a longer context or shorter "
                        "prompts / rollout.max_new_tokens");
  return ok_status();
}

TandemDecoder::TandemDecoder(Context& ctx, const ModelWeights& partner, const EngineOptions& eo, EngineGeometry geo,
                             TandemOptions opt)
    : w_(partner), opt_(std::move(opt)) {
  GRPO_CHECK_MSG(opt_.validate(partner.config.vocab_size).ok(), "TandemDecoder: invalid options (validate first)");
  if (geo.kv_dtype != DType::f8e4m3) geo.kv_dtype = partner.dtype;
  Context* pctx = &ctx;
#ifdef GRPO_HAVE_CUDA
  if (ctx.device() == Device::cuda) {
    ContextOptions co;
    co.device = Device::cuda;
    GRPO_CHECK(cudaGetDevice(&co.cuda_device) == cudaSuccess);
    co.n_threads = 1;
    co.deterministic = ctx.deterministic();
    // Inference only: cuBLASLt's share plus attention partials, which the kernels chunk
    // to whatever is left (results do not depend on the chunking).
    co.workspace_bytes = size_t(256) << 20;
    own_ctx_ = std::make_unique<Context>(co);
    pctx = own_ctx_.get();
  }
#endif
  partner_ = std::make_unique<ModelRunner>(*pctx, partner, eo, geo);
}

TandemDecoder::~TandemDecoder() = default;

void TandemDecoder::execute(ModelRunner& trained, const SchedulerOutput& step, const std::vector<RowSampling>& rows,
                            std::vector<SampledRow>& out) {
  GRPO_CHECK(int(rows.size()) == step.n_sampled);
  out.clear();
  if (step.empty()) return;
  // Both forwards write their own pools at the same slots (on CUDA on two streams); then
  // both sample with the same keys and counters, each from its own logits on its own stream.
  // Usually both samplers and the trained model's logprobs of both candidates run before one
  // wait (collect_pair); rows with top-n lists take the general path, a wait per call.
  trained.forward(step);
  partner_->forward(step);
  const bool pair = trained.sample_rows_async(rows) && partner_->sample_rows_async(rows);
  if (pair) {
    trained.collect_pair(*partner_, int64_t(rows.size()), out, rows_partner_, lp_trained_, lp_partner_);
  } else {
    trained.sample_rows(rows, out);
    partner_->sample_rows(rows, rows_partner_);
  }
  ids_.clear();
  temps_.clear();
  size_t r = 0;
  for (const ScheduledSeq& ss : step.seqs) {
    if (!ss.sample) continue;
    const Sequence& s = *ss.seq;
    const int i = s.n_completion();
    const int prev_owner = s.model_mask.empty() ? -1 : int(s.model_mask.back());
    const uint64_t key = tandem_key(opt_.seed, s.rng_key);
    const SampledRow& a = out[r];
    const SampledRow& b = rows_partner_[r];
    const bool by_trained = tandem_pick(opt_, key, i, prev_owner, s.tokens.back(), a.token, b.token);
    // The trainer's view of every emitted token: the trained model's full-vocabulary
    // distribution at the sampling temperature (general path: scored below).
    const float lp_trained = pair ? (by_trained ? lp_trained_[r] : lp_partner_[r]) : 0.f;
    if (!by_trained) out[r] = b;
    out[r].by_trained = by_trained;
    out[r].logprob_trained = lp_trained;
    if (!pair) {
      ids_.push_back(out[r].token);
      temps_.push_back(rows[r].temperature);
    }
    ++r;
  }
  if (pair) return;
  trained.row_logprobs(ids_, temps_, lp_trained_);  // its logits are still in place
  for (size_t j = 0; j < out.size(); ++j) out[j].logprob_trained = lp_trained_[j];
}

}  // namespace grpo
