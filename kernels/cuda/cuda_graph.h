// CudaGraph: work captured from a CUDA stream (cudaStreamBeginCapture ..
// cudaStreamEndCapture), instantiated once, replayed by Launch on that
// stream. The RAII handle behind Device::EndCapture on the CUDA backend.
#ifndef TESSERA_KERNELS_CUDA_CUDA_GRAPH_H_
#define TESSERA_KERNELS_CUDA_CUDA_GRAPH_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace tessera {

class CudaGraph final : public DeviceGraph {
 public:
  // Starts recording `stream`'s work from this thread. Other threads are not
  // disturbed (cudaStreamCaptureModeThreadLocal): ranks that run as threads of
  // one process may capture at the same time.
  static absl::Status BeginCapture(cudaStream_t stream);

  // Ends the capture on `stream` and instantiates what it recorded. When a
  // call made during the capture could not be captured (the capture is then
  // invalidated), the capture still ends, the error it left is cleared, and
  // the result is an error that says so.
  static absl::StatusOr<std::unique_ptr<CudaGraph>> EndCapture(
      cudaStream_t stream);

  ~CudaGraph() override;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Enqueues one replay on the captured stream, which must still exist.
  absl::Status Launch() override;

 private:
  CudaGraph(cudaStream_t stream, cudaGraph_t graph, cudaGraphExec_t exec)
      : stream_(stream), graph_(graph), exec_(exec) {}

  cudaStream_t stream_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_CUDA_CUDA_GRAPH_H_
