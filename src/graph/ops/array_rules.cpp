// The rules of the array ops (loom/graph/ops/array_rules.hpp): shape arithmetic and checks
// that inference and every backend's kernels share.
#include "loom/graph/ops/array_rules.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <string>

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

shape dynamic_reshape_shape(const ints& spec, const shape& in, bool allowzero,
                            const text_fn& what) {
  const std::int64_t n = in.num_elements();
  const auto fail = [&](const std::string& why) {
    throw invalid_argument(fmt::format("cannot reshape {} ({} elements) to [{}]: {}", what(), n,
                                       fmt::join(spec, ", "), why));
  };
  shape out(spec);
  std::ptrdiff_t infer_at = -1;
  bool has_zero = false;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < spec.size(); ++i) {
    const std::int64_t d = spec[i];
    if (d < -1) fail(fmt::format("entry {} is {}, below -1", i, d));
    if (d == -1) {
      if (infer_at >= 0) fail("more than one entry is -1");
      infer_at = static_cast<std::ptrdiff_t>(i);
      continue;
    }
    if (d == 0) {
      has_zero = true;
      if (!allowzero) {
        if (i >= in.rank()) {
          fail(fmt::format("entry {} is 0 (copy the input's dimension) but the input has rank {}",
                           i, in.rank()));
        }
        out[i] = in[i];
      }
    }
    known *= out[i];
  }
  if (allowzero && has_zero && infer_at >= 0) fail("with allowzero, 0 and -1 cannot both appear");
  if (infer_at >= 0) {
    if (known == 0) fail("the -1 cannot be inferred when the other entries hold 0 elements");
    if (n % known != 0) {
      fail(fmt::format("the other entries hold {} elements, which do not divide {}", known, n));
    }
    out[static_cast<std::size_t>(infer_at)] = n / known;
  } else if (known != n) {
    fail(fmt::format("the target holds {} elements", known));
  }
  return out;
}

shape expand_shape(const shape& in, const ints& target, const text_fn& what) {
  const std::size_t rank = std::max(in.rank(), target.size());
  shape out = shape::filled(rank, 1);
  for (std::size_t k = 0; k < rank; ++k) {
    const std::int64_t a = k + in.rank() >= rank ? in[k + in.rank() - rank] : 1;
    const std::int64_t b = k + target.size() >= rank ? target[k + target.size() - rank] : 1;
    if (b < 0) {
      throw invalid_argument(fmt::format("cannot expand {} to [{}]: dimension {} is negative",
                                         what(), fmt::join(target, ", "), b));
    }
    if (a < 0) {
      out[k] = b > 1 ? b : -1;
    } else if (a == b || b == 1) {
      out[k] = a;
    } else if (a == 1) {
      out[k] = b;
    } else {
      throw invalid_argument(fmt::format(
          "cannot expand {} to [{}]: dimension {} of the result would be both {} and {}", what(),
          fmt::join(target, ", "), k, a, b));
    }
  }
  return out;
}

ints expand_grad_axes(const shape& in, const shape& out, const text_fn& what) {
  check_broadcast(in, out, what);
  const std::size_t lead = out.rank() - in.rank();
  ints axes;
  for (std::size_t d = 0; d < out.rank(); ++d) {
    if (d < lead || (in[d - lead] == 1 && out[d] != 1))
      axes.push_back(static_cast<std::int64_t>(d));
  }
  return axes;
}

shape tile_shape(const shape& in, const ints& multiples, const text_fn& what) {
  if (multiples.size() != in.rank()) {
    throw invalid_argument(fmt::format("multiples [{}] has {} entries for the rank-{} input {}",
                                       fmt::join(multiples, ", "), multiples.size(), in.rank(),
                                       what()));
  }
  shape out = in;
  for (std::size_t d = 0; d < in.rank(); ++d) {
    if (multiples[d] < 0) {
      throw invalid_argument(fmt::format("multiples [{}] has the negative entry {} for {}",
                                         fmt::join(multiples, ", "), multiples[d], what()));
    }
    if (in[d] >= 0) out[d] = in[d] * multiples[d];
  }
  return out;
}

std::vector<bool> flip_dims(std::size_t rank, const ints& axes, const text_fn& what) {
  std::vector<bool> flip(rank, axes.empty());
  for (auto a : axes) {
    const std::size_t d = wrap_axis(a, rank, what);
    if (flip[d]) {
      throw invalid_argument(
          fmt::format("axes [{}] name dimension {} twice", fmt::join(axes, ", "), d));
    }
    flip[d] = true;
  }
  return flip;
}

strided_slice_geometry strided_slice_shape(const shape& in, const ints& starts, const ints& ends,
                                           const ints& axes, const ints& steps,
                                           const text_fn& what) {
  const std::size_t n = starts.size();
  if (ends.size() != n || (!axes.empty() && axes.size() != n) ||
      (!steps.empty() && steps.size() != n)) {
    throw invalid_argument(fmt::format(
        "starts [{}], ends [{}], axes [{}] and steps [{}] differ in length (axes and steps may "
        "be empty) for {}",
        fmt::join(starts, ", "), fmt::join(ends, ", "), fmt::join(axes, ", "),
        fmt::join(steps, ", "), what()));
  }
  strided_slice_geometry g;
  const std::size_t rank = in.rank();
  g.out = in;
  g.start = ints(rank, 0);
  g.step = ints(rank, 1);
  std::vector<bool> seen(rank, false);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t a = axes.empty() ? static_cast<std::int64_t>(i) : axes[i];
    const std::size_t d = wrap_axis(a, rank, what);
    if (seen[d]) {
      throw invalid_argument(fmt::format("axes [{}] name dimension {} twice for {}",
                                         fmt::join(axes, ", "), d, what()));
    }
    seen[d] = true;
    const std::int64_t step = steps.empty() ? 1 : steps[i];
    if (step == 0) {
      throw invalid_argument(fmt::format("steps [{}] has a 0 (for axis {}) for {}",
                                         fmt::join(steps, ", "), a, what()));
    }
    g.step[d] = step;
    const std::int64_t dim = in[d];
    if (dim < 0) {
      g.out[d] = -1;
      continue;
    }
    std::int64_t start = starts[i];
    std::int64_t end = ends[i];
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    std::int64_t count = 0;
    if (dim == 0) {
      start = 0;
    } else if (step > 0) {
      start = std::clamp<std::int64_t>(start, 0, dim);
      end = std::clamp<std::int64_t>(end, 0, dim);
      count = end > start ? 1 + (end - start - 1) / step : 0;
    } else {
      // -step overflows for INT64_MIN; any step past the dimension takes one element.
      const std::int64_t back = step == std::numeric_limits<std::int64_t>::min()
                                    ? std::numeric_limits<std::int64_t>::max()
                                    : -step;
      start = std::clamp<std::int64_t>(start, 0, dim - 1);
      end = std::clamp<std::int64_t>(end, -1, dim - 1);
      count = start > end ? 1 + (start - end - 1) / back : 0;
    }
    if (count == 0) start = 0;
    g.start[d] = start;
    g.out[d] = count;
  }
  return g;
}

std::size_t elements_axis(const shape& data, const shape& indices, const shape* updates,
                          std::int64_t axis, const texts_fn& what) {
  const std::size_t ax = wrap_axis(axis, data.rank(), [&] { return what(0); });
  if (indices.rank() != data.rank()) {
    throw invalid_argument(
        fmt::format("indices {} must have the rank of data {}", what(1), what(0)));
  }
  for (std::size_t d = 0; d < data.rank(); ++d) {
    if (d != ax && indices[d] >= 0 && data[d] >= 0 && indices[d] > data[d]) {
      throw invalid_argument(
          fmt::format("indices {} is larger than data {} in dimension {} (only axis {} may be)",
                      what(1), what(0), d, ax));
    }
  }
  if (updates != nullptr && *updates != indices) {
    throw invalid_argument(
        fmt::format("updates {} must have the shape of indices {}", what(2), what(1)));
  }
  return ax;
}

nd_geometry nd_shape(const shape& data, const shape& indices, std::int64_t batch_dims,
                     const texts_fn& what) {
  const auto b = static_cast<std::size_t>(std::max<std::int64_t>(batch_dims, 0));
  if (batch_dims < 0 || b >= data.rank() || b >= indices.rank()) {
    throw invalid_argument(
        fmt::format("batch_dims {} must be in [0, min(rank of data {}, rank "
                    "of indices {}))",
                    batch_dims, what(0), what(1)));
  }
  nd_geometry g;
  g.q = indices[indices.rank() - 1];
  if (g.q < 0 || static_cast<std::size_t>(g.q) > data.rank() - b) {
    throw invalid_argument(fmt::format(
        "the last dimension of indices {} ({}) must be at most the rank of data {} less "
        "batch_dims {}",
        what(1), g.q, what(0), b));
  }
  for (std::size_t d = 0; d < b; ++d) {
    if (data[d] != indices[d]) {
      throw invalid_argument(
          fmt::format("data {} and indices {} differ in batch dimension {}", what(0), what(1), d));
    }
    g.out.push_back(data[d]);
    g.batches *= data[d];
  }
  for (std::size_t d = b; d + 1 < indices.rank(); ++d) {
    g.out.push_back(indices[d]);
    g.tuples *= indices[d];
  }
  const auto qs = static_cast<std::size_t>(g.q);
  for (std::size_t d = b; d < b + qs; ++d) g.dims.push_back(data[d]);
  for (std::size_t d = b + qs; d < data.rank(); ++d) {
    g.out.push_back(data[d]);
    g.slice *= data[d];
  }
  return g;
}

void check_scatter_nd_updates(const nd_geometry& g, const shape& updates, const texts_fn& what) {
  if (updates != g.out) {
    throw invalid_argument(fmt::format(
        "updates {} must have the shape {} (indices' without its last dimension, then data's "
        "after the indexed ones) for data {} and indices {}",
        what(2), to_string(g.out), what(0), what(1)));
  }
}

topk_geometry topk_shape(const shape& in, std::int64_t k, std::int64_t axis, const text_fn& what) {
  if (in.rank() == 0) throw invalid_argument(fmt::format("topk needs rank >= 1, got {}", what()));
  topk_geometry g;
  g.axis = wrap_axis(axis, in.rank(), what);
  g.n = in[g.axis];
  if (k < 0 || (g.n >= 0 && k > g.n)) {
    throw invalid_argument(fmt::format("k {} is outside [0, {}] for {} (axis {})", k,
                                       g.n >= 0 ? g.n : 0, what(), g.axis));
  }
  g.out = in;
  g.out[g.axis] = k;
  for (std::size_t d = 0; d < g.axis; ++d) g.outer *= in[d];
  for (std::size_t d = g.axis + 1; d < in.rank(); ++d) g.inner *= in[d];
  return g;
}

}  // namespace loom::array_rules
