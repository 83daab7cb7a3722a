// dynamic_slice: ONNX Slice with starts and ends read at run time, checked against a direct
// loop over ONNX's rule (clamping, negative indices and steps) and against strided_slice.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/kernel_test_support.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::testing {
namespace {

tensor ints(const std::vector<std::int64_t>& v) {
  return memory::host_tensor<std::int64_t>({static_cast<std::int64_t>(v.size())}, v);
}

// ONNX Slice of a 1-D range along one axis of x [4, 7] (row-major values 0..27).
std::vector<double> reference(std::int64_t start, std::int64_t end, std::int64_t step, bool rows) {
  const std::int64_t n = rows ? 4 : 7;
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = step > 0 ? std::clamp<std::int64_t>(start, 0, n) : std::clamp<std::int64_t>(start, 0, n - 1);
  end = step > 0 ? std::clamp<std::int64_t>(end, 0, n) : std::clamp<std::int64_t>(end, -1, n - 1);
  std::vector<double> out;
  for (std::int64_t i = start; step > 0 ? i < end : i > end; i += step) {
    for (std::int64_t j = 0; j < (rows ? 7 : 4); ++j) out.push_back(rows ? i * 7 + j : j * 7 + i);
  }
  if (!rows) {  // reorder column-major picks to row-major [4, k]
    const auto k = static_cast<std::int64_t>(out.size()) / 4;
    std::vector<double> r(out.size());
    for (std::int64_t c = 0; c < k; ++c) {
      for (std::int64_t j = 0; j < 4; ++j) r[static_cast<std::size_t>(j * k + c)] = out[static_cast<std::size_t>(c * 4 + j)];
    }
    out = r;
  }
  return out;
}

TEST(DynamicSlice, MatchesOnnxRule) {
  std::vector<float> v(28);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const tensor x = memory::host_tensor<float>({4, 7}, v);
  struct c {
    std::int64_t start, end, step;
    bool rows;
  };
  for (const c& k : {c{1, 3, 1, true}, c{-3, 100, 1, true}, c{3, -100, -1, true}, c{0, 7, 2, false},
                     c{6, 0, -2, false}, c{-1, -8, -3, false}, c{5, 2, 1, false}}) {
    SCOPED_TRACE(::testing::Message() << k.start << ":" << k.end << ":" << k.step << (k.rows ? " rows" : " cols"));
    const std::int64_t axis = k.rows ? 0 : 1;
    const tensor got = run_op1("dynamic_slice", {x, ints({k.start}), ints({k.end})},
                               {{"axes", std::vector<std::int64_t>{axis}}, {"steps", std::vector<std::int64_t>{k.step}}});
    EXPECT_EQ(values(got), reference(k.start, k.end, k.step, k.rows));
    const tensor same = run_op1("strided_slice", {x},
                                {{"starts", std::vector<std::int64_t>{k.start}},
                                 {"ends", std::vector<std::int64_t>{k.end}},
                                 {"axes", std::vector<std::int64_t>{axis}},
                                 {"steps", std::vector<std::int64_t>{k.step}}});
    EXPECT_EQ(got.shape(), same.shape());
  }
}

TEST(DynamicSlice, BadBoundsAreNodeErrors) {
  const tensor x = memory::host_tensor<float>({2, 3}, std::vector<float>(6));
  EXPECT_THROW(run_op1("dynamic_slice", {x, ints({0, 0}), ints({1})}, {}), error);
  EXPECT_THROW(run_op1("dynamic_slice", {x, ints({0}), ints({1})},
                       {{"axes", std::vector<std::int64_t>{0}}, {"steps", std::vector<std::int64_t>{0}}}),
               error);
}

}  // namespace
}  // namespace loom::testing
