// The per-call carve-up of ctx.workspace() for CUDA ops.
//   [0, lt_bytes)            cuBLASLt workspace (min(32 MiB, total/2))
//   [lt_bytes, total)        kernel scratch, handed out by ScratchAlloc
// Ops on one stream run in order, so every op may reuse the whole scratch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "core/check.h"
#include "core/context.h"

namespace grpo::cuda {

struct Workspace {
  void* lt = nullptr;
  size_t lt_bytes = 0;
  char* scratch = nullptr;
  size_t scratch_bytes = 0;
};
inline Workspace workspace_of(Context& ctx) {
  Tensor& ws = ctx.workspace();
  Workspace w;
  const size_t total = ws.nbytes();
  size_t lt = total / 2;
  if (lt > (size_t(32) << 20)) lt = size_t(32) << 20;
  lt &= ~size_t(255);
  w.lt = ws.data;
  w.lt_bytes = lt;
  w.scratch = static_cast<char*>(ws.data) + lt;
  w.scratch_bytes = total - lt;
  return w;
}

// Bump allocator over the scratch part of the workspace (256-byte aligned pieces).
class ScratchAlloc {
 public:
  explicit ScratchAlloc(Context& ctx) : w_(workspace_of(ctx)) {}
  size_t left() const { return w_.scratch_bytes - used_; }
  template <class T>
  T* alloc(int64_t n, const char* what) {
    size_t bytes = (size_t(n) * sizeof(T) + 255) & ~size_t(255);
    if (bytes > left()) {
      std::fprintf(stderr, "grpo cuda: %s needs %zu bytes of scratch, %zu left; raise ContextOptions::workspace_bytes\n",
                   what, bytes, left());
      GRPO_CHECK_MSG(false, "CUDA workspace too small (see message above)");
    }
    T* p = reinterpret_cast<T*>(w_.scratch + used_);
    used_ += bytes;
    return p;
  }

 private:
  Workspace w_;
  size_t used_ = 0;
};

}  // namespace grpo::cuda
