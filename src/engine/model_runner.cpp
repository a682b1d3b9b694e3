// Model runner (see model_runner.h).
#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/log.h"
#include "engine/cuda_graph.h"
#include "kernels/cuda/env_switch.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/row_logprob.h"

namespace grpo {

namespace {

enum class CopyDir { to_device, to_host, on_device };

// Copies ordered on ctx.stream() (a non-blocking stream: plain cudaMemcpy would not be
// ordered with the forward and the sampler); copies to the host wait for them.
void copy_bytes(Context& ctx, void* dst, const void* src, size_t n, CopyDir dir) {
#ifdef GRPO_HAVE_CUDA
  if (ctx.device() == Device::cuda) {
    auto st = static_cast<cudaStream_t>(ctx.stream());
    const cudaMemcpyKind kind = dir == CopyDir::to_host     ? cudaMemcpyDeviceToHost
                                : dir == CopyDir::to_device ? cudaMemcpyHostToDevice
                                                            : cudaMemcpyDeviceToDevice;
    GRPO_CHECK(cudaMemcpyAsync(dst, src, n, kind, st) == cudaSuccess);
    if (dir == CopyDir::to_host) GRPO_CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    return;
  }
#endif
  (void)dir;
  std::memcpy(dst, src, n);
}

// Copies the first n host values into the front of a persistent device buffer.
template <class T>
void upload(Context& ctx, const Tensor& dst, const std::vector<T>& h, int64_t n) {
  if (n == 0) return;
  GRPO_CHECK(int64_t(h.size()) >= n && dst.numel() >= n && dtype_size(dst.dtype) == sizeof(T));
  copy_bytes(ctx, dst.data, h.data(), size_t(n) * sizeof(T), CopyDir::to_device);
}

template <class T>
void download(Context& ctx, std::vector<T>& h, const Tensor& src, int64_t n) {
  h.resize(size_t(n));
  if (n == 0) return;
  GRPO_CHECK(src.numel() >= n && dtype_size(src.dtype) == sizeof(T));
  copy_bytes(ctx, h.data(), src.data, size_t(n) * sizeof(T), CopyDir::to_host);
}

// Rows of ModelRunner::d_out_.
constexpr int kOutTok = 0, kOutRaw = 1, kOutProc = 2, kOutMine = 3, kOutTheirs = 4, kOutRows = 5;

}  // namespace

size_t kv_block_bytes(const ModelConfig& cfg, DType kv_dtype, int block_size) {
  return size_t(2) * size_t(cfg.n_layers) * size_t(block_size) * size_t(cfg.n_kv_heads) * size_t(cfg.head_dim) *
         dtype_size(kv_dtype);
}

ModelRunner::ModelRunner(Context& ctx, const ModelWeights& w, const EngineOptions& opt, const EngineGeometry& geo)
    : ctx_(ctx), w_(w), opt_(opt), geo_(geo) {
  GRPO_CHECK(geo.n_blocks > 0 && opt.block_size > 0 && geo.max_model_len > 0);
  GRPO_CHECK(opt.max_num_seqs > 0 && opt.max_num_batched_tokens > 0);
  GRPO_CHECK_MSG(w.device == ctx.device(), "ModelRunner: weights and context are on different devices");
  GRPO_CHECK_MSG(geo.kv_dtype == w.dtype || (geo.kv_dtype == DType::f8e4m3 && w.config.head_dim % 16 == 0),
                 "ModelRunner: the KV cache must have the weights' dtype, or be f8e4m3 with head_dim % 16 == 0 "
                 "(engine_kv_cache_dtype checks the options)");
  const ModelConfig& cfg = w.config;
  const Device dev = ctx.device();
  max_blocks_per_seq_ = (geo.max_model_len + opt.block_size - 1) / opt.block_size;
  max_T_ = std::max(opt.max_num_batched_tokens, opt.max_num_seqs);
  max_R_ = std::max(opt.max_num_seqs, geo.max_logit_rows);
  if (opt_.cuda_graph_batch_sizes.empty()) {
    for (int b : {1, 2, 4, 8})
      if (b < opt.max_num_seqs) opt_.cuda_graph_batch_sizes.push_back(b);
    for (int b = 16; b < opt.max_num_seqs; b += 8) opt_.cuda_graph_batch_sizes.push_back(b);
    opt_.cuda_graph_batch_sizes.push_back(opt.max_num_seqs);
    // Speculative verify steps have up to k + 1 rows per sequence; graphs up to
    // GRPO_VERIFY_GRAPH_ROWS rows (default 512; larger verify steps run eagerly with the
    // tensor-core prefill tiles), every 8 rows up to 128, every 32 past it.
    const int cap = int(cuda::env_long("GRPO_VERIFY_GRAPH_ROWS", 512, 0, 4096));
    const int verify_rows = std::min({geo.max_logit_rows, max_T_, cap});
    if (verify_rows > opt.max_num_seqs) {
      for (int b = (opt.max_num_seqs / 8 + 1) * 8; b < verify_rows; b += b < 128 ? 8 : 32)
        opt_.cuda_graph_batch_sizes.push_back(b);
      opt_.cuda_graph_batch_sizes.push_back(verify_rows);
    }
  }
  std::sort(opt_.cuda_graph_batch_sizes.begin(), opt_.cuda_graph_batch_sizes.end());
  if (opt_.cuda_graph_max_context <= 0) opt_.cuda_graph_max_context = std::min(geo.max_model_len, 2048);
  opt_.cuda_graph_max_context = std::min(opt_.cuda_graph_max_context, geo.max_model_len);

  cache_ = kv_cache_allocate(cfg, dev, geo.kv_dtype, geo.n_blocks, opt.block_size);
  rope_ = rope_table_build(cfg, dev, geo.max_model_len);
  int lora_r = opt.max_lora_rank;
  std::vector<const LoraWeights*> adapters = opt.lora_slots;
  adapters.push_back(opt.lora);
  for (const LoraWeights* a : adapters) {
    if (!a) continue;
    GRPO_CHECK_MSG(a->dtype == w.dtype && a->device == dev && int(a->layers.size()) == cfg.n_layers,
                   "ModelRunner: LoRA adapters must match the weights' dtype, device and layer count");
    lora_r = std::max(lora_r, a->cfg.r);
  }
  scratch_ = forward_scratch_allocate(cfg, dev, w.dtype, max_T_, max_R_, lora_r);
  d_tokens_ = tensor_zeros(dev, DType::i32, {max_T_});
  d_positions_ = tensor_zeros(dev, DType::i32, {max_T_});
  d_token_seq_ = tensor_zeros(dev, DType::i32, {max_T_});
  d_slots_ = tensor_zeros(dev, DType::i32, {max_T_});
  d_block_table_ = tensor_zeros(dev, DType::i32, {max_R_, max_blocks_per_seq_});  // graph rows may exceed the sequences
  d_logit_rows_ = tensor_zeros(dev, DType::i32, {max_R_});
  d_prefill_tiles_ = tensor_zeros(dev, DType::i32, {max_T_, 4});
  d_logits_ = tensor_zeros(dev, DType::f32, {max_R_, cfg.vocab_size});
  const int64_t N = max_R_;
  d_rows_.temperature = tensor_zeros(dev, DType::f32, {N});
  d_rows_.top_p = tensor_zeros(dev, DType::f32, {N});
  d_rows_.top_k = tensor_zeros(dev, DType::i32, {N});
  d_rows_.min_p = tensor_zeros(dev, DType::f32, {N});
  d_rows_.rng_key = tensor_zeros(dev, DType::i64, {N});
  d_rows_.rng_pos = tensor_zeros(dev, DType::i64, {N});
  d_out_ = tensor_zeros(dev, DType::f32, {kOutRows, N});
  if (dev == Device::cuda) h_out_ = tensor_empty_pinned(DType::f32, {kOutRows, N});
  d_tok_out_ = tensor_borrow(d_out_.index0(kOutTok).data, DType::i32, dev, {N});
  d_lp_raw_ = d_out_.index0(kOutRaw);
  d_lp_proc_ = d_out_.index0(kOutProc);
  h_block_table_.assign(size_t(N) * size_t(max_blocks_per_seq_), 0);
  if (opt_.bitwise_logprobs) {
    // Invariants: the loop's config check (train.on_policy) refuses these with a hint.
    GRPO_CHECK_MSG(ctx.deterministic() && (dev == Device::cpu || ctx.batch_invariant()),
                   "ModelRunner: bitwise_logprobs needs a deterministic Context (on CUDA also batch_invariant), or "
                   "rollouts would not equal the trainer's forward");
    const std::string gemm = batch_invariant_gemm_problem(ctx, w.dtype);
    GRPO_CHECK_MSG(gemm.empty(), ("ModelRunner: bitwise_logprobs " + gemm).c_str());
    GRPO_CHECK_MSG(geo.kv_dtype == w.dtype, "ModelRunner: bitwise_logprobs needs an unquantised KV cache");
    if (dev == Device::cpu) d_lse_ = tensor_zeros(dev, DType::f32, {N});  // CUDA folds the logits instead
  }

  // The eager paths' GEMM algorithms chosen now, not in the middle of a run
  // (GRPO_GEMM_PREWARM=0 leaves them to the first use, for A/B runs).
  static const bool prewarm = !cuda::env_off("GRPO_GEMM_PREWARM");
  if (prewarm) transformer_gemm_prewarm(ctx_, w_, scratch_, d_logits_);

  if (opt_.use_cuda_graphs) {
    if (dev != Device::cuda) {
      GRPO_LOG_INFO("engine: CUDA graphs apply to the CUDA backend only; running eagerly");
    } else {
      graphs_ = std::make_unique<DecodeGraphs>(ctx_);
      if (graphs_->supported()) capture_graphs();
    }
  }
}

ModelRunner::~ModelRunner() {
#ifdef GRPO_HAVE_CUDA
  if (pair_event_) cudaEventDestroy(static_cast<cudaEvent_t>(pair_event_));
#endif
}

ForwardBatch ModelRunner::batch_view(int T, int S, int R, int max_context) {
  ForwardBatch b;
  b.tokens = d_tokens_.slice0(0, T);
  b.positions = d_positions_.slice0(0, T);
  b.attn.token_seq = d_token_seq_.slice0(0, T);
  b.attn.token_pos = b.positions;
  b.attn.block_table = d_block_table_.slice0(0, S);
  b.attn.slot_mapping = d_slots_.slice0(0, T);
  b.attn.block_size = opt_.block_size;
  b.attn.max_context = max_context;
  b.attn.n_prefill_tiles = n_prefill_tiles_;
  if (n_prefill_tiles_ > 0) b.attn.prefill_tiles = d_prefill_tiles_.slice0(0, n_prefill_tiles_);
  b.logit_rows = d_logit_rows_.slice0(0, R);
  if (opt_.lora) b.lora.push_back({opt_.lora, 0, T});
  return b;
}

// Host-side batch for the step, padded with dummy decode rows up to padded_T
// (graph replays); uploads it. Returns through members. With allow_prefill_tiles
// (eager steps only) a mostly-prefill step also gets its query tile list.
void ModelRunner::fill_inputs(const SchedulerOutput& step, int padded_T, bool allow_prefill_tiles, bool graph) {
  const int bs = opt_.block_size, MB = max_blocks_per_seq_;
  const int S = int(step.seqs.size());
  h_tokens_.clear();
  h_positions_.clear();
  h_token_seq_.clear();
  h_slots_.clear();
  h_logit_rows_.clear();
  for (int s = 0; s < S; ++s) {
    const ScheduledSeq& ss = step.seqs[size_t(s)];
    const Sequence& seq = *ss.seq;
    GRPO_CHECK(int(seq.table.blocks.size()) <= MB);
    for (int i = 0; i < ss.n_new; ++i) {
      const int p = ss.start() + i;
      h_tokens_.push_back(seq.tokens[size_t(p)]);
      h_positions_.push_back(p);
      h_token_seq_.push_back(s);
      h_slots_.push_back(seq.table.blocks[size_t(p / bs)] * bs + p % bs);
    }
    if (ss.sample)
      for (int j = ss.n_extra_logits; j >= 0; --j) h_logit_rows_.push_back(int32_t(h_tokens_.size()) - 1 - j);
    int32_t* row = h_block_table_.data() + size_t(s) * size_t(MB);
    std::fill(row, row + MB, 0);
    std::copy(seq.table.blocks.begin(), seq.table.blocks.end(), row);
  }
  const int T = int(h_tokens_.size());
  GRPO_CHECK(T == step.n_tokens && T <= max_T_);
  GRPO_CHECK(int(h_logit_rows_.size()) == step.n_sampled && step.n_sampled <= max_R_);
  for (int t = T; t < padded_T; ++t) {  // dummy decode rows: own (zero) block-table row, no write
    h_tokens_.push_back(0);
    h_positions_.push_back(0);
    h_token_seq_.push_back(t);
    h_slots_.push_back(-1);
    h_logit_rows_.push_back(t);
    std::fill(h_block_table_.begin() + int64_t(t) * MB, h_block_table_.begin() + int64_t(t + 1) * MB, 0);
  }
  // A graph computes logits for each of its rows: with fewer sampled rows than tokens (short
  // chunks) the rest repeat row 0, after the sampled ones.
  while (graph && int(h_logit_rows_.size()) < padded_T) h_logit_rows_.push_back(0);
  const int S_pad = std::max(S, padded_T > T ? padded_T : S);
  upload(ctx_, d_tokens_, h_tokens_, padded_T);
  upload(ctx_, d_positions_, h_positions_, padded_T);
  upload(ctx_, d_token_seq_, h_token_seq_, padded_T);
  upload(ctx_, d_slots_, h_slots_, padded_T);
  upload(ctx_, d_block_table_, h_block_table_, int64_t(S_pad) * MB);
  upload(ctx_, d_logit_rows_, h_logit_rows_, int64_t(h_logit_rows_.size()));

  // Prefill tiles (PagedAttnMeta::prefill_tiles, read by the CUDA kernels only) when at
  // least half of the real tokens belong to sequences with n_new > 1: each sequence's rows
  // (a contiguous run at positions n_computed ..) cut into runs of up to kPrefillTile rows;
  // a one-token sequence is a one-row tile. Decode-heavy steps keep the per-token kernel,
  // which splits long contexts over more blocks than one tile per row could. Tiles are
  // ordered by descending key count (the kernel's work per tile), so the longest start
  // first and the short ones fill the tail of the launch; outputs do not depend on the order.
  constexpr int kPrefillTile = 64;  // the tensor-core kernel's query tile height
  n_prefill_tiles_ = 0;
  if (!allow_prefill_tiles || ctx_.device() != Device::cuda || padded_T != T || T == 0) return;
  int prefill_tokens = 0;
  for (const ScheduledSeq& ss : step.seqs)
    if (ss.n_new > 1) prefill_tokens += ss.n_new;
  if (2 * prefill_tokens < T) return;
  h_tiles_.clear();
  int row0 = 0;
  for (int s = 0; s < S; ++s) {
    const ScheduledSeq& ss = step.seqs[size_t(s)];
    for (int i = 0; i < ss.n_new; i += kPrefillTile)
      h_tiles_.push_back({row0 + i, std::min(kPrefillTile, ss.n_new - i), s, ss.start() + i});
    row0 += ss.n_new;
  }
  GRPO_CHECK_MSG(row0 == T && int(h_tiles_.size()) <= max_T_, "ModelRunner: prefill tiles must cover the step's rows");
  std::stable_sort(h_tiles_.begin(), h_tiles_.end(), [](const auto& a, const auto& b) { return a[3] + a[1] > b[3] + b[1]; });
  h_prefill_tiles_.clear();
  for (const auto& t : h_tiles_) h_prefill_tiles_.insert(h_prefill_tiles_.end(), t.begin(), t.end());
  n_prefill_tiles_ = int(h_tiles_.size());
  upload(ctx_, d_prefill_tiles_, h_prefill_tiles_, int64_t(h_prefill_tiles_.size()));
}

void ModelRunner::copy_ids(Tensor& dst, const Tensor& src) {
  GRPO_CHECK(dst.dtype == DType::i32 && src.dtype == DType::i32 && dst.numel() == src.numel());
  copy_bytes(ctx_, dst.data, src.data, size_t(src.numel()) * sizeof(int32_t), CopyDir::on_device);
}

void ModelRunner::download_ids(Tensor& host, const Tensor& src) {
  GRPO_CHECK(host.dtype == DType::i32 && src.dtype == DType::i32 && host.numel() == src.numel());
  copy_bytes(ctx_, host.data, src.data, size_t(src.numel()) * sizeof(int32_t), CopyDir::to_host);
}

void ModelRunner::take_next_tokens() {
  if (!next_tokens_.defined()) return;
  GRPO_CHECK(next_tokens_.numel() <= d_tokens_.numel());
  Tensor dst = d_tokens_.slice0(0, next_tokens_.numel());
  copy_ids(dst, next_tokens_);
  next_tokens_ = Tensor{};
}

void ModelRunner::run_forward(const SchedulerOutput& step) {
  const int S = int(step.seqs.size()), T = step.n_tokens, R = step.n_sampled;
  // A decode graph of B rows runs any step whose T <= B rows all want logits: decode steps
  // (a row per sequence) and speculative verify steps (k + 1 rows of one sequence): the
  // graph's kernels index every row's sequence and position through the step buffers, and
  // each layer writes all rows' K/V before its attention reads them.
  // With graph_short_chunks (a draft model's round 1: each sequence's few catch-up tokens, the
  // last one sampled) rows that want no logits ride along: the graph computes logits for all
  // of its rows, the sampled rows first (fill_inputs), and the sampler reads those.
  bool graphable = T > 0 && (R == T || (graph_short_chunks_ && R <= T));
  for (int s = 0; graphable && s < S; ++s) {
    const ScheduledSeq& ss = step.seqs[size_t(s)];
    graphable = ss.seq->lora == opt_.lora && ss.start() + ss.n_new - 1 < opt_.cuda_graph_max_context &&  // one adapter
                (R == T || ss.n_new <= kShortChunk);
  }
  if (graphs_ && graphable) {
    int B = 0;
    for (int b : opt_.cuda_graph_batch_sizes)
      if (b >= T && graphs_->has(b)) { B = b; break; }
    if (B > 0) {
      fill_inputs(step, B, false, /*graph=*/true);
      take_next_tokens();
      graphs_->launch(B);
      ++n_graph_replays_;
      return;
    }
  }
  // Bitwise logprobs: no tensor-core prefill tiles, whose reduction order differs from the
  // per-token kernels the trainer's forward runs in that mode (docs/bitwise.md).
  fill_inputs(step, T, !opt_.bitwise_logprobs);
  take_next_tokens();
  int max_context = 0;
  for (int t = 0; t < T; ++t) max_context = std::max(max_context, h_positions_[size_t(t)] + 1);
  ForwardBatch batch = batch_view(T, S, R, max_context);
  // Each sequence's rows are contiguous: a group per run of sequences with one adapter.
  batch.lora.clear();
  int row = 0;
  for (const ScheduledSeq& ss : step.seqs) {
    const LoraWeights* a = ss.seq->lora;
    if (a && !batch.lora.empty() && batch.lora.back().w == a && batch.lora.back().end == row)
      batch.lora.back().end += ss.n_new;
    else if (a)
      batch.lora.push_back({a, row, row + ss.n_new});
    row += ss.n_new;
  }
  Tensor logits = d_logits_.slice0(0, R);
  transformer_forward(ctx_, w_, cache_, rope_, batch, scratch_, logits);
}

void ModelRunner::capture_graphs() {
  SchedulerOutput empty;
  for (int B : opt_.cuda_graph_batch_sizes) {
    if (B > max_T_ || B > max_R_) break;
    fill_inputs(empty, B, false, /*graph=*/true);  // all rows dummy: nothing is written to the cache; no tiles
    ForwardBatch batch = batch_view(B, B, B, opt_.cuda_graph_max_context);
    Tensor logits = d_logits_.slice0(0, B);
    const bool ok = graphs_->capture(B, [&] { transformer_forward(ctx_, w_, cache_, rope_, batch, scratch_, logits); });
    if (!ok) {
      GRPO_LOG_WARN("engine: CUDA graph capture failed for batch %d; decode runs eagerly from there on", B);
      break;
    }
  }
}

void ModelRunner::execute(const SchedulerOutput& step, const std::vector<RowSampling>& rows,
                          std::vector<SampledRow>& out, const Tensor* probs) {
  GRPO_CHECK(int(rows.size()) == step.n_sampled);
  out.clear();
  if (step.empty()) return;
  run_forward(step);
  sample(rows, out, probs);
}

void ModelRunner::spec_verify_rows(const Tensor& P, const Tensor& Q, const std::vector<SpecVerifyRow>& rows,
                                   std::vector<SpecVerifyResult>& out, const Tensor& q_index) {
  const int64_t N = int64_t(rows.size());
  out.assign(rows.size(), SpecVerifyResult{});
  if (N == 0) return;
  GRPO_CHECK(N <= max_R_ && P.ndim == 2 && P.shape[0] <= max_R_);
  const Device dev = ctx_.device();
  if (!d_verify_.draft.defined()) {
    d_verify_.p_rows = tensor_zeros(dev, DType::i32, {max_R_});
    d_verify_.q_rows = tensor_zeros(dev, DType::i32, {max_R_});
    d_verify_.draft = tensor_zeros(dev, DType::i32, {max_R_});
    d_verify_.rng_key = tensor_zeros(dev, DType::i64, {max_R_});
    d_verify_.rng_pos = tensor_zeros(dev, DType::i64, {max_R_});
    d_verify_out_.token = tensor_zeros(dev, DType::i32, {max_R_});
    d_verify_out_.accepted = tensor_zeros(dev, DType::i32, {max_R_});
    d_verify_out_.lp_raw = tensor_zeros(dev, DType::f32, {max_R_});
    d_verify_out_.lp_proc = tensor_zeros(dev, DType::f32, {max_R_});
  }
  const size_t n = rows.size();
  std::vector<int32_t> pr(n), qr(n), dr(n);
  std::vector<int64_t> key(n), pos(n);
  for (size_t i = 0; i < rows.size(); ++i) {
    pr[i] = rows[i].p_row;
    qr[i] = rows[i].q_row;
    dr[i] = rows[i].draft;
    key[i] = int64_t(rows[i].rng_key);
    pos[i] = int64_t(rows[i].rng_pos);
  }
  upload(ctx_, d_verify_.p_rows, pr, N);
  upload(ctx_, d_verify_.q_rows, qr, N);
  upload(ctx_, d_verify_.draft, dr, N);
  upload(ctx_, d_verify_.rng_key, key, N);
  upload(ctx_, d_verify_.rng_pos, pos, N);
  SpecVerifyRows v{d_verify_.p_rows.slice0(0, N), d_verify_.q_rows.slice0(0, N), d_verify_.draft.slice0(0, N),
                   d_verify_.rng_key.slice0(0, N), d_verify_.rng_pos.slice0(0, N), q_index};
  SpecVerifyOutputs o{d_verify_out_.token.slice0(0, N), d_verify_out_.accepted.slice0(0, N),
                      d_verify_out_.lp_raw.slice0(0, N), d_verify_out_.lp_proc.slice0(0, N)};
  const int64_t Rp = P.shape[0];
  spec_verify(ctx_, o, d_logits_.slice0(0, Rp), P, Q, v);
  std::vector<int32_t> tok, acc;
  std::vector<float> lr, lp;
  download(ctx_, tok, o.token, N);
  download(ctx_, acc, o.accepted, N);
  download(ctx_, lr, o.lp_raw, N);
  download(ctx_, lp, o.lp_proc, N);
  for (size_t i = 0; i < rows.size(); ++i) out[i] = {tok[i], acc[i] != 0, lr[i], lp[i]};
}

SamplingRows ModelRunner::upload_rows(const std::vector<RowSampling>& rows) {
  const int64_t R = int64_t(rows.size());
  int NB = 0;
  int filters = 0;  // SamplingRows::filter_hint: which filters some row uses
  for (const auto& r : rows) {
    NB = std::max(NB, int(r.banned.size()));
    if (r.top_k > 0) filters |= kFilterTopK;
    if (r.top_p < 1.f) filters |= kFilterTopP;
    if (r.min_p > 0.f) filters |= kFilterMinP;
  }
  const size_t nR = static_cast<size_t>(R);
  std::vector<float> temp(nR), top_p(nR), min_p(nR);
  std::vector<int32_t> top_k(nR), banned(nR * static_cast<size_t>(NB), -1);
  std::vector<int64_t> key(nR), pos(nR);
  for (int64_t r = 0; r < R; ++r) {
    const RowSampling& rs = rows[size_t(r)];
    temp[size_t(r)] = rs.temperature;
    top_p[size_t(r)] = rs.top_p;
    min_p[size_t(r)] = rs.min_p;
    top_k[size_t(r)] = rs.top_k;
    key[size_t(r)] = int64_t(rs.rng_key);
    pos[size_t(r)] = int64_t(rs.rng_pos);
    std::copy(rs.banned.begin(), rs.banned.end(), banned.begin() + r * NB);
  }
  upload(ctx_, d_rows_.temperature, temp, R);
  upload(ctx_, d_rows_.top_p, top_p, R);
  upload(ctx_, d_rows_.min_p, min_p, R);
  upload(ctx_, d_rows_.top_k, top_k, R);
  upload(ctx_, d_rows_.rng_key, key, R);
  upload(ctx_, d_rows_.rng_pos, pos, R);
  SamplingRows v;
  v.filter_hint = filters;
  v.temperature = d_rows_.temperature.slice0(0, R);
  v.top_p = d_rows_.top_p.slice0(0, R);
  v.top_k = d_rows_.top_k.slice0(0, R);
  v.min_p = d_rows_.min_p.slice0(0, R);
  v.rng_key = d_rows_.rng_key.slice0(0, R);
  v.rng_pos = d_rows_.rng_pos.slice0(0, R);
  if (NB > 0) {
    if (NB > banned_cap_) {
      banned_cap_ = NB;
      d_rows_.banned = tensor_zeros(ctx_.device(), DType::i32, {int64_t(max_R_) * NB});
    }
    upload(ctx_, d_rows_.banned, banned, R * NB);
    v.banned = d_rows_.banned.view({d_rows_.banned.numel()}).slice0(0, R * NB).view({R, int64_t(NB)});
  }
  return v;
}

SamplingOutputs ModelRunner::sampler_outputs(int64_t R) const {
  SamplingOutputs o;
  o.tokens = d_tok_out_.slice0(0, R);
  o.logprob_raw = d_lp_raw_.slice0(0, R);
  o.logprob_processed = d_lp_proc_.slice0(0, R);
  return o;
}

const float* ModelRunner::read_out(Context& stream_ctx, int n, bool wait) {
#ifdef GRPO_HAVE_CUDA
  if (ctx_.device() == Device::cuda) {
    auto st = static_cast<cudaStream_t>(stream_ctx.stream());
    GRPO_CHECK(cudaMemcpyAsync(h_out_.data, d_out_.data, size_t(n) * size_t(max_R_) * sizeof(float),
                               cudaMemcpyDeviceToHost, st) == cudaSuccess);
    if (wait) GRPO_CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    return h_out_.ptr<float>();
  }
#endif
  (void)stream_ctx, (void)n, (void)wait;
  return d_out_.ptr<float>();
}

void ModelRunner::rows_from_out(const float* h, int64_t R, std::vector<SampledRow>& out) const {
  const size_t N = size_t(max_R_);
  out.resize(size_t(R));
  for (size_t r = 0; r < size_t(R); ++r) {
    std::memcpy(&out[r].token, h + kOutTok * N + r, sizeof(int32_t));
    out[r].logprob_raw = h[kOutRaw * N + r];
    out[r].logprob_processed = h[kOutProc * N + r];
  }
}

void ModelRunner::sample(const std::vector<RowSampling>& rows, std::vector<SampledRow>& out, const Tensor* probs) {
  const int64_t R = int64_t(rows.size());
  out.assign(size_t(R), SampledRow{});
  if (R == 0) return;
  const Device dev = ctx_.device();
  int n_top = 0;
  bool any_raw = false, any_proc = false;
  for (const auto& r : rows) {
    n_top = std::max(n_top, r.n_top);
    if (r.n_top > 0) (r.top_processed ? any_proc : any_raw) = true;
  }
  const SamplingRows v = upload_rows(rows);
  SamplingOutputs o = sampler_outputs(R);
  if (n_top > 0) {
    if (n_top > top_cap_) {
      top_cap_ = n_top;
      d_top_ids_ = tensor_zeros(dev, DType::i32, {int64_t(max_R_) * n_top});
      d_top_lps_ = tensor_zeros(dev, DType::f32, {int64_t(max_R_) * n_top});
    }
    o.top_ids = d_top_ids_.slice0(0, R * n_top).view({R, int64_t(n_top)});
    o.top_logprobs = d_top_lps_.slice0(0, R * n_top).view({R, int64_t(n_top)});
  }
  if (probs) {
    GRPO_CHECK(probs->ndim == 2 && probs->shape[0] >= R && probs->shape[1] == w_.config.vocab_size);
    o.probs = probs->slice0(0, R);
  }
  const Tensor logits = d_logits_.slice0(0, R);
  std::vector<int32_t> top_ids;
  std::vector<float> top_lps;
  // Top-n lists under each distribution some row asked for (tokens are identical across calls).
  for (int pass = 0; pass < 2; ++pass) {
    const bool processed = pass == 1;
    if (pass == 1 && !any_proc) break;
    if (pass == 0 && !any_raw && any_proc) continue;
    sample_tokens(ctx_, o, logits, v, processed);
    if (n_top > 0) {
      download(ctx_, top_ids, o.top_ids, R * n_top);
      download(ctx_, top_lps, o.top_logprobs, R * n_top);
    }
    rows_from_out(read_out(ctx_, kOutProc + 1, true), R, out);
    for (int64_t r = 0; r < R; ++r) {
      SampledRow& s = out[size_t(r)];
      const RowSampling& rs = rows[size_t(r)];
      if (rs.n_top > 0 && rs.top_processed == processed) {
        s.top.clear();
        for (int j = 0; j < rs.n_top; ++j)
          s.top.emplace_back(top_ids[size_t(r * n_top + j)], top_lps[size_t(r * n_top + j)]);
      }
    }
  }
  if (opt_.bitwise_logprobs) trainer_logprobs(rows, out);
}

bool ModelRunner::sample_rows_async(const std::vector<RowSampling>& rows, const Tensor* probs) {
  if (opt_.bitwise_logprobs) return false;
  for (const auto& r : rows)
    if (r.n_top > 0) return false;
  const int64_t R = int64_t(rows.size());
  if (R == 0) return true;
  const SamplingRows v = upload_rows(rows);
  SamplingOutputs o = sampler_outputs(R);
  if (probs) {
    GRPO_CHECK(probs->ndim == 2 && probs->shape[0] >= R && probs->shape[1] == w_.config.vocab_size);
    o.probs = probs->slice0(0, R);
  }
  sample_tokens(ctx_, o, d_logits_.slice0(0, R), v, false);
  return true;
}

void ModelRunner::collect_pair(ModelRunner& other, int64_t R, std::vector<SampledRow>& mine,
                               std::vector<SampledRow>& theirs, std::vector<float>& lp_mine,
                               std::vector<float>& lp_theirs) {
  GRPO_CHECK(other.max_R_ >= R && max_R_ >= R && other.device() == device());
  mine.clear(), theirs.clear(), lp_mine.clear(), lp_theirs.clear();
  if (R == 0) return;
#ifdef GRPO_HAVE_CUDA
  if (device() == Device::cuda && &other.ctx_ != &ctx_) {
    if (!pair_event_) {
      cudaEvent_t e = nullptr;
      GRPO_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
      pair_event_ = e;
    }
    auto ev = static_cast<cudaEvent_t>(pair_event_);
    GRPO_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(other.ctx_.stream())) == cudaSuccess);
    GRPO_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx_.stream()), ev, 0) == cudaSuccess);
  }
#endif
  const Tensor logits = d_logits_.slice0(0, R), temps = d_rows_.temperature.slice0(0, R);
  Tensor lp = d_out_.index0(kOutMine).slice0(0, R);
  logits_row_logprobs(ctx_, lp, logits, d_tok_out_.slice0(0, R), temps);
  lp = d_out_.index0(kOutTheirs).slice0(0, R);
  logits_row_logprobs(ctx_, lp, logits, other.d_tok_out_.slice0(0, R), temps);
  // The other runner's block is copied on this stream (after the wait), then one wait for both.
  const float* h_other = other.read_out(ctx_, kOutProc + 1, false);
  const float* h = read_out(ctx_, kOutRows, true);
  rows_from_out(h, R, mine);
  other.rows_from_out(h_other, R, theirs);
  const size_t N = size_t(max_R_);
  lp_mine.assign(h + kOutMine * N, h + kOutMine * N + size_t(R));
  lp_theirs.assign(h + kOutTheirs * N, h + kOutTheirs * N + size_t(R));
}

// The trainer scores logits / T over the full vocabulary with token_logprobs_forward on
// the final-normed hidden rows; here the same kernel runs on the same rows (which equal
// the trainer's bit for bit under a deterministic context), one call per run of rows
// that share a temperature. The kernel's result for a row depends on that row alone.
void ModelRunner::trainer_logprobs(const std::vector<RowSampling>& rows, std::vector<SampledRow>& out) {
  const int64_t R = int64_t(rows.size());
  const Tensor h = scratch_.xn.slice0(0, R);  // transformer_forward leaves the logit rows' final norm here
  const Tensor tokens = d_tok_out_.slice0(0, R);
  auto score = [&](int64_t r0, int64_t r1, float temperature, Tensor& dst) {
    Tensor lp = dst.slice0(r0, r1);
#ifdef GRPO_HAVE_CUDA
    if (ctx_.device() == Device::cuda) {
      // The step's logits are the LM head's batch-invariant product: fold them as the
      // trainer's kernel folds its own product of these rows (no second LM-head product).
      cuda::logits_token_logprobs(ctx_, lp, d_logits_.slice0(r0, r1), tokens.slice0(r0, r1), temperature);
      return;
    }
#endif
    Tensor lse = d_lse_.slice0(r0, r1);
    token_logprobs_forward(ctx_, lp, lse, nullptr, h.slice0(r0, r1), w_.lm_head, tokens.slice0(r0, r1), temperature);
  };
  auto temp_of = [&](int64_t r) { return rows[size_t(r)].temperature > 0.f ? rows[size_t(r)].temperature : 1.f; };
  score(0, R, 1.f, d_lp_raw_);
  for (int64_t r0 = 0; r0 < R;) {
    int64_t r1 = r0 + 1;
    while (r1 < R && temp_of(r1) == temp_of(r0)) ++r1;
    if (temp_of(r0) == 1.f) {
      Tensor dst = d_lp_proc_.slice0(r0, r1);
      tensor_copy(dst, d_lp_raw_.slice0(r0, r1));
    } else {
      score(r0, r1, temp_of(r0), d_lp_proc_);
    }
    r0 = r1;
  }
  rows_from_out(read_out(ctx_, kOutProc + 1, true), R, out);
}

void ModelRunner::row_logprobs(const std::vector<int32_t>& ids, const std::vector<float>& temps,
                               std::vector<float>& out) {
  const int64_t R = int64_t(ids.size());
  GRPO_CHECK(temps.size() == ids.size() && R <= max_R_);
  out.clear();
  if (R == 0) return;
  if (!d_given_ids_.defined()) {
    const Device dev = ctx_.device();
    d_given_ids_ = tensor_zeros(dev, DType::i32, {max_R_});
    d_given_temps_ = tensor_zeros(dev, DType::f32, {max_R_});
    d_given_lp_ = tensor_zeros(dev, DType::f32, {max_R_});
  }
  upload(ctx_, d_given_ids_, ids, R);
  upload(ctx_, d_given_temps_, temps, R);
  Tensor lp = d_given_lp_.slice0(0, R);
  logits_row_logprobs(ctx_, lp, d_logits_.slice0(0, R), d_given_ids_.slice0(0, R), d_given_temps_.slice0(0, R));
  download(ctx_, out, lp, R);
}

}  // namespace grpo
