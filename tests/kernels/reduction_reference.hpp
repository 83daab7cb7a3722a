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

}  // namespace loom::testing::reduction
