// tensor: a typed, shaped view of a buffer.
//
// A tensor is (buffer, dtype, shape, strides, offset). Strides and the offset count
// elements, as NumPy's count bytes; a broadcast view has stride 0. Copying a tensor copies
// the view and shares the buffer. A default-constructed tensor is undefined (`defined()` is
// false). Kernels accept any strides; those that need dense memory ask the kernel context
// for a contiguous input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "loom/core/buffer.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"

namespace loom {

class tensor {
 public:
  tensor() = default;
  /// A contiguous tensor over `buf` from its first byte. Throws loom::invalid_argument when
  /// the buffer is too small for the shape.
  tensor(buffer_ptr buf, dtype t, shape s);
  /// A strided view: element (i0, i1, ...) lives at offset + Σ ik·strides[k]. Throws
  /// loom::invalid_argument when any element would fall outside the buffer.
  static tensor strided(buffer_ptr buf, dtype t, shape s, shape strides, std::int64_t offset);

  [[nodiscard]] bool defined() const noexcept { return static_cast<bool>(buf_); }
  [[nodiscard]] dtype type() const noexcept { return dtype_; }
  [[nodiscard]] const loom::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] const loom::shape& strides() const noexcept { return strides_; }
  [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
  [[nodiscard]] std::size_t rank() const noexcept { return shape_.rank(); }
  [[nodiscard]] std::int64_t dim(std::size_t i) const noexcept { return shape_[i]; }
  [[nodiscard]] std::int64_t num_elements() const noexcept { return shape_.num_elements(); }
  /// Bytes the elements take when dense (num_elements × element size).
  [[nodiscard]] std::size_t nbytes() const noexcept {
    return static_cast<std::size_t>(num_elements()) * size_of(dtype_);
  }
  [[nodiscard]] bool is_contiguous() const noexcept { return contiguous_; }
  [[nodiscard]] device_id device() const noexcept { return buf_ ? buf_->device() : device_id{}; }
  [[nodiscard]] const buffer_ptr& buf() const noexcept { return buf_; }

  /// Address of the element at index 0 (the buffer's data plus the offset).
  [[nodiscard]] void* raw_data() const noexcept {
    return static_cast<std::byte*>(buf_->data()) + offset_ * static_cast<std::int64_t>(size_of(dtype_));
  }
  /// Typed address of element 0; throws loom::invalid_argument when T is not the dtype.
  template <class T>
  [[nodiscard]] T* data() const {
    if (dtype_v<T> != dtype_) throw_dtype_mismatch(dtype_v<T>);
    return static_cast<T*>(raw_data());
  }
  /// The elements of a contiguous tensor as a span (throws when not contiguous).
  template <class T>
  [[nodiscard]] std::span<T> span() const {
    require_contiguous("span");
    return {data<T>(), static_cast<std::size_t>(num_elements())};
  }

  /// The same elements under another shape of equal element count (contiguous only).
  [[nodiscard]] tensor reshaped(loom::shape s) const;

  /// "float32[2, 3] on cpu:0".
  [[nodiscard]] std::string describe() const;

 private:
  [[noreturn]] void throw_dtype_mismatch(dtype asked) const;
  void require_contiguous(const char* what) const;

  buffer_ptr buf_;
  dtype dtype_ = dtype::f32;
  loom::shape shape_;
  loom::shape strides_;
  std::int64_t offset_ = 0;
  bool contiguous_ = true;
};

/// Copies the elements of `src`, in row-major order, to dense memory at `dst` (host memory
/// on both sides). Handles any strides, including 0.
void copy_to_dense(const tensor& src, void* dst);

}  // namespace loom
