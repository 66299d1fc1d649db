#include "kernels/cuda/cuda_ops.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/attention/flash_prefill.h"
#include "kernels/cuda/cuda_graph.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/fused_kernels.h"
#include "kernels/cuda/gemm/fp8_gemm.h"
#include "kernels/cuda/gemm/gemm_plans.h"
#include "kernels/cuda/gemm/skinny_gemm.h"
#include "kernels/cuda/moe/moe_kernels.h"
#include "kernels/cuda/sampling/sampling_kernels.h"
#include "kernels/op_checks.h"
#include "kernels/op_timer.h"
#include "kernels/sampling_math.h"
#include "runtime/core/device_wait.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

absl::Status Launch(cudaError_t error, absl::string_view op) {
  return CudaStatus(error, absl::StrCat(op, " kernel"),
                    absl::StrCat("running ", op));
}

// Round to nearest even, as __float2bfloat16 does.
uint16_t ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu)) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);  // Quiet NaN.
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// The kernels' name of a cache dtype the checks admitted (kCacheDTypes).
cuda::KvDType KvDTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return cuda::KvDType::kBF16;
    case DType::kI8:
      return cuda::KvDType::kI8;
    case DType::kF8E4M3:
      return cuda::KvDType::kF8E4M3;
    default:
      return cuda::KvDType::kF32;
  }
}

// OpTimer over CUDA events (see CudaOps::NewOpTimer). Begin and End record
// one event each on the stream; the pairs are resolved in Collect, after one
// wait for the last event (every earlier one precedes it on the stream).
class CudaOpTimer final : public OpTimer {
 public:
  CudaOpTimer(int device, cudaStream_t stream)
      : device_(device), stream_(stream) {}
  ~CudaOpTimer() override {
    // Destroying an event the device has not reached yet is allowed: its
    // resources are released once it completes.
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
  }
  CudaOpTimer(const CudaOpTimer&) = delete;
  CudaOpTimer& operator=(const CudaOpTimer&) = delete;

  void Begin() override {
    open_ = -1;
    // After an error nothing more is recorded until Collect reports it.
    if (!error_.ok() || Capturing()) return;
    open_ = Record("marking the start of an op for op profiling");
  }

  void End(std::string label) override {
    if (open_ < 0) return;
    const int64_t start = open_;
    open_ = -1;
    const int64_t stop = Record("marking the end of an op for op profiling");
    if (stop < 0) return;
    pairs_.push_back(Pair{start, stop, std::move(label)});
  }

  absl::StatusOr<std::vector<OpTimeTotal>> Collect() override {
    const absl::Status error = std::move(error_);
    error_ = absl::OkStatus();
    std::vector<Pair> pairs = std::move(pairs_);
    pairs_.clear();
    used_ = 0;  // The pool is reused from the start.
    open_ = -1;
    RETURN_IF_ERROR(error);
    if (pairs.empty()) return std::vector<OpTimeTotal>();
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(events_[pairs.back().stop]),
                               "cudaEventSynchronize",
                               "waiting for the profiled ops"));
    OpTimeSums sums;
    for (Pair& pair : pairs) {
      float ms = 0.0f;
      RETURN_IF_ERROR(CudaStatus(
          cudaEventElapsedTime(&ms, events_[pair.start], events_[pair.stop]),
          "cudaEventElapsedTime",
          absl::StrCat("reading the time of ", pair.label)));
      sums.Add(std::move(pair.label), static_cast<double>(ms) * 1e3);
    }
    return sums.Take();
  }

 private:
  struct Pair {
    int64_t start, stop;  // Indices into events_.
    std::string label;
  };

  // Whether the stream is capturing a graph (an event recorded there would
  // become a node of the graph, never a time); an error counts as capturing
  // (nothing recorded) and is kept.
  bool Capturing() {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const absl::Status status =
        CudaStatus(cudaStreamIsCapturing(stream_, &capture),
                   "cudaStreamIsCapturing", "profiling an op");
    if (!status.ok()) {
      error_ = status;
      return true;
    }
    return capture != cudaStreamCaptureStatusNone;
  }

  // Records the pool's next event (made on first use) on the stream; its
  // index, or -1 with the error kept.
  int64_t Record(absl::string_view doing) {
    absl::Status status;
    if (used_ == events_.size()) {
      cudaEvent_t event = nullptr;
      status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice", doing);
      if (status.ok()) {
        status = CudaStatus(cudaEventCreate(&event), "cudaEventCreate", doing);
      }
      if (!status.ok()) {
        error_ = status;
        return -1;
      }
      events_.push_back(event);
    }
    status = CudaStatus(cudaEventRecord(events_[used_], stream_),
                        "cudaEventRecord", doing);
    if (!status.ok()) {
      error_ = status;
      return -1;
    }
    return static_cast<int64_t>(used_++);
  }

  int device_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;  // The pool; [0, used_) recorded.
  size_t used_ = 0;
  std::vector<Pair> pairs_;
  int64_t open_ = -1;  // The Begin event of the op under way, or -1.
  absl::Status error_;
};

constexpr DType kWeightDTypes[] = {DType::kF32, DType::kBF16, DType::kF8E4M3};

// The padded copy of a block weight's scale (kFp8ScalePad): ceil(N / 128) *
// Fp8BlockScaleStride(K) floats, at most 2^18 — N * K up to ~4e9 weights.
constexpr size_t kFp8ScalePadBytes = size_t{1} << 20;

bool IsFp8(const WeightView& w) { return w.dtype() == DType::kF8E4M3; }

// The skinny fp8 kernel's `block`: 0 for a per-channel scale.
int64_t Fp8Block(const WeightView& w) {
  return w.scale_kind == WeightScaleKind::kBlock ? w.block : 0;
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

size_t RoundUp(size_t v, size_t m) { return (v + m - 1) / m * m; }

// The e4m3 copy of x [rows, k] in kGemmInput: the values, then (from a
// 256-byte boundary) the scales, one per row or one per row and 1x128 group.
size_t Fp8InputScalesAt(int64_t rows, int64_t k) {
  return RoundUp(static_cast<size_t>(rows) * static_cast<size_t>(k), 256);
}
size_t Fp8InputBytes(int64_t rows, int64_t k, bool per_group) {
  const int64_t groups = per_group ? (k + cuda::kFp8ActivationGroup - 1) /
                                         cuda::kFp8ActivationGroup
                                   : 1;
  return Fp8InputScalesAt(rows, k) +
         static_cast<size_t>(rows) * static_cast<size_t>(groups) * 4;
}

// The weight format of a LinearKey.
int32_t LinearFormat(const WeightView& w) {
  return static_cast<int32_t>(w.dtype()) |
         (static_cast<int32_t>(w.scale_kind) << 8) |
         (static_cast<int32_t>(w.activations) << 12);
}

// OK where the tensor-core fp8 path takes this product; otherwise why not.
absl::Status Fp8CublasLtSupports(int64_t t, int64_t n, int64_t k,
                                 const WeightView& w) {
  // Every product of a step asks: the message is built only for a refusal.
  const auto shape = [&] {
    return absl::StrCat("[", t, ", ", k, "] x [", n, ", ", k, "]ᵀ");
  };
  if (k % 16 != 0 || n % 4 != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "the fp8 tensor-core path needs K % 16 == 0 and N % 4 == 0, not ",
        shape()));
  }
  if (!Aligned16(w.data.data()) || !Aligned16(w.scale.data())) {
    return absl::UnimplementedError(absl::StrCat(
        "the fp8 tensor-core path needs 16-byte aligned weights and scales (",
        shape(), ")"));
  }
  if (w.scale_kind == WeightScaleKind::kPerChannel) {
    if (w.activations == ActivationScaleKind::kDynamicPerBlock) {
      return absl::UnimplementedError(absl::StrCat(
          "per-channel fp8 weights with per-block activation scales: the "
          "fp8 tensor-core path pairs 1x128 activation groups with 128x128 "
          "weight blocks only (",
          shape(), ")"));
    }
    return absl::OkStatus();
  }
  if (w.block != 128) {
    return absl::UnimplementedError(
        absl::StrCat("the fp8 tensor-core path takes block scales of 128, not ",
                     w.block, " (", shape(), ")"));
  }
  if (t < 4) {
    return absl::UnimplementedError(absl::StrCat(
        "the fp8 tensor-core path takes block-scaled products of 4 rows or "
        "more (",
        shape(), ")"));
  }
  return absl::OkStatus();
}

cuda::Fp8Quantization QuantizationOf(ActivationScaleKind kind) {
  switch (kind) {
    case ActivationScaleKind::kStatic:
      return cuda::Fp8Quantization::kStatic;
    case ActivationScaleKind::kDynamicPerBlock:
      return cuda::Fp8Quantization::kDynamicPerGroup;
    case ActivationScaleKind::kDynamicPerToken:
      break;
  }
  return cuda::Fp8Quantization::kDynamicPerToken;
}
constexpr DType kCacheDTypes[] = {DType::kF32, DType::kBF16, DType::kI8,
                                  DType::kF8E4M3};
}  // namespace

CudaOps::CudaOps(int device, PinnableBlockAllocator* allocator)
    : Ops(OpSupport{kWeightDTypes, kCacheDTypes, cuda::kMaxTopLogprobs}),
      device_(device),
      allocator_(allocator) {}

absl::StatusOr<std::unique_ptr<CudaOps>> CudaOps::Create(
    int device, PinnableBlockAllocator* allocator) {
  if (device < 0 || device >= CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device ", device, " (", CudaDeviceCount(), " visible)"));
  }
  std::unique_ptr<CudaOps> ops(new CudaOps(device, allocator));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice",
                             absl::StrCat("selecting GPU ", device)));
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&ops->stream_, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags", "creating the compute stream"));
  ASSIGN_OR_RETURN(ops->gemm_, cuda::GemmPlans::Create());
  return ops;
}

CudaOps::~CudaOps() {
  if (capturing_) {
    // An unfinished capture: end it (the stream cannot be waited for or
    // destroyed while it captures) and drop what it recorded.
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess &&
        graph != nullptr) {
      cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  gemm_.reset();
  for (Scratch& s : scratch_) {
    if (s.data != nullptr) allocator_->Free(s.data).IgnoreError();
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

namespace {

// Ready when `query` (cudaStreamQuery / cudaEventQuery) says the work is done;
// any other answer than "not ready" is the device's error.
absl::StatusOr<bool> Finished(cudaError_t query, const char* call,
                              const char* what) {
  if (query == cudaSuccess) return true;
  if (query == cudaErrorNotReady) return false;
  return CudaStatus(query, call, what);
}

}  // namespace

absl::Status CudaOps::Synchronize() {
  // A polled wait in a job (runtime/core/device_wait.h): a collective that
  // waits on a stopped peer must not keep this rank out of the fault round.
  return WaitForDevice(
      [&] {
        return Finished(cudaStreamQuery(stream_), "cudaStreamQuery",
                        "waiting for the GPU");
      },
      [&] {
        return CudaStatus(cudaStreamSynchronize(stream_),
                          "cudaStreamSynchronize", "waiting for the GPU");
      },
      [] { return std::string("waiting for the GPU's stream"); });
}

absl::Status CudaOps::BeginCapture() {
  if (capturing_) {
    return absl::FailedPreconditionError(
        "BeginCapture: a capture is already under way");
  }
  RETURN_IF_ERROR(CudaGraph::BeginCapture(stream_));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceGraph>> CudaOps::EndCapture() {
  if (!capturing_) {
    return absl::FailedPreconditionError(
        "EndCapture: no capture is under way (BeginCapture)");
  }
  capturing_ = false;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaGraph> graph,
                   CudaGraph::EndCapture(stream_));
  return std::unique_ptr<DeviceGraph>(std::move(graph));
}

absl::StatusOr<std::unique_ptr<OpTimer>> CudaOps::NewOpTimer() {
  return std::make_unique<CudaOpTimer>(device_, stream_);
}

absl::StatusOr<void*> CudaOps::Grow(enum Buffer which, size_t bytes) {
  Scratch& s = scratch_[which];
  if (s.bytes >= bytes && s.data != nullptr) return s.data;
  if (s.reserved) {
    return absl::FailedPreconditionError(
        absl::StrCat("a step needs ", bytes, " bytes of scratch #",
                     static_cast<int>(which), ", ReserveStepScratch reserved ",
                     s.bytes, " (the rank's step limits are too small)"));
  }
  if (s.data != nullptr) {
    // The old buffer may still be read by enqueued work.
    RETURN_IF_ERROR(Synchronize());
    RETURN_IF_ERROR(allocator_->Free(s.data));
    s = Scratch{};
  }
  // Some headroom, so that slowly growing steps do not reallocate each time.
  const size_t want = std::max<size_t>(bytes + bytes / 2, 256);
  ASSIGN_OR_RETURN(s.data, allocator_->Allocate(want));
  s.bytes = want;
  return s.data;
}

absl::Status CudaOps::Reserve(enum Buffer which, size_t bytes) {
  Scratch& s = scratch_[which];
  if (s.data != nullptr) {
    RETURN_IF_ERROR(Synchronize());
    RETURN_IF_ERROR(allocator_->Free(s.data));
    s = Scratch{};
  }
  bytes = std::max<size_t>(bytes, 256);
  ASSIGN_OR_RETURN(s.data, allocator_->Allocate(bytes));
  s.bytes = bytes;
  s.reserved = true;
  return absl::OkStatus();
}

absl::Status CudaOps::ReserveStepScratch(const StepLimits& l) {
  if (l.max_tokens < 1 || l.max_seqs < 1 || l.max_seq_len < 1 ||
      l.max_heads < 1 || l.max_head_dim < 1 || l.max_linear_in < 1 ||
      l.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReserveStepScratch: limits of ", l.max_tokens, " tokens, ", l.max_seqs,
        " sequences of ", l.max_seq_len, " positions, ", l.max_heads,
        " heads of ", l.max_head_dim, ", Linear K ", l.max_linear_in,
        ", vocabulary ", l.vocab_size));
  }
  const size_t rows = static_cast<size_t>(l.max_seqs);
  const size_t vocab = static_cast<size_t>(l.vocab_size);
  // The largest Linear input as bf16 (the head's rows are <= max_seqs, so
  // max_tokens * max_linear_in covers it when max_seqs <= max_tokens).
  const size_t gemm_rows =
      static_cast<size_t>(std::max<int64_t>(l.max_tokens, l.max_seqs));
  // An fp8 product's e4m3 copy and its scales (per 1x128 group at most) take
  // about half of that; the buffer holds whichever is larger.
  RETURN_IF_ERROR(Reserve(
      kGemmInput,
      std::max(
          gemm_rows * static_cast<size_t>(l.max_linear_in) * sizeof(uint16_t),
          Fp8InputBytes(static_cast<int64_t>(gemm_rows), l.max_linear_in,
                        /*per_group=*/true))));
  RETURN_IF_ERROR(Reserve(kGemmWorkspace, cuda::GemmPlans::kWorkspaceBytes));
  // The fp8 paths' fixed buffers (17 MiB): a padded block scale, and the
  // chunks of a product for which cuBLASLt offers only bf16 output (none on
  // an H200 with cuBLASLt 13.1, but a plan decides that only when made).
  RETURN_IF_ERROR(Reserve(kFp8ScalePad, kFp8ScalePadBytes));
  RETURN_IF_ERROR(
      Reserve(kFp8Bf16Output, cuda::GemmPlans::kFp8Bf16ScratchBytes));
  // Split-K decode: every sequence of a step, all its heads, the splits of
  // the longest context, for whichever decode kernel needs more (the split
  // decode of decode_attention.h, or the old kernel for the cases it leaves).
  const int32_t decode_seqs =
      static_cast<int32_t>(std::min<int64_t>(l.max_seqs, INT32_MAX));
  const int32_t decode_len =
      static_cast<int32_t>(std::min<int64_t>(l.max_seq_len, INT32_MAX));
  RETURN_IF_ERROR(Reserve(
      kDecodeWorkspace,
      std::max(cuda::DecodeAttentionWorkspaceBytes(decode_seqs, l.max_heads,
                                                   l.max_head_dim, decode_len),
               cuda::DecodeSplitWorkspaceBytes(decode_seqs, l.max_heads,
                                               l.max_head_dim, decode_len))));
  // The sampler's per-row buffers. The penalty tables and the masked ids
  // (kSampleCounts, kSampleMask, kSampleMasked) still grow on first use.
  RETURN_IF_ERROR(
      Reserve(kSampleParams, rows * sizeof(cuda::DeviceSamplingParams)));
  RETURN_IF_ERROR(Reserve(kSampleScratch, rows * vocab * sizeof(float)));
  RETURN_IF_ERROR(
      Reserve(kSampleResults,
              rows * (3 + 2 * static_cast<size_t>(cuda::kMaxTopLogprobs)) * 4));
  RETURN_IF_ERROR(
      Reserve(kLogprobWorkspace,
              cuda::LogprobsWorkspaceBytes(static_cast<int64_t>(rows), vocab,
                                           cuda::kMaxTopLogprobs)));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaOps::CopySamplingInput(enum Buffer which,
                                                 const void* host,
                                                 size_t bytes) {
  ASSIGN_OR_RETURN(void* device, Grow(which, std::max<size_t>(bytes, 1)));
  if (bytes > 0) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync", "copying sampling parameters to the GPU"));
  }
  return device;
}

namespace {

// Device step buffers beside page-locked staging (upload_buffer.h).
class CudaUploadBuffer final : public UploadBuffer {
 public:
  CudaUploadBuffer(void* device, size_t bytes, void* host, cudaEvent_t done,
                   PinnableBlockAllocator* allocator, cudaStream_t stream)
      : UploadBuffer(device, bytes),
        host_(host),
        done_(done),
        allocator_(allocator),
        stream_(stream) {}
  ~CudaUploadBuffer() override {
    if (pending_) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    cudaFreeHost(host_);
    allocator_->Free(device()).IgnoreError();
  }

  absl::StatusOr<void*> BeginWrite() override {
    if (pending_) {
      // The previous step's copy may still be reading the staging.
      RETURN_IF_ERROR(WaitForDevice(
          [&] {
            return Finished(cudaEventQuery(done_), "cudaEventQuery",
                            "waiting for the last step's inputs copy");
          },
          [&] {
            return CudaStatus(cudaEventSynchronize(done_),
                              "cudaEventSynchronize",
                              "waiting for the last step's inputs copy");
          },
          [] {
            return std::string("waiting for the last step's inputs copy");
          }));
      pending_ = false;
    }
    return host_;
  }

  absl::Status Upload(size_t bytes) override {
    if (bytes > this->bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "upload of ", bytes, " bytes into a buffer of ", this->bytes()));
    }
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(device(), host_, bytes,
                                               cudaMemcpyHostToDevice, stream_),
                               "cudaMemcpyAsync",
                               "copying the step's inputs to the GPU"));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(done_, stream_),
                               "cudaEventRecord",
                               "marking the step's inputs copy"));
    pending_ = true;
    return absl::OkStatus();
  }

 private:
  void* host_;
  cudaEvent_t done_;
  PinnableBlockAllocator* allocator_;
  cudaStream_t stream_;
  bool pending_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UploadBuffer>> CudaOps::NewUploadBuffer(
    size_t bytes) {
  const size_t size = std::max<size_t>(bytes, 1);
  ASSIGN_OR_RETURN(void* device, allocator_->Allocate(size));
  void* host = nullptr;
  absl::Status st =
      CudaStatus(cudaHostAlloc(&host, size, cudaHostAllocDefault),
                 "cudaHostAlloc", "allocating page-locked step staging");
  cudaEvent_t done = nullptr;
  if (st.ok()) {
    st = CudaStatus(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                    "cudaEventCreateWithFlags", "creating the staging event");
  }
  if (!st.ok()) {
    if (host != nullptr) cudaFreeHost(host);
    allocator_->Free(device).IgnoreError();
    return st;
  }
  return std::unique_ptr<UploadBuffer>(
      new CudaUploadBuffer(device, bytes, host, done, allocator_, stream_));
}

absl::StatusOr<Tensor> CudaOps::Upload(const TensorView& host, DType dtype) {
  const DType from = host.dtype();
  if (from != DType::kF32 && from != DType::kBF16 && from != DType::kF16 &&
      from != DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("Upload: host tensor is ", DTypeName(from),
                     ", expected f32, bf16, f16 or f8_e4m3"));
  }
  if (dtype == DType::kF8E4M3) {
    // fp8 values mean nothing without their scale, which comes with them.
    if (from != DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Upload: f8_e4m3 weights come from f8_e4m3 host data (with their "
          "scale), not ",
          DTypeName(from), "; QuantizeWeightFp8 quantizes an uploaded weight"));
    }
  } else if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend stores weights as f32, bf16 or f8_e4m3, not ",
        DTypeName(dtype)));
  }
  const size_t bytes = static_cast<size_t>(host.numel()) * DTypeSize(dtype);
  ASSIGN_OR_RETURN(void* device,
                   allocator_->Allocate(std::max<size_t>(bytes, 1)));
  PinnableBlockAllocator* allocator = allocator_;
  Tensor t = Tensor::Adopt(device, dtype, host.shape(), [allocator](void* p) {
    allocator->Free(p).IgnoreError();
  });
  if (bytes == 0) return t;
  if (from == dtype) {
    // The checkpoint's dtype is the device's: one copy, no host pass.
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy", "uploading a weight"));
    return t;
  }
  // A conversion (f32 → bf16, bf16/f16/f8_e4m3 → f32, f16/f8_e4m3 → bf16,
  // the fp8 widenings exact) on the host in slices, so the staging stays
  // small (16 MiB of f32 at most).
  constexpr int64_t kSlice = int64_t{1} << 22;
  std::vector<float> widened;
  std::vector<uint16_t> narrowed;
  const size_t from_size = DTypeSize(from);
  const size_t to_size = DTypeSize(dtype);
  for (int64_t begin = 0; begin < host.numel(); begin += kSlice) {
    const int64_t n = std::min(kSlice, host.numel() - begin);
    const char* src = static_cast<const char*>(host.data()) + begin * from_size;
    const float* f32 = reinterpret_cast<const float*>(src);
    if (from != DType::kF32) {
      widened.resize(n);
      RETURN_IF_ERROR(
          ConvertToF32(from, src, static_cast<size_t>(n), widened.data()));
      f32 = widened.data();
    }
    const void* staged = f32;
    if (dtype == DType::kBF16) {
      narrowed.resize(n);
      for (int64_t i = 0; i < n; ++i) narrowed[i] = ToBf16(f32[i]);
      staged = narrowed.data();
    }
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(static_cast<char*>(device) + begin * to_size,
                              staged, n * to_size, cudaMemcpyHostToDevice),
                   "cudaMemcpy", "uploading a converted weight"));
  }
  return t;
}

absl::StatusOr<Weight> CudaOps::DoQuantizeWeightFp8(const TensorView& weight) {
  const int64_t n = weight.shape()[0], k = weight.shape()[1];
  PinnableBlockAllocator* allocator = allocator_;
  auto release = [allocator](void* p) { allocator->Free(p).IgnoreError(); };
  ASSIGN_OR_RETURN(void* data, allocator_->Allocate(std::max<size_t>(
                                   static_cast<size_t>(n * k), 1)));
  Tensor values = Tensor::Adopt(data, DType::kF8E4M3, Shape({n, k}), release);
  ASSIGN_OR_RETURN(void* scale, allocator_->Allocate(std::max<size_t>(
                                    static_cast<size_t>(n) * 4, 4)));
  Tensor scales = Tensor::Adopt(scale, DType::kF32, Shape({n}), release);
  if (n > 0 && k > 0) {
    RETURN_IF_ERROR(Launch(
        cuda::LaunchQuantizeFp8Weights(weight.dtype() == DType::kBF16, n, k,
                                       weight.data(), data,
                                       static_cast<float*>(scale), stream_),
        "QuantizeFp8Weights"));
  } else if (n > 0) {
    // Rows of no elements are all-zero rows: scale 1.
    const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(scale, ones.data(), ones.size() * 4,
                        cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync", "setting the scales of an empty fp8 weight"));
  }
  // The caller may free the source as soon as this returns.
  RETURN_IF_ERROR(Synchronize());
  Weight w(std::move(values));
  w.scale_kind = WeightScaleKind::kPerChannel;
  w.scale = std::move(scales);
  w.activations = ActivationScaleKind::kDynamicPerToken;
  return w;
}

absl::Status CudaOps::DoConcatShards(const TensorView& gathered, int64_t shards,
                                     const TensorView& out) {
  const int64_t n = out.shape()[0], v = out.shape()[1];
  const int64_t vp = gathered.shape()[1];
  if (n == 0) return absl::OkStatus();
  for (int64_t r = 0; r < shards && r * vp < v; ++r) {
    const int64_t width = std::min(vp, v - r * vp);
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy2DAsync(out.data_as<float>() + r * vp, v * sizeof(float),
                          gathered.data_as<const float>() + r * n * vp,
                          vp * sizeof(float), width * sizeof(float), n,
                          cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpy2DAsync", "putting the vocabulary shards side by side"));
  }
  return absl::OkStatus();
}

absl::Status CudaOps::DoSample(const TensorView& logits,
                               absl::Span<const SampleRow> rows,
                               std::vector<SampleResult>* out) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t vocab = logits.shape()[1];
  if (n * vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sample: ", n, " rows of ", vocab,
                     " logits exceed the device sampler's 2^31 elements per "
                     "call"));
  }
  std::vector<cuda::DeviceSamplingParams> params(n);
  bool penalties = false;
  bool constrained = false;
  int32_t top_n = 0;
  // Every row's masked ids, ascending and distinct, one list after another.
  sample_masked_.clear();
  for (int64_t i = 0; i < n; ++i) {
    const SampleRow& r = rows[i];
    const SamplingParams& sp = *r.params;
    // The one place the device image of SamplingParams is filled.
    cuda::DeviceSamplingParams& p = params[i];
    p.temperature = sp.temperature;
    p.top_k = sp.top_k;
    p.top_p = sp.top_p;
    p.min_p = sp.min_p;
    p.log_min_p = sp.min_p > 0.0f ? sampling::MinPLog(sp.min_p) : 0.0f;
    p.repetition_penalty = sp.repetition_penalty;
    p.presence_penalty = sp.presence_penalty;
    p.frequency_penalty = sp.frequency_penalty;
    p.seed = r.seed;
    p.step = r.step;
    const size_t begin = sample_masked_.size();
    for (int32_t t : r.masked) {
      if (t >= 0 && t < vocab) sample_masked_.push_back(t);
    }
    std::sort(sample_masked_.begin() + begin, sample_masked_.end());
    sample_masked_.erase(
        std::unique(sample_masked_.begin() + begin, sample_masked_.end()),
        sample_masked_.end());
    p.masked_begin = static_cast<int32_t>(begin);
    p.masked_end = static_cast<int32_t>(sample_masked_.size());
    p.constrained = r.allowed.empty() ? 0 : 1;
    constrained = constrained || !r.allowed.empty();
    penalties = penalties || sp.has_penalties();
    top_n = std::max(top_n, r.top_logprobs);
  }
  ASSIGN_OR_RETURN(
      void* d_params,
      CopySamplingInput(kSampleParams, params.data(),
                        params.size() * sizeof(cuda::DeviceSamplingParams)));
  const int32_t* d_counts = nullptr;
  const uint8_t* d_mask = nullptr;
  if (penalties) {
    // Output-token counts and the prompt's token set, per row.
    sample_counts_.assign(static_cast<size_t>(n * vocab), 0);
    sample_mask_.assign(static_cast<size_t>(n * vocab), 0);
    for (int64_t i = 0; i < n; ++i) {
      for (int32_t t : rows[i].output) {
        if (t >= 0 && t < vocab) ++sample_counts_[i * vocab + t];
      }
      for (int32_t t : rows[i].prompt) {
        if (t >= 0 && t < vocab) sample_mask_[i * vocab + t] = 1;
      }
    }
    ASSIGN_OR_RETURN(
        void* c, CopySamplingInput(kSampleCounts, sample_counts_.data(),
                                   sample_counts_.size() * sizeof(int32_t)));
    ASSIGN_OR_RETURN(void* m,
                     CopySamplingInput(kSampleMask, sample_mask_.data(),
                                       sample_mask_.size()));
    d_counts = static_cast<const int32_t*>(c);
    d_mask = static_cast<const uint8_t*>(m);
  }
  const int32_t* d_masked = nullptr;
  if (!sample_masked_.empty()) {
    ASSIGN_OR_RETURN(
        void* m, CopySamplingInput(kSampleMasked, sample_masked_.data(),
                                   sample_masked_.size() * sizeof(int32_t)));
    d_masked = static_cast<const int32_t*>(m);
  }
  const uint32_t* d_allowed = nullptr;
  if (constrained) {
    // One bitmask per row, rows without a constraint left out of use (their
    // params say so) but kept in place so the kernel indexes by row.
    const size_t words = static_cast<size_t>((vocab + 31) / 32);
    const size_t bytes = static_cast<size_t>(n) * words * sizeof(uint32_t);
    if (allowed_copy_pending_) {
      RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_),
                                 "cudaStreamSynchronize",
                                 "waiting for the last mask upload"));
      allowed_copy_pending_ = false;
    }
    if (sample_allowed_bytes_ < bytes) {
      sample_allowed_.reset();
      sample_allowed_bytes_ = 0;
      void* host = nullptr;
      RETURN_IF_ERROR(CudaStatus(
          cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc",
          absl::StrCat("allocating ", bytes,
                       " page-locked bytes for the allowed-token masks")));
      sample_allowed_.reset(host);
      sample_allowed_bytes_ = bytes;
    }
    uint32_t* staging = static_cast<uint32_t*>(sample_allowed_.get());
    for (int64_t i = 0; i < n; ++i) {
      // Rows without a constraint are not read (their params say so).
      const absl::Span<const uint32_t> bits = rows[i].allowed;
      uint32_t* row = staging + i * words;
      std::copy(bits.begin(), bits.end(), row);
      std::fill(row + bits.size(), row + words, 0u);
    }
    ASSIGN_OR_RETURN(void* a, Grow(kSampleAllowed, bytes));
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(a, staging, bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync", "copying the allowed-token masks to the GPU"));
    allowed_copy_pending_ = true;
    d_allowed = static_cast<const uint32_t*>(a);
  }
  ASSIGN_OR_RETURN(void* scratch,
                   Grow(kSampleScratch, static_cast<size_t>(n * vocab) * 4));
  // Everything the host reads back sits in one buffer, so one copy (and one
  // wait) brings it: the tokens, their own logits, log_z, then the top ids and
  // their log-probabilities (4-byte words each).
  const size_t words = static_cast<size_t>(n) * (3 + 2 * top_n);
  ASSIGN_OR_RETURN(void* d_results, Grow(kSampleResults, words * 4));
  int32_t* d_tokens = static_cast<int32_t*>(d_results);
  float* d_chosen = reinterpret_cast<float*>(d_tokens + n);
  float* d_log_z = d_chosen + n;
  int32_t* d_top_ids = reinterpret_cast<int32_t*>(d_log_z + n);
  float* d_top_lp = reinterpret_cast<float*>(d_top_ids + n * top_n);
  RETURN_IF_ERROR(
      Launch(cuda::LaunchSample(
                 logits.data_as<const float>(), n, vocab,
                 static_cast<const cuda::DeviceSamplingParams*>(d_params),
                 d_counts, d_mask, d_masked, d_allowed,
                 static_cast<float*>(scratch), d_tokens, stream_),
             "Sample"));
  const size_t workspace_bytes = cuda::LogprobsWorkspaceBytes(n, vocab, top_n);
  ASSIGN_OR_RETURN(void* workspace, Grow(kLogprobWorkspace, workspace_bytes));
  RETURN_IF_ERROR(Launch(
      cuda::LaunchLogprobs(
          logits.data_as<const float>(), n, vocab, top_n, d_tokens, d_chosen,
          /*argmax=*/nullptr, d_log_z, top_n > 0 ? d_top_ids : nullptr,
          top_n > 0 ? d_top_lp : nullptr, workspace, workspace_bytes, stream_),
      "Logprobs"));
  sample_results_.resize(words);
  RETURN_IF_ERROR(CopyToHost(
      TensorView(d_results, DType::kI32, {static_cast<int64_t>(words)}),
      sample_results_.data()));
  // The results came back after the masks' upload (one stream).
  allowed_copy_pending_ = false;
  const auto word_as_float = [&](size_t i) {
    float f;
    std::memcpy(&f, &sample_results_[i], sizeof(f));
    return f;
  };
  const size_t top_ids_at = 3 * static_cast<size_t>(n);
  const size_t top_lp_at = top_ids_at + static_cast<size_t>(n) * top_n;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t token = sample_results_[i];
    if (token < 0 || token >= vocab) {
      return absl::InternalError(
          absl::StrCat("the device sampler returned token ", token, " for row ",
                       i, " of a vocabulary of ", vocab));
    }
    SampleResult& s = (*out)[i];
    s.token = token;
    s.logprob = word_as_float(n + i) - word_as_float(2 * n + i);
    s.top.clear();
    const int64_t top = std::min<int64_t>(rows[i].top_logprobs, vocab);
    for (int64_t k = 0; k < top; ++k) {
      s.top.emplace_back(sample_results_[top_ids_at + i * top_n + k],
                         word_as_float(top_lp_at + i * top_n + k));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaOps::DoGatherRows(const TensorView& src,
                                   const TensorView& rows,
                                   const TensorView& dst) {
  if (rows.numel() == 0) return absl::OkStatus();
  return Launch(
      cuda::LaunchGatherRows(src.data_as<const float>(),
                             rows.data_as<const int32_t>(), rows.numel(),
                             src.shape()[1], dst.data_as<float>(), stream_),
      "GatherRows");
}

absl::StatusOr<Tensor> CudaOps::StackRows(absl::Span<const TensorView> parts,
                                          const Shape& shape) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("StackRows: no parts to stack");
  }
  const DType dtype = parts[0].dtype();
  const size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  size_t total = 0;
  for (const TensorView& part : parts) {
    if (part.dtype() != dtype) {
      return absl::InvalidArgumentError("StackRows: parts of two dtypes");
    }
    total += part.nbytes();
  }
  if (total != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("StackRows: the parts hold ", total, " bytes, ",
                     shape.ToString(), " needs ", bytes));
  }
  ASSIGN_OR_RETURN(void* device,
                   allocator_->Allocate(std::max<size_t>(bytes, 1)));
  PinnableBlockAllocator* allocator = allocator_;
  Tensor t = Tensor::Adopt(device, dtype, shape, [allocator](void* p) {
    allocator->Free(p).IgnoreError();
  });
  char* dst = static_cast<char*>(device);
  for (const TensorView& part : parts) {
    if (part.nbytes() == 0) continue;
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(dst, part.data(), part.nbytes(),
                                   cudaMemcpyDeviceToDevice, stream_),
                   "cudaMemcpyAsync", "stacking weights on the device"));
    dst += part.nbytes();
  }
  // The caller may free the parts as soon as this returns.
  RETURN_IF_ERROR(Synchronize());
  return t;
}

absl::Status CudaOps::CopyToHost(const TensorView& src, void* dst) {
  if (src.numel() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, src.data(), src.nbytes(),
                                             cudaMemcpyDeviceToHost, stream_),
                             "cudaMemcpyAsync", "copying results to the host"));
  return Synchronize();
}

absl::Status CudaOps::DoEmbedding(const TensorView& table,
                                  const TensorView& ids,
                                  const TensorView& out) {
  return DoEmbeddingShard(table, ids, 0, out);
}

absl::Status CudaOps::DoEmbeddingShard(const TensorView& table,
                                       const TensorView& ids, int64_t first_id,
                                       const TensorView& out) {
  if (table.dtype() == DType::kF8E4M3) {
    // The shared checks take every weight dtype; fp8 is a Linear format.
    return absl::InvalidArgumentError(
        "Embedding: f8_e4m3 tables are not supported (fp8 is a format of "
        "Linear weights)");
  }
  if (ids.numel() == 0) return absl::OkStatus();
  return Launch(cuda::LaunchEmbedding(
                    table.data(), table.dtype() == DType::kBF16,
                    ids.data_as<const int32_t>(), ids.numel(), table.shape()[1],
                    first_id, table.shape()[0], out.data_as<float>(), stream_),
                "Embedding");
}

absl::Status CudaOps::DoRmsNorm(const TensorView& x, const TensorView& weight,
                                float eps, const TensorView& out) {
  const int64_t n = weight.shape()[0];
  if (n == 0 || x.numel() == 0) return absl::OkStatus();
  return Launch(cuda::LaunchRmsNorm(
                    x.data_as<const float>(), weight.data_as<const float>(),
                    eps, x.numel() / n, n, out.data_as<float>(), stream_),
                "RmsNorm");
}

absl::Status CudaOps::DoAdd(const TensorView& a, const TensorView& b,
                            const TensorView& out) {
  if (a.numel() == 0) return absl::OkStatus();
  return Launch(
      cuda::LaunchAdd(a.data_as<const float>(), b.data_as<const float>(),
                      a.numel(), out.data_as<float>(), stream_),
      "Add");
}

absl::Status CudaOps::DoAddRmsNorm(const TensorView& residual,
                                   const TensorView& x,
                                   const TensorView& weight, float eps,
                                   const TensorView& out) {
  if (x.numel() == 0) return absl::OkStatus();
  return Launch(cuda::LaunchAddRmsNorm(
                    residual.data_as<float>(), x.data_as<const float>(),
                    weight.data_as<const float>(), eps, x.shape()[0],
                    x.shape()[1], out.data_as<float>(), stream_),
                "AddRmsNorm");
}

absl::Status CudaOps::DoLinear(const TensorView& x, const WeightView& w,
                               const TensorView* bias, const TensorView& out) {
  const TensorView& weight = w.data;
  const int64_t t = x.shape()[0], k = x.shape()[1], n = weight.shape()[0];
  if (t == 0 || n == 0) return absl::OkStatus();
  if (IsFp8(w)) return Fp8Linear(x, w, bias, out);
  if (weight.dtype() == DType::kBF16 &&
      cuda::SkinnyGemmApplies(t, n, k, x.data(), weight.data())) {
    ASSIGN_OR_RETURN(const LinearPath path, ChooseLinearPath(x, w, bias, out));
    if (path == LinearPath::kSkinny) return SkinnyLinear(x, w, bias, out);
  }
  return CublasLtLinear(x, w, bias, out);
}

absl::Status CudaOps::Fp8Linear(const TensorView& x, const WeightView& w,
                                const TensorView* bias, const TensorView& out) {
  const int64_t t = x.shape()[0], k = x.shape()[1], n = w.data.shape()[0];
  const bool skinny =
      cuda::Fp8SkinnyGemmApplies(t, n, k, Fp8Block(w), x.data(), w.data.data(),
                                 w.scale.data_as<const float>());
  const absl::Status tensor_cores = Fp8CublasLtSupports(t, n, k, w);
  if (skinny && tensor_cores.ok()) {
    ASSIGN_OR_RETURN(const LinearPath path, ChooseLinearPath(x, w, bias, out));
    return path == LinearPath::kSkinny ? SkinnyLinear(x, w, bias, out)
                                       : CublasLtLinear(x, w, bias, out);
  }
  if (skinny) return SkinnyLinear(x, w, bias, out);
  if (tensor_cores.ok()) return CublasLtLinear(x, w, bias, out);
  return absl::UnimplementedError(absl::StrCat(
      "Linear: no fp8 kernel takes this product: ", tensor_cores.message(),
      "; the few-row kernel takes 1..", cuda::kMaxFp8SkinnyRows,
      " rows with K % 16 == 0, a block of a multiple of 16 and 16-byte "
      "aligned x and weights"));
}

absl::Status CudaOps::SkinnyLinear(const TensorView& x, const WeightView& w,
                                   const TensorView* bias,
                                   const TensorView& out) {
  const float* b = bias != nullptr ? bias->data_as<const float>() : nullptr;
  if (IsFp8(w)) {
    return Launch(
        cuda::LaunchFp8SkinnyGemm(x.shape()[0], w.data.shape()[0], x.shape()[1],
                                  x.data_as<const float>(), w.data.data(),
                                  w.scale.data_as<const float>(), Fp8Block(w),
                                  b, out.data_as<float>(), stream_),
        "Fp8SkinnyGemm");
  }
  return Launch(
      cuda::LaunchSkinnyGemm(x.shape()[0], w.data.shape()[0], x.shape()[1],
                             x.data_as<const float>(), w.data.data(), b,
                             out.data_as<float>(), stream_),
      "SkinnyGemm");
}

absl::Status CudaOps::CublasLtLinear(const TensorView& x, const WeightView& w,
                                     const TensorView* bias,
                                     const TensorView& out) {
  if (IsFp8(w)) return Fp8CublasLtLinear(x, w, bias, out);
  const TensorView& weight = w.data;
  const int64_t t = x.shape()[0], k = x.shape()[1], n = weight.shape()[0];
  const void* input = x.data();
  if (weight.dtype() == DType::kBF16) {
    ASSIGN_OR_RETURN(void* converted,
                     Grow(kGemmInput, static_cast<size_t>(t * k) * 2));
    RETURN_IF_ERROR(Launch(cuda::LaunchCastF32ToBF16(x.data_as<const float>(),
                                                     converted, t * k, stream_),
                           "CastF32ToBF16"));
    input = converted;
  }
  ASSIGN_OR_RETURN(void* workspace,
                   Grow(kGemmWorkspace, cuda::GemmPlans::kWorkspaceBytes));
  RETURN_IF_ERROR(gemm_->Matmul(t, n, k, weight.dtype(), input, weight.data(),
                                out.data_as<float>(), workspace, stream_));
  if (bias != nullptr) return DoBiasAdd(out, *bias);
  return absl::OkStatus();
}

absl::Status CudaOps::Fp8CublasLtLinear(const TensorView& x,
                                        const WeightView& w,
                                        const TensorView* bias,
                                        const TensorView& out) {
  const int64_t t = x.shape()[0], k = x.shape()[1], n = w.data.shape()[0];
  const bool block = w.scale_kind == WeightScaleKind::kBlock;
  // cuBLASLt's block scaling takes rows in fours (its scale layouts): the
  // last t % 4 rows go through the skinny kernel, which takes every shape
  // this path does (K % 16 == 0, B = 128).
  const int64_t rows = block ? t - t % 4 : t;
  ASSIGN_OR_RETURN(void* input,
                   Grow(kGemmInput, Fp8InputBytes(rows, k, block)));
  void* q = input;
  float* x_scale = reinterpret_cast<float*>(static_cast<char*>(input) +
                                            Fp8InputScalesAt(rows, k));
  const bool is_static = w.activations == ActivationScaleKind::kStatic;
  RETURN_IF_ERROR(
      Launch(cuda::LaunchQuantizeFp8Activations(
                 QuantizationOf(w.activations),
                 block ? cuda::Fp8ScaleLayout::kPerGroup
                       : cuda::Fp8ScaleLayout::kPerRow,
                 rows, k, x.data_as<const float>(),
                 is_static ? w.input_scale.data_as<const float>() : nullptr, q,
                 x_scale, stream_),
             "QuantizeFp8Activations"));
  const float* w_scale = w.scale.data_as<const float>();
  if (block) {
    // cuBLASLt reads a block scale's rows at a stride of a multiple of 4.
    const int64_t row_blocks = w.scale.shape()[0], cols = w.scale.shape()[1];
    const int64_t stride = cuda::GemmPlans::Fp8BlockScaleStride(k);
    if (stride != cols) {
      const size_t bytes = static_cast<size_t>(row_blocks * stride) * 4;
      ASSIGN_OR_RETURN(void* padded, Grow(kFp8ScalePad, bytes));
      RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(padded, 0, bytes, stream_),
                                 "cudaMemsetAsync",
                                 "padding an fp8 block scale"));
      RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy2DAsync(padded, stride * 4, w_scale, cols * 4, cols * 4,
                            row_blocks, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpy2DAsync", "padding an fp8 block scale"));
      w_scale = static_cast<const float*>(padded);
    }
  }
  ASSIGN_OR_RETURN(void* workspace,
                   Grow(kGemmWorkspace, cuda::GemmPlans::kWorkspaceBytes));
  RETURN_IF_ERROR(gemm_->MatmulFp8(
      rows, n, k,
      block ? cuda::GemmPlans::Fp8Scaling::kBlock
            : cuda::GemmPlans::Fp8Scaling::kOuterVector,
      {q, x_scale}, {w.data.data(), w_scale}, out.data_as<float>(), workspace,
      [&]() -> absl::StatusOr<void*> {
        return Grow(kFp8Bf16Output, cuda::GemmPlans::kFp8Bf16ScratchBytes);
      },
      stream_));
  if (bias != nullptr) {
    RETURN_IF_ERROR(DoBiasAdd(
        TensorView(out.data(), DType::kF32, Shape({rows, n})), *bias));
  }
  if (rows == t) return absl::OkStatus();
  return Launch(cuda::LaunchFp8SkinnyGemm(
                    t - rows, n, k, x.data_as<const float>() + rows * k,
                    w.data.data(), w.scale.data_as<const float>(), Fp8Block(w),
                    bias != nullptr ? bias->data_as<const float>() : nullptr,
                    out.data_as<float>() + rows * n, stream_),
                "Fp8SkinnyGemm");
}

absl::StatusOr<CudaOps::LinearPath> CudaOps::ChooseLinearPath(
    const TensorView& x, const WeightView& weight, const TensorView* bias,
    const TensorView& out) {
  const LinearKey key{x.shape()[0], weight.data.shape()[0], x.shape()[1],
                      bias != nullptr, LinearFormat(weight)};
  if (auto it = linear_paths_.find(key); it != linear_paths_.end()) {
    return it->second;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(stream_, &capture),
                             "cudaStreamIsCapturing",
                             "choosing a matrix product's kernel"));
  // Timing needs a synchronization, which a capture cannot record: a shape
  // first seen while capturing runs through cuBLASLt (bf16) or the skinny
  // kernel (fp8: the tensor-core path's first product would also make a plan
  // mid-capture), still undecided.
  if (capture != cudaStreamCaptureStatusNone) {
    return IsFp8(weight) ? LinearPath::kSkinny : LinearPath::kCublasLt;
  }
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {
      if (start != nullptr) cudaEventDestroy(start);
      if (stop != nullptr) cudaEventDestroy(stop);
    }
  } events;
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&events.start), "cudaEventCreate",
                             "timing a matrix product"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&events.stop), "cudaEventCreate",
                             "timing a matrix product"));
  // Each path once untimed (cuBLASLt makes and tunes its plan then), then the
  // fastest of a few timed runs of each, its own extra kernels (the input
  // cast, the bias add) included. out is overwritten each time with the
  // same product.
  auto time = [&](LinearPath path) -> absl::StatusOr<float> {
    auto run = [&]() {
      return path == LinearPath::kSkinny ? SkinnyLinear(x, weight, bias, out)
                                         : CublasLtLinear(x, weight, bias, out);
    };
    RETURN_IF_ERROR(run());
    float best = -1.0f;
    for (int rep = 0; rep < 3; ++rep) {
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(events.start, stream_),
                                 "cudaEventRecord", "timing a product"));
      RETURN_IF_ERROR(run());
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(events.stop, stream_),
                                 "cudaEventRecord", "timing a product"));
      RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(events.stop),
                                 "cudaEventSynchronize", "timing a product"));
      float ms = 0.0f;
      RETURN_IF_ERROR(
          CudaStatus(cudaEventElapsedTime(&ms, events.start, events.stop),
                     "cudaEventElapsedTime", "timing a product"));
      if (best < 0.0f || ms < best) best = ms;
    }
    return best;
  };
  ASSIGN_OR_RETURN(const float skinny_ms, time(LinearPath::kSkinny));
  ASSIGN_OR_RETURN(const float cublaslt_ms, time(LinearPath::kCublasLt));
  const LinearPath path =
      skinny_ms < cublaslt_ms ? LinearPath::kSkinny : LinearPath::kCublasLt;
  linear_paths_.emplace(key, path);
  return path;
}

absl::Status CudaOps::DoRope(const TensorView& x, const TensorView& positions,
                             const TensorView& inv_freq) {
  if (x.numel() == 0) return absl::OkStatus();
  return Launch(
      cuda::LaunchRope(x.data_as<float>(), positions.data_as<const int32_t>(),
                       inv_freq.data_as<const float>(), x.shape()[0],
                       x.shape()[1], x.shape()[2], stream_),
      "Rope");
}

absl::Status CudaOps::DoBiasAdd(const TensorView& x, const TensorView& bias) {
  if (x.numel() == 0) return absl::OkStatus();
  return Launch(
      cuda::LaunchBiasAdd(x.data_as<float>(), bias.data_as<const float>(),
                          x.shape()[0], x.shape()[1], stream_),
      "BiasAdd");
}

absl::Status CudaOps::DoScale(const TensorView& x, float factor) {
  return Launch(
      cuda::LaunchScale(x.data_as<float>(), x.numel(), factor, stream_),
      "Scale");
}

absl::Status CudaOps::DoSoftcap(const TensorView& x, float cap) {
  return Launch(
      cuda::LaunchSoftcap(x.data_as<float>(), x.numel(), cap, stream_),
      "Softcap");
}

absl::Status CudaOps::DoSiluMul(const TensorView& gate, const TensorView& up,
                                const TensorView& out) {
  if (gate.numel() == 0) return absl::OkStatus();
  return Launch(cuda::LaunchSiluMul(gate.data_as<const float>(),
                                    up.data_as<const float>(), gate.numel(),
                                    out.data_as<float>(), stream_),
                "SiluMul");
}

namespace {

// The device view of one cache layer (checked by the public op): int8's
// per-slot and fp8's per-head scales both pass as k_scale / v_scale.
cuda::DeviceKvLayer DeviceLayer(const KvCacheLayer& cache) {
  const Shape& ks = cache.k.shape();
  const Shape& vs = cache.v.shape();
  const bool quantized = cache.quantized();
  cuda::DeviceKvLayer layer;
  layer.k = cache.k.data();
  layer.v = cache.v.data();
  layer.k_scale = quantized ? cache.k_scale.data_as<float>() : nullptr;
  layer.v_scale = quantized ? cache.v_scale.data_as<float>() : nullptr;
  layer.dtype = KvDTypeOf(cache.k.dtype());
  layer.num_slots = ks[0];
  layer.num_kv_heads = static_cast<int32_t>(ks[1]);
  layer.head_dim = static_cast<int32_t>(ks[2]);
  layer.head_dim_v = static_cast<int32_t>(vs[2]);
  return layer;
}

}  // namespace

absl::Status CudaOps::DoStoreKvCache(const TensorView& k, const TensorView& v,
                                     const TensorView& slot_mapping,
                                     const KvCacheLayer& cache) {
  const cuda::DeviceKvLayer layer = DeviceLayer(cache);
  // Slots are device values: the kernel skips one outside the cache.
  if (slot_mapping.numel() == 0) return absl::OkStatus();
  return Launch(cuda::LaunchStoreKvCache(k.data_as<const float>(),
                                         v.data_as<const float>(), k.shape()[0],
                                         slot_mapping.data_as<const int64_t>(),
                                         layer, stream_),
                "StoreKvCache");
}

absl::Status CudaOps::DoGatedLinear(GatedActivationKind kind,
                                    const TensorView& x,
                                    const WeightView& gate_up,
                                    const TensorView* bias,
                                    const TensorView& gate_up_scratch,
                                    const TensorView& out) {
  const TensorView& weight = gate_up.data;
  const int64_t t = x.shape()[0], k = x.shape()[1], n = out.shape()[1];
  if (t == 0 || n == 0) return absl::OkStatus();
  if (IsFp8(gate_up)) {
    return Fp8GatedLinear(kind, x, gate_up, bias, gate_up_scratch, out);
  }
  // The skinny path decided for the unfused product (by timing,
  // ChooseLinearPath) decides the fused one.
  if (weight.dtype() == DType::kBF16 &&
      cuda::SkinnyGemmApplies(t, 2 * n, k, x.data(), weight.data())) {
    ASSIGN_OR_RETURN(const LinearPath path,
                     ChooseLinearPath(x, gate_up, bias, gate_up_scratch));
    if (path == LinearPath::kSkinny) {
      const float* b = bias != nullptr ? bias->data_as<const float>() : nullptr;
      switch (kind) {
        case GatedActivationKind::kSilu:
          return Launch(cuda::LaunchSkinnyGatedSilu(
                            t, n, k, x.data_as<const float>(), weight.data(), b,
                            out.data_as<float>(), stream_),
                        "SkinnyGatedSilu");
        case GatedActivationKind::kGeluTanh:
          return Launch(cuda::LaunchSkinnyGatedGeluTanh(
                            t, n, k, x.data_as<const float>(), weight.data(), b,
                            out.data_as<float>(), stream_),
                        "SkinnyGatedGeluTanh");
      }
    }
  }
  return Ops::DoGatedLinear(kind, x, gate_up, bias, gate_up_scratch, out);
}

absl::Status CudaOps::Fp8GatedLinear(GatedActivationKind kind,
                                     const TensorView& x,
                                     const WeightView& gate_up,
                                     const TensorView* bias,
                                     const TensorView& gate_up_scratch,
                                     const TensorView& out) {
  const int64_t t = x.shape()[0], k = x.shape()[1], n = out.shape()[1];
  const float* scale = gate_up.scale.data_as<const float>();
  const int64_t block = Fp8Block(gate_up);
  // As for bf16: the path Linear would take for the [t, 2n] product decides;
  // the skinny one is fused.
  if (cuda::Fp8SkinnyGemmApplies(t, 2 * n, k, block, x.data(),
                                 gate_up.data.data(), scale)) {
    LinearPath path = LinearPath::kSkinny;
    if (Fp8CublasLtSupports(t, 2 * n, k, gate_up).ok()) {
      ASSIGN_OR_RETURN(path,
                       ChooseLinearPath(x, gate_up, bias, gate_up_scratch));
    }
    if (path == LinearPath::kSkinny) {
      const float* b = bias != nullptr ? bias->data_as<const float>() : nullptr;
      switch (kind) {
        case GatedActivationKind::kSilu:
          return Launch(
              cuda::LaunchFp8SkinnyGatedSilu(t, n, k, x.data_as<const float>(),
                                             gate_up.data.data(), scale, block,
                                             b, out.data_as<float>(), stream_),
              "Fp8SkinnyGatedSilu");
        case GatedActivationKind::kGeluTanh:
          return Launch(
              cuda::LaunchFp8SkinnyGatedGeluTanh(
                  t, n, k, x.data_as<const float>(), gate_up.data.data(), scale,
                  block, b, out.data_as<float>(), stream_),
              "Fp8SkinnyGatedGeluTanh");
      }
    }
  }
  return Ops::DoGatedLinear(kind, x, gate_up, bias, gate_up_scratch, out);
}

absl::Status CudaOps::DoGatedActivation(GatedActivationKind kind,
                                        const TensorView& gate_up,
                                        const TensorView& out) {
  if (out.numel() == 0) return absl::OkStatus();
  switch (kind) {
    case GatedActivationKind::kSilu:
      return Launch(
          cuda::LaunchGatedSilu(gate_up.data_as<const float>(), out.shape()[0],
                                out.shape()[1], out.data_as<float>(), stream_),
          "GatedActivation");
    case GatedActivationKind::kGeluTanh:
      return Launch(cuda::LaunchGatedGeluTanh(gate_up.data_as<const float>(),
                                              out.shape()[0], out.shape()[1],
                                              out.data_as<float>(), stream_),
                    "GatedActivation");
  }
  return absl::InvalidArgumentError("GatedActivation: unknown kind");
}

absl::Status CudaOps::DoQkvRopeStore(const QkvRopeStoreArgs& a) {
  const cuda::DeviceKvLayer layer = DeviceLayer(a.cache);
  const int64_t tokens = a.q_out.shape()[0];
  if (tokens == 0) return absl::OkStatus();
  if (layer.head_dim > cuda::kMaxFusedHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("QkvRopeStore: head_dim ", layer.head_dim,
                     " is above the CUDA kernel's ", cuda::kMaxFusedHeadDim));
  }
  // The rope's tables and the step's lengths stay on the device: the kernel
  // finds each token's sequence there (graph-safe).
  cuda::DeviceRope rope;
  const RopeOptions& r = a.rope;
  rope.rotary_half = static_cast<int32_t>(a.inv_freq.shape()[0]);
  rope.cos_sin_scale = r.cos_sin_scale;
  if (r.length_scaling != RopeLengthScaling::kNone) {
    rope.length_scaling = r.length_scaling == RopeLengthScaling::kLongRope
                              ? cuda::DeviceRopeLengthScaling::kLongRope
                              : cuda::DeviceRopeLengthScaling::kDynamicNtk;
    rope.original_max_len = r.original_max_len;
    rope.long_inv_freq = r.length_scaling == RopeLengthScaling::kLongRope
                             ? r.long_inv_freq.data_as<const float>()
                             : nullptr;
    rope.base = r.base;
    rope.factor = r.factor;
    rope.factor_minus_one = r.factor_minus_one;
    rope.exponent = r.exponent;
    rope.query_start_loc = a.metadata->query_start_loc.data_as<const int32_t>();
    rope.seq_lens = a.metadata->seq_lens.data_as<const int32_t>();
    rope.num_seqs = a.metadata->num_seqs;
  }
  // Slots are device values: the kernel skips one outside the cache (-1).
  return Launch(
      cuda::LaunchQkvRopeStore(
          a.qkv.data_as<const float>(),
          static_cast<int32_t>(a.q_out.shape()[1]),
          a.q_norm != nullptr ? a.q_norm->data_as<const float>() : nullptr,
          a.k_norm != nullptr ? a.k_norm->data_as<const float>() : nullptr,
          a.eps, a.positions.data_as<const int32_t>(),
          a.inv_freq.data_as<const float>(), rope,
          a.slot_mapping.data_as<const int64_t>(), tokens, layer,
          a.q_out.data_as<float>(), stream_),
      "QkvRopeStore");
}

absl::Status CudaOps::Attention(const PagedAttentionArgs& args,
                                AttentionKind kind) {
  const AttentionMetadata* m = args.metadata;
  if (args.first_seq == args.end_seq) return absl::OkStatus();
  const cuda::DeviceKvLayer layer = DeviceLayer(args.cache);
  const Shape& qs = args.q.shape();
  cuda::DeviceAttentionMetadata dm;
  // The arrays where they are (step inputs in device memory).
  dm.query_start_loc = m->query_start_loc.data_as<const int32_t>();
  dm.context_lens = m->context_lens.data_as<const int32_t>();
  dm.seq_lens = m->seq_lens.data_as<const int32_t>();
  dm.block_tables = m->block_tables.data_as<const int32_t>();
  dm.max_blocks_per_seq = m->max_blocks_per_seq;
  dm.block_size = m->block_size;
  dm.num_seqs = m->num_seqs;
  dm.num_tokens = m->num_tokens;
  dm.max_query_len = m->max_query_len;
  dm.max_seq_len = m->max_seq_len;
  dm.grid_max_seq_len = m->grid_max_seq_len;
  const int32_t heads = static_cast<int32_t>(qs[1]);
  const float* q = args.q.data_as<const float>();
  float* out = args.out.data_as<float>();
  const absl::string_view op = AttentionOpName(kind);
  // Prefill and static attention: the tensor-core kernel for a bf16 or fp8
  // cache at head_dim 64/128 (the dispatch rule of flash_prefill.h), the
  // older kernel for everything else (it takes every cache dtype).
  if (kind != AttentionKind::kDecode &&
      cuda::FlashPrefillSupports(layer, q, out)) {
    return Launch(
        cuda::LaunchFlashPrefillAttention(
            q, heads, layer, dm, args.first_seq, args.end_seq,
            args.sliding_window, args.scale, args.softcap, out, stream_),
        op);
  }
  switch (kind) {
    case AttentionKind::kPrefill:
      return Launch(
          cuda::LaunchPrefillAttention(q, heads, layer, dm, args.first_seq,
                                       args.end_seq, args.sliding_window,
                                       args.scale, args.softcap, out, stream_),
          op);
    case AttentionKind::kDecode: {
      // The dispatch rule of decode_attention.h: f32/bf16/fp8 caches, D == Dv
      // in {64, 128}, GQA groups <= 8 take the split decode; the rest (int8
      // among them) the old kernel, which takes every cache dtype.
      if (cuda::DecodeAttentionSupported(layer, heads)) {
        int64_t max_keys =
            m->grid_max_seq_len > 0 ? m->grid_max_seq_len : m->max_seq_len;
        if (args.sliding_window > 0 && args.sliding_window < max_keys) {
          max_keys = args.sliding_window;
        }
        const size_t bytes = cuda::DecodeSplitWorkspaceBytes(
            args.end_seq - args.first_seq, heads, layer.head_dim_v, max_keys);
        ASSIGN_OR_RETURN(void* workspace,
                         Grow(kDecodeWorkspace, std::max<size_t>(bytes, 1)));
        return Launch(cuda::LaunchSplitDecodeAttention(
                          q, heads, layer, dm, args.first_seq, args.end_seq,
                          args.sliding_window, args.scale, args.softcap, out,
                          workspace, scratch_[kDecodeWorkspace].bytes, stream_),
                      op);
      }
      // Sized for the grid's bound (graph-safe launches, attention_kernels.h).
      const size_t bytes = cuda::DecodeAttentionWorkspaceBytes(
          m->num_seqs, heads, layer.head_dim_v,
          m->grid_max_seq_len > 0 ? m->grid_max_seq_len : m->max_seq_len);
      ASSIGN_OR_RETURN(void* workspace,
                       Grow(kDecodeWorkspace, std::max<size_t>(bytes, 1)));
      return Launch(cuda::LaunchDecodeAttention(
                        q, heads, layer, dm, args.first_seq, args.end_seq,
                        args.sliding_window, args.scale, args.softcap, out,
                        workspace, scratch_[kDecodeWorkspace].bytes, stream_),
                    op);
    }
    case AttentionKind::kStatic:
      break;
  }
  return Launch(
      cuda::LaunchStaticAttention(q, heads, layer, dm, args.first_seq,
                                  args.end_seq, args.sliding_window, args.scale,
                                  args.softcap, out, stream_),
      op);
}

absl::Status CudaOps::DoPrefillAttention(const PagedAttentionArgs& args) {
  return Attention(args, AttentionKind::kPrefill);
}
absl::Status CudaOps::DoDecodeAttention(const PagedAttentionArgs& args) {
  return Attention(args, AttentionKind::kDecode);
}
absl::Status CudaOps::DoStaticAttention(const PagedAttentionArgs& args) {
  return Attention(args, AttentionKind::kStatic);
}

}  // namespace tessera

namespace tessera {

int64_t CudaOps::MoeExpertsScratchBytes(int64_t tokens, int64_t top_k,
                                        int64_t experts, int64_t hidden,
                                        int64_t intermediate) const {
  return cuda::MoeExpertsScratchBytes(tokens, top_k, experts, hidden,
                                      intermediate);
}

absl::Status CudaOps::DoMoeRoute(const TensorView& logits, bool renormalize,
                                 const TensorView& topk_ids,
                                 const TensorView& topk_weights) {
  return Launch(
      cuda::LaunchMoeRoute(logits.data_as<const float>(), logits.shape()[0],
                           logits.shape()[1], topk_ids.shape()[1], renormalize,
                           topk_ids.data_as<int32_t>(),
                           topk_weights.data_as<float>(), stream_),
      "MoeRoute");
}

absl::Status CudaOps::DoMoeExperts(const MoeExpertsArgs& a) {
  if (a.gate_up.dtype() == DType::kF8E4M3) {
    // Scaled expert weights are refused by the shared checks; this is fp8
    // data without a scale, which the kernels would read as f32.
    return absl::UnimplementedError(
        "MoeExperts: fp8 expert weights are not supported yet");
  }
  cuda::MoeExpertsLaunch l;
  l.x = a.x.data_as<const float>();
  l.topk_ids = a.topk_ids.data_as<const int32_t>();
  l.topk_weights = a.topk_weights.data_as<const float>();
  l.gate_up = a.gate_up.data.data();
  l.down = a.down.data.data();
  l.weight_type = a.gate_up.dtype() == DType::kBF16 ? cuda::MoeWeightType::kBF16
                                                    : cuda::MoeWeightType::kF32;
  l.tokens = a.x.shape()[0];
  l.top_k = a.topk_ids.shape()[1];
  l.experts = a.gate_up.data.shape()[0];
  l.hidden = a.x.shape()[1];
  l.intermediate = a.gate_up.data.shape()[1] / 2;
  l.first_expert = a.first_expert;
  l.scratch = a.scratch.data();
  l.out = a.out.data_as<float>();
  return Launch(cuda::LaunchMoeExperts(l, stream_), "MoeExperts");
}

absl::Status CudaOps::DoSigmoidGatedAdd(const TensorView& gate,
                                        const TensorView& x,
                                        const TensorView& out) {
  return Launch(cuda::LaunchSigmoidGatedAdd(
                    gate.data_as<const float>(), x.data_as<const float>(),
                    x.shape()[0], x.shape()[1], out.data_as<float>(), stream_),
                "SigmoidGatedAdd");
}

}  // namespace tessera
