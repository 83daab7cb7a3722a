// shape: the dimensions of a tensor.
//
// A small value type: up to `inline_rank` dimensions live inside the object, more go to the
// heap, so the shapes of the tensors a kernel sees cost no allocation. A dimension of -1 is
// unknown; such shapes appear only during shape inference (`is_fully_defined()` tells).
// Rank 0 is a scalar with one element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace loom {

class shape {
 public:
  static constexpr std::size_t inline_rank = 6;
  static constexpr std::int64_t unknown = -1;

  shape() noexcept = default;
  shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
  explicit shape(std::span<const std::int64_t> dims) { assign(dims.data(), dims.size()); }
  explicit shape(const std::vector<std::int64_t>& dims) { assign(dims.data(), dims.size()); }
  /// A shape of `rank` dimensions, each `fill`.
  static shape filled(std::size_t rank, std::int64_t fill);

  shape(const shape& o) { assign(o.data(), o.rank_); }
  shape(shape&& o) noexcept;
  shape& operator=(const shape& o);
  shape& operator=(shape&& o) noexcept;
  ~shape() = default;

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] const std::int64_t* data() const noexcept { return heap_ ? heap_.get() : inline_; }
  [[nodiscard]] std::int64_t* data() noexcept { return heap_ ? heap_.get() : inline_; }
  [[nodiscard]] std::int64_t operator[](std::size_t i) const noexcept { return data()[i]; }
  [[nodiscard]] std::int64_t& operator[](std::size_t i) noexcept { return data()[i]; }
  [[nodiscard]] const std::int64_t* begin() const noexcept { return data(); }
  [[nodiscard]] const std::int64_t* end() const noexcept { return data() + rank_; }
  [[nodiscard]] std::span<const std::int64_t> dims() const noexcept { return {data(), rank_}; }
  [[nodiscard]] std::vector<std::int64_t> to_vector() const { return {begin(), end()}; }

  /// Product of the dimensions (1 for a scalar). Unknown dimensions count as 0 here; callers
  /// that may hold them check is_fully_defined() first.
  [[nodiscard]] std::int64_t num_elements() const noexcept;
  [[nodiscard]] bool is_fully_defined() const noexcept;
  /// Wraps a possibly negative axis into [0, rank); throws loom::invalid_argument (naming the
  /// axis and the shape) when it is out of range.
  [[nodiscard]] std::size_t normalize_axis(std::int64_t axis) const;

  void push_back(std::int64_t d);
  void resize(std::size_t rank, std::int64_t fill = 1);

  friend bool operator==(const shape& a, const shape& b) noexcept;

 private:
  void assign(const std::int64_t* dims, std::size_t rank);

  std::size_t rank_ = 0;
  std::int64_t inline_[inline_rank] = {};
  std::unique_ptr<std::int64_t[]> heap_;
};

/// "[2, 3]", "[]" for a scalar, "?" for an unknown dimension.
std::string to_string(const shape& s);

/// Row-major strides (in elements) of a contiguous tensor of shape `s`.
shape contiguous_strides(const shape& s);

/// NumPy broadcasting of two shapes; throws loom::invalid_argument naming both shapes when
/// they are incompatible. Unknown dimensions broadcast to unknown (or to the other side's
/// known dimension when it is not 1).
shape broadcast_shapes(const shape& a, const shape& b);

}  // namespace loom
