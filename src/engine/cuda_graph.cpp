// CUDA-graph capture/replay of decode steps (see cuda_graph.h).
#include "engine/cuda_graph.h"

#include "core/check.h"
#include "core/log.h"

#ifdef GRPO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace grpo {

DecodeGraphs::DecodeGraphs(Context& ctx) : ctx_(ctx) {}

#ifdef GRPO_HAVE_CUDA

bool DecodeGraphs::supported() const { return ctx_.device() == Device::cuda; }

DecodeGraphs::~DecodeGraphs() {
  for (auto& [b, e] : exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
  for (auto& [b, g] : graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(g));
}

bool DecodeGraphs::capture(int B, const std::function<void()>& body) {
  GRPO_CHECK(supported());
  auto stream = static_cast<cudaStream_t>(ctx_.stream());
  body();  // warm-up outside the capture
  if (cudaStreamSynchronize(stream) != cudaSuccess) return false;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return false;
  body();
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream, &graph);
  if (err != cudaSuccess || graph == nullptr) {
    GRPO_LOG_WARN("engine: cudaStreamEndCapture: %s", cudaGetErrorString(err));
    cudaGetLastError();
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    GRPO_LOG_WARN("engine: cudaGraphInstantiate: %s", cudaGetErrorString(err));
    cudaGraphDestroy(graph);
    cudaGetLastError();
    return false;
  }
  graph_[B] = graph;
  exec_[B] = exec;
  return true;
}

void DecodeGraphs::launch(int B) {
  auto it = exec_.find(B);
  GRPO_CHECK_MSG(it != exec_.end(), "DecodeGraphs::launch: no graph for this batch size");
  GRPO_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second), static_cast<cudaStream_t>(ctx_.stream())) ==
             cudaSuccess);
}

#else

bool DecodeGraphs::supported() const { return false; }
DecodeGraphs::~DecodeGraphs() = default;
bool DecodeGraphs::capture(int, const std::function<void()>&) { return false; }
void DecodeGraphs::launch(int) { GRPO_CHECK_MSG(false, "DecodeGraphs::launch: this build has no CUDA"); }

#endif

}  // namespace grpo
