// Rollout engine (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <map>

#include "core/log.h"
#include "core/timer.h"
#include "model/lora.h"

namespace grpo {

struct Engine::Decoder {
  explicit Decoder(const Tokenizer& t) : dec(t, /*skip_special=*/true) {}
  IncrementalDecoder dec;
};

std::span<const EnumName<KvCacheDtype>> kv_cache_dtype_names() {
  static constexpr EnumName<KvCacheDtype> names[] = {
      {"auto", KvCacheDtype::automatic}, {"fp8", KvCacheDtype::fp8_e4m3}, {"fp8_e4m3", KvCacheDtype::fp8_e4m3}};
  return names;
}

Status EngineOptions::validate() const {
  auto bad = [](const std::string& m) { return error_status("engine options: " + m); };
  if (block_size < 1 || block_size > 1024) return bad("block_size must be in [1, 1024]");
  if (n_kv_blocks < 0) return bad("n_kv_blocks must be >= 0 (0 = size from kv_cache_bytes)");
  if (n_kv_blocks == 0 && kv_cache_bytes == 0) return bad("give kv_cache_bytes (memory budget) or n_kv_blocks");
  if (max_num_seqs < 1) return bad("max_num_seqs must be >= 1");
  if (max_num_batched_tokens < max_num_seqs)
    return bad("max_num_batched_tokens (" + std::to_string(max_num_batched_tokens) + ") must be >= max_num_seqs (" +
               std::to_string(max_num_seqs) + "), or running sequences could miss their decode steps");
  if (max_model_len < 0) return bad("max_model_len must be >= 0 (0 = the model's)");
  if (max_lora_rank < 0) return bad("max_lora_rank must be >= 0 (0 = the largest given adapter's r)");
  if (cuda_graph_max_context < 0) return bad("cuda_graph_max_context must be >= 0 (0 = min(max_model_len, 2048))");
  for (int b : cuda_graph_batch_sizes)
    if (b < 1 || b > max_num_seqs)
      return bad("cuda_graph_batch_sizes: " + std::to_string(b) + " is outside [1, max_num_seqs = " +
                 std::to_string(max_num_seqs) + "]");
  GRPO_TRY(speculative.validate());
  if (bitwise_logprobs && kv_cache_dtype != KvCacheDtype::automatic)
    return bad("bitwise_logprobs needs kv_cache_dtype = \"auto\": the trainer attends over unquantised K/V, so "
               "rollouts over an FP8 cache cannot give its logprobs bit for bit");
  if (bitwise_logprobs && speculative.enabled())
    return bad("bitwise_logprobs does not support speculative decoding yet; set speculative method = \"off\"");
  return ok_status();
}

Result<DType> engine_kv_cache_dtype(const ModelConfig& cfg, DType model_dtype, const EngineOptions& opt) {
  GRPO_TRY(opt.validate());
  if (opt.kv_cache_dtype == KvCacheDtype::automatic) return model_dtype;
  // The CUDA kernels handle an fp8 row (head_dim bytes) in 16-byte pieces.
  if (cfg.head_dim % 16 != 0)
    return error_status(std::string("engine options: kv_cache_dtype = \"fp8\" needs head_dim % 16 == 0, but ") +
                        "this model's head_dim is " + std::to_string(cfg.head_dim) + "; use kv_cache_dtype = \"auto\"");
  return DType::f8e4m3;
}

Result<int> engine_kv_blocks(const ModelConfig& cfg, DType model_dtype, const EngineOptions& opt) {
  GRPO_ASSIGN_OR_RETURN(const DType kv_dtype, engine_kv_cache_dtype(cfg, model_dtype, opt));
  const int max_len = opt.max_model_len > 0 ? opt.max_model_len : cfg.max_position_embeddings;
  if (max_len < 2) return error_status("engine options: max_model_len must be >= 2 (got " + std::to_string(max_len) + ")");
  if (!opt.enable_chunked_prefill && opt.max_num_batched_tokens < max_len)
    return error_status("engine options: without chunked prefill max_num_batched_tokens (" +
                        std::to_string(opt.max_num_batched_tokens) + ") must be >= max_model_len (" +
                        std::to_string(max_len) + "), or a long sequence could never be (re)computed");
  if (opt.n_kv_blocks > 0) return opt.n_kv_blocks;
  const size_t per_block = kv_block_bytes(cfg, kv_dtype, opt.block_size);
  const size_t n = opt.kv_cache_bytes / per_block;
  if (n < 1)
    return error_status("engine options: kv_cache_bytes (" + std::to_string(opt.kv_cache_bytes) +
                        ") is smaller than one KV block (" + std::to_string(per_block) + " bytes); raise it");
  return int(std::min<size_t>(n, size_t(1) << 30));
}

Engine::Engine(Context& ctx, ModelWeights& w, const Tokenizer* tok, EngineOptions opt, const EngineTandem* tandem,
               const ModelWeights* draft)
    : ctx_(ctx), w_(w), tok_(tok), opt_(std::move(opt)) {
  GRPO_CHECK_MSG(!tandem || tandem->partner, "engine: a tandem setup needs its partner weights");
  const SpeculativeOptions& spec = opt_.speculative;
  GRPO_CHECK_MSG(!(tandem && spec.enabled()), "engine: speculative decoding and tandem decoding cannot be combined");
  GRPO_CHECK_MSG(!(tandem && opt_.bitwise_logprobs), "engine: bitwise_logprobs does not support tandem decoding yet");
  GRPO_CHECK_MSG((spec.method == SpecMethod::draft) == (draft != nullptr),
                 "engine: speculative method \"draft\" needs the draft weights (and only it takes them)");
  const ModelWeights* second = tandem ? tandem->partner : draft;
  // The draft's pool is a second pool in the same block tables, sized like the tandem partner's.
  auto n_blocks = second ? tandem_kv_blocks(w.config, w.dtype, second->config, second->dtype, opt_)
                         : engine_kv_blocks(w.config, w.dtype, opt_);
  GRPO_CHECK_MSG(n_blocks.ok(), n_blocks.status().message().c_str());
  const DType kv_dtype = engine_kv_cache_dtype(w.config, w.dtype, opt_).value();  // checked by engine_kv_blocks
  max_model_len_ = opt_.max_model_len > 0 ? opt_.max_model_len : w.config.max_position_embeddings;
  eos_ = opt_.eos_token_ids;
  if (eos_.empty() && tok_) eos_ = tok_->eos_ids();
  if (eos_.empty()) eos_ = w.config.eos_token_ids;
  blocks_ = std::make_unique<BlockManager>(n_blocks.value(), opt_.block_size, opt_.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(opt_, *blocks_);
  EngineGeometry geo{n_blocks.value(), max_model_len_, kv_dtype};
  if (spec.enabled()) geo.max_logit_rows = opt_.max_num_seqs * (spec.num_speculative_tokens + 1);
  runner_ = std::make_unique<ModelRunner>(ctx_, w_, opt_, geo);
  // Slot k's first adapter keeps the namespace k + 1; later ones take fresh salts.
  for (size_t k = 0; k < opt_.lora_slots.size(); ++k) lora_salt_.push_back(uint64_t(k) + 1);
  next_lora_salt_ = uint64_t(opt_.lora_slots.size()) + 1;
  if (spec.enabled()) adapt_ = std::make_unique<SpecAdaptive>(spec.num_speculative_tokens, spec.probe_every);
  if (draft) {
    const Status ok = spec_check_draft(w.config, draft->config, max_model_len_);
    GRPO_CHECK_MSG(ok.ok(), ok.message().c_str());
    const Status vocab = spec_resolve_draft_vocab(opt_.speculative, w.config.vocab_size);
    GRPO_CHECK_MSG(vocab.ok(), vocab.message().c_str());
    draft_ = std::make_unique<SpecDraft>(ctx_, *draft, opt_, geo);
    const int64_t head = opt_.speculative.draft_vocab_ids.empty() ? 0 : draft_->head_rows();
    adapt_->set_draft_read_ratio(spec_draft_read_ratio(w.config, draft->config, head));
    draft_->times = &adapt_->draft;
  }
  if (tandem) {
    const Status ok = tandem_check_partner(w.config, tandem->partner->config, max_model_len_);
    GRPO_CHECK_MSG(ok.ok(), ok.message().c_str());
    tandem_ = std::make_unique<TandemDecoder>(ctx_, *tandem->partner, opt_, geo, tandem->opt);
    tandem_on_ = true;
  }
}

Status Engine::set_tandem_active(bool on) {
  if (!tandem_) return error_status("engine: set_tandem_active needs an engine created with a tandem partner");
  if (has_unfinished()) return error_status("engine: finish the running requests before switching tandem decoding");
  if (on != tandem_on_) blocks_->reset_prefix_cache();
  tandem_on_ = on;
  return ok_status();
}

Engine::~Engine() = default;

Status Engine::set_lora_slot(int slot, const LoraWeights* w) {
  if (slot < 0 || slot >= int(opt_.lora_slots.size()))
    return error_status("set_lora_slot: slot " + std::to_string(slot) + " is outside the engine's " +
                        std::to_string(opt_.lora_slots.size()) + " LoRA slot(s) (EngineOptions::lora_slots)");
  for (const auto& [id, s] : seqs_)
    if (s->params.lora_slot == slot && s->prefix_salt == lora_salt_[size_t(slot)])
      return error_status("set_lora_slot: request " + std::to_string(s->request_id) + " still runs on slot " +
                          std::to_string(slot) + "; let it finish or abort it first");
  if (w) {
    if (w->dtype != w_.dtype || w->device != w_.device || int(w->layers.size()) != w_.config.n_layers)
      return error_status(std::string("set_lora_slot: the adapter must have the weights' dtype (") +
                          dtype_name(w_.dtype) + "), device and layer count (" + std::to_string(w_.config.n_layers) + ")");
    if (w->cfg.r > runner_->lora_rank_capacity())
      return error_status("set_lora_slot: the adapter's rank " + std::to_string(w->cfg.r) +
                          " is above the engine's capacity of " + std::to_string(runner_->lora_rank_capacity()) +
                          " (EngineOptions::max_lora_rank)");
  }
  opt_.lora_slots[size_t(slot)] = w;
  lora_salt_[size_t(slot)] = next_lora_salt_++;
  return ok_status();
}

Status Engine::check_request(const std::vector<int32_t>& prompt_ids, const SamplingParams& params) const {
  const int V = w_.config.vocab_size;
  GRPO_TRY(params.validate(V));
  if (params.lora_slot >= int(opt_.lora_slots.size()) || (params.lora_slot >= 0 && !opt_.lora_slots[size_t(params.lora_slot)]))
    return error_status("lora_slot " + std::to_string(params.lora_slot) + ": the engine has " +
                        std::to_string(opt_.lora_slots.size()) + " LoRA adapter slot(s); load the adapter first");
  if (prompt_ids.empty()) return error_status("request: the prompt is empty (give at least one token id)");
  for (size_t i = 0; i < prompt_ids.size(); ++i)
    if (prompt_ids[i] < 0 || prompt_ids[i] >= V)
      return error_status("request: prompt id " + std::to_string(prompt_ids[i]) + " at position " +
                          std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  const int n_prompt = int(prompt_ids.size());
  if (n_prompt >= max_model_len_)
    return error_status("request: the prompt has " + std::to_string(n_prompt) + " tokens but the context is " +
                        std::to_string(max_model_len_) + " (max_model_len); shorten it to leave room for output");
  if (!params.stop.empty() && !tok_)
    return error_status("request: stop strings need a tokenizer (the engine was created without one)");
  const int max_total = int(std::min<int64_t>(int64_t(n_prompt) + params.max_tokens, max_model_len_));
  const int need = blocks_->blocks_for(max_total);
  if (need > blocks_->n_blocks())
    return error_status("request: prompt + max_tokens needs " + std::to_string(need) + " KV blocks but the pool has " +
                        std::to_string(blocks_->n_blocks()) + "; raise the KV memory budget or lower max_tokens");
  return ok_status();
}

Result<int64_t> Engine::add_request(std::vector<int32_t> prompt_ids, const SamplingParams& params) {
  GRPO_TRY(check_request(prompt_ids, params));
  const int n_prompt = int(prompt_ids.size());
  const int max_total = int(std::min<int64_t>(int64_t(n_prompt) + params.max_tokens, max_model_len_));
  const int64_t rid = next_request_++;
  const double now = now_seconds();
  auto group = std::make_shared<SeqGroup>();
  for (int j = 0; j < params.n; ++j) {
    auto s = std::make_unique<Sequence>();
    s->seq_id = next_seq_++;
    s->request_id = rid;
    s->sample_index = j;
    s->tokens = prompt_ids;
    s->n_prompt = n_prompt;
    s->max_total = max_total;
    s->group = group;
    s->params = params;
    if (params.lora_slot >= 0) {
      s->lora = opt_.lora_slots[size_t(params.lora_slot)];
      s->prefix_salt = lora_salt_[size_t(params.lora_slot)];
    } else {
      s->lora = opt_.lora;
    }
    const uint64_t seed = params.seed ? *params.seed : (opt_.seed ^ sampling_mix64(uint64_t(rid)));
    s->rng_key = sampling_row_key(seed, uint64_t(j));
    s->t_arrival = now;
    if (tok_) decoders_[s->seq_id] = std::make_unique<Decoder>(*tok_);
    scheduler_->add(s.get());
    seqs_[s->seq_id] = std::move(s);
  }
  return rid;
}

RowSampling Engine::row_sampling(const Sequence& s, int at) const {
  if (at < 0) at = s.n_completion();
  const SamplingParams& p = s.params;
  RowSampling r;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.top_k = p.top_k;
  r.min_p = p.min_p;
  r.rng_key = s.rng_key;
  r.rng_pos = uint64_t(at);
  if (at < p.min_tokens) {
    r.banned.assign(eos_.begin(), eos_.end());
    r.banned.insert(r.banned.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
  r.n_top = p.top_logprobs;
  r.top_processed = p.logprobs_mode == LogprobsMode::processed;
  return r;
}

bool Engine::abort_request(int64_t request_id) {
  const std::vector<Sequence*> gone = scheduler_->abort_request(request_id);
  for (Sequence* s : gone) {
    decoders_.erase(s->seq_id);
    seqs_.erase(s->seq_id);
  }
  return !gone.empty();
}

std::vector<RequestOutput> Engine::step(std::vector<TokenEvent>* events) {
  if (opt_.speculative.enabled()) return step_speculative(events);
  return step_plain(events);
}

std::vector<RequestOutput> Engine::step_plain(std::vector<TokenEvent>* events) {
  const double t_step = now_seconds();
  std::vector<RequestOutput> done;
  SchedulerOutput out = scheduler_->schedule();
  if (out.empty() && !out.preempted.empty()) {
    for (Sequence* s : out.preempted) s->draft_computed = 0;
    out = scheduler_->schedule();  // admissions wait a pass after preemption
  }
  for (Sequence* s : out.preempted) s->draft_computed = 0;  // a draft model's pool lost it too
  if (out.empty()) {
    GRPO_CHECK_MSG(!scheduler_->has_work(), "engine: requests are queued but none can be scheduled");
    return done;
  }
  double now = now_seconds();
  std::vector<RowSampling> rows;
  for (const auto& ss : out.seqs) {
    if (ss.seq->t_first_scheduled < 0) ss.seq->t_first_scheduled = now;
    ++ss.seq->n_engine_steps;
    if (ss.sample) rows.push_back(row_sampling(*ss.seq));
  }
  std::vector<SampledRow> sampled;
  if (tandem_active()) tandem_->execute(*runner_, out, rows, sampled);
  else runner_->execute(out, rows, sampled);
  if (adapt_) ++stats_.spec_plain_steps;
  scheduler_->on_step_done(out);
  ++stats_.steps;
  stats_.tokens_computed += out.n_tokens;
  stats_.preemptions = scheduler_->n_preemptions();
  stats_.graph_replays = runner_->n_graph_replays() + (tandem_ ? tandem_->n_graph_replays() : 0);
  now = now_seconds();
  size_t r = 0;
  for (const auto& ss : out.seqs) {
    if (!ss.sample) continue;
    Sequence& s = *ss.seq;
    if (s.n_completion() == 0) stats_.prefix_hit_tokens += s.prefix_hit_tokens;
    ++s.engine_steps;
    on_token(s, sampled[r], now);
    ++stats_.tokens_generated;
    after_token(s, add_event(s, sampled[r++], events), now, done);
  }
  // Speculative engines: the adaptive plan compares drafting steps against this: the whole
  // step (scheduling, forward, sampling, commits) of decode-only steps.
  if (adapt_ && out.n_tokens == int(out.seqs.size()) && out.n_sampled == out.n_tokens)
    adapt_->plain.add(double(out.n_tokens), now_seconds() - t_step);
  return done;
}

TokenEvent* Engine::add_event(const Sequence& s, const SampledRow& row, std::vector<TokenEvent>* events) {
  if (!events) return nullptr;
  TokenEvent* ev = &events->emplace_back();
  ev->request_id = s.request_id;
  ev->sample_index = s.sample_index;
  ev->token = row.token;
  ev->logprob_raw = row.logprob_raw;
  ev->logprob_processed = row.logprob_processed;
  ev->logprob = s.params.logprobs_mode == LogprobsMode::raw ? row.logprob_raw : row.logprob_processed;
  if (s.params.top_logprobs > 0) ev->top_logprobs = row.top;
  return ev;
}

void Engine::after_token(Sequence& s, TokenEvent* ev, double now, std::vector<RequestOutput>& done) {
  if (s.finish != FinishReason::none) {
    const size_t emitted = s.text_emitted;
    done.push_back(finish_output(s, s.finish, now));  // s is gone from here
    if (ev) {
      const std::string& text = done.back().text;
      if (text.size() > emitted) ev->text_delta = text.substr(emitted);
      ev->finish_reason = done.back().finish_reason;
    }
  } else if (ev) {
    size_t hold = 0;
    for (const auto& st : s.params.stop) hold = std::max(hold, st.size() - 1);
    const size_t safe = s.text.size() > hold ? s.text.size() - hold : 0;
    if (safe > s.text_emitted) {
      ev->text_delta = s.text.substr(s.text_emitted, safe - s.text_emitted);
      s.text_emitted = safe;
    }
  }
}

// Appends the sampled token and decides whether the sample ends (sets s.finish).
void Engine::on_token(Sequence& s, const SampledRow& row, double now) {
  const SamplingParams& p = s.params;
  const int32_t t = row.token;
  s.tokens.push_back(t);
  s.logprobs_raw.push_back(row.logprob_raw);
  s.logprobs_processed.push_back(row.logprob_processed);
  if (p.top_logprobs > 0) s.top_logprobs.push_back(row.top);
  if (tandem_active()) {
    s.model_mask.push_back(row.by_trained ? 1 : 0);
    s.logprobs_trained.push_back(row.logprob_trained);
    ++(row.by_trained ? stats_.tandem_trained_tokens : stats_.tandem_partner_tokens);
  }
  if (s.t_first_token < 0) s.t_first_token = now;
  auto it = decoders_.find(s.seq_id);
  if (it != decoders_.end()) s.text += it->second->dec.push(t);

  const bool past_min = s.n_completion() >= p.min_tokens;
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) != p.stop_token_ids.end()) {
    s.finish = FinishReason::stop;
  } else if (!p.ignore_eos && std::find(eos_.begin(), eos_.end(), t) != eos_.end()) {
    s.finish = FinishReason::eos;
  } else if (!p.stop.empty()) {
    // A match must end in text new since the last scan; before min_tokens text is scanned
    // (so that an early match is never acted on later) but not stopped on.
    size_t cut = std::string::npos;
    for (const auto& st : p.stop) {
      const size_t from = s.text_checked >= st.size() ? s.text_checked - (st.size() - 1) : 0;
      cut = std::min(cut, s.text.find(st, from));
    }
    s.text_checked = s.text.size();
    if (cut != std::string::npos && past_min) {
      s.text.resize(cut);
      s.finish = FinishReason::stop;
      decoders_.erase(s.seq_id);  // nothing after the stop string belongs to the text
    }
  }
  if (s.finish == FinishReason::none && (s.n_completion() >= p.max_tokens || s.n_total() >= s.max_total))
    s.finish = FinishReason::length;
}

RequestOutput Engine::finish_output(Sequence& s, FinishReason reason, double now) {
  scheduler_->finish(&s, reason);
  auto dit = decoders_.find(s.seq_id);
  if (dit != decoders_.end()) {
    s.text += dit->second->dec.flush();
    decoders_.erase(dit);
  }
  RequestOutput o;
  o.request_id = s.request_id;
  o.sample_index = s.sample_index;
  o.prompt_ids.assign(s.tokens.begin(), s.tokens.begin() + s.n_prompt);
  o.completion_ids.assign(s.tokens.begin() + s.n_prompt, s.tokens.end());
  o.text = std::move(s.text);
  o.logprobs = s.params.logprobs_mode == LogprobsMode::raw ? s.logprobs_raw : s.logprobs_processed;
  o.logprobs_raw = std::move(s.logprobs_raw);
  o.logprobs_processed = std::move(s.logprobs_processed);
  o.top_logprobs = std::move(s.top_logprobs);
  o.model_mask = std::move(s.model_mask);
  o.logprobs_trained = std::move(s.logprobs_trained);
  o.finish_reason = reason;
  RequestTelemetry& tm = o.telemetry;
  tm.queue_s = s.t_first_scheduled - s.t_arrival;
  tm.ttft_s = s.t_first_token - s.t_arrival;
  tm.e2e_s = now - s.t_arrival;
  tm.prompt_tokens = s.n_prompt;
  tm.generated_tokens = s.n_completion();
  tm.prefix_hit_tokens = s.prefix_hit_tokens;
  tm.n_preemptions = s.n_preemptions;
  tm.peak_kv_bytes = size_t(s.peak_blocks) * runner_->kv_bytes_per_block();
  tm.spec_proposed = s.spec_proposed;
  tm.spec_accepted = s.spec_accepted;
  tm.spec_acceptance_rate = s.spec_proposed > 0 ? double(s.spec_accepted) / double(s.spec_proposed) : 0.0;
  tm.spec_accepted_by_pos = std::move(s.spec_accepted_by_pos);
  tm.spec_proposed_by_pos = std::move(s.spec_proposed_by_pos);
  tm.engine_steps = s.engine_steps;
  seqs_.erase(s.seq_id);  // s is dangling from here
  return o;
}

Result<std::vector<RequestOutput>> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                    const SamplingParams& params) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params));
}

Result<std::vector<RequestOutput>> Engine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                    const std::vector<SamplingParams>& params) {
  GRPO_CHECK(params.size() == prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    GRPO_TRY(check_request(prompts[i], params[i]).with_context("prompt " + std::to_string(i)));
  std::map<int64_t, size_t> first_index;  // request id -> index of its sample 0 in the result
  size_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto rid = add_request(prompts[i], params[i]);
    if (!rid.ok()) return rid.status().with_context("prompt " + std::to_string(i));
    first_index[rid.value()] = total;
    total += size_t(params[i].n);
  }
  std::vector<RequestOutput> result(total);
  size_t n_left = result.size();
  while (n_left > 0) {
    GRPO_CHECK_MSG(has_unfinished(), "engine: generate lost track of a request");
    for (auto& o : step()) {
      auto it = first_index.find(o.request_id);
      if (it == first_index.end()) continue;
      result[it->second + size_t(o.sample_index)] = std::move(o);
      --n_left;
    }
  }
  return result;
}

}  // namespace grpo
