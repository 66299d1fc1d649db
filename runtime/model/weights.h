// The weights of one rank: which tensors a model has (a WeightTable of
// WeightSpecs, written once per architecture), how a tensor is split across
// tensor-parallel ranks (the split rules), and the tensors themselves (a
// WeightSet in the backend's memory).
//
// Weights keep the checkpoint's dtype from file to device. Loading streams
// tensor by tensor: a rank's slice is read straight from the mmapped
// safetensors when it is contiguous (replicated, rows, experts, vocabulary
// without padding, row ranges that meet), or gathered into one reused host
// staging buffer in the checkpoint's dtype when it is not (columns: strided
// rows; vocabulary with padding rows; separate row ranges). Device::Upload then
// stores it in the backend. The only conversions are the backend's (Upload):
// f32 compute on the CPU, bf16/f32 matrices on a GPU; never a host f32 copy of
// a bf16 checkpoint on a GPU.
#ifndef TESSERA_RUNTIME_MODEL_WEIGHTS_H_
#define TESSERA_RUNTIME_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/tensor.h"
#include "runtime/model/safetensors.h"

namespace tessera {

// How a tensor is divided among the ranks of a tensor-parallel group.
enum class WeightSplit {
  kReplicated,  // Every rank holds it whole (norms, row-parallel biases).
  kRows,        // Rows [begin, end) of dim 0 (q/k/v, gate/up, their biases).
  kColumns,     // Columns [begin, end) of dim 1 of a matrix (o, down).
  kVocab,       // Rows [begin, end) of dim 0 then `pad_rows` rows of zeros
                // (embedding and LM head, vocabulary-parallel).
  kExperts,     // Experts [begin, end) of dim 0 of [E, ...] (MoE).
  kRowRanges,   // Several row ranges of dim 0 (row_ranges), stacked in
                // order: this rank's q, k and v rows of a fused qkv_proj,
                // its gate and up rows of a fused gate_up_proj (Phi-3).
};

// Rows [begin, end) of dim 0 (WeightSplit::kRowRanges).
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
};

absl::string_view WeightSplitName(WeightSplit split);

// A range [begin, end) of indices along one dimension.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// One tensor of a model as one rank holds it.
struct WeightSpec {
  std::string name;  // The Hugging Face name in the checkpoint.
  Shape full;        // The whole tensor's shape, as the config implies it.
  WeightSplit split = WeightSplit::kReplicated;
  // This rank's range along the split dimension (dim 0, or dim 1 for
  // kColumns); unused for kReplicated.
  int64_t begin = 0;
  int64_t end = 0;
  int64_t pad_rows = 0;  // kVocab only.
  // kRowRanges only: the ranges, each within dim 0 (begin/end above span
  // the first range's begin to the last's end, for messages).
  std::vector<RowRange> row_ranges;
  // Stored in the backend's matrix dtype (projections, embedding, head);
  // everything else (norms, biases) is f32.
  bool matrix = false;
  // The progress part it belongs to (the embedding, each layer, the head are
  // one part each); non-decreasing along a table.
  int part = 0;

  // Stacked expert tensors under tensor parallelism (kExperts only): when
  // inner_dim > 0, each expert's slice is, along dimension inner_dim, the
  // concatenation of inner_ranges (all of one length). [E, 2I, H] gate/up
  // rows of intermediate [a, b): inner_dim 1, {[a, b), [I + a, I + b)};
  // [E, H, I] down columns: inner_dim 2, {[a, b)}.
  int inner_dim = 0;
  std::vector<IndexRange> inner_ranges;

  // Another layout the checkpoint may hold the tensor in: when it has no
  // `name`, the full tensor is the concatenation in row-major order of the
  // tensors `parts`, each of shape part_shape (the per-expert matrices of a
  // stacked expert tensor, or the same tensor under another name). Empty: no
  // other layout.
  std::vector<std::string> parts;
  Shape part_shape;

  // fp8 checkpoints (ModelConfig::quant). `fp8`: the checkpoint holds this
  // matrix as f8_e4m3 (CheckedTensor insists), its scale in the spec named
  // by FindScaleSpecs. `any_shape`: the checkpoint's tensor may have any
  // shape of full's element count (a scale [N] published as [N, 1], [1] as
  // []). `broadcast` > 0: full is {1} and the slice is that one value
  // repeated `broadcast` times (a per-tensor scale held per channel, so that
  // q/k/v stack).
  bool fp8 = false;
  bool any_shape = false;
  int64_t broadcast = 0;

  // The shape of this rank's slice.
  Shape local_shape() const;
};

// Constructors of the split rules.
WeightSpec Replicated(std::string name, Shape full, int part);
WeightSpec RowSplit(std::string name, Shape full, int64_t begin, int64_t end,
                    int part);
WeightSpec ColumnSplit(std::string name, Shape full, int64_t begin, int64_t end,
                       int part);
WeightSpec VocabSplit(std::string name, Shape full, int64_t begin, int64_t end,
                      int64_t pad_rows, int part);
WeightSpec ExpertSplit(std::string name, Shape full, int64_t begin, int64_t end,
                       int part);
// Experts [begin, end) of dim 0, and of each, `inner_ranges` along
// `inner_dim` (>= 1; see WeightSpec::inner_dim).
WeightSpec ExpertSlices(std::string name, Shape full, int64_t begin,
                        int64_t end, int inner_dim,
                        std::vector<IndexRange> inner_ranges, int part);
// `spec`, also found in a checkpoint as `parts` (see WeightSpec::parts).
WeightSpec WithParts(WeightSpec spec, std::vector<std::string> parts,
                     Shape part_shape);

// The local slice of an ExpertSlices spec (inner_dim > 0) is runs of
// ExpertSliceRunElems(spec) consecutive elements of the full tensor
// (row-major); run r of the slice starts at full element
// ExpertSliceRunStart(spec, r). (For the random weights, which make each
// element from its full index.)
int64_t ExpertSliceRunElems(const WeightSpec& spec);
int64_t ExpertSliceRunStart(const WeightSpec& spec, int64_t run);
// Adjacent ranges are merged, so a rank that holds every row (one rank, or
// ranges that meet) reads one contiguous slice.
WeightSpec RowRangesSplit(std::string name, Shape full,
                          std::vector<RowRange> ranges, int part);

// Every tensor one rank holds, in one canonical order: the order it is read,
// sent and received in.
using WeightTable = std::vector<WeightSpec>;

// How many progress parts a table has (on_part calls of LoadWeightSet).
int64_t WeightParts(const WeightTable& table);

// Bytes of `spec`'s local slice in `dtype`.
int64_t SliceBytes(const WeightSpec& spec, DType dtype);

// The dtype a backend stores `spec` in: `matrix_dtype` for matrices, f32
// otherwise; an fp8 matrix stays f8_e4m3 where matrices are bf16 (the GPU,
// whose products read fp8), and is widened to f32 elsewhere (the CPU, the
// GPU's f32 golden mode; the model then multiplies its scale in, as
// transformers dequantizes).
inline DType StoredDType(const WeightSpec& spec, DType matrix_dtype) {
  if (spec.fp8 && matrix_dtype == DType::kBF16) return DType::kF8E4M3;
  return spec.matrix ? matrix_dtype : DType::kF32;
}

// A reusable host buffer for slices that are not contiguous in the file. It
// grows to the largest such slice and is never shrunk, so a load allocates
// it at most a few times.
class HostStaging {
 public:
  // At least `bytes` of storage (contents unspecified).
  absl::StatusOr<void*> Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
};

// The checkpoint's entry for `spec`, after checking that it has the full
// shape ("<name>: expected shape [64, 256], found [128, 256]") and a
// floating-point dtype, and that a kRowRanges spec's ranges lie within dim 0.
// A missing tensor is NotFound naming it.
absl::StatusOr<TensorInfo> CheckedTensor(const Checkpoint& checkpoint,
                                         const WeightSpec& spec);

// Writes `spec`'s local slice of the contiguous full tensor `full` (in the
// checkpoint's dtype `dtype`) to `out` (SliceBytes(spec, dtype) bytes).
void CopySlice(const WeightSpec& spec, DType dtype, const void* full,
               void* out);

// This rank's slice of `spec` in the checkpoint's dtype, as a host view that
// is valid until `staging` is next used or the checkpoint closes: into the
// mapping when the slice is contiguous, else gathered into `staging`. A
// checkpoint without `spec.name` is read from spec.parts when it has them
// (each checked as CheckedTensor checks, of one dtype); NotFound names the
// tensor and its parts when it has neither, or the first missing part.
absl::StatusOr<TensorView> ReadSlice(const Checkpoint& checkpoint,
                                     const WeightSpec& spec,
                                     HostStaging* staging);

// Stores one host tensor in a backend as `dtype`: Device::Upload (UploadTo),
// or a test's counting fake.
using UploadFn =
    std::function<absl::StatusOr<Tensor>(const TensorView& host, DType dtype)>;
UploadFn UploadTo(Device* device);

// One rank's tensors in a backend's memory, by spec. Built tensor by tensor
// (Put/Store), then taken apart by the model that binds them (Take). Move-only.
class WeightSet {
 public:
  WeightSet() = default;
  explicit WeightSet(WeightTable table);
  WeightSet(WeightSet&&) = default;
  WeightSet& operator=(WeightSet&&) = default;

  const WeightTable& table() const { return table_; }
  size_t size() const { return table_.size(); }

  // Stores `host` (table()[i]'s local slice, host memory in any float dtype)
  // through `upload` (device->Upload) as StoredDType(spec, matrix_dtype).
  // DataLoss when the shape is not the slice's; FailedPrecondition when tensor
  // i is present.
  absl::Status Store(size_t i, const TensorView& host, const UploadFn& upload,
                     DType matrix_dtype);
  absl::Status Store(size_t i, const TensorView& host, Device* device,
                     DType matrix_dtype) {
    return Store(i, host, UploadTo(device), matrix_dtype);
  }
  // Places a tensor already in the backend's memory (the slice's shape).
  absl::Status Put(size_t i, Tensor tensor);

  // Whether every tensor of the table is present.
  bool complete() const;
  // The first absent tensor's name (empty when complete).
  std::string first_missing() const;

  // Whether the table lists `name`.
  bool Has(absl::string_view name) const { return index_.contains(name); }
  // The tensor named `name`, if the table has it and it is present.
  const Tensor* Find(absl::string_view name) const;
  // Moves the tensor named `name` out. NotFound naming it when the table has
  // none or it was taken or never stored.
  absl::StatusOr<Tensor> Take(absl::string_view name);

  // Bytes of the present tensors.
  int64_t bytes() const;

 private:
  WeightTable table_;
  std::vector<std::optional<Tensor>> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
};

struct WeightLoadOptions {
  // The backend the tensors are stored in (an Ops is one): `upload` when
  // set, else device->Upload (one of them is required).
  Device* device = nullptr;
  UploadFn upload;
  DType matrix_dtype = DType::kF32;
  // Called after each part of the table (see WeightSpec::part) is stored.
  std::function<void()> on_part;
  // Called after each tensor is stored: finer than on_part, so that a
  // parallel job's startup deadline (parallel/fault_monitor.h) counts a
  // layer's tensors read from a slow disk as progress one by one.
  std::function<void()> on_tensor;
  // Non-empty (the model folder): one process keeps the whole checkpoint in
  // host memory as f32 (the CPU backend), so loading first refuses, before
  // reading any tensor, a checkpoint that cannot fit (CheckHostMemoryForF32).
  std::string check_host_memory_for;
  // The memory the weights may take, when the caller knows it (the device's
  // free memory on a GPU, MemAvailable on the CPU); -1: unknown. Sources that
  // make their tensors (random weights) refuse a table that cannot fit
  // before making any.
  int64_t available_bytes = -1;
};

// Reads every tensor of `table` from `checkpoint` and stores it through
// options.device, one tensor at a time: host memory holds at most one staged
// slice (and what the backend's Upload converts in bounded pieces). Errors
// are CheckedTensor's.
absl::StatusOr<WeightSet> LoadWeightSet(const Checkpoint& checkpoint,
                                        WeightTable table,
                                        const WeightLoadOptions& options);

// The concatenation along dim 0 of `parts` (tensors in `device`'s memory of
// one dtype and equal trailing dims; a vector's dim 0 is its length), as a
// new tensor in `device`'s memory with that dtype: how a model fuses this
// rank's q/k/v (or gate/up) slices into one projection after loading, so the
// checkpoint, the weight table and the weight transfer keep the published
// tensors. A host-memory backend copies in place; any other stacks them with
// copies inside its own memory (Device::StackRows: on a GPU, no host pass),
// and one without such copies goes through one host buffer of the result's
// size: `staging` when given (reused across calls, so binding a model's
// layers allocates it once), else a buffer of its own. InvalidArgument for no
// parts or parts that do not stack.
absl::StatusOr<Tensor> ConcatRows(Device* device,
                                  absl::Span<const Tensor* const> parts,
                                  HostStaging* staging = nullptr);

// The CPU backend holds every weight as f32: ResourceExhausted ("DIR needs
// N GiB for its weights as f32 on the CPU, but only M GiB of memory is
// available") when the checkpoint's floating-point tensors cannot fit in
// MemAvailable, instead of the kernel's out-of-memory killer ending the
// process half-way through loading. For one process, which holds them all.
absl::Status CheckHostMemoryForF32(const Checkpoint& checkpoint,
                                   const std::string& model_dir);

}  // namespace tessera

#endif  // TESSERA_RUNTIME_MODEL_WEIGHTS_H_
