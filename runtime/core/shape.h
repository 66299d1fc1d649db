// Shape: the dimensions of a dense row-major tensor (outermost first).
#ifndef TESSERA_RUNTIME_CORE_SHAPE_H_
#define TESSERA_RUNTIME_CORE_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace tessera {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(absl::Span<const int64_t> dims)
      : dims_(dims.begin(), dims.end()) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[i]; }
  int64_t operator[](int i) const { return dims_[i]; }
  absl::Span<const int64_t> dims() const { return dims_; }

  // Product of the dimensions; 1 for a scalar (rank 0).
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }

  // "[4, 64]"
  std::string ToString() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.dims_ == b.dims_;
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  absl::InlinedVector<int64_t, 4> dims_;
};

}  // namespace tessera

#endif  // TESSERA_RUNTIME_CORE_SHAPE_H_
