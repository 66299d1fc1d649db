// MemoryBreakdown: where one rank's device memory goes (host memory on the
// CPU backend), as `tessera bench` prints it. Bytes as the rank's allocator
// hands them out (block sizes), so the parts add up to what the rank holds.
#ifndef TESSERA_RUNTIME_EXECUTOR_MEMORY_BREAKDOWN_H_
#define TESSERA_RUNTIME_EXECUTOR_MEMORY_BREAKDOWN_H_

#include <cstdint>

namespace tessera {

struct MemoryBreakdown {
  // The rank's weights (Model::weight_bytes).
  int64_t weights_bytes = 0;
  // Everything a step works in besides the KV cache: the model's activation
  // workspace (Model::workspace_bytes), the step inputs' buffers
  // (StepInputs) and the backend's step scratch (Ops::ReserveStepScratch:
  // GEMM casts, attention partials, the sampler's buffers).
  int64_t workspace_bytes = 0;
  // What captured decode graphs hold beyond the workspace (their own
  // nodes' memory): the free device memory their capture took
  // (runtime/executor/graph_runner.h; the driver's 2 MiB pages, so a small
  // model's graphs read 0 or 2 MiB). 0 while the rank captures no graphs
  // (the CPU backend, --no-graphs, parallel ranks for now).
  int64_t graphs_bytes = 0;
  // The KV pool (KvPool::bytes), sized last from what is left.
  int64_t kv_bytes = 0;

  int64_t total_bytes() const {
    return weights_bytes + workspace_bytes + graphs_bytes + kv_bytes;
  }
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_EXECUTOR_MEMORY_BREAKDOWN_H_
