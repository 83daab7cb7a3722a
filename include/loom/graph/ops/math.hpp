// Element-wise math: unary and binary ops (NumPy broadcasting), comparisons, logic, where,
// cast, and the generators fill / zeros / ones / range / random_uniform / random_normal.
//
// Each function adds one node to the builder's graph and returns its output. Errors are
// those of graph::add_node: loom::invalid_argument naming the node when dtypes differ,
// shapes do not broadcast, or an attribute is out of range.
//
// The arithmetic operators + - * / and unary - on loom::output (found by argument-dependent
// lookup) add the same nodes as ops::add, sub, mul, div and neg; mixed with a double, the
// double becomes a scalar constant of the tensor's dtype.
#pragma once

#include <cstdint>
#include <string_view>

#include "loom/graph/builder.hpp"

namespace loom::ops {

// ---- unary (y has x's dtype and shape) -----------------------------------------------------

/// -x. Float types and int32/int64/int8 (integers wrap: -INT_MIN is INT_MIN).
output neg(output x, const node_options& o = {});
/// |x|. Float types and int32/int64/int8 (|INT_MIN| wraps to INT_MIN).
output abs(output x, const node_options& o = {});
/// e^x (float types).
output exp(output x, const node_options& o = {});
/// Natural logarithm (float types): -inf at 0, NaN below.
output log(output x, const node_options& o = {});
/// Square root (float types): NaN below 0.
output sqrt(output x, const node_options& o = {});
/// 1 / sqrt(x) (float types).
output rsqrt(output x, const node_options& o = {});
/// Hyperbolic tangent (float types).
output tanh(output x, const node_options& o = {});
/// 1 / (1 + e^-x) (float types).
output sigmoid(output x, const node_options& o = {});
/// max(x, 0); NaN stays NaN. Float and integer types.
output relu(output x, const node_options& o = {});
/// Gaussian error linear unit, x·Φ(x) (float types), exactly (erf form).
output gelu(output x, const node_options& o = {});
/// gelu with `approximate` = "none" (erf form) or "tanh" (the tanh approximation).
output gelu(output x, std::string_view approximate, const node_options& o = {});
/// The error function (float types).
output erf(output x, const node_options& o = {});
/// x·x. Float types and int32/int64/int8 (integers wrap).
output square(output x, const node_options& o = {});
/// 1 / x (float types).
output reciprocal(output x, const node_options& o = {});

/// Trigonometric and hyperbolic functions and their inverses (float types), as the C
/// library's: asin / acos give NaN outside [-1, 1], acosh below 1, atanh ±inf at ±1 and NaN
/// beyond.
output sin(output x, const node_options& o = {});
output cos(output x, const node_options& o = {});
output tan(output x, const node_options& o = {});
output asin(output x, const node_options& o = {});
output acos(output x, const node_options& o = {});
output atan(output x, const node_options& o = {});
output sinh(output x, const node_options& o = {});
output cosh(output x, const node_options& o = {});
output asinh(output x, const node_options& o = {});
output acosh(output x, const node_options& o = {});
output atanh(output x, const node_options& o = {});
/// log(1 + x) and e^x - 1, accurate near 0 (float types); log1p(-1) = -inf.
output log1p(output x, const node_options& o = {});
output expm1(output x, const node_options& o = {});
/// Rounding to an integer value (float types; NaN, ±inf and -0 pass through): floor, ceil,
/// and round to nearest with halves to even (as NumPy and ONNX: round(2.5) = 2).
/// Not differentiable: no gradient flows through them.
output floor(output x, const node_options& o = {});
output ceil(output x, const node_options& o = {});
output round(output x, const node_options& o = {});
/// -1, 0 or +1 by x's sign (float types and int32/int64/int8); NaN stays NaN, -0 gives 0.
/// Not differentiable: no gradient flows through it.
output sign(output x, const node_options& o = {});

// ---- activations (float types; NaN stays NaN, ±inf give the function's limit) --------------

/// log(1 + e^x), computed without overflow for large x.
output softplus(output x, const node_options& o = {});
/// x / (1 + |x|).
output softsign(output x, const node_options& o = {});
/// x * sigmoid(x) (also called swish).
output silu(output x, const node_options& o = {});
/// x * tanh(softplus(x)).
output mish(output x, const node_options& o = {});
/// x * max(0, min(1, x / 6 + 1/2)).
output hard_swish(output x, const node_options& o = {});
/// x > 0 ? x : alpha (e^x - 1). `alpha` finite.
output elu(output x, double alpha = 1.0, const node_options& o = {});
/// gamma (x > 0 ? x : alpha (e^x - 1)), by default the self-normalising constants.
output selu(output x, double alpha = 1.67326319217681884765625,
            double gamma = 1.05070102214813232421875, const node_options& o = {});
/// x > 0 ? x : alpha (e^(x / alpha) - 1). `alpha` finite and not 0.
output celu(output x, double alpha = 1.0, const node_options& o = {});
/// x < 0 ? alpha x : x.
output leaky_relu(output x, double alpha = 0.01, const node_options& o = {});
/// max(0, min(1, alpha x + beta)).
output hard_sigmoid(output x, double alpha = 0.2, double beta = 0.5, const node_options& o = {});
/// x > alpha ? x : 0.
output thresholded_relu(output x, double alpha = 1.0, const node_options& o = {});
/// min(max(x, lo), hi), composed of maximum and minimum with scalar constants of x's dtype
/// (numeric types): NaN stays NaN; where lo > hi every element is hi.
output clamp(output x, double lo, double hi, const node_options& o = {});

// ---- predicates (float x; y is bool of x's shape) ------------------------------------------

/// x is NaN.
output isnan(output x, const node_options& o = {});
/// x is +inf (when detect_positive) or -inf (when detect_negative), as ONNX IsInf.
output isinf(output x, bool detect_positive = true, bool detect_negative = true,
             const node_options& o = {});
/// x is neither infinite nor NaN.
output isfinite(output x, const node_options& o = {});

// ---- binary, NumPy broadcasting (x and y of one dtype) -------------------------------------

/// x + y, x - y, x * y. Numeric types; integers wrap on overflow.
output add(output x, output y, const node_options& o = {});
output sub(output x, output y, const node_options& o = {});
output mul(output x, output y, const node_options& o = {});
/// x / y. Integer division truncates toward zero (as C does); an integer division by zero
/// fails the run with a loom::node_error naming the node.
output div(output x, output y, const node_options& o = {});
/// x to the power y (float types).
output pow(output x, output y, const node_options& o = {});
/// Element-wise max / min; a NaN on either side gives NaN (as NumPy's maximum).
output maximum(output x, output y, const node_options& o = {});
output minimum(output x, output y, const node_options& o = {});
/// The remainder of x / y (numeric types). `fmod` false: with y's sign, as NumPy's mod and
/// Python's % (mod(-5, 3) = 1, mod(5.5, -2) = -0.5); true: with x's sign, as C's fmod and
/// integer % (-5 mod 3 = -2). A float y of 0 gives NaN; an integer division by zero fails
/// the run with a loom::node_error naming the node, as div does.
output mod(output x, output y, bool fmod = false, const node_options& o = {});

/// Comparisons, giving bool. equal / not_equal take every dtype (bool included), the
/// orderings the numeric types. NaN compares unequal to everything.
output equal(output x, output y, const node_options& o = {});
output not_equal(output x, output y, const node_options& o = {});
output less(output x, output y, const node_options& o = {});
output less_equal(output x, output y, const node_options& o = {});
output greater(output x, output y, const node_options& o = {});
output greater_equal(output x, output y, const node_options& o = {});

/// Logic on bool tensors (logical_and / logical_or broadcast).
output logical_and(output x, output y, const node_options& o = {});
output logical_or(output x, output y, const node_options& o = {});
output logical_not(output x, const node_options& o = {});

/// condition ? x : y element-wise, the three broadcast together. `condition` is bool; x and
/// y share any dtype.
output where(output condition, output x, output y, const node_options& o = {});

/// x converted to dtype `to`: float to integer truncates toward zero and saturates at the
/// integer's range (NaN gives 0); integer to integer wraps; anything to bool is x != 0;
/// float16 / bfloat16 results round to nearest even (through float32).
output cast(output x, dtype to, const node_options& o = {});

// ---- generators (no inputs; the shape must be fully defined) -------------------------------

/// A tensor of dtype `t` and shape `s` whose elements are all `value` (converted as cast).
output fill(graph_builder& b, dtype t, shape s, double value, const node_options& o = {});
/// fill with 0 and with 1.
output zeros(graph_builder& b, dtype t, shape s, const node_options& o = {});
output ones(graph_builder& b, dtype t, shape s, const node_options& o = {});
/// start, start + delta, ... up to (not including) limit, as NumPy's arange: a 1-D tensor
/// of ceil((limit - start) / delta) elements (none when that is negative), each computed in
/// double and converted to `t` (numeric types). delta = 0 is an error.
output range(graph_builder& b, double start, double limit, double delta = 1.0, dtype t = dtype::f32,
             const node_options& o = {});
/// range with start, limit and delta from tensors of one numeric dtype (each one number):
/// the length is known at run time only (the output's shape is [-1]). Each element is
/// computed in double and converted, as range's; delta = 0, a non-finite bound and a length
/// past 2^48 fail at run time naming the node.
output dynamic_range(output start, output limit, output delta, const node_options& o = {});
/// Uniform random values in [minval, maxval) (float types). The values depend only on
/// `seed` and each element's index: the same in every run and with any number of threads.
output random_uniform(graph_builder& b, dtype t, shape s, std::int64_t seed, double minval = 0.0,
                      double maxval = 1.0, const node_options& o = {});
/// Normal random values with `mean` and `stddev` (float types), reproducible as
/// random_uniform's.
output random_normal(graph_builder& b, dtype t, shape s, std::int64_t seed, double mean = 0.0,
                     double stddev = 1.0, const node_options& o = {});
/// random_uniform drawn anew on every run (CPU): the kernel's run k gives block stream k of
/// the seed's generator, run 0 random_uniform's values, so a session's sequence of runs is
/// reproducible from the seed. Stateful: the passes never fold it into a constant. What a
/// training step's dropout mask needs.
output random_uniform_per_run(graph_builder& b, dtype t, shape s, std::int64_t seed,
                              double minval = 0.0, double maxval = 1.0, const node_options& o = {});
/// random_normal drawn anew on every run, as random_uniform_per_run.
output random_normal_per_run(graph_builder& b, dtype t, shape s, std::int64_t seed,
                             double mean = 0.0, double stddev = 1.0, const node_options& o = {});

}  // namespace loom::ops

namespace loom {

/// ops::add, ops::sub, ops::mul, ops::div and ops::neg as operators.
output operator+(output x, output y);
output operator-(output x, output y);
output operator*(output x, output y);
output operator/(output x, output y);
output operator-(output x);
/// With a double: the double becomes a scalar constant of the tensor's dtype
/// (ops::scalar), so `x * 2.0` and `1.0 - x` keep x's dtype.
output operator+(output x, double y);
output operator+(double x, output y);
output operator-(output x, double y);
output operator-(double x, output y);
output operator*(output x, double y);
output operator*(double x, output y);
output operator/(output x, double y);
output operator/(double x, output y);

}  // namespace loom
