// Model runner (see model_runner.h).
#include "engine/model_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/log.h"
#include "engine/cuda_graph.h"
#include "kernels/gather.h"
#include "kernels/logprob.h"
#include "kernels/row_logprob.h"

namespace grpo {

namespace {

// Host <-> device copies ordered on ctx.stream() (a non-blocking stream: plain
// cudaMemcpy would not be ordered with the forward and the sampler).
void copy_bytes(Context& ctx, void* dst, const void* src, size_t n, bool to_host) {
#ifdef GRPO_HAVE_CUDA
  if (ctx.device() == Device::cuda) {
    auto st = static_cast<cudaStream_t>(ctx.stream());
    GRPO_CHECK(cudaMemcpyAsync(dst, src, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, st) ==
               cudaSuccess);
    if (to_host) GRPO_CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Copies the first n host values into the front of a persistent device buffer.
template <class T>
void upload(Context& ctx, const Tensor& dst, const std::vector<T>& h, int64_t n) {
  if (n == 0) return;
  GRPO_CHECK(int64_t(h.size()) >= n && dst.numel() >= n && dtype_size(dst.dtype) == sizeof(T));
  copy_bytes(ctx, dst.data, h.data(), size_t(n) * sizeof(T), false);
}

template <class T>
void download(Context& ctx, std::vector<T>& h, const Tensor& src, int64_t n) {
  h.resize(size_t(n));
  if (n == 0) return;
  GRPO_CHECK(src.numel() >= n && dtype_size(src.dtype) == sizeof(T));
  copy_bytes(ctx, h.data(), src.data, size_t(n) * sizeof(T), true);
}

}  // namespace

// One call's small host <-> device transfers through pinned host memory: uploads are packed
// into one host buffer and sent with one copy (the device views point into one device buffer);
// downloads are queued on the stream and waited for once. Pageable copies would each be staged
// by the driver, and each download would be a host sync of its own. On the CPU the device
// buffer is host memory and copies are plain memcpy.
class TransferStage {
 public:
  explicit TransferStage(Context& ctx) : ctx_(ctx), cuda_(ctx.device() == Device::cuda) {}
  ~TransferStage() {
    if (cuda_) ctx_.synchronize();
    host_free(up_host_);
    host_free(down_host_);
#ifdef GRPO_HAVE_CUDA
    if (sent_) cudaEventDestroy(static_cast<cudaEvent_t>(sent_));
#endif
  }
  TransferStage(const TransferStage&) = delete;
  TransferStage& operator=(const TransferStage&) = delete;

  // Opens a batch of uploads of at most `bytes` in all, counting 16 bytes of padding per put.
  void begin_upload(size_t bytes) {
    // The host buffer is rewritten below: the previous batch's copy must have left it.
#ifdef GRPO_HAVE_CUDA
    if (sent_) GRPO_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(sent_)) == cudaSuccess);
#endif
    if (bytes > up_cap_) {
      ctx_.synchronize();  // queued kernels may still read the old device views
      const size_t cap = round16(std::max({bytes, 2 * up_cap_, size_t(4096)}));
      host_free(up_host_);
      up_host_ = static_cast<char*>(host_alloc(cap));
      up_dev_ = tensor_empty(ctx_.device(), DType::i32, {int64_t(cap / 4)});
      up_cap_ = cap;
    }
    up_used_ = 0;
  }
  // Appends n values; the returned device view holds them once send() has been queued.
  template <class T>
  Tensor put(const T* h, int64_t n, DType dt, const std::vector<int64_t>& shape) {
    GRPO_CHECK(dtype_size(dt) == sizeof(T) && n >= 0);
    const size_t off = up_used_, bytes = size_t(n) * sizeof(T);
    GRPO_CHECK_MSG(off + bytes <= up_cap_, "TransferStage: upload batch larger than begin_upload reserved");
    if (bytes > 0) std::memcpy(up_host_ + off, h, bytes);
    up_used_ = round16(off + bytes);
    return tensor_borrow(static_cast<char*>(up_dev_.data) + off, dt, ctx_.device(), shape);
  }
  void send() {
    if (up_used_ == 0) return;
#ifdef GRPO_HAVE_CUDA
    if (cuda_) {
      auto st = static_cast<cudaStream_t>(ctx_.stream());
      GRPO_CHECK(cudaMemcpyAsync(up_dev_.data, up_host_, up_used_, cudaMemcpyHostToDevice, st) == cudaSuccess);
      if (!sent_) {
        cudaEvent_t e = nullptr;
        GRPO_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
        sent_ = e;
      }
      GRPO_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(sent_), st) == cudaSuccess);
      return;
    }
#endif
    std::memcpy(up_dev_.data, up_host_, up_used_);
  }

  // Opens a batch of downloads of at most `bytes` in all (16 bytes of padding per fetch).
  void begin_download(size_t bytes) {
    GRPO_CHECK_MSG(pending_.empty(), "TransferStage: wait() for the previous downloads first");
    if (bytes > down_cap_) {
      const size_t cap = round16(std::max({bytes, 2 * down_cap_, size_t(4096)}));
      host_free(down_host_);
      down_host_ = static_cast<char*>(host_alloc(cap));
      down_cap_ = cap;
    }
    down_used_ = 0;
  }
  // Queues a copy of src's first `bytes` bytes into dst, which must stay valid until wait().
  void fetch(void* dst, const Tensor& src, size_t bytes) {
    if (bytes == 0) return;
    GRPO_CHECK(src.numel() * int64_t(dtype_size(src.dtype)) >= int64_t(bytes));
#ifdef GRPO_HAVE_CUDA
    if (cuda_) {
      const size_t off = down_used_;
      GRPO_CHECK_MSG(off + bytes <= down_cap_, "TransferStage: download batch larger than begin_download reserved");
      GRPO_CHECK(cudaMemcpyAsync(down_host_ + off, src.data, bytes, cudaMemcpyDeviceToHost,
                                 static_cast<cudaStream_t>(ctx_.stream())) == cudaSuccess);
      pending_.push_back({dst, off, bytes});
      down_used_ = round16(off + bytes);
      return;
    }
#endif
    std::memcpy(dst, src.data, bytes);
  }
  void wait() {
    if (pending_.empty()) return;
    ctx_.synchronize();
    for (const Pending& p : pending_) std::memcpy(p.dst, down_host_ + p.off, p.bytes);
    pending_.clear();
  }

 private:
  static size_t round16(size_t n) { return (n + 15) & ~size_t(15); }
  void* host_alloc(size_t n) {
#ifdef GRPO_HAVE_CUDA
    if (cuda_) {
      void* p = nullptr;
      GRPO_CHECK_MSG(cudaMallocHost(&p, n) == cudaSuccess,
                     "engine: cudaMallocHost failed for the sampler's pinned staging buffer");
      return p;
    }
#endif
    void* p = std::malloc(n);  // 16-byte aligned: enough for every staged dtype
    GRPO_CHECK_MSG(p, "engine: out of host memory for the sampler's staging buffer");
    return p;
  }
  void host_free(void* p) {
    if (!p) return;
#ifdef GRPO_HAVE_CUDA
    if (cuda_) {
      cudaFreeHost(p);
      return;
    }
#endif
    std::free(p);
  }

  struct Pending {
    void* dst;
    size_t off, bytes;
  };
  Context& ctx_;
  bool cuda_;
  char* up_host_ = nullptr;
  size_t up_cap_ = 0, up_used_ = 0;
  Tensor up_dev_;
  char* down_host_ = nullptr;
  size_t down_cap_ = 0, down_used_ = 0;
  std::vector<Pending> pending_;
  void* sent_ = nullptr;  // cudaEvent_t recorded after the last upload copy
};

// Caller additions to one sample_on call.
struct SampleHooks {
  size_t upload_bytes = 0;                      // what stage() puts, padding included
  std::function<void(TransferStage&)> stage;    // puts its inputs into the sampler's upload batch
  std::function<void()> before;                 // queued after the upload, before the sampler
  // Queued after the sampler (d_tok_out_ holds the tokens; temps: the rows' temperatures on
  // the device); returns (R) f32 on the device, downloaded into out[j].logprob_trained.
  std::function<Tensor(const Tensor& temps)> after;
};

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
  if (opt_.cuda_graph_batch_sizes.empty()) {
    for (int b : {1, 2, 4, 8})
      if (b < opt.max_num_seqs) opt_.cuda_graph_batch_sizes.push_back(b);
    for (int b = 16; b < opt.max_num_seqs; b += 8) opt_.cuda_graph_batch_sizes.push_back(b);
    opt_.cuda_graph_batch_sizes.push_back(opt.max_num_seqs);
  }
  std::sort(opt_.cuda_graph_batch_sizes.begin(), opt_.cuda_graph_batch_sizes.end());
  if (opt_.cuda_graph_max_context <= 0) opt_.cuda_graph_max_context = std::min(geo.max_model_len, 2048);
  opt_.cuda_graph_max_context = std::min(opt_.cuda_graph_max_context, geo.max_model_len);
  max_T_ = std::max(opt.max_num_batched_tokens, opt.max_num_seqs);
  max_R_ = std::max(opt.max_num_seqs, geo.max_logit_rows);

  cache_ = kv_cache_allocate(cfg, dev, geo.kv_dtype, geo.n_blocks, opt.block_size);
  rope_ = rope_table_build(cfg, dev, geo.max_model_len);
  int lora_r = 0;
  std::vector<const LoraWeights*> adapters = opt.lora_slots;
  adapters.push_back(opt.lora);
  for (const LoraWeights* a : adapters) {
    if (!a) continue;
    GRPO_CHECK_MSG(a->dtype == w.dtype && a->device == dev && int(a->layers.size()) == cfg.n_layers,
                   "ModelRunner: LoRA adapters must match the weights' dtype, device and layer count");
    lora_r = std::max(lora_r, a->cfg.r);
  }
  scratch_ = forward_scratch_allocate(cfg, dev, w.dtype, max_T_, max_R_, lora_r);
  // The per-token inputs are rows of one (5, max_T) buffer so that one 2D copy uploads them
  // (logit rows are token rows of the step, so at most max_T of them).
  d_step_ = tensor_zeros(dev, DType::i32, {kStepRows, max_T_});
  d_tokens_ = d_step_.index0(0);
  d_positions_ = d_step_.index0(1);
  d_token_seq_ = d_step_.index0(2);
  d_slots_ = d_step_.index0(3);
  d_logit_rows_ = d_step_.index0(4);
  d_block_table_ = tensor_zeros(dev, DType::i32, {opt.max_num_seqs, max_blocks_per_seq_});
#ifdef GRPO_HAVE_CUDA
  if (dev == Device::cuda) {
    const size_t n = size_t(kStepRows) * size_t(max_T_) + size_t(opt.max_num_seqs) * size_t(max_blocks_per_seq_);
    void* p = nullptr;
    GRPO_CHECK_MSG(cudaMallocHost(&p, n * sizeof(int32_t)) == cudaSuccess,
                   "engine: cudaMallocHost failed for the step inputs' pinned staging buffer");
    h_pinned_ = static_cast<int32_t*>(p);
    cudaEvent_t e = nullptr;
    GRPO_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    inputs_sent_ = e;
  }
#endif
  d_prefill_tiles_ = tensor_zeros(dev, DType::i32, {max_T_, 4});
  d_logits_ = tensor_zeros(dev, DType::f32, {max_R_, cfg.vocab_size});
  const int64_t N = max_R_;
  d_tok_out_ = tensor_zeros(dev, DType::i32, {N});
  d_lp_raw_ = tensor_zeros(dev, DType::f32, {N});
  d_lp_proc_ = tensor_zeros(dev, DType::f32, {N});
  h_block_table_.assign(size_t(N) * size_t(max_blocks_per_seq_), 0);
  stage_ = std::make_unique<TransferStage>(ctx_);
  if (opt_.bitwise_logprobs) {
    // Invariants: the loop's config check (train.on_policy) refuses these with a hint.
    GRPO_CHECK_MSG(dev == Device::cpu, "ModelRunner: bitwise_logprobs runs on the CPU backend only (docs/bitwise.md)");
    GRPO_CHECK_MSG(ctx.deterministic(), "ModelRunner: bitwise_logprobs needs a deterministic Context (batch-invariant "
                                        "kernels), or rollouts would not equal the trainer's forward");
    GRPO_CHECK_MSG(geo.kv_dtype == w.dtype, "ModelRunner: bitwise_logprobs needs an unquantised KV cache");
    d_lse_ = tensor_zeros(dev, DType::f32, {N});
  }

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
  if (h_pinned_) {
    ctx_.synchronize();
    cudaFreeHost(h_pinned_);
  }
  if (inputs_sent_) cudaEventDestroy(static_cast<cudaEvent_t>(inputs_sent_));
#endif
}

// The step's inputs: the first n entries of the per-token rows (n >= the logit rows) and
// table_n entries of the block table. On CUDA through pinned memory in two copies (a pageable
// copy each is staged by the driver, and the trained model's uploads delay its forward).
void ModelRunner::upload_inputs(int n, int64_t table_n) {
  const int64_t R = int64_t(h_logit_rows_.size());
  GRPO_CHECK(R <= n && n <= max_T_ && table_n <= d_block_table_.numel());
#ifdef GRPO_HAVE_CUDA
  if (h_pinned_) {
    auto st = static_cast<cudaStream_t>(ctx_.stream());
    // The pinned buffer is rewritten below: the previous step's copies must have left it.
    GRPO_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(inputs_sent_)) == cudaSuccess);
    const size_t T = size_t(max_T_);
    std::copy_n(h_tokens_.begin(), n, h_pinned_);
    std::copy_n(h_positions_.begin(), n, h_pinned_ + T);
    std::copy_n(h_token_seq_.begin(), n, h_pinned_ + 2 * T);
    std::copy_n(h_slots_.begin(), n, h_pinned_ + 3 * T);
    std::copy_n(h_logit_rows_.begin(), R, h_pinned_ + 4 * T);
    std::copy_n(h_block_table_.begin(), table_n, h_pinned_ + kStepRows * T);
    if (n > 0)
      GRPO_CHECK(cudaMemcpy2DAsync(d_step_.data, T * sizeof(int32_t), h_pinned_, T * sizeof(int32_t),
                                   size_t(n) * sizeof(int32_t), kStepRows, cudaMemcpyHostToDevice, st) == cudaSuccess);
    if (table_n > 0)
      GRPO_CHECK(cudaMemcpyAsync(d_block_table_.data, h_pinned_ + kStepRows * T, size_t(table_n) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, st) == cudaSuccess);
    GRPO_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(inputs_sent_), st) == cudaSuccess);
    return;
  }
#endif
  upload(ctx_, d_tokens_, h_tokens_, n);
  upload(ctx_, d_positions_, h_positions_, n);
  upload(ctx_, d_token_seq_, h_token_seq_, n);
  upload(ctx_, d_slots_, h_slots_, n);
  upload(ctx_, d_block_table_, h_block_table_, table_n);
  upload(ctx_, d_logit_rows_, h_logit_rows_, R);
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
void ModelRunner::fill_inputs(const SchedulerOutput& step, int padded_T, bool allow_prefill_tiles) {
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
  const int S_pad = std::max(S, padded_T > T ? padded_T : S);
  upload_inputs(padded_T, int64_t(S_pad) * MB);

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

void ModelRunner::run_forward(const SchedulerOutput& step) {
  const int S = int(step.seqs.size()), T = step.n_tokens, R = step.n_sampled;
  bool decode = T == S && R == S;
  for (int s = 0; decode && s < S; ++s) decode = step.seqs[size_t(s)].seq->lora == opt_.lora;  // graphs: one adapter
  for (int s = 0; decode && s < S; ++s) decode = step.seqs[size_t(s)].start() < opt_.cuda_graph_max_context;
  if (graphs_ && decode) {
    int B = 0;
    for (int b : opt_.cuda_graph_batch_sizes)
      if (b >= S && graphs_->has(b)) { B = b; break; }
    if (B > 0) {
      fill_inputs(step, B, false);
      graphs_->launch(B);
      ++n_graph_replays_;
      return;
    }
  }
  fill_inputs(step, T, true);
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
    if (B > max_T_) break;
    fill_inputs(empty, B, false);  // all rows dummy: nothing is written to the cache; no tiles
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
                                   std::vector<SpecVerifyResult>& out) {
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
                   d_verify_.rng_key.slice0(0, N), d_verify_.rng_pos.slice0(0, N)};
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

void ModelRunner::sample(const std::vector<RowSampling>& rows, std::vector<SampledRow>& out, const Tensor* probs) {
  std::vector<const RowSampling*> order(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) order[r] = &rows[r];
  sample_on(d_logits_.slice0(0, int64_t(rows.size())), order, out, probs);
  if (opt_.bitwise_logprobs && !rows.empty()) trainer_logprobs(rows, out);
}

void ModelRunner::sample_on(const Tensor& logits, const std::vector<const RowSampling*>& rows,
                            std::vector<SampledRow>& out, const Tensor* probs, const SampleHooks* hooks) {
  const int64_t R = int64_t(rows.size());
  out.assign(size_t(R), SampledRow{});
  if (R == 0) return;
  GRPO_CHECK(R <= max_R_ && logits.ndim == 2 && logits.shape[0] == R);
  const Device dev = ctx_.device();
  int NB = 0, n_top = 0;
  bool any_raw = false, any_proc = false;
  int filters = 0;  // SamplingRows::filter_hint: which filters some row uses
  for (const RowSampling* r : rows) {
    NB = std::max(NB, int(r->banned.size()));
    n_top = std::max(n_top, r->n_top);
    if (r->n_top > 0) (r->top_processed ? any_proc : any_raw) = true;
    if (r->top_k > 0) filters |= kFilterTopK;
    if (r->top_p < 1.f) filters |= kFilterTopP;
    if (r->min_p > 0.f) filters |= kFilterMinP;
  }
  const size_t nR = static_cast<size_t>(R);
  std::vector<float> temp(nR), top_p(nR), min_p(nR);
  std::vector<int32_t> top_k(nR), banned(nR * static_cast<size_t>(NB), -1);
  std::vector<int64_t> key(nR), pos(nR);
  for (size_t r = 0; r < nR; ++r) {
    const RowSampling& rs = *rows[r];
    temp[r] = rs.temperature;
    top_p[r] = rs.top_p;
    min_p[r] = rs.min_p;
    top_k[r] = rs.top_k;
    key[r] = int64_t(rs.rng_key);
    pos[r] = int64_t(rs.rng_pos);
    std::copy(rs.banned.begin(), rs.banned.end(), banned.begin() + int64_t(r) * NB);
  }
  stage_->begin_upload(nR * (2 * 8 + 4 * 4) + banned.size() * 4 + 7 * 16 + (hooks ? hooks->upload_bytes : 0));
  SamplingRows v;
  v.filter_hint = filters;
  v.rng_key = stage_->put(key.data(), R, DType::i64, {R});
  v.rng_pos = stage_->put(pos.data(), R, DType::i64, {R});
  v.temperature = stage_->put(temp.data(), R, DType::f32, {R});
  v.top_p = stage_->put(top_p.data(), R, DType::f32, {R});
  v.min_p = stage_->put(min_p.data(), R, DType::f32, {R});
  v.top_k = stage_->put(top_k.data(), R, DType::i32, {R});
  if (NB > 0) v.banned = stage_->put(banned.data(), R * NB, DType::i32, {R, int64_t(NB)});
  if (hooks && hooks->stage) hooks->stage(*stage_);
  stage_->send();
  if (hooks && hooks->before) hooks->before();
  SamplingOutputs o;
  o.tokens = d_tok_out_.slice0(0, R);
  o.logprob_raw = d_lp_raw_.slice0(0, R);
  o.logprob_processed = d_lp_proc_.slice0(0, R);
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
  std::vector<int32_t> tok(nR), top_ids(nR * size_t(n_top));
  std::vector<float> lr(nR), lp(nR), top_lps(nR * size_t(n_top)), lp_after(nR);
  Tensor after;  // hooks->after's result (tokens are identical across passes, so it runs once)
  // Top-n lists under each distribution some row asked for.
  for (int pass = 0; pass < 2; ++pass) {
    const bool processed = pass == 1;
    if (pass == 1 && !any_proc) break;
    if (pass == 0 && !any_raw && any_proc) continue;
    sample_tokens(ctx_, o, logits, v, processed);
    const bool first = !after.defined();
    if (first && hooks && hooks->after) after = hooks->after(v.temperature);
    stage_->begin_download(nR * 4 * 4 + 2 * top_ids.size() * 4 + 6 * 16);
    stage_->fetch(tok.data(), o.tokens, nR * 4);
    stage_->fetch(lr.data(), o.logprob_raw, nR * 4);
    stage_->fetch(lp.data(), o.logprob_processed, nR * 4);
    if (n_top > 0) {
      stage_->fetch(top_ids.data(), o.top_ids, top_ids.size() * 4);
      stage_->fetch(top_lps.data(), o.top_logprobs, top_lps.size() * 4);
    }
    if (first && after.defined()) stage_->fetch(lp_after.data(), after, nR * 4);
    stage_->wait();
    for (size_t r = 0; r < nR; ++r) {
      SampledRow& s = out[r];
      s.token = tok[r];
      s.logprob_raw = lr[r];
      s.logprob_processed = lp[r];
      if (first && after.defined()) s.logprob_trained = lp_after[r];
      const RowSampling& rs = *rows[r];
      if (rs.n_top > 0 && rs.top_processed == processed) {
        s.top.clear();
        for (int j = 0; j < rs.n_top; ++j)
          s.top.emplace_back(top_ids[r * size_t(n_top) + size_t(j)], top_lps[r * size_t(n_top) + size_t(j)]);
      }
    }
  }
}

// The sampler's rows are permuted so that one window of a gathered buffer B holds every row's
// owner logits: B = [the other runner's rows of the rows it owns (Rp) | this runner's rows of
// its own rows (Rt) | this runner's rows of the other's rows (Rp)]. The sampler reads B[0, R);
// the trained logprob reads B[Rp, R + Rp), this runner's logits of every row, in two calls
// whose ids and temperatures line up with the sampler's order.
void ModelRunner::sample_rows_mixed(const std::vector<RowSampling>& rows, const std::vector<uint8_t>& own,
                                    const Tensor& other_logits, std::vector<SampledRow>& out) {
  const int64_t R = int64_t(rows.size());
  const int64_t V = w_.config.vocab_size;
  GRPO_CHECK(own.size() == rows.size() && R <= max_R_);
  GRPO_CHECK_MSG(other_logits.ndim == 2 && other_logits.shape[0] >= R && other_logits.shape[1] == V &&
                     other_logits.dtype == DType::f32 && other_logits.device == ctx_.device(),
                 "sample_rows_mixed: the other runner's logits must be (>= R, V) f32 on this device");
  out.clear();
  if (R == 0) return;
  if (!d_given_lp_.defined()) d_given_lp_ = tensor_zeros(ctx_.device(), DType::f32, {max_R_});
  std::vector<int32_t> theirs, order;  // order[j]: the row the sampler's row j is
  for (int64_t r = 0; r < R; ++r)
    if (!own[size_t(r)]) theirs.push_back(int32_t(r));
  const int64_t Rp = int64_t(theirs.size()), Rt = R - Rp;
  order = theirs;
  for (int64_t r = 0; r < R; ++r)
    if (own[size_t(r)]) order.push_back(int32_t(r));
  std::vector<const RowSampling*> ptrs(static_cast<size_t>(R));
  for (int64_t j = 0; j < R; ++j) ptrs[size_t(j)] = &rows[size_t(order[size_t(j)])];
  const Tensor lp_t = d_given_lp_.slice0(0, R);
  const Tensor tokens = d_tok_out_.slice0(0, R);
  SampleHooks hooks;
  if (Rp > 0 && (!d_mixed_.defined() || d_mixed_.shape[0] < R + Rp)) {
    ctx_.synchronize();  // the old buffer may still be read by queued kernels
    d_mixed_ = tensor_empty(ctx_.device(), DType::f32, {R + Rp, V});
  }
  const Tensor B = Rp > 0 ? d_mixed_.slice0(0, R + Rp) : Tensor();
  // All rows this runner's: no gather, the sampler and the logprob read the logits in place.
  const Tensor window = Rp > 0 ? B.slice0(0, R) : d_logits_.slice0(0, R);
  // Gather indices: the other's rows (Rp), then this runner's rows in B[Rp, R + Rp) order.
  std::vector<int32_t> idx_mine(order.begin() + Rp, order.end());
  idx_mine.insert(idx_mine.end(), theirs.begin(), theirs.end());
  Tensor d_theirs, d_mine;
  if (Rp > 0) {
    hooks.upload_bytes = size_t(Rp + R) * 4 + 2 * 16;
    hooks.stage = [&](TransferStage& st) {
      d_theirs = st.put(theirs.data(), Rp, DType::i32, {Rp});
      d_mine = st.put(idx_mine.data(), R, DType::i32, {R});
    };
    hooks.before = [&] {
      Tensor a = B.slice0(0, Rp), b = B.slice0(Rp, R + Rp);
      gather_rows_forward(ctx_, a, other_logits, d_theirs);
      gather_rows_forward(ctx_, b, d_logits_, d_mine);
    };
  }
  hooks.after = [&](const Tensor& temps) {
    if (Rp == 0) {
      Tensor dst = lp_t;
      logits_row_logprobs(ctx_, dst, window, tokens, temps);
      return lp_t;
    }
    if (Rt > 0) {
      Tensor dst = lp_t.slice0(Rp, R);
      logits_row_logprobs(ctx_, dst, B.slice0(Rp, R), tokens.slice0(Rp, R), temps.slice0(Rp, R));
    }
    Tensor dst = lp_t.slice0(0, Rp);
    logits_row_logprobs(ctx_, dst, B.slice0(R, R + Rp), tokens.slice0(0, Rp), temps.slice0(0, Rp));
    return lp_t;
  };
  std::vector<SampledRow> res;
  sample_on(window, ptrs, res, nullptr, &hooks);
  out.assign(size_t(R), SampledRow{});
  for (int64_t j = 0; j < R; ++j) {
    const size_t r = size_t(order[size_t(j)]);
    out[r] = std::move(res[size_t(j)]);
    out[r].by_trained = own[r] != 0;
  }
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
    Tensor lp = dst.slice0(r0, r1), lse = d_lse_.slice0(r0, r1);
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
  std::vector<float> lr, lp;
  download(ctx_, lr, d_lp_raw_.slice0(0, R), R);
  download(ctx_, lp, d_lp_proc_.slice0(0, R), R);
  for (int64_t r = 0; r < R; ++r) {
    out[size_t(r)].logprob_raw = lr[size_t(r)];
    out[size_t(r)].logprob_processed = lp[size_t(r)];
  }
}

void ModelRunner::row_logprobs(const std::vector<int32_t>& ids, const std::vector<float>& temps,
                               std::vector<float>& out) {
  const int64_t R = int64_t(ids.size());
  GRPO_CHECK(temps.size() == ids.size() && R <= max_R_);
  out.clear();
  if (R == 0) return;
  if (!d_given_lp_.defined()) d_given_lp_ = tensor_zeros(ctx_.device(), DType::f32, {max_R_});
  stage_->begin_upload(size_t(R) * 8 + 2 * 16);
  const Tensor d_ids = stage_->put(ids.data(), R, DType::i32, {R});
  const Tensor d_temps = stage_->put(temps.data(), R, DType::f32, {R});
  stage_->send();
  Tensor lp = d_given_lp_.slice0(0, R);
  logits_row_logprobs(ctx_, lp, d_logits_.slice0(0, R), d_ids, d_temps);
  out.resize(size_t(R));
  stage_->begin_download(size_t(R) * 4 + 16);
  stage_->fetch(out.data(), lp, size_t(R) * 4);
  stage_->wait();
}

}  // namespace grpo
