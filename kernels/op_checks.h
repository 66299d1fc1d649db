// Argument checks shared by the backends' ops, so that the CPU reference and
// the GPU refuse the same inputs with the same messages.
#ifndef TESSERA_KERNELS_OP_CHECKS_H_
#define TESSERA_KERNELS_OP_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/core/tensor.h"

namespace tessera {

// InvalidArgument unless `t` has dtype `want` and storage (when non-empty).
inline absl::Status CheckDType(absl::string_view op, absl::string_view name,
                               const TensorView& t, DType want) {
  if (t.dtype() != want) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be ",
                                                   DTypeName(want), ", got ",
                                                   DTypeName(t.dtype())));
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " has no storage"));
  }
  return absl::OkStatus();
}

// "Op: what (a vs b)".
inline absl::Status ShapeError(absl::string_view op, absl::string_view what,
                               const Shape& a, const Shape& b) {
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", what, " (", a.ToString(), " vs ", b.ToString(), ")"));
}

// A step array (ops.h): `dtype`, rank 1, with storage when non-empty.
inline absl::Status CheckStepArray(absl::string_view op, absl::string_view name,
                                   const TensorView& t, DType dtype) {
  if (absl::Status s = CheckDType(op, name, t, dtype); !s.ok()) return s;
  if (t.shape().rank() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " must be a vector, got ", t.shape().ToString()));
  }
  return absl::OkStatus();
}

// GatherRows: f32 src [R, N], rows kI32 [n], dst [n, N]. The rows' values are
// checked by a backend that can read them (GatherRowsInRange).
inline absl::Status CheckGatherRows(const TensorView& src,
                                    const TensorView& rows,
                                    const TensorView& dst) {
  if (absl::Status s = CheckDType("GatherRows", "src", src, DType::kF32);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDType("GatherRows", "dst", dst, DType::kF32);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckStepArray("GatherRows", "rows", rows, DType::kI32);
      !s.ok()) {
    return s;
  }
  if (src.shape().rank() != 2 || dst.shape().rank() != 2 ||
      dst.shape()[0] != rows.shape()[0] || dst.shape()[1] != src.shape()[1]) {
    return ShapeError("GatherRows", "src [R, N] and dst [rows, N] disagree",
                      src.shape(), dst.shape());
  }
  return absl::OkStatus();
}

// Every row in [0, num_rows) (host rows).
inline absl::Status GatherRowsInRange(absl::Span<const int32_t> rows,
                                      int64_t num_rows) {
  for (int32_t r : rows) {
    if (r < 0 || r >= num_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("GatherRows: row ", r, " of ", num_rows));
    }
  }
  return absl::OkStatus();
}

// ConcatShards: f32 gathered [shards * n, Vp] covering out [n, V].
inline absl::Status CheckConcatShards(const TensorView& gathered,
                                      int64_t shards, const TensorView& out) {
  if (absl::Status s =
          CheckDType("ConcatShards", "gathered", gathered, DType::kF32);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDType("ConcatShards", "out", out, DType::kF32);
      !s.ok()) {
    return s;
  }
  if (shards < 1 || gathered.shape().rank() != 2 || out.shape().rank() != 2 ||
      gathered.shape()[0] != shards * out.shape()[0] ||
      gathered.shape()[1] * shards < out.shape()[1]) {
    return ShapeError("ConcatShards",
                      "gathered [shards * n, Vp] cannot fill out [n, V]",
                      gathered.shape(), out.shape());
  }
  return absl::OkStatus();
}

}  // namespace tessera

#endif  // TESSERA_KERNELS_OP_CHECKS_H_
