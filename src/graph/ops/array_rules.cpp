// The rules of the array ops (loom/graph/ops/array_rules.hpp): shape arithmetic and checks
// that inference and every backend's kernels share.
#include "loom/graph/ops/array_rules.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::array_rules {

std::size_t wrap_axis(std::int64_t axis, std::size_t rank, const text_fn& what) {
  const auto r = static_cast<std::int64_t>(rank);
  if (axis < -r || axis >= r) {
    throw invalid_argument(fmt::format("axis {} is outside [{}, {}) for {}", axis, -r, r, what()));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

shape reshape_shape(const ints& target, std::int64_t n, const text_fn& what) {
  shape out(target);
  std::int64_t known = 1;
  std::ptrdiff_t infer_at = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] < 0)
      infer_at = static_cast<std::ptrdiff_t>(i);
    else
      known *= target[i];
  }
  const bool ok = infer_at < 0 ? known == n : known != 0 && n % known == 0;
  if (!ok) {
    throw invalid_argument(
        fmt::format("cannot reshape {} ({} elements) to [{}]", what(), n, fmt::join(target, ", ")));
  }
  if (infer_at >= 0) out[static_cast<std::size_t>(infer_at)] = n / known;
  return out;
}

std::vector<bool> squeezed_dims(const shape& s, const ints& axes, const text_fn& what) {
  std::vector<bool> drop(s.rank(), false);
  if (axes.empty()) {
    for (std::size_t d = 0; d < s.rank(); ++d) drop[d] = s[d] == 1;
  }
  for (auto a : axes) {
    const std::size_t d = wrap_axis(a, s.rank(), what);
    if (s[d] != 1) {
      throw invalid_argument(
          fmt::format("cannot squeeze dimension {} of {}: its size is {}, not 1", d, what(), s[d]));
    }
    drop[d] = true;
  }
  return drop;
}

std::size_t expand_dims_position(std::int64_t axis, std::size_t rank, const text_fn& what) {
  const auto r = static_cast<std::int64_t>(rank);
  if (axis < -r - 1 || axis > r) {
    throw invalid_argument(
        fmt::format("axis {} is outside [{}, {}] for {}", axis, -r - 1, r, what()));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r + 1 : axis);
}

ints transpose_perm(const ints& perm, std::size_t rank, const text_fn& what) {
  if (perm.empty()) {
    ints reversed;
    for (std::size_t i = rank; i-- > 0;) reversed.push_back(static_cast<std::int64_t>(i));
    return reversed;
  }
  if (perm.size() != rank) {
    throw invalid_argument(fmt::format("perm [{}] has {} entries for the rank-{} input {}",
                                       fmt::join(perm, ", "), perm.size(), rank, what()));
  }
  return perm;
}

concat_geometry concat_shape(const std::vector<shape>& inputs, std::int64_t axis,
                             const texts_fn& what) {
  const shape& first = inputs.front();
  if (first.rank() == 0) {
    throw invalid_argument(fmt::format("cannot concatenate scalars (input 0 is {})", what(0)));
  }
  concat_geometry g;
  g.axis = wrap_axis(axis, first.rank(), [&] { return what(0); });
  g.out = first;
  g.out[g.axis] = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const shape& in = inputs[i];
    bool fits = in.rank() == first.rank();
    for (std::size_t d = 0; fits && d < in.rank(); ++d) fits = d == g.axis || in[d] == first[d];
    if (!fits) {
      throw invalid_argument(
          fmt::format("input {} is {} but input 0 is {}: only dimension {} may differ", i, what(i),
                      what(0), g.axis));
    }
    g.out[g.axis] += in[g.axis];
  }
  return g;
}

std::size_t split_axis(std::int64_t axis, std::size_t rank, const text_fn& what) {
  if (rank == 0) throw invalid_argument(fmt::format("cannot split a scalar ({})", what()));
  return wrap_axis(axis, rank, what);
}

ints split_sizes(std::int64_t dim, std::size_t axis, std::int64_t num_splits, const ints& sizes,
                 const text_fn& what) {
  if (sizes.empty()) {
    if (dim % num_splits != 0) {
      throw invalid_argument(
          fmt::format("dimension {} of {} (size {}) does not split into {} equal pieces", axis,
                      what(), dim, num_splits));
    }
    return ints(static_cast<std::size_t>(num_splits), dim / num_splits);
  }
  ints pieces = sizes;
  std::int64_t known = 0;
  std::ptrdiff_t rest_at = -1;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i] < 0)
      rest_at = static_cast<std::ptrdiff_t>(i);
    else
      known += pieces[i];
  }
  if (rest_at >= 0 ? known > dim : known != dim) {
    throw invalid_argument(fmt::format("sizes [{}] do not add up to dimension {} of {} (size {})",
                                       fmt::join(sizes, ", "), axis, what(), dim));
  }
  if (rest_at >= 0) pieces[static_cast<std::size_t>(rest_at)] = dim - known;
  return pieces;
}

shape slice_shape(const ints& begin, const ints& size, const shape& in, const text_fn& what) {
  if (begin.size() != in.rank() || size.size() != in.rank()) {
    throw invalid_argument(fmt::format("begin [{}] and size [{}] do not have the rank of {}",
                                       fmt::join(begin, ", "), fmt::join(size, ", "), what()));
  }
  shape out = shape::filled(in.rank(), -1);
  for (std::size_t d = 0; d < in.rank(); ++d) {
    if (in[d] < 0) {
      out[d] = size[d];
      continue;
    }
    const std::int64_t end = size[d] < 0 ? in[d] : begin[d] + size[d];
    if (begin[d] > in[d] || end > in[d]) {
      throw invalid_argument(
          fmt::format("begin [{}] size [{}] reaches outside {} in dimension {} ({} > {})",
                      fmt::join(begin, ", "), fmt::join(size, ", "), what(), d,
                      std::max(begin[d], end), in[d]));
    }
    out[d] = end - begin[d];
  }
  return out;
}

shape pad_shape(const shape& in, const ints& paddings, const text_fn& what) {
  const std::size_t rank = in.rank();
  if (paddings.size() != 2 * rank) {
    throw invalid_argument(fmt::format(
        "paddings [{}] has {} entries for the rank-{} input {}: it needs 2 per dimension",
        fmt::join(paddings, ", "), paddings.size(), rank, what()));
  }
  shape out = in;
  for (std::size_t d = 0; d < rank; ++d) {
    if (in[d] >= 0) out[d] = in[d] + paddings[2 * d] + paddings[2 * d + 1];
  }
  return out;
}

gather_geometry gather_shape(const shape& params, const shape& indices, std::int64_t axis,
                             const text_fn& params_text) {
  const auto rank = static_cast<std::int64_t>(params.rank());
  if (rank == 0) {
    throw invalid_argument(fmt::format("params must have rank >= 1, got {}", params_text()));
  }
  if (axis < -rank || axis >= rank) {
    throw invalid_argument(
        fmt::format("axis {} is outside [{}, {}) for params {}", axis, -rank, rank, params_text()));
  }
  gather_geometry g;
  g.axis = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
  for (std::size_t d = 0; d < g.axis; ++d) {
    g.out.push_back(params[d]);
    g.outer *= params[d];
  }
  for (auto d : indices.dims()) g.out.push_back(d);
  for (std::size_t d = g.axis + 1; d < params.rank(); ++d) {
    g.out.push_back(params[d]);
    g.inner *= params[d];
  }
  g.n = params[g.axis];
  return g;
}

gather_geometry gather_grad_shape(const shape& params_shape, std::int64_t axis, const shape& dy,
                                  const shape& indices, const text_fn& dy_text,
                                  const text_fn& indices_text) {
  gather_geometry g;
  shape& ps = g.out;
  ps = params_shape;
  const auto rank = static_cast<std::int64_t>(ps.rank());
  if (axis < -rank || axis >= rank) {
    throw invalid_argument(fmt::format("axis {} is outside [{}, {}) for params_shape {}", axis,
                                       -rank, rank, to_string(ps)));
  }
  const auto ax = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
  g.axis = ax;
  const std::size_t k = indices.rank();
  // dy must be gather's output: ps[:ax] + indices.shape + ps[ax+1:].
  const auto mismatch = [&] {
    throw invalid_argument(
        fmt::format("dy {} is not gather's output for params_shape {}, indices {} and axis {}",
                    dy_text(), to_string(params_shape), indices_text(), ax));
  };
  if (dy.rank() != ps.rank() - 1 + k) mismatch();
  for (std::size_t d = 0; d < ps.rank(); ++d) {
    if (d == ax) continue;
    const std::int64_t have = dy[d < ax ? d : d - 1 + k];
    if (ps[d] < 0) ps[d] = have;
    if (ps[d] != have) mismatch();
  }
  for (std::size_t j = 0; j < k; ++j) {
    if (dy[ax + j] != indices[j]) mismatch();
  }
  if (ps[ax] < 0) {
    throw invalid_argument(
        fmt::format("params_shape {} leaves the gathered dimension {} unknown", to_string(ps), ax));
  }
  for (std::size_t d = 0; d < ax; ++d) g.outer *= ps[d];
  for (std::size_t d = ax + 1; d < ps.rank(); ++d) g.inner *= ps[d];
  g.n = ps[ax];
  return g;
}

one_hot_geometry one_hot_shape(const shape& indices, std::int64_t depth, std::int64_t axis,
                               const text_fn& indices_text) {
  const auto rank = static_cast<std::int64_t>(indices.rank());
  if (axis < -1 || axis > rank) {
    throw invalid_argument(
        fmt::format("axis {} is outside [-1, {}] for indices {}", axis, rank, indices_text()));
  }
  const auto at = static_cast<std::size_t>(axis == -1 ? rank : axis);
  one_hot_geometry g;
  for (std::size_t d = 0; d < indices.rank(); ++d) {
    if (d == at) g.out.push_back(depth);
    g.out.push_back(indices[d]);
    (d < at ? g.prefix : g.suffix) *= indices[d];
  }
  if (at == indices.rank()) g.out.push_back(depth);
  return g;
}

void check_broadcast(const shape& in, const shape& target, const text_fn& what) {
  if (in.rank() > target.rank()) {
    throw invalid_argument(fmt::format("cannot broadcast {} to {}: the target has fewer dimensions",
                                       what(), to_string(target)));
  }
  const std::size_t lead = target.rank() - in.rank();
  for (std::size_t d = 0; d < in.rank(); ++d) {
    const std::int64_t want = target[lead + d];
    if (in[d] >= 0 && in[d] != 1 && in[d] != want) {
      throw invalid_argument(
          fmt::format("cannot broadcast {} to {}: dimension {} is {}, not 1 or {}", what(),
                      to_string(target), d, in[d], want));
    }
  }
}

}  // namespace loom::array_rules
