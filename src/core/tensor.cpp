#include "loom/core/tensor.hpp"

#include <fmt/format.h>

#include <cstring>

namespace loom {

tensor::tensor(buffer_ptr buf, dtype t, loom::shape s)
    : buf_(std::move(buf)), dtype_(t), shape_(std::move(s)), strides_(contiguous_strides(shape_)) {
  if (!shape_.is_fully_defined()) {
    throw invalid_argument(fmt::format("tensor shape {} has unknown dimensions", to_string(shape_)));
  }
  if (buf_ && nbytes() > buf_->bytes()) {
    throw invalid_argument(fmt::format("a {} needs {} bytes but its buffer holds {}", describe(),
                                       nbytes(), buf_->bytes()));
  }
}

tensor tensor::strided(buffer_ptr buf, dtype t, loom::shape s, loom::shape strides,
                       std::int64_t offset) {
  if (strides.rank() != s.rank()) {
    throw invalid_argument(fmt::format("strides {} do not match shape {}", to_string(strides),
                                       to_string(s)));
  }
  if (!s.is_fully_defined()) {
    throw invalid_argument(fmt::format("tensor shape {} has unknown dimensions", to_string(s)));
  }
  tensor out;
  out.buf_ = std::move(buf);
  out.dtype_ = t;
  out.offset_ = offset;
  // Element range the view touches, to check it against the buffer.
  std::int64_t lo = offset;
  std::int64_t hi = offset;
  const bool empty = s.num_elements() == 0;
  // An empty view touches nothing, whatever its strides; a non-empty one whose reach does not
  // fit in 64 bits cannot fit in any buffer.
  for (std::size_t i = 0; i < s.rank() && !empty; ++i) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(s[i] - 1, strides[i], &span) ||
        __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi)) {
      throw invalid_argument(fmt::format(
          "strided view (shape {}, strides {}, offset {}) reaches beyond 64-bit element offsets",
          to_string(s), to_string(strides), offset));
    }
  }
  const auto capacity = out.buf_ ? static_cast<std::int64_t>(out.buf_->bytes() / size_of(t)) : 0;
  if (!empty && (lo < 0 || hi >= capacity)) {
    throw invalid_argument(fmt::format(
        "strided view (shape {}, strides {}, offset {}) reaches elements [{}, {}] outside a "
        "buffer of {} elements",
        to_string(s), to_string(strides), offset, lo, hi, capacity));
  }
  out.contiguous_ = strides == contiguous_strides(s);
  if (!out.contiguous_) {
    // Dimensions of size 1 may carry any stride and still be dense.
    bool dense = true;
    std::int64_t expect = 1;
    for (std::size_t i = s.rank(); i-- > 0;) {
      if (s[i] == 1) continue;
      if (strides[i] != expect) dense = false;
      expect *= s[i];
    }
    out.contiguous_ = dense || empty;
  }
  out.shape_ = std::move(s);
  out.strides_ = std::move(strides);
  return out;
}

tensor tensor::reshaped(loom::shape s) const {
  require_contiguous("reshaped");
  if (s.num_elements() != num_elements() || !s.is_fully_defined()) {
    throw invalid_argument(fmt::format("cannot reshape {} to {}: {} elements vs {}", describe(),
                                       to_string(s), num_elements(), s.num_elements()));
  }
  tensor out = *this;
  out.strides_ = contiguous_strides(s);
  out.shape_ = std::move(s);
  out.contiguous_ = true;
  return out;
}

std::string tensor::describe() const {
  return fmt::format("{}{} on {}", to_string(dtype_), to_string(shape_), to_string(device()));
}

void tensor::throw_dtype_mismatch(dtype asked) const {
  throw invalid_argument(
      fmt::format("tensor is {}, accessed as {}", describe(), to_string(asked)));
}

void tensor::require_contiguous(const char* what) const {
  if (!contiguous_) {
    throw invalid_argument(fmt::format("{} needs a contiguous tensor; {} has strides {}", what,
                                       describe(), to_string(strides_)));
  }
}

void copy_to_dense(const tensor& src, void* dst) {
  const std::size_t elem = size_of(src.type());
  const auto n = src.num_elements();
  if (n == 0) return;
  if (src.is_contiguous()) {
    std::memcpy(dst, src.raw_data(), static_cast<std::size_t>(n) * elem);
    return;
  }
  const std::size_t rank = src.rank();
  const auto* base = static_cast<const std::byte*>(src.raw_data());
  auto* out = static_cast<std::byte*>(dst);
  // Innermost dimension copied as a run when it is dense, element by element when not.
  const std::int64_t inner = src.dim(rank - 1);
  const std::int64_t inner_stride = src.strides()[rank - 1];
  shape index = shape::filled(rank, 0);
  const std::int64_t outer = n / inner;
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t off = 0;
    for (std::size_t k = 0; k + 1 < rank; ++k) off += index[k] * src.strides()[k];
    const std::byte* row = base + off * static_cast<std::int64_t>(elem);
    if (inner_stride == 1) {
      std::memcpy(out, row, static_cast<std::size_t>(inner) * elem);
      out += inner * static_cast<std::int64_t>(elem);
    } else {
      for (std::int64_t i = 0; i < inner; ++i) {
        std::memcpy(out, row + i * inner_stride * static_cast<std::int64_t>(elem), elem);
        out += elem;
      }
    }
    for (std::size_t k = rank - 1; k-- > 0;) {
      if (++index[k] < src.dim(k)) break;
      index[k] = 0;
    }
  }
}

}  // namespace loom
