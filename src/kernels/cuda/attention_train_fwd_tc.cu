// Tensor-core attention forward of packed training batches (bf16, head dim 64/128): one block per
// (64 query tokens, query head), the key walk of attention_tc_tile.cuh; writes out and lse.
// The definitions and the tiling are described in attention_tc_tile.cuh.
#include "kernels/cuda/attention_tc_tile.cuh"

namespace grpo::cuda {

namespace {

template <int D>
__global__ void __launch_bounds__(kThreads) attn_fwd_tc_kernel(TcArgs a) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smraw);
  __nv_bfloat16* Ks = Qs + TS;      // 2 buffers
  __nv_bfloat16* Vs = Ks + 2 * TS;  // 2 buffers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, kh = h / a.G;
  const QueryWalk wk = query_walk(a, warp, g);
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  const auto kv = packed_kv<D>(a, Ks, Vs, wk.ks, kh);

  load_tile<D>(Qs, q, wk.r0, a.T, a.Hq, h);
  kv(0);
  cp_commit();

  FwdState<D> st;
  fwd_walk<D>(st, Qs, Ks, Vs, wk.n_tiles, wk.ks, wk.warp_last, wk.rstart, wk.row, a.scale * kLog2e, kv);

  auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t row = wk.row[i];
    __nv_bfloat16* o = row < a.T ? out + (row * a.Hq + h) * D : nullptr;
    const float L = fwd_finish<D>(st, i, o, t4);
    if (o && t4 == 0 && a.lse) a.lse[int64_t(h) * a.T + row] = st.m[i] * kLn2 + logf(L);
  }
}

template <int D>
void launch_fwd(Context& ctx, const TcArgs& a) {
  const size_t sm = fwd_smem<D>();
  set_smem(attn_fwd_tc_kernel<D>, sm);
  attn_fwd_tc_kernel<D><<<dim3(unsigned(ceil_div(a.T, kTile)), unsigned(a.Hq)), kThreads, sm, stream_of(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_tc_supported(DType dt, int D) { return dt == DType::bf16 && (D == 64 || D == 128); }

bool attention_forward_tc(Context& ctx, const TcArgs& a, DType dt) {
  if (!attention_tc_supported(dt, a.D) || a.T == 0) return false;
  if (a.D == 64) launch_fwd<64>(ctx, a);
  else launch_fwd<128>(ctx, a);
  return true;
}

}  // namespace grpo::cuda
