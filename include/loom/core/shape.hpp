// shape: the dimensions of a tensor.
//
// A small value type: up to `inline_rank` dimensions live inside the object, more go to the
// heap, so the shapes of the tensors a kernel sees cost no allocation. A dimension of -1 is
// unknown; such shapes appear only during shape inference (`is_fully_defined()` tells).
// Rank 0 is a scalar with one element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
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
  static shape filled(std::size_t rank, std::int64_t fill) {
    shape s;
    if (rank <= inline_rank) {
      s.rank_ = rank;
      for (std::size_t i = 0; i < rank; ++i) s.inline_[i] = fill;
    } else {
      s.resize(rank, fill);
    }
    return s;
  }

  // Copies and moves of shapes up to inline_rank dimensions are a fixed-size copy, inline:
  // kernels copy shapes on every call.
  shape(const shape& o) : rank_(o.rank_) {
    if (o.heap_) {
      copy_heap(o);
    } else {
      std::memcpy(inline_, o.inline_, sizeof(inline_));
    }
  }
  shape(shape&& o) noexcept : rank_(o.rank_), heap_(std::move(o.heap_)) {
    std::memcpy(inline_, o.inline_, sizeof(inline_));
    o.rank_ = 0;
  }
  shape& operator=(const shape& o) {
    if (this != &o) {
      if (o.heap_ || heap_) {
        assign(o.data(), o.rank_);
      } else {
        rank_ = o.rank_;
        std::memcpy(inline_, o.inline_, sizeof(inline_));
      }
    }
    return *this;
  }
  shape& operator=(shape&& o) noexcept {
    if (this != &o) {
      rank_ = o.rank_;
      heap_ = std::move(o.heap_);
      std::memcpy(inline_, o.inline_, sizeof(inline_));
      o.rank_ = 0;
    }
    return *this;
  }
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
  [[nodiscard]] std::int64_t num_elements() const noexcept {
    std::int64_t n = 1;
    for (std::int64_t d : dims()) n *= d < 0 ? 0 : d;
    return n;
  }
  [[nodiscard]] bool is_fully_defined() const noexcept {
    for (std::int64_t d : dims()) {
      if (d < 0) return false;
    }
    return true;
  }
  /// Wraps a possibly negative axis into [0, rank); throws loom::invalid_argument (naming the
  /// axis and the shape) when it is out of range.
  [[nodiscard]] std::size_t normalize_axis(std::int64_t axis) const;

  void push_back(std::int64_t d) {
    if (!heap_ && rank_ < inline_rank) {
      inline_[rank_++] = d;
    } else {
      grow_by_one(d);
    }
  }
  void resize(std::size_t rank, std::int64_t fill = 1);

  friend bool operator==(const shape& a, const shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (std::size_t i = 0; i < a.rank_; ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }

 private:
  void assign(const std::int64_t* dims, std::size_t rank);
  void copy_heap(const shape& o);
  void grow_by_one(std::int64_t d);

  // Invariant: heap_ is set exactly when rank_ > inline_rank; inline_ is always initialised
  // (so it can be copied whole).
  std::size_t rank_ = 0;
  std::int64_t inline_[inline_rank] = {};
  std::unique_ptr<std::int64_t[]> heap_;
};

/// "[2, 3]", "[]" for a scalar, "?" for an unknown dimension.
std::string to_string(const shape& s);

/// Row-major strides (in elements) of a contiguous tensor of shape `s`.
inline shape contiguous_strides(const shape& s) {
  shape strides = shape::filled(s.rank(), 1);
  std::int64_t acc = 1;
  for (std::size_t i = s.rank(); i-- > 0;) {
    strides[i] = acc;
    acc *= s[i] > 1 ? s[i] : 1;
  }
  return strides;
}

/// NumPy broadcasting of two shapes; throws loom::invalid_argument naming both shapes when
/// they are incompatible. Unknown dimensions broadcast to unknown (or to the other side's
/// known dimension when it is not 1).
shape broadcast_shapes(const shape& a, const shape& b);

}  // namespace loom
