// The layout kernels of the array family written once over a backend's dense copy (the Copy
// policy of src/kernel/common/array_kernels.hpp): tile, flip and strided_slice. Each applies
// its op rule (loom/graph/ops/array_rules.hpp), makes a strided view of its input that holds
// the result's elements in row-major order (tile: stride 0 along the repeats; flip and
// strided_slice: an offset and negative or larger strides) and copies it dense.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "apply_rule.hpp"
#include "loom/graph/ops/array_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// tile: x viewed as [m0, d0, m1, d1, ...] with stride 0 along each m, copied dense.
template <class Copy>
class tile_kernel final : public op_kernel {
 public:
  explicit tile_kernel(const kernel_construction& c)
      : op_kernel(c), multiples_(c.attr<std::vector<std::int64_t>>("multiples")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape out = apply_rule(
        ctx, [&] { return array_rules::tile_shape(in.shape(), multiples_, text_of(in)); });
    if (out.num_elements() == 0) {
      ctx.allocate_output(0, out);
      return;
    }
    shape dims;
    shape strides;
    for (std::size_t d = 0; d < in.rank(); ++d) {
      dims.push_back(multiples_[d]);
      strides.push_back(0);
      dims.push_back(in.dim(d));
      strides.push_back(in.strides()[d]);
    }
    Copy{ctx}(0, tensor::strided(in.buf(), in.type(), dims, strides, in.offset()), out);
  }

 private:
  std::vector<std::int64_t> multiples_;
};

/// flip: x viewed from its last entry backwards along the flipped axes, copied dense.
template <class Copy>
class flip_kernel final : public op_kernel {
 public:
  explicit flip_kernel(const kernel_construction& c)
      : op_kernel(c), axes_(c.attr<std::vector<std::int64_t>>("axes")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto flip =
        apply_rule(ctx, [&] { return array_rules::flip_dims(in.rank(), axes_, text_of(in)); });
    if (in.num_elements() == 0) {
      ctx.allocate_output(0, in.shape());
      return;
    }
    shape strides = in.strides();
    std::int64_t offset = in.offset();
    for (std::size_t d = 0; d < in.rank(); ++d) {
      if (!flip[d]) continue;
      offset += (in.dim(d) - 1) * strides[d];
      strides[d] = -strides[d];
    }
    Copy{ctx}(0, tensor::strided(in.buf(), in.type(), in.shape(), strides, offset), in.shape());
  }

 private:
  std::vector<std::int64_t> axes_;
};

/// strided_slice's attributes.
struct strided_slice_attrs {
  explicit strided_slice_attrs(const kernel_construction& c)
      : starts(c.attr<std::vector<std::int64_t>>("starts")),
        ends(c.attr<std::vector<std::int64_t>>("ends")),
        axes(c.attr<std::vector<std::int64_t>>("axes")),
        steps(c.attr<std::vector<std::int64_t>>("steps")) {}
  [[nodiscard]] array_rules::strided_slice_geometry geometry(
      const shape& in, const array_rules::text_fn& what) const {
    return array_rules::strided_slice_shape(in, starts, ends, axes, steps, what);
  }
  std::vector<std::int64_t> starts;
  std::vector<std::int64_t> ends;
  std::vector<std::int64_t> axes;
  std::vector<std::int64_t> steps;
};

/// The elements strided_slice reads from a tensor laid out as `offset` and `strides` (the
/// input's, or strided_slice_grad's output's): the offset of the first and the strides
/// between them, for the geometry's counts.
inline std::pair<std::int64_t, shape> strided_slice_layout(
    const array_rules::strided_slice_geometry& g, std::int64_t offset, const shape& strides) {
  shape s = strides;
  for (std::size_t d = 0; d < s.rank(); ++d) {
    offset += g.start[d] * strides[d];
    // A single entry may keep any stride; this keeps a huge step from overflowing.
    if (g.out[d] > 1) s[d] = strides[d] * g.step[d];
  }
  return {offset, s};
}

/// strided_slice: the view of the entries read, copied dense.
template <class Copy>
class strided_slice_kernel final : public op_kernel {
 public:
  explicit strided_slice_kernel(const kernel_construction& c) : op_kernel(c), attrs_(c) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto g = apply_rule(ctx, [&] { return attrs_.geometry(in.shape(), text_of(in)); });
    if (g.out.num_elements() == 0) {
      ctx.allocate_output(0, g.out);
      return;
    }
    const auto [offset, strides] = strided_slice_layout(g, in.offset(), in.strides());
    Copy{ctx}(0, tensor::strided(in.buf(), in.type(), g.out, strides, offset), g.out);
  }

 private:
  strided_slice_attrs attrs_;
};

}  // namespace loom::common
