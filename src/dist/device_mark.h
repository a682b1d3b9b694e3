// A point in a context's stream that another thread can wait for on the host:
// the gradient all-reduce thread waits until the backward kernels of a layer
// have run before it hands that layer's bucket to the collective. On the CPU
// ops are synchronous, so a mark is empty and waiting on it returns at once.
#pragma once
#include <memory>

#include "core/context.h"

namespace grpo {

using DeviceMark = std::shared_ptr<void>;

// Records the current end of ctx's stream (a CUDA event); nullptr on the CPU.
DeviceMark device_mark(Context& ctx);
// Blocks the calling thread until the work before the mark has finished.
void device_mark_wait(const DeviceMark& mark);
// The calling thread's current CUDA device (a context made current on it sets it); 0 without CUDA.
int device_current_cuda();

}  // namespace grpo
