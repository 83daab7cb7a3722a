// Host helpers shared by the CUDA kernels of the reduction family (reduction_kernels.cpp)
// and of the normalization family (normalization_kernels.cpp): the device code's element
// type of a dtype, and fills of dense tensors on the compute stream.
#pragma once

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "kernel/common/elementwise_checks.hpp"
#include "kernel/common/reduction_helpers.hpp"
#include "kernels/reduction.cuh"

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

/// Fills the dense tensor t with v (ew::element_bits: as fill makes it) on the compute
/// stream (a NaN v gives the quiet NaN of each float type).
inline void fill(kernel_context& ctx, const launch_scope& scope, tensor& t, double v) {
  if (t.num_elements() == 0) return;
  kernels::launch_fill(t.raw_data(), t.num_elements(), static_cast<int>(size_of(t.type())),
                       ew::element_bits(t.type(), v), scope.stream);
  check_launch(ctx, "fill");
}

}  // namespace loom::cuda::reduction
