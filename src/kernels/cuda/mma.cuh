// Private to src/kernels/cuda/*.cu: the warp-level tensor-core and async-copy primitives
// (sm_80+ PTX; the build targets sm_90a) shared by the tensor-core kernels:
//   ldmatrix x4 (plain and transposed), mma.sync m16n8k16 bf16 → f32 (A row-major in 4
//   registers, B as rows of k in 2), 16-byte cp.async with zero fill (optionally with an L2
//   eviction policy), commit/wait groups. The asm statements that touch shared memory
//   clobber memory so ordinary shared accesses stay on the right side of them. Also the
//   widening of FP8 (E4M3) K/V rows to the bf16 operand layout (KV cache dtype fp8).
#pragma once
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/fp8.cuh"

namespace grpo::cuda::tc {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8×8 b16 matrices from shared memory; lane l supplies the row address of matrix l/8.
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a·b for one m16n8k16 tile (a: 4 regs, b: 2 regs of packed bf16 pairs), f32 accumulate.
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Eight E4M3 bytes (byte i = element i) → the eight bf16 of a 16-byte chunk of a bf16 row,
// exactly (every E4M3 value is a bf16 value): lets an FP8 tile be widened into the padded
// bf16 shared layout that the ldmatrix/mma code reads.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 w) {
  return make_uint4(e4m3x2_to_bf16x2(uint16_t(w.x & 0xffffu)), e4m3x2_to_bf16x2(uint16_t(w.x >> 16)),
                    e4m3x2_to_bf16x2(uint16_t(w.y & 0xffffu)), e4m3x2_to_bf16x2(uint16_t(w.y >> 16)));
}

// Rows 0..R-1 of an FP8 K tile and V tile (E4M3, D bytes per row, unpadded) → the same rows
// of two padded bf16 tiles (row stride D + 8 elements), by NT threads of which this is thread t.
// A thread takes 8-byte pieces of one column (the pieces of 16 (8) consecutive threads cover
// 128 contiguous bytes of source (destination): conflict-free), and loads all of its pieces
// before the first store.
template <int D, int R, int NT>
__device__ __forceinline__ void widen_e4m3_kv(__nv_bfloat16* Kd, __nv_bfloat16* Vd, const uint8_t* K8,
                                              const uint8_t* V8, int t) {
  constexpr int PPR = D / 8;  // 8-byte pieces per row
  constexpr int kPer = R * PPR / NT;
  constexpr int RS = NT / PPR;  // rows between a thread's pieces
  static_assert(R * PPR % NT == 0 && NT % PPR == 0, "widen_e4m3_kv: every thread keeps one piece column");
  const int c = t % PPR, r0 = t / PPR;
  uint2 wk[kPer], wv[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    wk[i] = *reinterpret_cast<const uint2*>(K8 + (r0 + i * RS) * D + c * 8);
    wv[i] = *reinterpret_cast<const uint2*>(V8 + (r0 + i * RS) * D + c * 8);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    *reinterpret_cast<uint4*>(Kd + (r0 + i * RS) * (D + 8) + c * 8) = e4m3x8_to_bf16x8(wk[i]);
    *reinterpret_cast<uint4*>(Vd + (r0 + i * RS) * (D + 8) + c * 8) = e4m3x8_to_bf16x8(wv[i]);
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// 16-byte global → shared copy (L2 only); !valid writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n)
               : "memory");
}
// 16-byte copy carrying an L2 eviction policy (createpolicy), e.g. l2_evict_first_policy().
__device__ __forceinline__ void cp_async16_policy(void* smem, const void* gmem, bool valid, uint64_t policy) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_u32(smem)),
               "l"(gmem), "r"(n), "l"(policy)
               : "memory");
}
// An L2 policy that marks lines for early eviction: for data read exactly once (weights
// streamed by a GEMV-like kernel), so that data reused by many blocks stays in L2.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One step of the online softmax (exp2 domain) of a warp's two mma rows g and g + 8: s holds
// the tile's scaled scores in mma C layout (masked entries -inf; NJ n8 tiles), m and l the
// rows' running max and sum, acc their NA n8 tiles of output. On return s holds
// p = 2^(s − m_new) (0 where masked, also when a row has seen no key yet), l and acc are
// rescaled to m_new and l includes this tile's p. Shared by the tensor-core attention kernels.
template <int NJ, int NA>
__device__ __forceinline__ void online_softmax_step(float (&s)[NJ][4], float (&m)[2], float (&l)[2],
                                                    float (&acc)[NA][4]) {
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
  float corr[2], base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));  // the row's 4 lanes
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    base[i] = mx[i] == -INFINITY ? 0.f : mx[i];
    corr[i] = exp2f(m[i] - base[i]);  // m = -inf: 0
    m[i] = mx[i];
    l[i] *= corr[i];
  }
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[j][e] - base[e >> 1]);
      s[j][e] = p;
      l[e >> 1] += p;
    }
#pragma unroll
  for (int j = 0; j < NA; ++j) {
    acc[j][0] *= corr[0];
    acc[j][1] *= corr[0];
    acc[j][2] *= corr[1];
    acc[j][3] *= corr[1];
  }
}

}  // namespace grpo::cuda::tc
