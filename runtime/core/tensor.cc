#include "runtime/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

std::string Shape::ToString() const {
  return absl::StrCat("[", absl::StrJoin(dims_, ", "), "]");
}

TensorView TensorView::Rows(int64_t begin, int64_t end) const {
  const int64_t row_elems =
      shape_.rank() == 0 ? 1 : shape_.numel() / std::max<int64_t>(shape_[0], 1);
  absl::InlinedVector<int64_t, 4> dims(shape_.dims().begin(),
                                       shape_.dims().end());
  dims[0] = end - begin;
  return TensorView(
      static_cast<char*>(data_) + begin * row_elems * DTypeSize(dtype_), dtype_,
      Shape(absl::MakeConstSpan(dims)));
}

absl::StatusOr<TensorView> TensorView::Reshape(Shape shape) const {
  if (shape.numel() != numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot reshape ", shape_.ToString(), " to ", shape.ToString()));
  }
  return TensorView(data_, dtype_, std::move(shape));
}

void Tensor::Deleter::operator()(void* p) const {
  if (release) {
    release(p);
  } else {
    std::free(p);
  }
}

Tensor Tensor::Adopt(void* data, DType dtype, Shape shape,
                     std::function<void(void*)> release) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ =
      std::unique_ptr<void, Deleter>(data, Deleter{std::move(release)});
  return t;
}

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, Shape shape) {
  for (int64_t d : shape.dims()) {
    if (d < 0)
      return absl::InvalidArgumentError("negative dimension in " +
                                        shape.ToString());
  }
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  constexpr size_t kAlign = 64;
  const size_t bytes =
      (std::max<size_t>(t.nbytes(), 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host allocation of ", bytes, " bytes for tensor ",
                     t.shape_.ToString(), " failed"));
  }
  t.storage_.reset(p);
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, Shape shape) {
  auto t = Empty(dtype, std::move(shape));
  if (t.ok()) std::memset(t->data(), 0, t->nbytes());
  return t;
}

}  // namespace tessera
