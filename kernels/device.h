// Device: what a backend does besides math — moving tensors between the host
// and its memory, waiting for its work, the stream that work is ordered on,
// and recording that work as a graph to replay.
//
// Device is an interface of its own that the backends' op sets implement
// (`class Ops : public Device`), not a part of the Backend struct: the code
// that only moves memory or replays graphs (weight loading, the decode graph
// runner) takes a Device and needs no op set, while everything that holds an
// Ops — the model above all — keeps calling ops->Upload / ops->CopyToHost as
// before. One object per rank implements both, so there is one stream and
// one allocator behind them.
#ifndef TESSERA_KERNELS_DEVICE_H_
#define TESSERA_KERNELS_DEVICE_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/upload_buffer.h"
#include "runtime/core/tensor.h"

// cudaStream_t without the CUDA headers (it is CUstream_st*).
struct CUstream_st;

namespace tessera {

// A recorded sequence of device work (a CUDA graph), replayed by Launch on
// the stream it was captured from. It reads and writes the very buffers the
// captured ops were given: the owner keeps them alive and refills the inputs
// in place between launches. Destroying the graph frees what capture made.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Enqueues one replay; like any op, complete only after Synchronize.
  virtual absl::Status Launch() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // A copy of the host tensor `host` (f32, bf16 or f16; contiguous, any
  // alignment, e.g. a slice of an mmapped checkpoint) in this backend's
  // memory, stored as `dtype` (kF32, or kBF16 where the backend computes with
  // it): weights and constants, once at load time. When host.dtype() ==
  // dtype it is one copy with no host pass; otherwise the backend converts in
  // bounded slices (never a whole-tensor host copy besides the result when
  // the result lives in host memory). InvalidArgument for an unsupported
  // dtype.
  virtual absl::StatusOr<Tensor> Upload(const TensorView& host,
                                        DType dtype) = 0;

  // One tensor of `shape` holding `parts` (this backend's memory, one dtype)
  // back to back, made by copies within this backend's memory: the load-time
  // stacking of a layer's q/k/v and gate/up weights (runtime/model/weights.h
  // ConcatRows). The parts' bytes must add up to the shape's (InvalidArgument
  // otherwise); they may be freed once the call returns. Unimplemented where
  // a backend has no such copies (ConcatRows then stages through the host).
  virtual absl::StatusOr<Tensor> StackRows(absl::Span<const TensorView> parts,
                                           const Shape& shape) {
    (void)parts;
    (void)shape;
    return absl::UnimplementedError(
        "this backend has no device-to-device copies");
  }

  // Copies `src` (this backend's memory) to host memory at `dst`
  // (src.nbytes() bytes), complete when the call returns.
  virtual absl::Status CopyToHost(const TensorView& src, void* dst) = 0;

  // A buffer of `bytes` in this backend's memory that the host refills every
  // step through one staging copy (upload_buffer.h): the step inputs'
  // storage (runtime/executor/step_inputs.h), made once when the rank is
  // built, at an address a captured graph may read.
  virtual absl::StatusOr<std::unique_ptr<UploadBuffer>> NewUploadBuffer(
      size_t bytes) = 0;

  // Whether this backend's memory is host memory that host code may read and
  // write directly (the CPU backend): step arrays are then packed in place,
  // and the shared op checks read their values.
  virtual bool host_memory() const { return false; }

  // Waits for everything enqueued so far (the CPU runs ops synchronously).
  virtual absl::Status Synchronize() { return absl::OkStatus(); }

  // The stream every op runs on, in order, and with which collectives are
  // ordered (a cudaStream_t); null where ops run on the calling thread.
  virtual CUstream_st* stream() const { return nullptr; }

  // Graph capture (for decode CUDA graphs). Between BeginCapture and
  // EndCapture the ops this device runs are recorded, not run; EndCapture
  // returns them as a graph. Only work that stays on the device can be
  // captured: an op that copies to or from host memory, takes new memory from
  // the driver or waits for the device fails, and so does the EndCapture
  // after it (run the ops once before capturing, so that their buffers and
  // plans exist). The capture records this thread's work only: other threads
  // (other ranks in one process) are not disturbed. Unimplemented where ops
  // are not enqueued (the CPU backend).
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError("this backend cannot capture graphs");
  }
  virtual absl::StatusOr<std::unique_ptr<DeviceGraph>> EndCapture() {
    return absl::UnimplementedError("this backend cannot capture graphs");
  }
};

}  // namespace tessera

#endif  // TESSERA_KERNELS_DEVICE_H_
