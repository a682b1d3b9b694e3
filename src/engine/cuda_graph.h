// CUDA graphs for decode steps: one graph per padded batch size, captured on
// ctx.stream() and replayed with cudaGraphLaunch. The captured body must read its
// inputs from buffers whose addresses never change (the model runner's persistent
// step buffers) and must not synchronise or allocate while capturing. Without CUDA
// (or on a CPU context) supported() is false and nothing else may be called.
#pragma once
#include <functional>
#include <map>

#include "core/context.h"

namespace grpo {

class DecodeGraphs {
 public:
  explicit DecodeGraphs(Context& ctx);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  bool supported() const;
  // Runs body once eagerly (warm-up: lazy handles, workspaces), then captures it as
  // the graph for batch size B. False when capture or instantiation fails.
  bool capture(int B, const std::function<void()>& body);
  bool has(int B) const { return exec_.count(B) > 0; }
  // Replays the graph of batch size B on ctx.stream() (asynchronous).
  void launch(int B);

 private:
  Context& ctx_;
  std::map<int, void*> graph_, exec_;  // cudaGraph_t, cudaGraphExec_t
};

}  // namespace grpo
