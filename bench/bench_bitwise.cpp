// Where the time of train.on_policy = "bitwise" goes on CUDA (issue 22, docs/bitwise.md): the
// trainer-side kernels of the mode against the default mode's, on Qwen2.5-0.5B shapes at the
// GRPO benchmark's micro-batch (21 sequences of 640 tokens = 13,440 rows, 10,752 completion
// rows), timed with CUDA events (median of 7 repeats of 5 calls):
//   gemm     linear_forward of qkv / o / gate_up / down: cuBLASLt (default context) against the
//            batch-invariant wgmma kernel (linear_wgmma_rows) at weight tiles nt = 64, 128, 256
//   attn     attention forward: the packed tensor-core kernel (default) against the mode's
//            cache write + per-token paged kernel (the engine's)
//   logprob  token_logprobs_forward (LM head + log-sum-exp): cuBLASLt tiles against wgmma tiles
//   decode   decode-sized products at 64..128 rows: linear_forward (the wgmma decode kernel up to
//            64 rows, cuBLASLt above) against linear_wgmma_rows with one or two warpgroups
// Prints a table; no JSON (a diagnostic for the step figure of tools/device/bitwise_bench.sh).
#include <cstdio>

#ifndef GRPO_HAVE_CUDA
int main() {
  std::printf("bench_bitwise: this build has no CUDA backend\n");
  return 0;
}
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/context.h"
#include "kernels/attention.h"
#include "kernels/cuda/linear_wgmma.h"
#include "kernels/linear.h"
#include "kernels/logprob.h"

using namespace grpo;

namespace {

using bench::randt;

// Median ms per call (bench_util.h's timer, 5 calls a repeat).
double time_ms(Context& ctx, const std::function<void()>& fn, int iters = 5, int repeats = 7) {
  return bench::time_ms(ctx, [&](int) { fn(); }, iters, repeats);
}

Tensor ints(const std::vector<int32_t>& v) {
  Tensor h = tensor_borrow(const_cast<int32_t*>(v.data()), DType::i32, Device::cpu, {int64_t(v.size())});
  Tensor t = tensor_empty(Device::cuda, DType::i32, {int64_t(v.size())});
  tensor_copy(t, h);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  auto want = [&](const char* what) {  // sections named on the command line (none: all)
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == what) return true;
    return false;
  };
  if (!cuda_available()) {
    std::printf("bench_bitwise: no CUDA device\n");
    return 0;
  }
  ContextOptions od;
  od.device = Device::cuda;
  Context def(od);
  ContextOptions ob = od;
  ob.deterministic = ob.batch_invariant = true;
  Context bi(ob);
  const int64_t S = 21, L = 640, M = S * L, C = 896, Hq = 14, Hk = 2, D = 64, V = 151936;
  std::printf("bench_bitwise: Qwen2.5-0.5B shapes, %lld rows (%lld sequences of %lld)\n", (long long)M, (long long)S,
              (long long)L);
  struct G { const char* name; int64_t N, K; bool acc; bool qwen25; };
  double tot_def = 0, tot_bi = 0;
  // Qwen2.5-0.5B's four (summed below), then Qwen3-0.6B's and Llama-3.2-1B's at the same rows.
  if (want("gemm"))
  for (const G& g : {G{"qkv", 1152, 896, false, true}, G{"o", 896, 896, true, true}, G{"gate_up", 9728, 896, false, true},
                     G{"down", 896, 4864, true, true}, G{"q3.qkv", 4096, 1024, false, false},
                     G{"q3.o", 1024, 2048, true, false}, G{"q3.gu", 6144, 1024, false, false},
                     G{"q3.down", 1024, 3072, true, false}, G{"l1.qkv", 3072, 2048, false, false},
                     G{"l1.o", 2048, 2048, true, false}, G{"l1.gu", 16384, 2048, false, false},
                     G{"l1.down", 2048, 8192, true, false}}) {
    Tensor x = randt(DType::bf16, {M, g.K}, 1), w = randt(DType::bf16, {g.N, g.K}, 2, 0.03f);
    Tensor out = randt(DType::bf16, {M, g.N}, 3);
    const double td = time_ms(def, [&] { linear_forward(def, out, x, w, nullptr, g.acc); });
    const double tb = time_ms(bi, [&] { linear_forward(bi, out, x, w, nullptr, g.acc); });
    const double fl = 2.0 * double(M) * double(g.N) * double(g.K);
    std::printf("gemm %-8s cuBLASLt %.3f ms (%.0f TFLOP/s)  bitwise %.3f ms (%.0f)  ratio %.2fx\n", g.name, td,
                fl / td / 1e9, tb, fl / tb / 1e9, tb / td);
    // Warpgroups, tile width and ring depth (none changes a bit; 0 = the default): one
    // warpgroup per block over 64-row slices, or two sharing each weight chunk (persistent grid;
    // with split > 1 the serial split, nt <= 128).
    const cuda::WgmmaGemmConfig h = cuda::wgmma_gemm_config(g.N, g.K);
    std::printf("    sweep:");
    struct P { int wg, nt, stages; };
    for (const P& p : {P{1, 64, 3}, P{1, 128, 3}, P{1, 128, 6}, P{2, 64, 0}, P{2, 128, 0}, P{2, 128, 4}, P{2, 256, 0},
                       P{2, 256, 3}}) {
      if (p.wg == 2 && p.nt == 256 && h.split > 1) continue;
      const double t = time_ms(
          bi, [&] { cuda::linear_wgmma_rows(bi, out, x, w, nullptr, g.acc, {p.nt, h.split, p.stages, p.wg}); });
      std::printf(" wg%d/nt%d/s%d %.3f", p.wg, p.nt, p.stages, t);
    }
    std::printf("\n");
    if (g.qwen25) {
      tot_def += td * 24;
      tot_bi += tb * 24;
    }
  }
  if (want("decode")) {
    // Decode-sized products around the 64-row bound of the decode kernels: linear_forward (wgmma
    // up to 64 rows, cuBLASLt above) against linear_wgmma_rows with one or two warpgroups.
    for (const G& g : {G{"qkv", 1152, 896, false, true}, G{"o", 896, 896, true, true}, G{"gate_up", 9728, 896, false, true},
                       G{"down", 896, 4864, true, true}, G{"q3.gu", 6144, 1024, false, false}}) {
      const cuda::WgmmaGemmConfig h = cuda::wgmma_gemm_config(g.N, g.K);
      for (int64_t m : {64, 72, 80, 96, 128}) {
        Tensor x = randt(DType::bf16, {m, g.K}, 1), w = randt(DType::bf16, {g.N, g.K}, 2, 0.03f);
        Tensor out = randt(DType::bf16, {m, g.N}, 3);
        const double td = time_ms(def, [&] { linear_forward(def, out, x, w, nullptr, g.acc); });
        std::printf("decode %-8s M %3lld  linear_forward %.4f ms", g.name, (long long)m, td);
        struct P { int wg, nt, split, stages; };
        for (const P& p : {P{1, 0, 0, 0}, P{2, 0, 0, 0}, P{2, 128, h.split, 0}, P{2, 64, h.split, 0}, P{2, 64, 1, 0}}) {
          cuda::WgmmaGemmConfig c{p.nt, p.split, p.stages, p.wg};
          const double t = time_ms(def, [&] { cuda::linear_wgmma_rows(def, out, x, w, nullptr, g.acc, c); });
          std::printf("  wg%d/nt%d/sp%d %.4f", p.wg, p.nt, p.split, t);
        }
        std::printf("  (h: nt %d split %d stages %d)\n", h.nt, h.split, h.stages);
      }
    }
  }
  if (want("attn")) {  // attention over S sequences of L tokens
    Tensor q = randt(DType::bf16, {M, Hq, D}, 4), k = randt(DType::bf16, {M, Hk, D}, 5), v = randt(DType::bf16, {M, Hk, D}, 6);
    Tensor out = tensor_empty(Device::cuda, DType::bf16, {M, Hq, D});
    Tensor lse = tensor_empty(Device::cuda, DType::f32, {Hq, M});
    AttnVarlen vl;
    for (int64_t s = 0; s <= S; ++s) vl.cu_seqlens.push_back(int32_t(s * L));
    vl.cu_seqlens_dev = ints(vl.cu_seqlens);
    vl.max_seqlen = int(L);
    const int bs = 16, nbs = int((L + bs - 1) / bs);
    std::vector<int32_t> seq(static_cast<size_t>(M)), pos(static_cast<size_t>(M)), slot(static_cast<size_t>(M)),
        table(static_cast<size_t>(S * nbs));
    for (int64_t t = 0; t < M; ++t) {
      seq[size_t(t)] = int32_t(t / L);
      pos[size_t(t)] = int32_t(t % L);
      slot[size_t(t)] = int32_t(t);
    }
    for (int64_t i = 0; i < S * nbs; ++i) table[size_t(i)] = int32_t(i);
    PagedAttnMeta pm;
    pm.token_seq = ints(seq);
    pm.token_pos = ints(pos);
    pm.slot_mapping = ints(slot);
    pm.block_table = ints(table).view({S, int64_t(nbs)});
    pm.block_size = bs;
    pm.max_context = int(L);
    Tensor kc = tensor_empty(Device::cuda, DType::bf16, {S * nbs, bs, Hk, D});
    Tensor vc = tensor_empty(Device::cuda, DType::bf16, {S * nbs, bs, Hk, D});
    const double td = time_ms(def, [&] { attention_forward(def, out, &lse, q, k, v, vl); });
    const double tw = time_ms(bi, [&] { kv_cache_write(bi, kc, vc, k, v, pm); });
    const double tp = time_ms(bi, [&] { attention_paged(bi, out, q, kc, vc, pm, &lse); });
    // lse against the packed kernel's (the backward reads it; not part of the logprobs).
    std::vector<float> lb(size_t(Hq * M)), ld(size_t(Hq * M));
    attention_paged(bi, out, q, kc, vc, pm, &lse);
    bi.synchronize();
    cudaMemcpy(lb.data(), lse.data, lb.size() * sizeof(float), cudaMemcpyDeviceToHost);
    attention_forward(def, out, &lse, q, k, v, vl);
    def.synchronize();
    cudaMemcpy(ld.data(), lse.data, ld.size() * sizeof(float), cudaMemcpyDeviceToHost);
    double dmax = 0;
    for (size_t i = 0; i < lb.size(); ++i) dmax = std::max(dmax, double(std::fabs(lb[i] - ld[i])));
    std::printf("attn packed (default) %.3f ms  bitwise: cache write %.3f + paged with lse %.3f = %.3f ms (%.2fx); "
                "lse max |paged - packed| %.2e\n",
                td, tw, tp, tw + tp, (tw + tp) / td, dmax);
    tot_def += td * 24;
    tot_bi += (tw + tp) * 24;
  }
  if (want("logprob")) {  // LM head + logprob over the completion rows
    const int64_t R = S * 512;
    Tensor h = randt(DType::bf16, {R, C}, 7), w = randt(DType::bf16, {V, C}, 8, 0.03f);
    std::vector<int32_t> tg(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) tg[size_t(i)] = int32_t((i * 7919) % V);
    Tensor t = ints(tg);
    Tensor lp = tensor_empty(Device::cuda, DType::f32, {R}), lse = tensor_empty(Device::cuda, DType::f32, {R});
    const double td = time_ms(def, [&] { token_logprobs_forward(def, lp, lse, nullptr, h, w, t, 1.f); }, 2, 5);
    const double tb = time_ms(bi, [&] { token_logprobs_forward(bi, lp, lse, nullptr, h, w, t, 1.f); }, 2, 5);
    std::printf("logprob forward %lld rows: cuBLASLt %.3f ms  bitwise %.3f ms (%.2fx)\n", (long long)R, td, tb, tb / td);
    tot_def += td;
    tot_bi += tb;
  }
  std::printf("one micro-batch forward (24 layers' GEMMs + attention, the LM head): default %.1f ms, bitwise %.1f ms "
              "(+%.1f ms)\n",
              tot_def, tot_bi, tot_bi - tot_def);
  return 0;
}
#endif
