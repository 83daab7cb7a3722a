// Test support for kernels: run one op on a CPU device without a session, build inputs
// (including non-contiguous views), and compare against float64 references.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <random>
#include <string_view>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/graph/attr_value.hpp"

namespace loom::testing {

/// A 2-thread CPU device shared by the tests of one executable.
cpu_device& test_device();

/// Adds placeholders for `inputs` and one `op` node with `attrs` to a fresh graph, makes
/// the node's CPU kernel through the kernel registry, runs it once on test_device(), and
/// returns the outputs. Errors propagate (graph::add_node's, the registry's, the kernel's).
std::vector<tensor> run_op(std::string_view op, std::vector<tensor> inputs, attr_map attrs = {});
/// run_op for single-output ops.
tensor run_op1(std::string_view op, std::vector<tensor> inputs, attr_map attrs = {});

/// A host tensor of `t` and `s` holding `values` converted from double.
tensor make(dtype t, const shape& s, const std::vector<double>& values);
/// A host tensor of shape s with values drawn uniformly from [lo, hi) (rounded for
/// integer types), reproducibly from `seed`.
tensor random(dtype t, const shape& s, std::uint64_t seed, double lo = -2.0, double hi = 2.0);
/// The elements of `x` (any dtype, any strides) in row-major order, as doubles.
std::vector<double> values(const tensor& x);
/// conv2d's definition in float64: x [n, c, h, w] with w [o, c / groups, kh, kw], `padding`
/// [top, bottom, left, right] (or [h, w]). Each output's value and the sum of its products'
/// magnitudes (a tolerance's scale), and the output shape.
struct conv2d_reference {
  shape s;
  std::vector<double> value;
  std::vector<double> magnitude;
};
conv2d_reference conv2d_float64(const tensor& x, const tensor& w, const std::vector<std::int64_t>& strides,
                                const std::vector<std::int64_t>& padding,
                                const std::vector<std::int64_t>& dilations, std::int64_t groups);
/// A non-contiguous view with the same elements as `x`: the data is stored transposed
/// (last two dims swapped) in a new buffer and viewed back through strides. Needs rank >= 2.
tensor non_contiguous(const tensor& x);
/// A view that broadcasts `x` (shape s) to `to` with stride 0 on the broadcast dims.
tensor broadcast_view(const tensor& x, const shape& to);

/// Expects `actual` to have `expected_shape` and elements close to `expected`:
/// |a - e| <= atol + rtol·|e| element-wise (NaN matches NaN, infinities must match).
void expect_close(const tensor& actual, const shape& expected_shape,
                  const std::vector<double>& expected, double rtol = 1e-5, double atol = 1e-6);

/// Expects f() to throw loom::invalid_argument whose message contains every one of `parts`.
void expect_invalid_argument(const std::function<void()>& f, const std::vector<std::string>& parts);

/// run_op with the placeholders declared with `declared` shapes (dims -1 allowed) instead
/// of the fed tensors' shapes, so what inference accepts may fail in the kernel. Unlike
/// run_op it checks nothing about the outputs.
std::vector<tensor> run_op_declared(std::string_view op, std::vector<tensor> inputs,
                                    const std::vector<shape>& declared, attr_map attrs = {});

/// Default tolerances for a dtype: tight for f64, looser for f32, loose for f16/bf16,
/// exact for integers and bool.
double rtol_for(dtype t);
double atol_for(dtype t);

}  // namespace loom::testing
