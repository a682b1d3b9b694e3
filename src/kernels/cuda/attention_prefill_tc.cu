// Tensor-core engine prefill over the paged KV cache (bf16 q/out, bf16 or FP8 E4M3 caches, head dim
// 64/128): attention_paged with a query tile list (PagedAttnMeta::prefill_tiles). The training
// forward's key walk (attention_tc_tile.cuh) over K/V rows gathered through the block table.
#include "kernels/cuda/attention_tc_tile.cuh"

namespace grpo::cuda {

namespace {

// Paged prefill: block = (one tile of the list, one query head). The tile's n_rows query
// rows are consecutive tokens of one sequence at positions pos0 .., so its keys are
// positions 0 .. pos0 + n_rows - 1 of that sequence, walked in 64-key tiles from
// position 0 (tile boundaries do not depend on the query tiling, so a row's output is the
// same whichever tile holds it). Key position p lives in cache row
// (block_table[seq][p / block_size]·block_size + p % block_size)·Hkv + kh; positions past
// the sequence's last query are zero-filled and masked. Query rows past n_rows are
// zero-filled padding: they see no key, and warps made only of them skip every tile.
// F8 (FP8 E4M3 caches): the K/V tiles come as bytes through two staging stages and are
// widened (exactly) into one bf16 K and V tile before the products (fwd_walk's staged walk),
// so the mma operands, and with them the outputs, are bit for bit those of the bf16 kernel on
// a bf16 cache holding the same values.
template <int D, bool F8>
__global__ void __launch_bounds__(kThreads) attn_paged_prefill_tc_kernel(PagedTcArgs a) {
  constexpr int LD = D + 8, TS = kTile * LD;
  extern __shared__ __align__(16) unsigned char smraw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smraw);
  __nv_bfloat16* Ks = Qs + TS;                 // 2 buffers (F8: 1)
  __nv_bfloat16* Vs = Ks + (F8 ? 1 : 2) * TS;  // 2 buffers (F8: 1)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int h = blockIdx.y, kh = h / a.G;
  const int32_t* tile = a.tiles + int64_t(blockIdx.x) * 4;
  const int64_t row0 = tile[0];
  const int n_rows = tile[1], pos0 = tile[3];
  const int32_t* bt = a.block_table + int64_t(tile[2]) * a.max_blocks;
  const int n_keys = pos0 + n_rows;
  const int n_tiles = (n_keys - 1) / kTile + 1;
  const int bs = a.block_size, Hq = a.Hq, Hkv = a.Hkv;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);

  // This thread's rows r (tile rows warp·16 + g, + 8) see keys 0 .. pos0 + r.
  int64_t lo[2], hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + i * 8;
    lo[i] = r < n_rows ? 0 : INT64_MAX;
    hi[i] = int64_t(pos0) + r;
  }
  const int64_t warp_last = warp * 16 < n_rows ? int64_t(pos0) + min(warp * 16 + 15, n_rows - 1) : -1;

  load_rows<D, 1>({Qs}, {q}, [=](int r) { return r < n_rows ? ((row0 + r) * Hq + h) * D : int64_t(-1); });
  FwdState<D> st;
  if constexpr (F8) {
    constexpr int TS8 = kTile * D;  // one staging tile (bytes)
    uint8_t* K8 = reinterpret_cast<uint8_t*>(Vs + TS);  // 2 stages
    uint8_t* V8 = K8 + 2 * TS8;                         // 2 stages
    const auto* kc = static_cast<const uint8_t*>(a.k_cache);
    const auto* vc = static_cast<const uint8_t*>(a.v_cache);
    const auto kv = [=](int j) {
      const int b = j & 1;
      const int k0 = j * kTile;
      load_rows_hoisted<D, 2, uint8_t, D>({K8 + b * TS8, V8 + b * TS8}, {kc, vc}, [=](int r) {
        const int p = k0 + r;
        if (p >= n_keys) return int64_t(-1);
        const int64_t slot = int64_t(bt[p / bs]) * bs + p % bs;
        return (slot * Hkv + kh) * D;
      });
    };
    const auto widen = [=](int j) {
      const int b = j & 1;
      widen_e4m3_kv<D, kTile, kThreads>(Ks, Vs, K8 + b * TS8, V8 + b * TS8, int(threadIdx.x));
    };
    kv(0);
    cp_commit();
    fwd_walk<D>(st, Qs, Ks, Vs, n_tiles, 0, warp_last, lo, hi, a.scale * kLog2e, kv, widen);
  } else {
    const auto* kc = static_cast<const __nv_bfloat16*>(a.k_cache);
    const auto* vc = static_cast<const __nv_bfloat16*>(a.v_cache);
    const auto kv = [=](int j) {
      const int b = j & 1;
      const int k0 = j * kTile;
      load_rows_hoisted<D, 2>({Ks + b * TS, Vs + b * TS}, {kc, vc}, [=](int r) {
        const int p = k0 + r;
        if (p >= n_keys) return int64_t(-1);
        const int64_t slot = int64_t(bt[p / bs]) * bs + p % bs;
        return (slot * Hkv + kh) * D;
      });
    };
    kv(0);
    cp_commit();
    fwd_walk<D>(st, Qs, Ks, Vs, n_tiles, 0, warp_last, lo, hi, a.scale * kLog2e, kv);
  }

  auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + i * 8;
    fwd_finish<D>(st, i, r < n_rows ? out + ((row0 + r) * Hq + h) * D : nullptr, t4);
  }
}

template <int D, bool F8>
void launch_paged_prefill(Context& ctx, const PagedTcArgs& a) {
  const size_t sm = F8 ? paged_fp8_smem<D>() : fwd_smem<D>();
  set_smem(attn_paged_prefill_tc_kernel<D, F8>, sm);
  attn_paged_prefill_tc_kernel<D, F8><<<dim3(unsigned(a.n_tiles), unsigned(a.Hq)), kThreads, sm, stream_of(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_paged_prefill_tc(Context& ctx, const PagedTcArgs& a, DType dt) {
  if (!attention_tc_supported(dt, a.D) || a.n_tiles == 0) return false;
  GRPO_CHECK_MSG(a.n_tiles > 0 && a.tiles && a.block_table, "attention_paged_prefill_tc: tile list and block table needed");
  GRPO_CHECK_MSG(a.Hkv > 0 && a.Hq % a.Hkv == 0 && a.G == a.Hq / a.Hkv, "attention_paged_prefill_tc: Hq must be G·Hkv");
  GRPO_CHECK_MSG(a.block_size > 0 && a.max_blocks > 0, "attention_paged_prefill_tc: block_size and max_blocks must be > 0");
  GRPO_CHECK_MSG(a.Hq <= 65535, "attention_paged_prefill_tc: more than 65535 query heads (grid y)");
  if (a.kv_fp8) {
    if (a.D == 64) launch_paged_prefill<64, true>(ctx, a);
    else launch_paged_prefill<128, true>(ctx, a);
  } else {
    if (a.D == 64) launch_paged_prefill<64, false>(ctx, a);
    else launch_paged_prefill<128, false>(ctx, a);
  }
  return true;
}

}  // namespace grpo::cuda
