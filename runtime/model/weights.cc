#include "runtime/model/weights.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <new>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/core/status.h"

namespace tessera {
namespace {

WeightSpec MakeSpec(std::string name, Shape full, WeightSplit split,
                    int64_t begin, int64_t end, int64_t pad_rows, int part) {
  WeightSpec s;
  s.name = std::move(name);
  s.full = std::move(full);
  s.split = split;
  s.begin = begin;
  s.end = end;
  s.pad_rows = pad_rows;
  s.matrix = s.full.rank() == 2;
  s.part = part;
  return s;
}

// Elements of one row of dim 0 (1 for a scalar or a vector).
int64_t RowElems(const Shape& full) {
  return full.rank() <= 1 ? 1 : full.numel() / full[0];
}

bool Contiguous(const WeightSpec& spec) {
  if (spec.inner_dim > 0) return false;  // Strided expert slices.
  switch (spec.split) {
    case WeightSplit::kColumns:
      return false;
    case WeightSplit::kVocab:
      return spec.pad_rows == 0;
    case WeightSplit::kRowRanges:
      // RowRangesSplit merged the ranges that meet.
      return spec.row_ranges.size() <= 1;
    default:
      return true;
  }
}

// Rows of dim 0 in the local slice of a kRowRanges spec.
int64_t RangeRows(const WeightSpec& spec) {
  int64_t rows = 0;
  for (const RowRange& r : spec.row_ranges) rows += r.end - r.begin;
  return rows;
}

// Byte offset of the slice's first element in the full tensor (contiguous
// splits).
int64_t SliceOffset(const WeightSpec& spec, DType dtype) {
  if (spec.split == WeightSplit::kReplicated ||
      spec.split == WeightSplit::kColumns)
    return 0;
  if (spec.split == WeightSplit::kRowRanges) {
    const int64_t first =
        spec.row_ranges.empty() ? 0 : spec.row_ranges.front().begin;
    return first * RowElems(spec.full) * static_cast<int64_t>(DTypeSize(dtype));
  }
  return spec.begin * RowElems(spec.full) *
         static_cast<int64_t>(DTypeSize(dtype));
}

// MemAvailable from /proc/meminfo in bytes; -1 when it cannot be read.
int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

absl::Status CheckHostMemoryForF32(const Checkpoint& ckpt,
                                   const std::string& model_dir) {
  // Every floating-point tensor of the checkpoint, widened: checked before
  // any shape, so a checkpoint far too large fails here.
  int64_t needed = 0;
  for (const std::string& name : ckpt.Names()) {
    absl::StatusOr<TensorInfo> info = ckpt.Get(name);
    if (info.ok() && IsFloatConvertible(info->dtype))
      needed += 4 * info->shape.numel();
  }
  const int64_t available = AvailableHostBytes();
  if (available >= 0 && needed > available) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s needs %.1f GiB for its weights as f32 on the CPU, "
                        "but only %.1f GiB of memory is available",
                        model_dir, needed / kGiB, available / kGiB));
  }
  return absl::OkStatus();
}

absl::string_view WeightSplitName(WeightSplit split) {
  switch (split) {
    case WeightSplit::kReplicated:
      return "replicated";
    case WeightSplit::kRows:
      return "rows";
    case WeightSplit::kColumns:
      return "columns";
    case WeightSplit::kVocab:
      return "vocab";
    case WeightSplit::kExperts:
      return "experts";
    case WeightSplit::kRowRanges:
      return "row ranges";
  }
  return "?";
}

Shape WeightSpec::local_shape() const {
  if (broadcast > 0) return Shape({broadcast});
  absl::InlinedVector<int64_t, 4> dims(full.dims().begin(), full.dims().end());
  switch (split) {
    case WeightSplit::kReplicated:
      break;
    case WeightSplit::kRows:
    case WeightSplit::kExperts:
      if (!dims.empty()) dims[0] = end - begin;
      if (split == WeightSplit::kExperts && inner_dim > 0 &&
          inner_dim < static_cast<int>(dims.size()) && !inner_ranges.empty()) {
        dims[inner_dim] =
            static_cast<int64_t>(inner_ranges.size()) * inner_ranges[0].size();
      }
      break;
    case WeightSplit::kVocab:
      if (!dims.empty()) dims[0] = end - begin + pad_rows;
      break;
    case WeightSplit::kColumns:
      if (dims.size() >= 2) dims[1] = end - begin;
      break;
    case WeightSplit::kRowRanges:
      if (!dims.empty()) dims[0] = RangeRows(*this);
      break;
  }
  return Shape(absl::MakeConstSpan(dims));
}

WeightSpec Replicated(std::string name, Shape full, int part) {
  return MakeSpec(std::move(name), std::move(full), WeightSplit::kReplicated, 0,
                  0, 0, part);
}
WeightSpec RowSplit(std::string name, Shape full, int64_t begin, int64_t end,
                    int part) {
  return MakeSpec(std::move(name), std::move(full), WeightSplit::kRows, begin,
                  end, 0, part);
}
WeightSpec ColumnSplit(std::string name, Shape full, int64_t begin, int64_t end,
                       int part) {
  return MakeSpec(std::move(name), std::move(full), WeightSplit::kColumns,
                  begin, end, 0, part);
}
WeightSpec VocabSplit(std::string name, Shape full, int64_t begin, int64_t end,
                      int64_t pad_rows, int part) {
  return MakeSpec(std::move(name), std::move(full), WeightSplit::kVocab, begin,
                  end, pad_rows, part);
}
WeightSpec ExpertSplit(std::string name, Shape full, int64_t begin, int64_t end,
                       int part) {
  WeightSpec s = MakeSpec(std::move(name), std::move(full),
                          WeightSplit::kExperts, begin, end, 0, part);
  s.matrix = s.full.rank() >= 2;
  return s;
}

WeightSpec ExpertSlices(std::string name, Shape full, int64_t begin,
                        int64_t end, int inner_dim,
                        std::vector<IndexRange> inner_ranges, int part) {
  WeightSpec s =
      ExpertSplit(std::move(name), std::move(full), begin, end, part);
  s.inner_dim = inner_dim;
  s.inner_ranges = std::move(inner_ranges);
  return s;
}

WeightSpec WithParts(WeightSpec spec, std::vector<std::string> parts,
                     Shape part_shape) {
  spec.parts = std::move(parts);
  spec.part_shape = std::move(part_shape);
  return spec;
}

namespace {

// The product of full's dims [from, to).
int64_t DimProduct(const Shape& full, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; ++d) p *= full[d];
  return p;
}

}  // namespace

int64_t ExpertSliceRunElems(const WeightSpec& spec) {
  const int d = spec.inner_dim;
  return spec.inner_ranges[0].size() *
         DimProduct(spec.full, d + 1, spec.full.rank());
}

int64_t ExpertSliceRunStart(const WeightSpec& spec, int64_t run) {
  // Per expert: mid (the dims between 0 and inner_dim) blocks of n runs.
  const int d = spec.inner_dim;
  const int64_t n = static_cast<int64_t>(spec.inner_ranges.size());
  const int64_t mid = DimProduct(spec.full, 1, d);
  const int64_t tail = DimProduct(spec.full, d + 1, spec.full.rank());
  const int64_t e = spec.begin + run / (mid * n);
  const int64_t rem = run % (mid * n);
  const int64_t m = rem / n;
  const IndexRange& r = spec.inner_ranges[rem % n];
  return ((e * mid + m) * spec.full[d] + r.begin) * tail;
}

WeightSpec RowRangesSplit(std::string name, Shape full,
                          std::vector<RowRange> ranges, int part) {
  std::vector<RowRange> merged;
  for (const RowRange& r : ranges) {
    if (r.end == r.begin) continue;  // An empty range holds nothing.
    if (!merged.empty() && merged.back().end == r.begin) {
      merged.back().end = r.end;
    } else {
      merged.push_back(r);
    }
  }
  const int64_t begin = merged.empty() ? 0 : merged.front().begin;
  const int64_t end = merged.empty() ? 0 : merged.back().end;
  WeightSpec s = MakeSpec(std::move(name), std::move(full),
                          WeightSplit::kRowRanges, begin, end, 0, part);
  s.row_ranges = std::move(merged);
  return s;
}

int64_t WeightParts(const WeightTable& table) {
  int64_t parts = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    if (i + 1 == table.size() || table[i + 1].part != table[i].part) ++parts;
  }
  return parts;
}

int64_t SliceBytes(const WeightSpec& spec, DType dtype) {
  return spec.local_shape().numel() * static_cast<int64_t>(DTypeSize(dtype));
}

absl::StatusOr<void*> HostStaging::Reserve(size_t bytes) {
  if (bytes > capacity_) {
    data_.reset();
    capacity_ = 0;
    data_.reset(new (std::nothrow) char[bytes]);
    if (data_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes to stage a weight"));
    }
    capacity_ = bytes;
  }
  return static_cast<void*>(data_.get());
}

absl::StatusOr<TensorInfo> CheckedTensor(const Checkpoint& ckpt,
                                         const WeightSpec& spec) {
  ASSIGN_OR_RETURN(TensorInfo info, ckpt.Get(spec.name));
  // A scale published in another shape of the same size reads as `full`.
  if (spec.any_shape && info.shape.numel() == spec.full.numel()) {
    info.shape = spec.full;
  }
  if (info.shape != spec.full) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.name, ": expected shape ", spec.full.ToString(),
                     ", found ", info.shape.ToString()));
  }
  if (!IsFloatConvertible(info.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, ": dtype ", DTypeName(info.dtype), " is not a float type"));
  }
  // fp8 values without their scale (or a scale read as values) would be
  // silently wrong weights.
  if (spec.fp8 != (info.dtype == DType::kF8E4M3)) {
    return absl::InvalidArgumentError(
        spec.fp8 ? absl::StrCat(spec.name,
                                ": the quantization_config makes it an fp8 "
                                "matrix, but the checkpoint holds ",
                                DTypeName(info.dtype))
                 : absl::StrCat(spec.name,
                                ": f8_e4m3 in the checkpoint, but the "
                                "quantization_config does not quantize it "
                                "(fp8 embeddings, heads and norms are not "
                                "supported)"));
  }
  if (spec.split == WeightSplit::kRowRanges) {
    const int64_t rows = spec.full.rank() >= 1 ? spec.full[0] : 0;
    for (const RowRange& r : spec.row_ranges) {
      if (r.begin < 0 || r.begin > r.end || r.end > rows) {
        return absl::InvalidArgumentError(
            absl::StrCat(spec.name, ": rows [", r.begin, ", ", r.end,
                         ") are outside its ", rows, " rows"));
      }
    }
  }
  return info;
}

void CopySlice(const WeightSpec& spec, DType dtype, const void* full,
               void* out) {
  const size_t elem = DTypeSize(dtype);
  const char* src = static_cast<const char*>(full);
  char* dst = static_cast<char*>(out);
  if (spec.inner_dim > 0) {
    const int64_t run = ExpertSliceRunElems(spec);
    const int64_t runs = run == 0 ? 0 : spec.local_shape().numel() / run;
    const size_t width = static_cast<size_t>(run) * elem;
    for (int64_t r = 0; r < runs; ++r) {
      std::memcpy(dst + r * width, src + ExpertSliceRunStart(spec, r) * elem,
                  width);
    }
    return;
  }
  if (spec.split == WeightSplit::kColumns) {
    // Row r's columns [begin, end): one strided copy per row.
    const int64_t rows = spec.full[0], cols = spec.full[1];
    const size_t width = static_cast<size_t>(spec.end - spec.begin) * elem;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + r * width, src + (r * cols + spec.begin) * elem, width);
    }
    return;
  }
  if (spec.split == WeightSplit::kRowRanges) {
    // Each range's rows, one after the other.
    const size_t row = static_cast<size_t>(RowElems(spec.full)) * elem;
    for (const RowRange& r : spec.row_ranges) {
      const size_t n = static_cast<size_t>(r.end - r.begin) * row;
      if (n > 0) std::memcpy(dst, src + static_cast<size_t>(r.begin) * row, n);
      dst += n;
    }
    return;
  }
  const size_t offset = static_cast<size_t>(SliceOffset(spec, dtype));
  size_t body = static_cast<size_t>(spec.full.numel()) * elem;
  if (spec.split != WeightSplit::kReplicated) {
    body = static_cast<size_t>((spec.end - spec.begin) * RowElems(spec.full)) *
           elem;
  }
  if (body > 0) std::memcpy(dst, src + offset, body);
  if (spec.split == WeightSplit::kVocab && spec.pad_rows > 0) {
    std::memset(
        dst + body, 0,
        static_cast<size_t>(spec.pad_rows * RowElems(spec.full)) * elem);
  }
}

namespace {

// An ExpertSlices spec's ranges fit its tensor and have one length (the
// tables are ours, but a bad one must not read out of bounds).
absl::Status CheckInnerRanges(const WeightSpec& spec) {
  if (spec.inner_dim <= 0) return absl::OkStatus();
  const Shape& f = spec.full;
  bool ok = spec.split == WeightSplit::kExperts && f.rank() >= 2 &&
            spec.inner_dim < f.rank() && !spec.inner_ranges.empty() &&
            spec.begin >= 0 && spec.begin <= spec.end && spec.end <= f[0];
  for (const IndexRange& r : spec.inner_ranges) {
    ok = ok && r.begin >= 0 && r.begin <= r.end && r.end <= f[spec.inner_dim] &&
         r.size() == spec.inner_ranges[0].size();
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, ": the expert slice's ranges do not fit ", f.ToString()));
  }
  return absl::OkStatus();
}

// The checkpoint's parts of `spec` (WeightSpec::parts), checked: each of
// part_shape, floating point, all of one dtype, together the full tensor.
absl::StatusOr<std::vector<TensorInfo>> CheckedParts(const Checkpoint& ckpt,
                                                     const WeightSpec& spec) {
  if (static_cast<int64_t>(spec.parts.size()) * spec.part_shape.numel() !=
      spec.full.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, ": ", spec.parts.size(), " parts of ",
        spec.part_shape.ToString(), " do not make ", spec.full.ToString()));
  }
  std::vector<TensorInfo> infos;
  infos.reserve(spec.parts.size());
  for (const std::string& part : spec.parts) {
    absl::StatusOr<TensorInfo> info = ckpt.Get(part);
    if (!info.ok()) {
      return absl::NotFoundError(absl::StrCat(
          "tensor ", part, " not found (a part of ", spec.name, ")"));
    }
    // A scale published in another shape of its size ([] for [1]).
    if (spec.any_shape && info->shape.numel() == spec.part_shape.numel()) {
      info->shape = spec.part_shape;
    }
    if (info->shape != spec.part_shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(part, ": expected shape ", spec.part_shape.ToString(),
                       ", found ", info->shape.ToString()));
    }
    if (!IsFloatConvertible(info->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          part, ": dtype ", DTypeName(info->dtype), " is not a float type"));
    }
    if (!infos.empty() && info->dtype != infos[0].dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          part, ": dtype ", DTypeName(info->dtype), " differs from ",
          spec.parts[0], "'s ", DTypeName(infos[0].dtype)));
    }
    infos.push_back(*std::move(info));
  }
  return infos;
}

// Copies full elements [first, first + count) of a tensor stored as `parts`
// (each `part_elems` elements) to `dst`.
void CopyFromParts(absl::Span<const TensorInfo> parts, int64_t part_elems,
                   size_t elem, int64_t first, int64_t count, char* dst) {
  while (count > 0) {
    const int64_t p = first / part_elems;
    const int64_t offset = first % part_elems;
    const int64_t n = std::min(count, part_elems - offset);
    std::memcpy(dst, static_cast<const char*>(parts[p].data) + offset * elem,
                static_cast<size_t>(n) * elem);
    dst += static_cast<size_t>(n) * elem;
    first += n;
    count -= n;
  }
}

// `spec`'s local slice gathered from its parts, in local row-major order:
// the same bytes CopySlice writes from the whole tensor.
void CopySliceFromParts(const WeightSpec& spec,
                        absl::Span<const TensorInfo> parts, void* out) {
  const size_t elem = DTypeSize(parts[0].dtype);
  const int64_t part_elems = spec.part_shape.numel();
  char* dst = static_cast<char*>(out);
  auto copy = [&](int64_t first, int64_t count) {
    if (count <= 0) return;
    CopyFromParts(parts, part_elems, elem, first, count, dst);
    dst += static_cast<size_t>(count) * elem;
  };
  if (spec.inner_dim > 0) {
    const int64_t run = ExpertSliceRunElems(spec);
    const int64_t runs = run == 0 ? 0 : spec.local_shape().numel() / run;
    for (int64_t r = 0; r < runs; ++r) copy(ExpertSliceRunStart(spec, r), run);
    return;
  }
  const int64_t row = RowElems(spec.full);
  switch (spec.split) {
    case WeightSplit::kReplicated:
      copy(0, spec.full.numel());
      return;
    case WeightSplit::kRows:
    case WeightSplit::kExperts:
      copy(spec.begin * row, (spec.end - spec.begin) * row);
      return;
    case WeightSplit::kVocab:
      copy(spec.begin * row, (spec.end - spec.begin) * row);
      std::memset(dst, 0, static_cast<size_t>(spec.pad_rows * row) * elem);
      return;
    case WeightSplit::kColumns: {
      const int64_t rows = spec.full[0], cols = spec.full[1];
      for (int64_t r = 0; r < rows; ++r) {
        copy(r * cols + spec.begin, spec.end - spec.begin);
      }
      return;
    }
  }
}

}  // namespace

absl::StatusOr<TensorView> ReadSlice(const Checkpoint& ckpt,
                                     const WeightSpec& spec,
                                     HostStaging* staging) {
  RETURN_IF_ERROR(CheckInnerRanges(spec));
  if (!spec.parts.empty() && !ckpt.Has(spec.name)) {
    if (!ckpt.Has(spec.parts[0])) {
      return absl::NotFoundError(
          absl::StrCat("tensor ", spec.name, " not found, nor its ",
                       spec.parts.size() == 1 ? "other name " : "parts ",
                       spec.parts[0], spec.parts.size() > 1 ? ", ..." : ""));
    }
    ASSIGN_OR_RETURN(const std::vector<TensorInfo> parts,
                     CheckedParts(ckpt, spec));
    const DType dtype = parts[0].dtype;
    ASSIGN_OR_RETURN(void* out,
                     staging->Reserve(std::max<size_t>(
                         static_cast<size_t>(SliceBytes(spec, dtype)), 1)));
    CopySliceFromParts(spec, parts, out);
    return TensorView(out, dtype, spec.local_shape());
  }
  ASSIGN_OR_RETURN(const TensorInfo info, CheckedTensor(ckpt, spec));
  const Shape local = spec.local_shape();
  if (spec.broadcast > 0) {
    const size_t elem = DTypeSize(info.dtype);
    ASSIGN_OR_RETURN(
        void* out,
        staging->Reserve(static_cast<size_t>(spec.broadcast) * elem));
    for (int64_t i = 0; i < spec.broadcast; ++i) {
      std::memcpy(static_cast<char*>(out) + i * elem, info.data, elem);
    }
    return TensorView(out, info.dtype, local);
  }
  if (Contiguous(spec)) {
    const char* data =
        static_cast<const char*>(info.data) + SliceOffset(spec, info.dtype);
    // Upload only reads it; the mapping is read-only.
    return TensorView(const_cast<char*>(data), info.dtype, local);
  }
  ASSIGN_OR_RETURN(
      void* out,
      staging->Reserve(static_cast<size_t>(SliceBytes(spec, info.dtype))));
  CopySlice(spec, info.dtype, info.data, out);
  return TensorView(out, info.dtype, local);
}

WeightSet::WeightSet(WeightTable table)
    : table_(std::move(table)), tensors_(table_.size()) {
  for (size_t i = 0; i < table_.size(); ++i) index_[table_[i].name] = i;
}

absl::Status WeightSet::Put(size_t i, Tensor tensor) {
  if (i >= table_.size()) {
    return absl::DataLossError(absl::StrCat("weight #", i, ": the table has ",
                                            table_.size(), " tensors"));
  }
  const WeightSpec& spec = table_[i];
  if (tensor.shape() != spec.local_shape()) {
    return absl::DataLossError(
        absl::StrCat(spec.name, ": got shape ", tensor.shape().ToString(),
                     ", this rank's ", WeightSplitName(spec.split),
                     " slice is ", spec.local_shape().ToString()));
  }
  if (tensors_[i].has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.name, " was stored twice"));
  }
  tensors_[i] = std::move(tensor);
  return absl::OkStatus();
}

UploadFn UploadTo(Device* device) {
  return [device](const TensorView& host, DType dtype) {
    return device->Upload(host, dtype);
  };
}

absl::Status WeightSet::Store(size_t i, const TensorView& host,
                              const UploadFn& upload, DType matrix_dtype) {
  if (i >= table_.size()) {
    return absl::DataLossError(absl::StrCat("weight #", i, ": the table has ",
                                            table_.size(), " tensors"));
  }
  const WeightSpec& spec = table_[i];
  if (host.shape() != spec.local_shape()) {
    return absl::DataLossError(
        absl::StrCat(spec.name, ": got shape ", host.shape().ToString(),
                     ", this rank's ", WeightSplitName(spec.split),
                     " slice is ", spec.local_shape().ToString()));
  }
  absl::StatusOr<Tensor> stored = upload(host, StoredDType(spec, matrix_dtype));
  if (!stored.ok()) {
    return Annotate(stored.status(), absl::StrCat("uploading ", spec.name));
  }
  return Put(i, *std::move(stored));
}

bool WeightSet::complete() const { return first_missing().empty(); }

std::string WeightSet::first_missing() const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i].has_value()) return table_[i].name;
  }
  return "";
}

const Tensor* WeightSet::Find(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end() || !tensors_[it->second].has_value()) return nullptr;
  return &*tensors_[it->second];
}

absl::StatusOr<Tensor> WeightSet::Take(absl::string_view name) {
  auto it = index_.find(name);
  if (it == index_.end() || !tensors_[it->second].has_value()) {
    return absl::NotFoundError(
        absl::StrCat("weight ", name, " is not in this rank's weight set"));
  }
  Tensor t = std::move(*tensors_[it->second]);
  tensors_[it->second].reset();
  return t;
}

int64_t WeightSet::bytes() const {
  int64_t bytes = 0;
  for (const std::optional<Tensor>& t : tensors_) {
    if (t.has_value()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

absl::StatusOr<Tensor> ConcatRows(Device* device,
                                  absl::Span<const Tensor* const> parts,
                                  HostStaging* staging) {
  if (device == nullptr || parts.empty() || parts[0] == nullptr ||
      parts[0]->shape().rank() < 1) {
    return absl::InvalidArgumentError("ConcatRows: no parts to stack");
  }
  const DType dtype = parts[0]->dtype();
  const Shape& first = parts[0]->shape();
  absl::InlinedVector<int64_t, 4> dims(first.dims().begin(),
                                       first.dims().end());
  dims[0] = 0;
  for (const Tensor* part : parts) {
    const Shape& s = part == nullptr ? first : part->shape();
    bool stacks =
        part != nullptr && part->dtype() == dtype && s.rank() == first.rank();
    for (int i = 1; stacks && i < s.rank(); ++i) stacks = s[i] == first[i];
    if (!stacks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ConcatRows: ", part == nullptr ? "a null part" : s.ToString(),
          " does not stack on ", first.ToString(), " ", DTypeName(dtype)));
    }
    dims[0] += s[0];
  }
  const Shape shape(absl::MakeConstSpan(dims));
  const size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  if (device->host_memory()) {
    ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dtype, shape));
    char* dst = static_cast<char*>(out.data());
    for (const Tensor* part : parts) {
      if (part->nbytes() > 0) std::memcpy(dst, part->data(), part->nbytes());
      dst += part->nbytes();
    }
    return out;
  }
  std::vector<TensorView> views;
  views.reserve(parts.size());
  for (const Tensor* part : parts) views.push_back(part->view());
  absl::StatusOr<Tensor> stacked = device->StackRows(views, shape);
  if (!absl::IsUnimplemented(stacked.status())) return stacked;
  // A backend without device-to-device copies: one round trip.
  HostStaging own;
  ASSIGN_OR_RETURN(void* host, (staging != nullptr ? staging : &own)
                                   ->Reserve(std::max<size_t>(bytes, 1)));
  char* dst = static_cast<char*>(host);
  for (const Tensor* part : parts) {
    RETURN_IF_ERROR(device->CopyToHost(part->view(), dst));
    dst += part->nbytes();
  }
  return device->Upload(TensorView(host, dtype, shape), dtype);
}

absl::StatusOr<WeightSet> LoadWeightSet(const Checkpoint& ckpt,
                                        WeightTable table,
                                        const WeightLoadOptions& options) {
  if (options.device == nullptr && !options.upload) {
    return absl::InvalidArgumentError("LoadWeightSet: no backend");
  }
  const UploadFn upload =
      options.upload ? options.upload : UploadTo(options.device);
  if (!options.check_host_memory_for.empty()) {
    RETURN_IF_ERROR(CheckHostMemoryForF32(ckpt, options.check_host_memory_for));
  }
  WeightSet set(std::move(table));
  HostStaging staging;
  for (size_t i = 0; i < set.size(); ++i) {
    const WeightSpec& spec = set.table()[i];
    ASSIGN_OR_RETURN(const TensorView host, ReadSlice(ckpt, spec, &staging));
    RETURN_IF_ERROR(set.Store(i, host, upload, options.matrix_dtype));
    if (options.on_tensor) options.on_tensor();
    const bool part_done =
        i + 1 == set.size() || set.table()[i + 1].part != spec.part;
    if (part_done && options.on_part) options.on_part();
  }
  return set;
}

}  // namespace tessera
