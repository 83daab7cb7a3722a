// Float64 references and input builders for the reduction family's kernel tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::testing::reduction {

/// The row-major multi-index of flat index i in s.
inline std::vector<std::int64_t> unravel(std::int64_t i, const shape& s) {
  std::vector<std::int64_t> idx(s.rank());
  for (std::size_t k = s.rank(); k-- > 0;) {
    idx[k] = i % s[k];
    i /= s[k];
  }
  return idx;
}

/// Every subset of the axes of a rank-`rank` tensor, as a list spelled with a mix of positive
/// and negative axes.
inline std::vector<std::vector<std::int64_t>> axis_subsets(std::size_t rank) {
  std::vector<std::vector<std::int64_t>> out;
  for (std::uint32_t mask = 0; mask < (1u << rank); ++mask) {
    std::vector<std::int64_t> axes;
    for (std::size_t d = 0; d < rank; ++d) {
      if (mask & (1u << d)) {
        const auto a = static_cast<std::int64_t>(d);
        axes.push_back((mask + d) % 2 == 0 ? a : a - static_cast<std::int64_t>(rank));
      }
    }
    out.push_back(axes);
  }
  return out;
}

/// x's elements grouped by the output of a reduction over `axes` (empty: all) they go into,
/// in row-major order within each group, and that output's shape (NumPy's keepdims rule).
struct output_groups {
  shape out;
  std::vector<std::vector<double>> groups;
};
inline output_groups group_by_output(const tensor& x, const std::vector<std::int64_t>& axes,
                                     bool keepdims) {
  const shape& s = x.shape();
  const auto r = static_cast<std::int64_t>(s.rank());
  std::vector<bool> red(s.rank(), axes.empty());
  for (auto a : axes) red[static_cast<std::size_t>(a < 0 ? a + r : a)] = true;
  output_groups g;
  shape kept;
  for (std::size_t d = 0; d < s.rank(); ++d) {
    if (!red[d]) {
      g.out.push_back(s[d]);
      kept.push_back(s[d]);
    } else if (keepdims) {
      g.out.push_back(1);
    }
  }
  g.groups.resize(static_cast<std::size_t>(kept.num_elements()));
  const auto xs = values(x);
  for (std::int64_t i = 0; i < x.num_elements(); ++i) {
    const auto idx = unravel(i, s);
    std::int64_t o = 0;
    for (std::size_t d = 0; d < s.rank(); ++d) {
      if (!red[d]) o = o * s[d] + idx[d];
    }
    g.groups[static_cast<std::size_t>(o)].push_back(xs[static_cast<std::size_t>(i)]);
  }
  return g;
}

/// A view of x's elements whose last dim is strided (step 2) and whose data starts at an
/// offset; the elements between hold `filler` (NaN for floats), so a kernel that reads
/// outside the view gets caught.
inline tensor strided_view(const tensor& x) {
  const std::size_t r = x.rank();
  EXPECT_GE(r, 1u);
  shape storage_shape = x.shape();
  storage_shape[r - 1] = 2 * x.dim(r - 1) + 1;
  const double filler = is_floating(x.type()) ? std::nan("") : 99.0;
  std::vector<double> store(static_cast<std::size_t>(storage_shape.num_elements()), filler);
  const auto v = values(x);
  const shape st = contiguous_strides(storage_shape);
  for (std::int64_t i = 0; i < x.num_elements(); ++i) {
    const auto idx = unravel(i, x.shape());
    std::int64_t off = 1;
    for (std::size_t k = 0; k < r; ++k) off += idx[k] * (k + 1 == r ? 2 : st[k]);
    store[static_cast<std::size_t>(off)] = v[static_cast<std::size_t>(i)];
  }
  tensor storage = make(x.type(), storage_shape, store);
  shape strides = st;
  strides[r - 1] = 2;
  return tensor::strided(storage.buf(), x.type(), x.shape(), strides, 1);
}

/// Runs f and expects an exception of type E whose what() contains every part.
template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& p : parts) {
      EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
    }
  }
}

/// |got - want| <= atol + rtol * scale, NaN matching NaN and infinities matching exactly.
inline bool close(double got, double want, double scale, double rtol, double atol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= atol + rtol * scale;
}

/// A reduction's expected result: its shape, its values, and per output the scale errors are
/// measured against.
struct expected_reduction {
  shape s;
  std::vector<double> v;
  std::vector<double> scale;
};

/// Runs the reduction `op` on x over axes and expects `e` (of dtype x's), within
/// atol + rtol · scale per output (the first five misses reported).
inline void expect_reduction(const char* op, const tensor& x, const std::vector<std::int64_t>& axes,
                             bool keepdims, const expected_reduction& e, double rtol, double atol) {
  SCOPED_TRACE(::testing::Message() << op << " " << x.describe() << " axes "
                                    << ::testing::PrintToString(axes) << " keepdims " << keepdims);
  const tensor got = run_op1(op, {x}, {{"axes", axes}, {"keepdims", keepdims}});
  ASSERT_EQ(to_string(got.shape()), to_string(e.s));
  ASSERT_EQ(got.type(), x.type());
  ASSERT_TRUE(got.is_contiguous());
  const auto g = values(got);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!close(g[i], e.v[i], e.scale[i], rtol, atol) && bad++ < 5) {
      ADD_FAILURE() << "output " << i << ": got " << g[i] << ", expected " << e.v[i];
    }
  }
}

}  // namespace loom::testing::reduction
