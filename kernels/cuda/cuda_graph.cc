#include "kernels/cuda/cuda_graph.h"

#include "kernels/cuda/cuda_status.h"
#include "runtime/core/status.h"

namespace tessera {

absl::Status CudaGraph::BeginCapture(cudaStream_t stream) {
  return CudaStatus(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
      "cudaStreamBeginCapture", "starting a graph capture");
}

absl::StatusOr<std::unique_ptr<CudaGraph>> CudaGraph::EndCapture(
    cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    // The call that broke the capture left its error behind; the next kernel
    // launch's cudaGetLastError must not report it.
    (void)cudaGetLastError();
    return CudaStatus(ended, "cudaStreamEndCapture",
                      "ending a graph capture (a call in it could not be "
                      "captured: a host copy, an allocation or a wait?)");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  if (made != cudaSuccess) {
    cudaGraphDestroy(graph);
    return CudaStatus(made, "cudaGraphInstantiate",
                      "instantiating a captured graph");
  }
  return std::unique_ptr<CudaGraph>(new CudaGraph(stream, graph, exec));
}

CudaGraph::~CudaGraph() {
  cudaGraphExecDestroy(exec_);
  cudaGraphDestroy(graph_);
}

absl::Status CudaGraph::Launch() {
  return CudaStatus(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch",
                    "replaying a captured graph");
}

}  // namespace tessera
