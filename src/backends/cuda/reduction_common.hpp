// Host helpers shared by the CUDA kernels of the reduction family (reduction_kernels.cpp)
// and of the normalization family (normalization_kernels.cpp): the device code's element
// type of a dtype, and fills of dense tensors on the compute stream.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "kernel/common/reduction_helpers.hpp"
#include "kernels/reduction.cuh"
#include "loom/core/half.hpp"

namespace loom::cuda::reduction {

static_assert(static_cast<int>(kernels::elem_type::f32) == static_cast<int>(dtype::f32));
static_assert(static_cast<int>(kernels::elem_type::f64) == static_cast<int>(dtype::f64));
static_assert(static_cast<int>(kernels::elem_type::f16) == static_cast<int>(dtype::f16));
static_assert(static_cast<int>(kernels::elem_type::bf16) == static_cast<int>(dtype::bf16));
static_assert(static_cast<int>(kernels::elem_type::i32) == static_cast<int>(dtype::i32));
static_assert(static_cast<int>(kernels::elem_type::i64) == static_cast<int>(dtype::i64));
static_assert(static_cast<int>(kernels::elem_type::i8) == static_cast<int>(dtype::i8));
static_assert(static_cast<int>(kernels::elem_type::u8) == static_cast<int>(dtype::u8));

using common::dense_input;

/// The device code's element type of t (the same numbering).
inline kernels::elem_type elem_of(dtype t) {
  return static_cast<kernels::elem_type>(static_cast<int>(t));
}

/// The bits of `v` as a value of t (for fills of 1, 2, 4 or 8 bytes).
inline std::uint64_t bits_of(dtype t, double v) {
  std::uint64_t bits = 0;
  auto put = [&](auto x) { std::memcpy(&bits, &x, sizeof x); };
  switch (t) {
    case dtype::f32:
      put(static_cast<float>(v));
      break;
    case dtype::f64:
      put(v);
      break;
    case dtype::f16:
      put(half(static_cast<float>(v)));
      break;
    case dtype::bf16:
      put(bfloat16(static_cast<float>(v)));
      break;
    case dtype::i32:
      put(static_cast<std::int32_t>(v));
      break;
    case dtype::i64:
      put(static_cast<std::int64_t>(v));
      break;
    case dtype::i8:
      put(static_cast<std::int8_t>(v));
      break;
    case dtype::u8:
      put(static_cast<std::uint8_t>(v));
      break;
    case dtype::boolean:
      put(static_cast<std::uint8_t>(v != 0.0));
      break;
  }
  return bits;
}

/// Fills the dense tensor t with v on the compute stream (a NaN v gives the quiet NaN of
/// each float type).
inline void fill(kernel_context& ctx, const launch_scope& scope, tensor& t, double v) {
  if (t.num_elements() == 0) return;
  kernels::launch_fill(t.raw_data(), t.num_elements(), static_cast<int>(size_of(t.type())),
                       bits_of(t.type(), v), scope.stream);
  check_launch(ctx, "fill");
}

}  // namespace loom::cuda::reduction
