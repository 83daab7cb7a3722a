// tensor: construction checks, strided views against a hand-computed element map, the
// contiguity flag, reshaping, typed access, and copy_to_dense against naive index math.
#include "loom/core/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "loom/core/error.hpp"

namespace {

using loom::buffer;
using loom::buffer_ptr;
using loom::dtype;
using loom::shape;
using loom::tensor;

// A borrowed host buffer over `storage` (the test keeps the storage alive).
buffer_ptr borrow(std::vector<float>& storage) {
  return buffer::adopt(storage.data(), storage.size() * sizeof(float), alignof(float),
                       loom::device_id{}, {}, nullptr, nullptr);
}

std::vector<float> iota(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

// The elements of `t` in row-major order, by index arithmetic on its strides.
std::vector<float> elements(const tensor& t) {
  std::vector<float> out;
  const auto n = t.num_elements();
  const auto* base = static_cast<const float*>(t.buf()->data());
  for (std::int64_t flat = 0; flat < n; ++flat) {
    std::int64_t rem = flat;
    std::int64_t off = t.offset();
    for (std::size_t d = t.rank(); d-- > 0;) {
      off += (rem % t.dim(d)) * t.strides()[d];
      rem /= t.dim(d);
    }
    out.push_back(base[off]);
  }
  return out;
}

std::vector<float> dense(const tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.num_elements()));
  loom::copy_to_dense(t, out.data());
  return out;
}

TEST(Tensor, ContiguousConstructionChecksTheBuffer) {
  auto storage = iota(6);
  const tensor t(borrow(storage), dtype::f32, {2, 3});
  EXPECT_TRUE(t.defined());
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides().to_vector(), (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.describe(), "float32[2, 3] on cpu:0");
  EXPECT_THROW(tensor(borrow(storage), dtype::f32, {7}), loom::invalid_argument);
  EXPECT_THROW(tensor(borrow(storage), dtype::f32, {2, shape::unknown}), loom::invalid_argument);
  EXPECT_FALSE(tensor().defined());
}

TEST(Tensor, TypedAccessChecksTheDtype) {
  auto storage = iota(4);
  const tensor t(borrow(storage), dtype::f32, {4});
  EXPECT_EQ(t.data<float>()[3], 3.0f);
  try {
    (void)t.data<std::int32_t>();
    FAIL() << "expected invalid_argument";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("int32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32[4]"), std::string::npos) << e.what();
  }
}

TEST(Tensor, StridedViewsReadTheRightElements) {
  auto storage = iota(24);  // a dense [2, 3, 4]
  // Transpose of the last two dims: shape [2, 4, 3], strides [12, 1, 4].
  const auto t = tensor::strided(borrow(storage), dtype::f32, {2, 4, 3}, {12, 1, 4}, 0);
  EXPECT_FALSE(t.is_contiguous());
  std::vector<float> expect;
  for (int a = 0; a < 2; ++a) {
    for (int c = 0; c < 4; ++c) {
      for (int b = 0; b < 3; ++b) expect.push_back(static_cast<float>(a * 12 + b * 4 + c));
    }
  }
  EXPECT_EQ(elements(t), expect);
  EXPECT_EQ(dense(t), expect);

  // A broadcast view (stride 0) and a reversed view (negative stride).
  const auto row = tensor::strided(borrow(storage), dtype::f32, {3, 4}, {0, 1}, 4);
  EXPECT_EQ(dense(row), elements(row));
  EXPECT_EQ(dense(row)[8], 4.0f);
  const auto reversed = tensor::strided(borrow(storage), dtype::f32, {5}, {-2}, 10);
  EXPECT_EQ(dense(reversed), (std::vector<float>{10, 8, 6, 4, 2}));
}

TEST(Tensor, StridedViewsOutsideTheBufferAreRejected) {
  auto storage = iota(6);
  EXPECT_THROW((void)tensor::strided(borrow(storage), dtype::f32, {2, 3}, {3, 1}, 1),
               loom::invalid_argument);
  EXPECT_THROW((void)tensor::strided(borrow(storage), dtype::f32, {3}, {-1}, 1),
               loom::invalid_argument);
  EXPECT_THROW((void)tensor::strided(borrow(storage), dtype::f32, {2, 3}, {1}, 0),
               loom::invalid_argument);
  // An empty view touches nothing, wherever it points.
  EXPECT_NO_THROW((void)tensor::strided(borrow(storage), dtype::f32, {0, 3}, {3, 1}, 100));
  // ... whatever its strides, even ones whose reach would not fit in 64 bits.
  constexpr std::int64_t huge = std::int64_t{1} << 62;
  EXPECT_NO_THROW(
      (void)tensor::strided(borrow(storage), dtype::f32, {huge, 0, 0}, {huge, huge, 1}, 0));
  // A non-empty view whose reach overflows is refused, not wrapped around into the buffer.
  EXPECT_THROW((void)tensor::strided(borrow(storage), dtype::f32, {3, 2}, {huge, huge}, 0),
               loom::invalid_argument);
}

TEST(Tensor, SizeOneDimensionsMayCarryAnyStrideAndStayContiguous) {
  auto storage = iota(12);
  const auto t = tensor::strided(borrow(storage), dtype::f32, {3, 1, 4}, {4, 99, 1}, 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(dense(t), storage);
  // A contiguous window with an offset: rows 1..2 of a [3, 4].
  const auto rows = tensor::strided(borrow(storage), dtype::f32, {2, 4}, {4, 1}, 4);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.data<float>()[0], 4.0f);
  EXPECT_EQ(dense(rows), std::vector<float>(storage.begin() + 4, storage.end()));
}

TEST(Tensor, ReshapedSharesTheBufferAndChecksCounts) {
  auto storage = iota(12);
  const tensor t(borrow(storage), dtype::f32, {3, 4});
  const tensor r = t.reshaped({2, 2, 3});
  EXPECT_EQ(r.buf().get(), t.buf().get());
  EXPECT_EQ(r.strides().to_vector(), (std::vector<std::int64_t>{6, 3, 1}));
  EXPECT_EQ(dense(r), storage);
  EXPECT_THROW((void)t.reshaped({5}), loom::invalid_argument);
  const auto transposed = tensor::strided(borrow(storage), dtype::f32, {4, 3}, {1, 4}, 0);
  EXPECT_THROW((void)transposed.reshaped({12}), loom::invalid_argument);
}

TEST(Tensor, CopiesShareTheBufferAndCountReferences) {
  std::vector<float> storage = iota(4);
  tensor a(borrow(storage), dtype::f32, {4});
  EXPECT_TRUE(a.buf()->unique());
  {
    const tensor b = a;  // NOLINT(performance-unnecessary-copy-initialization): the point
    EXPECT_FALSE(a.buf()->unique());
    EXPECT_EQ(b.buf().get(), a.buf().get());
  }
  EXPECT_TRUE(a.buf()->unique());
  const tensor moved = std::move(a);
  EXPECT_TRUE(moved.buf()->unique());
  EXPECT_FALSE(a.defined());  // NOLINT(bugprone-use-after-move): documented state
}

TEST(Tensor, HighRankViewsCopyToDenseLikeIndexMath) {
  // Rank 8 (past the inline limit of shape), a permuted view.
  auto storage = iota(256);
  const shape dims{2, 2, 2, 2, 2, 2, 2, 2};
  const shape strides{1, 2, 4, 8, 16, 32, 64, 128};  // fully reversed dimension order
  const auto t = tensor::strided(borrow(storage), dtype::f32, dims, strides, 0);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(dense(t), elements(t));
  const tensor copy = t;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_EQ(copy.strides(), t.strides());
  EXPECT_EQ(dense(copy), dense(t));
}

}  // namespace
