// ew::element_bits: the bits a device fill kernel writes for a double, as the CPU's fill,
// zeros and ones make the element (NumPy's np.full(..., v, dtype) for in-range values; out of
// range integers saturate, NaN becomes 0 for integers and the quiet NaN for floats).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "../../src/kernel/common/elementwise_checks.hpp"
#include "loom/core/half.hpp"

namespace loom {
namespace {

template <class T>
T element_of(dtype t, double v) {
  const std::uint64_t bits = ew::element_bits(t, v);
  T e{};
  std::memcpy(static_cast<void*>(&e), &bits, sizeof(T));
  return e;
}

TEST(ElementBits, FloatsRoundAsACastDoes) {
  EXPECT_EQ(element_of<float>(dtype::f32, 0.1), 0.1f);
  EXPECT_EQ(element_of<double>(dtype::f64, 0.1), 0.1);
  EXPECT_EQ(static_cast<float>(element_of<half>(dtype::f16, 1.5)), 1.5f);
  EXPECT_EQ(static_cast<float>(element_of<bfloat16>(dtype::bf16, -2.0)), -2.0f);
  EXPECT_TRUE(std::isnan(element_of<float>(dtype::f32, std::nan(""))));
  EXPECT_TRUE(std::isnan(static_cast<float>(element_of<half>(dtype::f16, std::nan("")))));
  // Only the element's own bytes are set.
  EXPECT_EQ(ew::element_bits(dtype::f16, 1.0) >> 16, 0u);
  EXPECT_EQ(ew::element_bits(dtype::f32, -1.0) >> 32, 0u);
}

TEST(ElementBits, IntegersSaturateAndBoolIsNonZero) {
  EXPECT_EQ(element_of<std::int32_t>(dtype::i32, 7.0), 7);
  EXPECT_EQ(element_of<std::int64_t>(dtype::i64, -3.0), -3);
  EXPECT_EQ(element_of<std::int8_t>(dtype::i8, 300.0), 127);
  EXPECT_EQ(element_of<std::uint8_t>(dtype::u8, -5.0), 0);
  EXPECT_EQ(element_of<std::int32_t>(dtype::i32, std::nan("")), 0);
  EXPECT_EQ(element_of<std::uint8_t>(dtype::boolean, 2.0), 1);
  EXPECT_EQ(element_of<std::uint8_t>(dtype::boolean, 0.0), 0);
}

}  // namespace
}  // namespace loom
