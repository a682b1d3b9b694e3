// GPU micro-benchmarks of the hot CUDA kernels on Qwen2.5-0.5B shapes
// (C 896, Hq 14, Hkv 2, D 64, F 4864, V 151936, 24 layers), timed with CUDA events:
//   copy        cudaMemcpyAsync D2D of 1 GiB: the bandwidth ceiling of this run
//   paged attn  decode step: B sequences × one query token against their KV pages
//               (rotating over 24 layers' caches so the L2 does not hold them); GB/s of
//               K/V/q/out bytes against the copy ceiling; also the Qwen3-0.6B head
//               layout (Hq 16, Hkv 8, D 128), and a 2048-token prefill in TFLOP/s
//   gemm        linear_forward bf16: decode-shaped (M = B, weight-read bound, rotating
//               over 24 weight copies) in GB/s and a training-shaped one in TFLOP/s
//   small-M     decode GEMMs of Qwen2.5-0.5B and Qwen3-0.6B at M = 64 and 16: cuBLASLt vs
//               the small-M kernel (linear_small_m.cu) in GB/s of weight bytes, plus a sweep
//               of its tile configurations (printed after the table, for the heuristic)
//   gate+swiglu the MLP's gate/up projection + SwiGLU at M = 64 for both presets: unfused
//               (linear_forward + swiglu_forward) against the fused wgmma kernel
//               (linear_swiglu_forward), in GB/s of weight bytes
//   logprob     fused LM head + logsumexp forward (2·N·C·V flop) and backward (6·N·C·V)
//   sampling    sample_tokens on (B, V) f32 logits with and without top-p/top-k
// Prints a table and writes the JSON of docs/DESIGN §6 (path: argv[1], default
// bench/results/bench_kernels.json). Median over 7 repeats of 20 iterations each.
#include <cstdio>
#include <cstring>

#ifndef GRPO_HAVE_CUDA
int main() {
  std::printf("bench_kernels: this build has no CUDA backend; rebuild with nvcc (-DGRPO_CUDA=ON)\n");
  return 0;
}
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cuda/linear_small_m.h"
#include "kernels/cuda/linear_wgmma.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"
#include "kernels/sampling.h"

using namespace grpo;

namespace {

using bench::randt;
using bench::time_ms;

template <class I>
Tensor dev_ints(const std::vector<I>& v, DType dt, const std::vector<int64_t>& shape) {
  Tensor t = tensor_empty(Device::cuda, dt, shape);
  Tensor h = tensor_borrow(const_cast<I*>(v.data()), dt, Device::cpu, shape);
  tensor_copy(t, h);
  return t;
}

// Device copy of t (cheap way to get many distinct buffers with random contents).
Tensor clone(const Tensor& t) {
  Tensor c = tensor_empty(Device::cuda, t.dtype, std::vector<int64_t>(t.shape, t.shape + t.ndim));
  BENCH_CUDA(cudaMemcpy(c.data, t.data, t.nbytes(), cudaMemcpyDeviceToDevice));
  return c;
}

struct Row {
  std::string name, unit;
  double ms, value, ceiling;
};

}  // namespace

int main(int argc, char** argv) {
  if (!cuda_available()) {
    std::printf("bench_kernels: no CUDA device visible\n");
    return 0;
  }
  const std::string json_path = argc > 1 ? argv[1] : "bench/results/bench_kernels.json";
  ContextOptions o;
  o.device = Device::cuda;
  Context ctx(o);
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  auto st = static_cast<cudaStream_t>(ctx.stream());
  const int64_t C = 896, Hq = 14, Hkv = 2, D = 64, F = 4864, V = 151936, L = 24;
  std::vector<Row> rows;

  // Copy ceiling.
  const size_t copy_bytes = size_t(1) << 30;
  Tensor cs = tensor_empty(Device::cuda, DType::u8, {int64_t(copy_bytes)}), cd = tensor_empty(Device::cuda, DType::u8, {int64_t(copy_bytes)});
  BENCH_CUDA(cudaMemsetAsync(cs.data, 1, copy_bytes, st));
  const double copy_ms = time_ms(ctx, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(cd.data, cs.data, copy_bytes, cudaMemcpyDeviceToDevice, st));
  }, 5, 5);
  const double copy_gbs = 2.0 * double(copy_bytes) / (copy_ms * 1e6);
  rows.push_back({"copy D2D 1 GiB (read+write)", "GB/s", copy_ms, copy_gbs, copy_gbs});

  // Decode-shaped paged attention (Qwen2.5-0.5B heads; Qwen3-0.6B: Hq 16, Hkv 8, D 128;
  // "graph": max_context 2048 as in a CUDA-graph replay, most partitions empty).
  struct PagedShape {
    int64_t ctx_len, hq, hkv, hd, max_context;
    const char* tag;
  };
  for (const PagedShape& ps : {PagedShape{640, Hq, Hkv, D, 640, ""}, PagedShape{2048, Hq, Hkv, D, 2048, ""},
                               PagedShape{640, Hq, Hkv, D, 2048, " graph"},
                               PagedShape{640, 16, 8, 128, 640, " Qwen3 Hq16 Hkv8 D128"}}) {
    const int64_t ctx_len = ps.ctx_len;
    const int64_t B = 64, bs = 16, nbps = (ctx_len + bs - 1) / bs, n_blocks = B * nbps;
    std::vector<Tensor> kc, vc;
    const Tensor k0 = randt(DType::bf16, {n_blocks, bs, ps.hkv, ps.hd}, 10);
    const Tensor v0 = randt(DType::bf16, {n_blocks, bs, ps.hkv, ps.hd}, 11);
    for (int64_t l = 0; l < L; ++l) {
      kc.push_back(clone(k0));
      vc.push_back(clone(v0));
    }
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks)), seq(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    for (int64_t b = 0; b < B; ++b) {
      seq[static_cast<size_t>(b)] = int32_t(b);
      pos[static_cast<size_t>(b)] = int32_t(ctx_len - 1);
    }
    PagedAttnMeta m;
    m.block_size = int(bs);
    m.max_context = int(ps.max_context);
    m.token_seq = dev_ints(seq, DType::i32, {B});
    m.token_pos = dev_ints(pos, DType::i32, {B});
    m.block_table = dev_ints(perm, DType::i32, {B, nbps});
    Tensor q = randt(DType::bf16, {B, ps.hq, ps.hd}, 7), out = tensor_empty(Device::cuda, DType::bf16, {B, ps.hq, ps.hd});
    const double ms = time_ms(ctx, [&](int i) { cuda::attention_paged(ctx, out, q, kc[size_t(i % L)], vc[size_t(i % L)], m); });
    const double bytes = double(B) * double(ctx_len) * ps.hkv * ps.hd * 2 * 2 + 2.0 * B * ps.hq * ps.hd * 2;
    rows.push_back({"paged attn decode B=64 ctx=" + std::to_string(ctx_len) + ps.tag, "GB/s", ms, bytes / (ms * 1e6),
                    copy_gbs});
  }
  // Prefill-shaped paged attention: one sequence of 2048 tokens (the causal triangle).
  {
    const int64_t T = 2048, bs = 16, nb = T / bs;
    const Tensor kc = randt(DType::bf16, {nb, bs, Hkv, D}, 20), vc = randt(DType::bf16, {nb, bs, Hkv, D}, 21);
    std::vector<int32_t> table(static_cast<size_t>(nb)), seq(static_cast<size_t>(T), 0), pos(static_cast<size_t>(T));
    std::iota(table.begin(), table.end(), 0);
    std::iota(pos.begin(), pos.end(), 0);
    PagedAttnMeta m;
    m.block_size = int(bs);
    m.max_context = int(T);
    m.token_seq = dev_ints(seq, DType::i32, {T});
    m.token_pos = dev_ints(pos, DType::i32, {T});
    m.block_table = dev_ints(table, DType::i32, {1, nb});
    Tensor q = randt(DType::bf16, {T, Hq, D}, 22), out = tensor_empty(Device::cuda, DType::bf16, {T, Hq, D});
    const double ms = time_ms(ctx, [&](int) { cuda::attention_paged(ctx, out, q, kc, vc, m); }, 10, 5);
    const double flop = 4.0 * double(T) * double(T + 1) / 2 * Hq * D;  // QK^T and PV over the causal triangle
    rows.push_back({"paged attn prefill T=2048 (one sequence), per-token kernel", "TFLOP/s", ms, flop / (ms * 1e9), 0});
    // The same with the engine's query tiles (64 rows each): the tensor-core prefill kernel.
    std::vector<int32_t> tiles;
    for (int32_t r = 0; r < int32_t(T); r += 64) tiles.insert(tiles.end(), {r, 64, 0, r});
    m.n_prefill_tiles = int(tiles.size() / 4);
    m.prefill_tiles = dev_ints(tiles, DType::i32, {int64_t(m.n_prefill_tiles), 4});
    const double ms_tc = time_ms(ctx, [&](int) { cuda::attention_paged(ctx, out, q, kc, vc, m); }, 10, 5);
    rows.push_back({"paged attn prefill T=2048 (one sequence), query tiles", "TFLOP/s", ms_tc, flop / (ms_tc * 1e9), 0});
  }

  // GEMMs: decode-shaped (weight-read bound) and training-shaped (FLOP bound).
  {
    const int64_t M = 64;
    std::vector<Tensor> ws;
    const Tensor w0 = randt(DType::bf16, {2 * F, C}, 200, 0.05f);
    for (int64_t l = 0; l < L; ++l) ws.push_back(clone(w0));
    Tensor x = randt(DType::bf16, {M, C}, 8), y = tensor_empty(Device::cuda, DType::bf16, {M, 2 * F});
    const double ms = time_ms(ctx, [&](int i) { cuda::linear_forward(ctx, y, x, ws[size_t(i % L)], nullptr, false); });
    const double bytes = double(2 * F) * C * 2 + double(M) * C * 2 + double(M) * 2 * F * 2;
    rows.push_back({"gemm gate_up M=64 N=9728 K=896 (decode)", "GB/s", ms, bytes / (ms * 1e6), copy_gbs});
  }
  {
    const int64_t M = 8192;
    Tensor w = randt(DType::bf16, {2 * F, C}, 9, 0.05f), x = randt(DType::bf16, {M, C}, 10);
    Tensor y = tensor_empty(Device::cuda, DType::bf16, {M, 2 * F});
    const double ms = time_ms(ctx, [&](int) { cuda::linear_forward(ctx, y, x, w, nullptr, false); });
    const double tf = 2.0 * M * 2 * F * C / (ms * 1e9);
    rows.push_back({"gemm gate_up M=8192 N=9728 K=896 (train)", "TFLOP/s", ms, tf, 0});
  }

  // Decode GEMMs: cuBLASLt (small-M dispatch off) against the small-M kernel with the
  // heuristic's configuration, and every (nt, split) of the kernel. Weights rotate over
  // enough copies (>= 2× the L2) that every call reads them from HBM. GB/s of weight bytes.
  std::vector<std::string> sweep_lines;
  {
    struct GemmShape {
      const char* name;
      int64_t N, K;
      bool bias, accumulate;
    };
    const GemmShape shapes[] = {
        {"Qwen2.5 qkv", 1152, 896, true, false},       {"Qwen2.5 o", 896, 896, false, true},
        {"Qwen2.5 gate_up", 9728, 896, false, false},  {"Qwen2.5 down", 896, 4864, false, true},
        {"Qwen2.5 lm_head", 151936, 896, false, false}, {"Qwen3 qkv", 4096, 1024, false, false},
        {"Qwen3 o", 1024, 2048, false, true},          {"Qwen3 gate_up", 6144, 1024, false, false},
        {"Qwen3 down", 1024, 3072, false, true}};
    const bool was_enabled = cuda::small_m_gemm_enabled();
    for (const GemmShape& gs : shapes) {
      const double wbytes = double(gs.N) * double(gs.K) * 2;
      const int64_t copies = std::min<int64_t>(64, std::max<int64_t>(1, int64_t(2.0 * prop.l2CacheSize / wbytes) + 1));
      std::vector<Tensor> ws;
      const Tensor w0 = randt(DType::bf16, {gs.N, gs.K}, 300, 0.05f);
      ws.push_back(w0);
      for (int64_t i = 1; i < copies; ++i) ws.push_back(clone(w0));
      const Tensor bias = randt(DType::bf16, {gs.N}, 301);
      const cuda::SmallMConfig h = cuda::small_m_config(gs.N, gs.K);
      for (int64_t M : {int64_t(64), int64_t(16)}) {
        Tensor x = randt(DType::bf16, {M, gs.K}, 302), y = randt(DType::bf16, {M, gs.N}, 303);
        const Tensor* b = gs.bias ? &bias : nullptr;
        const std::string tag = std::string("gemm ") + gs.name + " M=" + std::to_string(M) + " N=" +
                                std::to_string(gs.N) + " K=" + std::to_string(gs.K);
        // cuBLASLt: both decode kernels off in linear_forward.
        const bool was_wgmma = cuda::wgmma_gemm_enabled();
        cuda::set_small_m_gemm_enabled(false);
        cuda::set_wgmma_gemm_enabled(false);
        const double lt_ms = time_ms(ctx, [&](int i) { cuda::linear_forward(ctx, y, x, ws[size_t(i) % ws.size()], b, gs.accumulate); });
        cuda::set_small_m_gemm_enabled(was_enabled);
        cuda::set_wgmma_gemm_enabled(was_wgmma);
        auto small = [&](cuda::SmallMConfig c) {
          return time_ms(ctx, [&](int i) {
            if (!cuda::linear_small_m(ctx, y, x, ws[size_t(i) % ws.size()], b, gs.accumulate, c)) {
              std::fprintf(stderr, "linear_small_m declined %s\n", tag.c_str());
              std::exit(1);
            }
          });
        };
        const double sm_ms = small({});
        const int64_t ctas = (gs.N + h.nt - 1) / h.nt * h.split;
        rows.push_back({tag + " cuBLASLt", "GB/s", lt_ms, wbytes / (lt_ms * 1e6), copy_gbs});
        rows.push_back({tag + " small-M nt=" + std::to_string(h.nt) + " split=" + std::to_string(h.split) + " (" +
                            std::to_string(ctas) + " CTAs)",
                        "GB/s", sm_ms, wbytes / (sm_ms * 1e6), copy_gbs});
        char line[256];
        std::snprintf(line, sizeof line, "%-44s cuBLASLt %7.2f us | heuristic nt=%d split=%d %7.2f us |", tag.c_str(),
                      lt_ms * 1e3, h.nt, h.split, sm_ms * 1e3);
        std::string l = line;
        for (int nt : {64, 128})
          for (int split : {1, 2, 4, 8}) {
            const double ms = small({nt, split});
            std::snprintf(line, sizeof line, " %d/%d %.2f", nt, split, ms * 1e3);
            l += line;
          }
        // The Hopper wgmma/TMA kernel (linear_wgmma.cu): its heuristic's configuration on this line
        // and in the table, every nt/split (default ring depth) on a line of its own; -1 = declined.
        auto wgmma = [&](cuda::WgmmaGemmConfig c) {
          if (!cuda::linear_wgmma(ctx, y, x, ws[0], b, gs.accumulate, c)) return -1e-3;
          return time_ms(ctx, [&](int i) { cuda::linear_wgmma(ctx, y, x, ws[size_t(i) % ws.size()], b, gs.accumulate, c); });
        };
        const cuda::WgmmaGemmConfig wh = cuda::wgmma_gemm_config(gs.N, gs.K);
        const double wg_ms = wgmma({});
        std::snprintf(line, sizeof line, " | wgmma %d/%d/%d %.2f us", wh.nt, wh.split, wh.stages, wg_ms * 1e3);
        l += line;
        sweep_lines.push_back(l);
        if (wg_ms > 0) {
          rows.push_back({tag + " wgmma nt=" + std::to_string(wh.nt) + " split=" + std::to_string(wh.split) +
                              " stages=" + std::to_string(wh.stages),
                          "GB/s", wg_ms, wbytes / (wg_ms * 1e6), copy_gbs});
          std::string lw = "  wgmma nt/split:";
          for (int nt : {64, 128, 256})
            for (int split : {1, 2, 4, 8}) {
              if (split > (gs.K + 63) / 64) continue;
              std::snprintf(line, sizeof line, " %d/%d %.2f", nt, split, wgmma({nt, split}) * 1e3);
              lw += line;
            }
          sweep_lines.push_back(lw);
        }
      }
    }
    cuda::set_small_m_gemm_enabled(was_enabled);
  }

  // Gate/up projection + SwiGLU at M = 64: the two ops against the fused kernel (the decode
  // step's path), weights rotating over enough copies that every call reads them from HBM.
  {
    struct MlpShape {
      const char* name;
      int64_t C, F;
    };
    const bool was_on = cuda::fused_gate_swiglu_enabled();
    for (const MlpShape& ms : {MlpShape{"Qwen2.5", 896, 4864}, MlpShape{"Qwen3", 1024, 3072}}) {
      const int64_t M = 64;
      const double wbytes = double(2 * ms.F) * double(ms.C) * 2;
      const int64_t copies = std::min<int64_t>(64, std::max<int64_t>(1, int64_t(2.0 * prop.l2CacheSize / wbytes) + 1));
      std::vector<Tensor> ws;
      ws.push_back(randt(DType::bf16, {2 * ms.F, ms.C}, 400, 0.05f));
      for (int64_t i = 1; i < copies; ++i) ws.push_back(clone(ws[0]));
      Tensor x = randt(DType::bf16, {M, ms.C}, 401);
      Tensor gu = tensor_empty(Device::cuda, DType::bf16, {M, 2 * ms.F}), act = tensor_empty(Device::cuda, DType::bf16, {M, ms.F});
      const std::string tag = std::string("gate_up+swiglu ") + ms.name + " M=64 C=" + std::to_string(ms.C) +
                              " F=" + std::to_string(ms.F);
      const double un_ms = time_ms(ctx, [&](int i) {
        cuda::linear_forward(ctx, gu, x, ws[size_t(i) % ws.size()], nullptr, false);
        cuda::swiglu_forward(ctx, act, gu);
      });
      cuda::set_fused_gate_swiglu_enabled(true);
      const double fu_ms = time_ms(ctx, [&](int i) { linear_swiglu_forward(ctx, act, gu, x, ws[size_t(i) % ws.size()]); });
      cuda::set_fused_gate_swiglu_enabled(was_on);
      const cuda::WgmmaGemmConfig g = cuda::wgmma_gated_config(ms.F, ms.C);
      rows.push_back({tag + " unfused", "GB/s", un_ms, wbytes / (un_ms * 1e6), copy_gbs});
      rows.push_back({tag + " fused nt=" + std::to_string(g.nt) + " split=" + std::to_string(g.split) +
                          " stages=" + std::to_string(g.stages),
                      "GB/s", fu_ms, wbytes / (fu_ms * 1e6), copy_gbs});
    }
  }

  // Fused logprob forward/backward.
  {
    const int64_t N = 4096;
    Tensor h = randt(DType::bf16, {N, C}, 11), w = randt(DType::bf16, {V, C}, 12, 0.05f);
    std::vector<int32_t> tg(static_cast<size_t>(N));
    std::mt19937 g(13);
    for (auto& t : tg) t = int32_t(g() % uint32_t(V));
    Tensor tgt = dev_ints(tg, DType::i32, {N});
    Tensor lp = tensor_empty(Device::cuda, DType::f32, {N}), lse = tensor_empty(Device::cuda, DType::f32, {N});
    Tensor ent = tensor_empty(Device::cuda, DType::f32, {N}), dl = randt(DType::f32, {N}, 14);
    Tensor dh = tensor_empty(Device::cuda, DType::bf16, {N, C}), dw = tensor_zeros(Device::cuda, DType::f32, {V, C});
    const double fms = time_ms(ctx, [&](int) { cuda::token_logprobs_forward(ctx, lp, lse, &ent, h, w, tgt, 1.f); }, 5, 5);
    rows.push_back({"logprob fwd N=4096 V=151936", "TFLOP/s", fms, 2.0 * N * C * V / (fms * 1e9), 0});
    const double bms = time_ms(ctx, [&](int) { cuda::token_logprobs_backward(ctx, dh, &dw, dl, h, w, tgt, lse, 1.f); }, 3, 5);
    rows.push_back({"logprob bwd N=4096 V=151936 (dh+dw)", "TFLOP/s", bms, 6.0 * N * C * V / (bms * 1e9), 0});
  }

  // Sampling.
  for (int filt = 0; filt < 4; ++filt) {  // none; top-p 0.9 + top-k 50; top-p 0.95; the same on peaked logits
    const int64_t R = 64;
    Tensor z = randt(DType::f32, {R, V}, 15, filt == 3 ? 12.f : 3.f);
    SamplingRows sr;
    sr.filter_hint = filt == 0 ? 0 : filt == 1 ? kFilterTopK | kFilterTopP : kFilterTopP;  // as the engine passes it
    sr.temperature = tensor_from_f32(Device::cuda, DType::f32, std::vector<float>(R, 1.f), {R});
    sr.top_p = tensor_from_f32(Device::cuda, DType::f32, std::vector<float>(R, filt == 0 ? 1.f : filt == 1 ? 0.9f : 0.95f), {R});
    sr.min_p = tensor_from_f32(Device::cuda, DType::f32, std::vector<float>(R, 0.f), {R});
    sr.top_k = dev_ints(std::vector<int32_t>(R, filt == 1 ? 50 : 0), DType::i32, {R});
    sr.rng_key = dev_ints(std::vector<int64_t>(R, 42), DType::i64, {R});
    sr.rng_pos = dev_ints(std::vector<int64_t>(R, 1), DType::i64, {R});
    SamplingOutputs so;
    so.tokens = tensor_empty(Device::cuda, DType::i32, {R});
    so.logprob_raw = tensor_empty(Device::cuda, DType::f32, {R});
    so.logprob_processed = tensor_empty(Device::cuda, DType::f32, {R});
    const double ms = time_ms(ctx, [&](int) { cuda::sample_tokens(ctx, so, z, sr, false); }, 10, 5);
    const double bytes = double(R) * V * 4;
    rows.push_back({std::string("sample_tokens R=64 V=151936 ") + (filt == 0 ? "no filter" : filt == 1 ? "top_p=0.9 top_k=50" : filt == 2 ? "top_p=0.95" : "top_p=0.95 peaked (x4 logits)"),
                    "GB/s (one pass)", ms, bytes / (ms * 1e6), copy_gbs});
  }

  std::printf("device: %s (%d SMs, L2 %d MB)\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::printf("%-76s %10s %12s %-16s %8s\n", "kernel", "ms", "value", "unit", "of ceil");
  for (const Row& r : rows)
    std::printf("%-76s %10.4f %12.1f %-16s %8s\n", r.name.c_str(), r.ms, r.value, r.unit.c_str(),
                r.ceiling > 0 ? (std::to_string(int(100.0 * r.value / r.ceiling + 0.5)) + "%").c_str() : "-");
  std::printf("\nsmall-M GEMM sweep (us per call; nt/split of linear_small_m; results differ in bits only across splits):\n");
  for (const std::string& l : sweep_lines) std::printf("%s\n", l.c_str());

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  if (FILE* f = std::fopen(json_path.c_str(), "w")) {
    std::fprintf(f, "{\"bench\": \"bench_kernels\", \"date\": \"%s\", \"device\": \"%s\", \"command\": \"%s\",\n", date,
                 prop.name, argv[0]);
    std::fprintf(f, " \"config\": {\"model\": \"Qwen2.5-0.5B shapes\", \"C\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"D\": %lld, \"V\": %lld},\n",
                 (long long)C, (long long)Hq, (long long)Hkv, (long long)D, (long long)V);
    std::fprintf(f, " \"metrics\": {");
    for (size_t i = 0; i < rows.size(); ++i)
      std::fprintf(f, "%s\n  \"%s\": {\"ms\": %.5f, \"value\": %.3f, \"unit\": \"%s\"}", i ? "," : "", rows[i].name.c_str(),
                   rows[i].ms, rows[i].value, rows[i].unit.c_str());
    std::fprintf(f, "},\n \"peer\": {\"name\": \"cudaMemcpy D2D\", \"metrics\": {\"copy_gbs\": %.1f}}}\n", copy_gbs);
    std::fclose(f);
    std::printf("wrote %s\n", json_path.c_str());
  } else {
    std::printf("could not write %s (run from the repository root)\n", json_path.c_str());
  }
  return 0;
}
#endif
