// CUDA causal GQA attention forward: one split-context kernel serves both the paged
// engine path (attention_paged) and the packed training path (attention_forward), so
// that a token's output — and the logprob built on it — is computed by the same
// instructions in the same order in rollout and in training: bit-identical for equal
// q/k/v, independent of batch composition.
//
// Kernel layout (attn_split_kernel):
//   grid (tokens, Hkv·n_hgroups, n_splits), 128 threads. A block takes one query token,
//   up to kMaxG query heads sharing one kv head (GQA: K/V are read once for all of them),
//   and one partition of kPart consecutive key positions. Each key is handled by TPK
//   lanes (D/8 for bf16, D/4 for f32, rounded up to a power of two; head dims 16, 32, 48,
//   64, 96, 128) holding 16 bytes of it each; every lane group keeps its own online
//   softmax state (m, l, acc) per head; states merge across lanes by a fixed xor
//   butterfly, across warps in warp order, across partitions in partition order.
//   The last partition also takes any keys past n_splits·kPart, so an underestimated
//   max_context stays correct.
// kv_cache_write copies token rows into their slots (slot < 0: padding, skipped).
#include "kernels/attention.h"
#include "kernels/cuda/cuda_check.cuh"

#include <algorithm>
#include <cmath>

namespace grpo::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxG = 8;     // most query heads per block (MG: 2 or 8 by the GQA group size)
constexpr int kPart = 256;   // key positions per partition (64 measured slower for B=64 decode)
constexpr int kUnroll = 4;   // keys in flight per lane group (~233 regs bf16, no spills)

struct AttnArgs {
  const void* q;          // (T,Hq,D)
  void* out;              // (T,Hq,D)
  float* lse;             // (Hq,T) or null
  float* part_acc;        // (chunk,Hq,n_splits,D) when n_splits > 1
  float* part_ml;         // (chunk,Hq,n_splits,2)
  const void* k;          // paged: (n_blocks,bs,Hkv,D); packed: (T,Hkv,D)
  const void* v;
  const int32_t* token_seq;    // paged
  const int32_t* token_pos;    // paged
  const int32_t* block_table;  // paged (S,max_blocks)
  const int32_t* cu_seqlens;   // packed (S+1)
  int n_seqs, max_blocks, block_size;
  int64_t T;              // total query tokens (lse row stride)
  int64_t tok0;           // first token of this launch
  int Hq, Hkv, G, n_hgroups, n_splits;
  float scale;
};

__device__ __forceinline__ float rescale(float m, float mn) { return m == -INFINITY ? 0.f : expf(m - mn); }

constexpr int pow2ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

template <class T, int D, int MG, bool PAGED>
__global__ void __launch_bounds__(kThreads) attn_split_kernel(AttnArgs a) {
  constexpr int VEC = Vec16<T>::n;
  constexpr int NV = D / VEC;            // 16-byte vectors per key row
  constexpr int TPK = pow2ceil(NV);      // lanes per key (lanes dpart >= NV hold zeros)
  static_assert(D % VEC == 0, "head dim must be a multiple of the vector width");
  constexpr int KPW = 32 / TPK;    // keys per warp
  constexpr int KPB = kWarps * KPW;
  static_assert(TPK >= 1 && TPK <= 32 && (TPK & (TPK - 1)) == 0, "unsupported head dim");
  __shared__ float sm_m[kWarps][MG], sm_l[kWarps][MG];
  __shared__ float sm_acc[kWarps][MG][D];

  const int64_t tok = a.tok0 + blockIdx.x;
  const int kh = blockIdx.y / a.n_hgroups;
  const int qh0 = kh * a.G + (blockIdx.y % a.n_hgroups) * MG;
  const int ng = min(MG, kh * a.G + a.G - qh0);
  const int split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int dpart = lane % TPK;

  int64_t ctx_len, row0 = 0;
  const int32_t* table = nullptr;
  if constexpr (PAGED) {
    ctx_len = int64_t(a.token_pos[tok]) + 1;
    table = a.block_table + int64_t(a.token_seq[tok]) * a.max_blocks;
  } else {
    int lo = 0, hi = a.n_seqs - 1;  // last s with cu[s] <= tok
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (a.cu_seqlens[mid] <= tok) lo = mid; else hi = mid - 1;
    }
    row0 = a.cu_seqlens[lo];
    ctx_len = tok - row0 + 1;
  }
  const int64_t kbeg = int64_t(split) * kPart;
  const int64_t kend = split == a.n_splits - 1 ? ctx_len : min(ctx_len, kbeg + kPart);
  const int64_t prow = (int64_t(blockIdx.x) * a.Hq + qh0) * a.n_splits + split;  // partial row of head qh0

  if (kbeg >= kend) {  // empty partition (only when n_splits > 1): neutral partial
    for (int e = threadIdx.x; e < ng * D; e += kThreads)
      a.part_acc[(prow + int64_t(e / D) * a.n_splits) * D + e % D] = 0.f;
    if (threadIdx.x < ng) {
      a.part_ml[(prow + int64_t(threadIdx.x) * a.n_splits) * 2] = -INFINITY;
      a.part_ml[(prow + int64_t(threadIdx.x) * a.n_splits) * 2 + 1] = 0.f;
    }
    return;
  }

  const T* q = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
  float qv[MG][VEC];
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    if (g < ng && dpart < NV) {
      load_vec(q + ((tok * a.Hq) + qh0 + g) * D + dpart * VEC, qv[g]);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) qv[g][i] = 0.f;
    }
  }
  float m[MG], l[MG], acc[MG][VEC];
#pragma unroll
  for (int g = 0; g < MG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
  }

  const int kslot = warp * KPW + lane / TPK;
  for (int64_t base = kbeg; base < kend; base += KPB * kUnroll) {
    float kf[kUnroll][VEC], vf[kUnroll][VEC];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * KPB + kslot;
      valid[u] = p < kend;
      if (valid[u] && dpart < NV) {
        int64_t row;
        if constexpr (PAGED) {
          const int pi = int(p);  // positions < 2^31: 32-bit division
          row = (int64_t(table[pi / a.block_size]) * a.block_size + pi % a.block_size) * a.Hkv + kh;
        } else {
          row = (row0 + p) * a.Hkv + kh;
        }
        load_vec(kc + row * D + dpart * VEC, kf[u]);
        load_vec(vc + row * D + dpart * VEC, vf[u]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) kf[u][i] = vf[u][i] = 0.f;
      }
    }
    // Per head: the kUnroll scores of this batch, one rescale of (l, acc) per batch.
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= ng) break;
      float sc[kUnroll];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += qv[g][i] * kf[u][i];
#pragma unroll
        for (int o = TPK / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        sc[u] = valid[u] ? s * a.scale : -INFINITY;
        mx = fmaxf(mx, sc[u]);
      }
      if (mx != -INFINITY) {  // some key seen by this lane group
        const float corr = rescale(m[g], mx);
        float lsum = l[g] * corr;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] *= corr;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const float pe = valid[u] ? expf(sc[u] - mx) : 0.f;
          lsum += pe;
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc[g][i] += pe * vf[u][i];
        }
        l[g] = lsum;
        m[g] = mx;
      }
    }
  }

  // Merge the KPW lane groups of the warp (xor butterfly over the key-slot bits).
#pragma unroll
  for (int o = TPK; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= ng) break;
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float lo_ = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mn = fmaxf(m[g], mo);
      const float sa = rescale(m[g], mn), sb = rescale(mo, mn);
      l[g] = l[g] * sa + lo_ * sb;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        acc[g][i] = acc[g][i] * sa + ao * sb;
      }
      m[g] = mn;
    }
  }
  if (lane < TPK) {
#pragma unroll
    for (int g = 0; g < MG; ++g) {
      if (g >= ng) break;
      if (dpart < NV) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) sm_acc[warp][g][dpart * VEC + i] = acc[g][i];
      }
      if (lane == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  T* out = static_cast<T*>(a.out);
  for (int e = threadIdx.x; e < ng * D; e += kThreads) {
    const int g = e / D, d = e % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, A = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float sc = rescale(sm_m[w][g], M);
      L += sm_l[w][g] * sc;
      A += sm_acc[w][g][d] * sc;
    }
    if (a.n_splits == 1) {
      out[(tok * a.Hq + qh0 + g) * D + d] = from_f32<T>(A / L);
      if (d == 0 && a.lse) a.lse[int64_t(qh0 + g) * a.T + tok] = M + logf(L);
    } else {
      const int64_t r = prow + int64_t(g) * a.n_splits;
      a.part_acc[r * D + d] = A;
      if (d == 0) {
        a.part_ml[r * 2] = M;
        a.part_ml[r * 2 + 1] = L;
      }
    }
  }
}

// Merges the partitions of each (token, head) in partition order: grid (chunk, Hq), D threads.
template <class T>
__global__ void attn_combine_kernel(T* __restrict__ out, float* __restrict__ lse, const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml, int64_t T_, int64_t tok0, int Hq, int n_splits,
                                    int D) {
  const int64_t tl = blockIdx.x, h = blockIdx.y;
  const int64_t r0 = (tl * Hq + h) * n_splits;
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, part_ml[(r0 + s) * 2]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float L = 0.f, A = 0.f;
    for (int s = 0; s < n_splits; ++s) {
      const float sc = rescale(part_ml[(r0 + s) * 2], M);
      L += part_ml[(r0 + s) * 2 + 1] * sc;
      A += part_acc[(r0 + s) * D + d] * sc;
    }
    out[((tok0 + tl) * Hq + h) * D + d] = from_f32<T>(A / L);
    if (d == 0 && lse) lse[h * T_ + tok0 + tl] = M + logf(L);
  }
}

template <class T, int D, int MG>
void launch_split_g(Context& ctx, const AttnArgs& a, dim3 grid, bool paged) {
  if (paged) attn_split_kernel<T, D, MG, true><<<grid, kThreads, 0, stream_of(ctx)>>>(a);
  else attn_split_kernel<T, D, MG, false><<<grid, kThreads, 0, stream_of(ctx)>>>(a);
}

// Heads per block by the GQA group size: fewer register-resident heads when G is small.
// The per-head arithmetic is the same for every MG, so results do not depend on it.
inline int heads_per_block(int G) { return G <= 2 ? 2 : kMaxG; }  // two variants: compile time

template <class T, int D>
void launch_split(Context& ctx, AttnArgs a, int64_t n_tok, bool paged) {
  dim3 grid(unsigned(n_tok), unsigned(a.Hkv * a.n_hgroups), unsigned(a.n_splits));
  switch (heads_per_block(a.G)) {
    case 2: launch_split_g<T, D, 2>(ctx, a, grid, paged); break;
    default: launch_split_g<T, D, kMaxG>(ctx, a, grid, paged); break;
  }
  CUDA_CHECK_LAUNCH();
  if (a.n_splits > 1) {
    attn_combine_kernel<T><<<dim3(unsigned(n_tok), unsigned(a.Hq)), D, 0, stream_of(ctx)>>>(
        static_cast<T*>(a.out), a.lse, a.part_acc, a.part_ml, a.T, a.tok0, a.Hq, a.n_splits, D);
    CUDA_CHECK_LAUNCH();
  }
}

// Runs the split kernel over all tokens, in chunks whose partials fit the scratch.
void run_split(Context& ctx, AttnArgs a, DType dt, int D, int64_t max_ctx, bool paged) {
  if (a.T == 0) return;
  GRPO_CHECK_MSG(a.Hkv > 0 && a.Hq % a.Hkv == 0, "attention: Hq must be a multiple of Hkv");
  GRPO_CHECK_MSG(D == 8 || D == 16 || D == 32 || D == 48 || D == 64 || D == 96 || D == 128,
                 "attention (cuda): head dim must be 8, 16, 32, 48, 64, 96 or 128");
  a.G = a.Hq / a.Hkv;
  a.n_hgroups = int(ceil_div(a.G, heads_per_block(a.G)));
  if (max_ctx < 1) max_ctx = 1;
  a.n_splits = int(ceil_div(max_ctx, kPart));
  GRPO_CHECK_MSG(a.n_splits <= 65535 && int64_t(a.Hkv) * a.n_hgroups <= 65535, "attention: grid too large");
  int64_t chunk = a.T;
  if (a.n_splits > 1) {
    ScratchAlloc sa(ctx);
    const int64_t per_tok = int64_t(a.Hq) * a.n_splits * (D + 2) * int64_t(sizeof(float)) + 512;
    chunk = int64_t(sa.left()) / per_tok;
    GRPO_CHECK_MSG(chunk >= 1, "attention: workspace too small for one token's partials");
    if (chunk > a.T) chunk = a.T;
    a.part_acc = sa.alloc<float>(chunk * a.Hq * a.n_splits * D, "attention partial acc");
    a.part_ml = sa.alloc<float>(chunk * a.Hq * a.n_splits * 2, "attention partial m/l");
  }
  if (chunk > 0x7fffffff) chunk = 0x7fffffff;
  for (int64_t t0 = 0; t0 < a.T; t0 += chunk) {
    a.tok0 = t0;
    const int64_t n = a.T - t0 < chunk ? a.T - t0 : chunk;
    GRPO_DISPATCH_FLOAT(dt, T, {
      switch (D) {
        case 8: launch_split<T, 8>(ctx, a, n, paged); break;  // llama2.c stories260K
        case 16: launch_split<T, 16>(ctx, a, n, paged); break;
        case 32: launch_split<T, 32>(ctx, a, n, paged); break;
        case 48: launch_split<T, 48>(ctx, a, n, paged); break;
        case 64: launch_split<T, 64>(ctx, a, n, paged); break;
        case 96: launch_split<T, 96>(ctx, a, n, paged); break;
        default: launch_split<T, 128>(ctx, a, n, paged); break;
      }
    });
  }
}

__global__ void kv_write_kernel(uint4* __restrict__ kc, uint4* __restrict__ vc, const uint4* __restrict__ k,
                                const uint4* __restrict__ v, const int32_t* __restrict__ slots, int64_t row16) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row16; i += blockDim.x) {
    kc[slot * row16 + i] = k[t * row16 + i];
    vc[slot * row16 + i] = v[t * row16 + i];
  }
}

template <class T>
__global__ void kv_write_scalar_kernel(T* __restrict__ kc, T* __restrict__ vc, const T* __restrict__ k,
                                       const T* __restrict__ v, const int32_t* __restrict__ slots, int64_t row) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[slot * row + i] = k[t * row + i];
    vc[slot * row + i] = v[t * row + i];
  }
}

}  // namespace

void attention_forward(Context& ctx, Tensor& out, Tensor* lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttnVarlen& meta) {
  GRPO_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3, "attention_forward: q, k, v must be 3-D");
  const int64_t T_ = q.shape[0];
  GRPO_CHECK_MSG(out.numel() == q.numel() && out.dtype == q.dtype, "attention_forward: out must match q");
  GRPO_CHECK_MSG(k.dtype == q.dtype && v.dtype == q.dtype && k.shape[0] == T_ && v.numel() == k.numel() &&
                     k.shape[2] == q.shape[2],
                 "attention_forward: k, v must be (T,Hkv,D) with q's dtype");
  GRPO_CHECK_MSG(meta.cu_seqlens.size() >= 2 && meta.cu_seqlens.back() == T_ && meta.cu_seqlens_dev.defined() &&
                     meta.cu_seqlens_dev.numel() == int64_t(meta.cu_seqlens.size()),
                 "attention_forward: cu_seqlens (host and device) must span the T tokens");
  if (lse) GRPO_CHECK_MSG(lse->dtype == DType::f32 && lse->numel() == q.shape[1] * T_, "attention_forward: lse (Hq,T) f32");
  GRPO_CHECK_MSG(aligned16(q.data) && aligned16(k.data) && aligned16(v.data), "attention_forward: 16-byte alignment");
  int64_t max_len = 0;
  for (size_t i = 0; i + 1 < meta.cu_seqlens.size(); ++i)
    max_len = std::max<int64_t>(max_len, meta.cu_seqlens[i + 1] - meta.cu_seqlens[i]);
  AttnArgs a{};
  a.q = q.data;
  a.out = out.data;
  a.lse = lse ? lse->ptr<float>() : nullptr;
  a.k = k.data;
  a.v = v.data;
  a.cu_seqlens = meta.cu_seqlens_dev.ptr<int32_t>();
  a.n_seqs = int(meta.cu_seqlens.size() - 1);
  a.T = T_;
  a.Hq = int(q.shape[1]);
  a.Hkv = int(k.shape[1]);
  a.scale = 1.f / std::sqrt(float(q.shape[2]));
  run_split(ctx, a, q.dtype, int(q.shape[2]), max_len, false);
}

void kv_cache_write(Context& ctx, Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const PagedAttnMeta& meta) {
  const int64_t T_ = k.shape[0], row = k.numel() / (T_ ? T_ : 1);
  GRPO_CHECK_MSG(k_cache.dtype == k.dtype && v_cache.dtype == k.dtype && v.dtype == k.dtype && v.numel() == k.numel(),
                 "kv_cache_write: k, v and the caches must share a dtype and shape");
  GRPO_CHECK_MSG(k_cache.ndim == 4 && k_cache.shape[2] * k_cache.shape[3] == row, "kv_cache_write: cache row mismatch");
  GRPO_CHECK_MSG(meta.slot_mapping.dtype == DType::i32 && meta.slot_mapping.numel() == T_, "kv_cache_write: slot_mapping (T) i32");
  if (T_ == 0) return;
  const size_t row_bytes = size_t(row) * dtype_size(k.dtype);
  const bool vec = row_bytes % 16 == 0 && aligned16(k.data) && aligned16(v.data) && aligned16(k_cache.data) &&
                   aligned16(v_cache.data);
  if (vec) {
    const int64_t row16 = int64_t(row_bytes / 16);
    const int threads = row16 >= 128 ? 128 : 64;
    kv_write_kernel<<<unsigned(T_), threads, 0, stream_of(ctx)>>>(k_cache.ptr<uint4>(), v_cache.ptr<uint4>(),
                                                                   k.ptr<uint4>(), v.ptr<uint4>(),
                                                                   meta.slot_mapping.ptr<int32_t>(), row16);
  } else {
    GRPO_DISPATCH_FLOAT(k.dtype, T, {
      kv_write_scalar_kernel<T><<<unsigned(T_), 128, 0, stream_of(ctx)>>>(
          k_cache.ptr<T>(), v_cache.ptr<T>(), k.ptr<T>(), v.ptr<T>(), meta.slot_mapping.ptr<int32_t>(), row);
    });
  }
  CUDA_CHECK_LAUNCH();
}

void attention_paged(Context& ctx, Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const PagedAttnMeta& meta) {
  GRPO_CHECK_MSG(q.ndim == 3 && k_cache.ndim == 4 && v_cache.ndim == 4, "attention_paged: q (T,Hq,D), caches 4-D");
  GRPO_CHECK_MSG(out.numel() == q.numel() && out.dtype == q.dtype, "attention_paged: out must match q");
  GRPO_CHECK_MSG(k_cache.dtype == q.dtype && v_cache.dtype == q.dtype && k_cache.shape[3] == q.shape[2],
                 "attention_paged: caches must be (n_blocks,bs,Hkv,D) with q's dtype");
  GRPO_CHECK_MSG(meta.block_table.ndim == 2 && meta.block_table.dtype == DType::i32, "attention_paged: block_table (S,max_blocks) i32");
  GRPO_CHECK_MSG(meta.token_seq.numel() == q.shape[0] && meta.token_pos.numel() == q.shape[0],
                 "attention_paged: token_seq/token_pos must be (T)");
  GRPO_CHECK_MSG(aligned16(q.data) && aligned16(k_cache.data) && aligned16(v_cache.data), "attention_paged: alignment");
  AttnArgs a{};
  a.q = q.data;
  a.out = out.data;
  a.k = k_cache.data;
  a.v = v_cache.data;
  a.token_seq = meta.token_seq.ptr<int32_t>();
  a.token_pos = meta.token_pos.ptr<int32_t>();
  a.block_table = meta.block_table.ptr<int32_t>();
  a.max_blocks = int(meta.block_table.shape[1]);
  a.block_size = int(k_cache.shape[1]);
  a.T = q.shape[0];
  a.Hq = int(q.shape[1]);
  a.Hkv = int(k_cache.shape[2]);
  a.scale = 1.f / std::sqrt(float(q.shape[2]));
  run_split(ctx, a, q.dtype, int(q.shape[2]), meta.max_context, true);
}

}  // namespace grpo::cuda
