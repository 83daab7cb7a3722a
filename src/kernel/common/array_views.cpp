// The views of the array kernels, and concat's plan (array_views.hpp).
#include "array_views.hpp"

#include "apply_rule.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::common {

tensor transpose_view(const tensor& in, const std::vector<std::int64_t>& perm) {
  const std::size_t rank = in.rank();
  shape s = shape::filled(rank, 0);
  shape strides = shape::filled(rank, 0);
  for (std::size_t i = 0; i < rank; ++i) {
    const auto p = static_cast<std::size_t>(perm[i]);
    s[i] = in.dim(p);
    strides[i] = in.strides()[p];
  }
  return tensor::strided(in.buf(), in.type(), s, strides, in.offset());
}

tensor block_view(const tensor& in, const std::vector<std::int64_t>& begin, const shape& s) {
  std::int64_t offset = in.offset();
  for (std::size_t d = 0; d < in.rank(); ++d) offset += begin[d] * in.strides()[d];
  return tensor::strided(in.buf(), in.type(), s, in.strides(), offset);
}

tensor piece_view(const tensor& in, std::size_t axis, std::int64_t at, std::int64_t size) {
  shape s = in.shape();
  s[axis] = size;
  return tensor::strided(in.buf(), in.type(), s, in.strides(),
                         in.offset() + at * in.strides()[axis]);
}

tensor squeeze_view(const tensor& in, const std::vector<bool>& drop) {
  shape s;
  shape strides;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    if (drop[d]) continue;
    s.push_back(in.dim(d));
    strides.push_back(in.strides()[d]);
  }
  return tensor::strided(in.buf(), in.type(), s, strides, in.offset());
}

tensor expand_dims_view(const tensor& in, std::size_t at) {
  shape s;
  shape strides;
  for (std::size_t d = 0; d <= in.rank(); ++d) {
    if (d == at) {
      // Any stride serves a dimension of size 1; this one keeps dense views dense.
      s.push_back(1);
      strides.push_back(d < in.rank() ? in.strides()[d] * in.dim(d) : 1);
    }
    if (d < in.rank()) {
      s.push_back(in.dim(d));
      strides.push_back(in.strides()[d]);
    }
  }
  return tensor::strided(in.buf(), in.type(), s, strides, in.offset());
}

tensor broadcast_view(const tensor& in, const shape& target) {
  const std::size_t lead = target.rank() - in.rank();
  shape strides = shape::filled(target.rank(), 0);
  for (std::size_t d = 0; d < in.rank(); ++d) {
    if (in.dim(d) == target[lead + d]) strides[lead + d] = in.strides()[d];
  }
  return tensor::strided(in.buf(), in.type(), target, strides, in.offset());
}

concat_plan plan_concat(const kernel_context& ctx, std::int64_t axis) {
  const std::size_t n = ctx.num_inputs();
  std::vector<shape> shapes;
  shapes.reserve(n);
  concat_plan p;
  for (std::size_t i = 0; i < n; ++i) {
    shapes.push_back(ctx.input(i).shape());
    p.all_dense = p.all_dense && ctx.input(i).is_contiguous();
  }
  auto g = apply_rule(ctx, [&] {
    return array_rules::concat_shape(shapes, axis,
                                     [&](std::size_t i) { return ctx.input(i).describe(); });
  });
  p.out = std::move(g.out);
  p.axis = g.axis;
  return p;
}

}  // namespace loom::common
