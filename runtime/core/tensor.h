// Dense row-major tensors: `Tensor` owns host storage, `TensorView` borrows it.
//
// Memory layout: element (i0, i1, ..., ik) of shape [d0, d1, ..., dk] lives at
// ((i0 * d1 + i1) * d2 + ...) * dtype size bytes from data(). Storage is
// 64-byte aligned so SIMD loads and OpenBLAS never see a misaligned row start.
//
// Thread safety: none; a tensor is owned by one step at a time. Views do not
// keep storage alive: the owner must outlive them.
#ifndef TESSERA_RUNTIME_CORE_TENSOR_H_
#define TESSERA_RUNTIME_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"

namespace tessera {

// A non-owning view of contiguous elements.
class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape)
      : data_(data), dtype_(dtype), shape_(std::move(shape)) {}

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const {
    return static_cast<size_t>(numel()) * DTypeSize(dtype_);
  }

  // Rows [begin, end) of the outermost dimension, as a view of the same rank.
  TensorView Rows(int64_t begin, int64_t end) const;

  // The same elements under another shape with the same element count.
  absl::StatusOr<TensorView> Reshape(Shape shape) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

// Owns a contiguous, 64-byte-aligned host buffer. Move-only.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;

  // Uninitialised storage for `shape`. Fails on a negative dimension.
  static absl::StatusOr<Tensor> Empty(DType dtype, Shape shape);
  // Zero-filled storage.
  static absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape);
  // Takes ownership of storage that lives elsewhere (device memory, a pool):
  // `release` is called once with `data` when the tensor dies.
  static Tensor Adopt(void* data, DType dtype, Shape shape,
                      std::function<void(void*)> release);

  void* data() const { return storage_.get(); }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const {
    return static_cast<size_t>(numel()) * DTypeSize(dtype_);
  }

  TensorView view() const { return TensorView(data(), dtype_, shape_); }

 private:
  // Frees host storage with free(), or calls the adopted release function.
  struct Deleter {
    std::function<void(void*)> release;
    void operator()(void* p) const;
  };

  std::unique_ptr<void, Deleter> storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_TENSOR_H_
