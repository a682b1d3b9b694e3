// CUDA events behind DeviceMark (see device_mark.h).
#include "dist/device_mark.h"

#include "core/check.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace grpo {

DeviceMark device_mark(Context& ctx) {
  if (ctx.device() != Device::cuda) return nullptr;
#ifdef GRPO_HAVE_CUDA
  cudaEvent_t e = nullptr;
  GRPO_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  GRPO_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(ctx.stream())) == cudaSuccess);
  return DeviceMark(static_cast<void*>(e), [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
#else
  GRPO_CHECK_MSG(false, "device_mark: this build has no CUDA backend");
  return nullptr;
#endif
}

void device_mark_wait(const DeviceMark& mark) {
  if (!mark) return;
#ifdef GRPO_HAVE_CUDA
  GRPO_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(mark.get())) == cudaSuccess);
#endif
}

int device_current_cuda() {
#ifdef GRPO_HAVE_CUDA
  int d = 0;
  if (cudaGetDevice(&d) == cudaSuccess) return d;
#endif
  return 0;
}

}  // namespace grpo
