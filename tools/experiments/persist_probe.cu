// Probe: what does a kernel boundary cost in a graph-replayed decode step, against a grid
// barrier inside one persistent kernel?  A "step" is 24 layers of the Qwen2.5-0.5B decode
// phases at 64 sequences, modelled by their bytes only: each phase streams its weight slice
// (or KV bytes for attention) into shared memory, reads its input activations (L2-resident),
// and writes its output activations.  Three ways to run the same phases:
//   (a) one kernel per phase in a CUDA graph with programmatic dependent launch
//       (weights requested before griddepcontrol.wait, as the engine's GEMMs do),
//   (b) the same without PDL,
//   (c) one persistent kernel per step, phases separated by a grid barrier, each
//       phase's weights requested before the barrier that precedes it.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o persist_probe tools/experiments/persist_probe.cu
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

struct Phase {
  long long w_off;      // byte offset of the phase's weights
  int w_per_block;      // weight bytes per block (multiple of 4096)
  int act_in;           // input activation bytes each block reads
  int act_out_per_blk;  // output bytes each block writes
};

constexpr int kThreads = 256;

__device__ __forceinline__ void cp16(void* smem, const void* g) {
  unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_commit_wait() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void fetch_weights(unsigned char* sm, const unsigned char* w, const Phase& p) {
  const unsigned char* src = w + p.w_off + (long long)blockIdx.x * p.w_per_block;
  for (int i = threadIdx.x * 16; i < p.w_per_block; i += kThreads * 16) cp16(sm + i, src + i);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// After the dependency: the input activations (L2-resident), folded into one value.
__device__ __forceinline__ uint4 read_acts(const Phase& p, const uint4* in) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int n_in = p.act_in / 16;
  const int start = (blockIdx.x * 977) % (n_in > 0 ? n_in : 1);
  for (int i = threadIdx.x; i < n_in; i += kThreads) {
    uint4 v = __ldcg(in + (start + i) % n_in);
    acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  return acc;
}
// Once the weights are in shared memory: fold them in and write the block's output slice.
__device__ __forceinline__ void consume_write(const unsigned char* sm, const Phase& p, uint4 acc, uint4* out) {
  __syncthreads();
  const uint4* s4 = reinterpret_cast<const uint4*>(sm);
  for (int i = threadIdx.x; i < p.w_per_block / 16; i += kThreads) {
    uint4 v = s4[i];
    acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  const int n_out = p.act_out_per_blk / 16;
  for (int i = threadIdx.x; i < n_out; i += kThreads) out[(long long)blockIdx.x * n_out + i] = acc;
}
__device__ __forceinline__ void phase_body(const unsigned char* sm, const Phase& p, const uint4* in, uint4* out) {
  const uint4 acc = read_acts(p, in);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  consume_write(sm, p, acc, out);
}

__global__ void phase_kernel(const unsigned char* w, Phase p, const uint4* in, uint4* out, long long pf_off,
                             int pf_per_block) {
  extern __shared__ __align__(16) unsigned char sm[];
  if (pf_per_block > 0 && threadIdx.x == 0) {
    const unsigned char* a = w + pf_off + (long long)blockIdx.x * pf_per_block;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(a), "r"(pf_per_block) : "memory");
  }
  fetch_weights(sm, w, p);
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  phase_body(sm, p, in, out);
}

__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(bar) : "memory");
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(bar) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

__global__ void persistent_kernel(const unsigned char* w, const Phase* phases, int n_phases, uint4* a0, uint4* a1,
                                  unsigned* bar) {
  extern __shared__ __align__(16) unsigned char sm[];
  for (int i = 0; i < n_phases; ++i) {
    const Phase p = phases[i];
    fetch_weights(sm, w, p);  // this phase's weights, before the barrier that orders its inputs
    grid_barrier(bar, unsigned(i + 1) * gridDim.x);
    phase_body(sm, p, (i & 1) ? a1 : a0, (i & 1) ? a0 : a1);
    __syncthreads();  // smem reused by the next phase's prefetch
  }
}

// (e) as (c), but phase i+1's weights are requested at the start of phase i into the other
// of two shared-memory regions, so every phase's weights have a whole phase of lead time.
__global__ void persistent2_kernel(const unsigned char* w, const Phase* phases, const int* buf_off, int n_phases,
                                   uint4* a0, uint4* a1, unsigned* bar) {
  extern __shared__ __align__(16) unsigned char sm[];
  fetch_weights(sm + buf_off[0], w, phases[0]);
  for (int i = 0; i < n_phases; ++i) {
    const Phase p = phases[i];
    if (i + 1 < n_phases) {
      fetch_weights(sm + buf_off[i + 1], w, phases[i + 1]);
    } else {
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    grid_barrier(bar, unsigned(i + 1) * gridDim.x);
    // read activations, then wait for all but the newest group (this phase's weights)
    const uint4 acc = read_acts(p, (i & 1) ? a1 : a0);
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    consume_write(sm + buf_off[i], p, acc, (i & 1) ? a0 : a1);
    __syncthreads();
  }
}

int main(int argc, char** argv) {
  const int layers = 24, iters = 20;
  int dev = 0, nsm = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
  const int NB = nsm;
  // Qwen2.5-0.5B decode at M = 64 (bytes): weights or KV per phase, input bytes per block, output bytes.
  struct Spec { const char* name; long long w; int in; int out; };
  const Spec spec[] = {
      {"norm1", 0, 64 * 896 * 2 / 64 * 4, 64 * 896 * 2},
      {"qkv", 896LL * 1152 * 2, 64 * 896 * 2, 64 * 1152 * 2},
      {"rope", 0, 64 * 1152 * 2 / 32, 64 * 1152 * 2},
      {"attn", 64LL * 384 * 512, 64 * 896 * 2 / 64, 64 * 896 * 2},
      {"combine", 0, 64 * 896 * 2 / 32, 64 * 896 * 2},
      {"o", 896LL * 896 * 2, 64 * 896 * 2, 64 * 896 * 2},
      {"norm2", 0, 64 * 896 * 2 / 64 * 4, 64 * 896 * 2},
      {"gate_up", 896LL * 9728 * 2, 64 * 896 * 2, 64 * 4864 * 2},
      {"down", 4864LL * 896 * 2, 64 * 4864 * 2 / 8, 64 * 896 * 2},
  };
  // The shortest dependency chain of a layer: RMSNorm folded into the projections' prologues,
  // RoPE and the cache write into the qkv epilogue, the partition merge into attention.
  const Spec fused[] = {
      {"norm1+qkv+rope", 896LL * 1152 * 2, 64 * 896 * 2, 64 * 1152 * 2},
      {"attn", 64LL * 384 * 512, 64 * 1152 * 2 / 64, 64 * 896 * 2},
      {"o", 896LL * 896 * 2, 64 * 896 * 2, 64 * 896 * 2},
      {"norm2+gate_up", 896LL * 9728 * 2, 64 * 896 * 2, 64 * 4864 * 2},
      {"down", 4864LL * 896 * 2, 64 * 4864 * 2 / 8, 64 * 896 * 2},
  };
  const int mode = argc < 2 ? 1 : std::atoi(argv[1]);  // 1: 9 phases, 0: 8 (no combine), 2: 5 (fused)
  const Spec* table = mode == 2 ? fused : spec;
  const int nspec = mode == 2 ? 5 : int(sizeof(spec) / sizeof(spec[0]));
  const bool with_combine = mode != 0;
  std::vector<Phase> ph;
  long long off = 0;
  int max_w = 0;
  for (int l = 0; l < layers; ++l)
    for (int s = 0; s < nspec; ++s) {
      if (!with_combine && s == 4) continue;
      const Spec& sp = table[s];
      Phase p;
      long long per = (sp.w / NB + 15) / 16 * 16;
      p.w_off = off;
      p.w_per_block = int(per);
      off += per * NB;
      p.act_in = sp.in / 16 * 16;
      p.act_out_per_blk = (sp.out / NB + 15) / 16 * 16;
      if (p.w_per_block > max_w) max_w = p.w_per_block;
      ph.push_back(p);
    }
  std::printf("SMs %d, phases per step %zu, weight+KV bytes per step %.1f MB, largest slice %d B\n", NB, ph.size(),
              off / 1e6, max_w);
  unsigned char* w;
  uint4 *a0, *a1;
  unsigned* bar;
  Phase* dph;
  CK(cudaMalloc(&w, off + 4096));
  CK(cudaMemset(w, 1, off + 4096));
  CK(cudaMalloc(&a0, 64 * 4864 * 2 * 2));
  CK(cudaMalloc(&a1, 64 * 4864 * 2 * 2));
  CK(cudaMemset(a0, 0, 64 * 4864 * 2 * 2));
  CK(cudaMemset(a1, 0, 64 * 4864 * 2 * 2));
  CK(cudaMalloc(&bar, 4));
  CK(cudaMalloc(&dph, ph.size() * sizeof(Phase)));
  CK(cudaMemcpy(dph, ph.data(), ph.size() * sizeof(Phase), cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(phase_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  // copy bandwidth for the floor
  {
    unsigned char* tmp;
    CK(cudaMalloc(&tmp, off));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpyAsync(tmp, w, off, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(tmp, w, off, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double bw = 2.0 * off * 5 / (ms * 1e-3);
    std::printf("copy bandwidth %.2f TB/s -> weight+KV read floor %.1f us per step\n", bw / 1e12,
                off / (bw / 2) * 1e6);
    CK(cudaFree(tmp));
  }
  auto time_graph = [&](cudaGraphExec_t ge) {
    for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; ++i) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e3 / iters;
  };
  // One phase kernel on st (captured), with or without programmatic dependent launch.
  auto launch_phase = [&](const Phase& p, bool pdl, const uint4* in, uint4* out, long long pf_off, int pf) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(NB);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = size_t(p.w_per_block);
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, phase_kernel, (const unsigned char*)w, p, in, out, pf_off, pf));
  };
  const int modes[][2] = {{1, 0}, {0, 0}, {1, 1}, {1, 2}, {1, 3}};  // (pdl, L2 prefetch distance)
  for (auto& m : modes) {
    const int pdl = m[0], dist = m[1];
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (size_t i = 0; i < ph.size(); ++i) {
      const uint4* in = (i & 1) ? a1 : a0;
      uint4* out = (i & 1) ? a0 : a1;
      long long pf_off = 0;
      int pf = 0;
      if (dist > 0 && i + dist < ph.size()) {
        pf_off = ph[i + dist].w_off;
        pf = ph[i + dist].w_per_block;
      }
      launch_phase(ph[i], pdl != 0, in, out, pf_off, pf);
    }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float us = time_graph(ge);
    std::printf("(%c) %zu kernels per step%s, L2 prefetch %d phases ahead: %.1f us per step, %.2f us per phase\n",
                pdl ? 'a' : 'b', ph.size(), pdl ? " with PDL" : "", dist, us, us / ph.size());
  }
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CK(cudaMemsetAsync(bar, 0, 4, st));
    persistent_kernel<<<NB, kThreads, size_t(max_w), st>>>(w, dph, int(ph.size()), a0, a1, bar);
    CK(cudaGetLastError());
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float us = time_graph(ge);
    std::printf("(c) one persistent kernel, %zu barrier-separated phases: %.1f us per step, %.2f us per phase\n",
                ph.size(), us, us / ph.size());
  }
  {
    // two regions: A holds the largest slice, B the rest of 227 KB; consecutive phases alternate.
    const int total = 227 * 1024, A = max_w;
    std::vector<int> off_h(ph.size());
    bool ok = true;
    std::vector<int> buf(ph.size(), 0);
    for (size_t i = 0; i < ph.size(); ++i) {
      const bool fits_b = ph[i].w_per_block <= total - A;
      if (i > 0 && ph[i - 1].w_per_block > 0) buf[i] = 1 - buf[i - 1];
      else buf[i] = fits_b ? 1 : 0;
      if (buf[i] == 1 && !fits_b) ok = false;
      off_h[i] = buf[i] ? A : 0;
    }
    if (!ok) std::printf("(e) skipped: slices do not alternate within 227 KB\n");
    else {
      int* doff;
      CK(cudaMalloc(&doff, ph.size() * sizeof(int)));
      CK(cudaMemcpy(doff, off_h.data(), ph.size() * sizeof(int), cudaMemcpyHostToDevice));
      CK(cudaFuncSetAttribute(persistent2_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, total));
      cudaGraph_t g;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      CK(cudaMemsetAsync(bar, 0, 4, st));
      persistent2_kernel<<<NB, kThreads, size_t(total), st>>>(w, dph, doff, int(ph.size()), a0, a1, bar);
      CK(cudaGetLastError());
      CK(cudaStreamEndCapture(st, &g));
      cudaGraphExec_t ge;
      CK(cudaGraphInstantiate(&ge, g, 0));
      const float us = time_graph(ge);
      std::printf("(e) persistent, next phase's weights one phase ahead: %.1f us per step, %.2f us per phase\n", us,
                  us / ph.size());
    }
  }
  // Barrier alone: phases with no bytes.
  {
    std::vector<Phase> empty(ph.size());
    for (auto& p : empty) p = Phase{0, 0, 0, 0};
    CK(cudaMemcpy(dph, empty.data(), empty.size() * sizeof(Phase), cudaMemcpyHostToDevice));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CK(cudaMemsetAsync(bar, 0, 4, st));
    persistent_kernel<<<NB, kThreads, 0, st>>>(w, dph, int(empty.size()), a0, a1, bar);
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float us = time_graph(ge);
    std::printf("    empty phases: %.2f us per grid barrier\n", us / empty.size());
    cudaGraph_t g2;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (size_t i = 0; i < empty.size(); ++i) {
      launch_phase(empty[i], true, a0, a1, 0LL, 0);
    }
    CK(cudaStreamEndCapture(st, &g2));
    cudaGraphExec_t ge2;
    CK(cudaGraphInstantiate(&ge2, g2, 0));
    const float us2 = time_graph(ge2);
    std::printf("    empty kernels with PDL: %.2f us per kernel boundary\n", us2 / empty.size());
  }
  return 0;
}
