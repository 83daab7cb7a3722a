// Builder functions and operators of the element-wise ops (loom/graph/ops/math.hpp).
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::ops {
namespace {

output unary(const char* op, output x, const node_options& o, attr_map attrs = {}) {
  return x.builder().add1(op, {x}, std::move(attrs), o);
}
output binary(const char* op, output x, output y, const node_options& o) {
  return x.builder().add1(op, {x, y}, {}, o);
}

}  // namespace

output neg(output x, const node_options& o) {
  return unary("neg", x, o);
}
output abs(output x, const node_options& o) {
  return unary("abs", x, o);
}
output exp(output x, const node_options& o) {
  return unary("exp", x, o);
}
output log(output x, const node_options& o) {
  return unary("log", x, o);
}
output sqrt(output x, const node_options& o) {
  return unary("sqrt", x, o);
}
output rsqrt(output x, const node_options& o) {
  return unary("rsqrt", x, o);
}
output tanh(output x, const node_options& o) {
  return unary("tanh", x, o);
}
output sigmoid(output x, const node_options& o) {
  return unary("sigmoid", x, o);
}
output relu(output x, const node_options& o) {
  return unary("relu", x, o);
}
output gelu(output x, const node_options& o) {
  return unary("gelu", x, o);
}
output gelu(output x, std::string_view approximate, const node_options& o) {
  return unary("gelu", x, o, {{"approximate", std::string(approximate)}});
}
output erf(output x, const node_options& o) {
  return unary("erf", x, o);
}
output square(output x, const node_options& o) {
  return unary("square", x, o);
}
output reciprocal(output x, const node_options& o) {
  return unary("reciprocal", x, o);
}

output sin(output x, const node_options& o) {
  return unary("sin", x, o);
}
output cos(output x, const node_options& o) {
  return unary("cos", x, o);
}
output tan(output x, const node_options& o) {
  return unary("tan", x, o);
}
output asin(output x, const node_options& o) {
  return unary("asin", x, o);
}
output acos(output x, const node_options& o) {
  return unary("acos", x, o);
}
output atan(output x, const node_options& o) {
  return unary("atan", x, o);
}
output sinh(output x, const node_options& o) {
  return unary("sinh", x, o);
}
output cosh(output x, const node_options& o) {
  return unary("cosh", x, o);
}
output asinh(output x, const node_options& o) {
  return unary("asinh", x, o);
}
output acosh(output x, const node_options& o) {
  return unary("acosh", x, o);
}
output atanh(output x, const node_options& o) {
  return unary("atanh", x, o);
}
output log1p(output x, const node_options& o) {
  return unary("log1p", x, o);
}
output expm1(output x, const node_options& o) {
  return unary("expm1", x, o);
}
output floor(output x, const node_options& o) {
  return unary("floor", x, o);
}
output ceil(output x, const node_options& o) {
  return unary("ceil", x, o);
}
output round(output x, const node_options& o) {
  return unary("round", x, o);
}
output sign(output x, const node_options& o) {
  return unary("sign", x, o);
}
output softplus(output x, const node_options& o) {
  return unary("softplus", x, o);
}
output softsign(output x, const node_options& o) {
  return unary("softsign", x, o);
}
output silu(output x, const node_options& o) {
  return unary("silu", x, o);
}
output mish(output x, const node_options& o) {
  return unary("mish", x, o);
}
output hard_swish(output x, const node_options& o) {
  return unary("hard_swish", x, o);
}
output isnan(output x, const node_options& o) {
  return unary("isnan", x, o);
}
output isfinite(output x, const node_options& o) {
  return unary("isfinite", x, o);
}
output elu(output x, double alpha, const node_options& o) {
  return unary("elu", x, o, {{"alpha", alpha}});
}
output selu(output x, double alpha, double gamma, const node_options& o) {
  return unary("selu", x, o, {{"alpha", alpha}, {"gamma", gamma}});
}
output celu(output x, double alpha, const node_options& o) {
  return unary("celu", x, o, {{"alpha", alpha}});
}
output leaky_relu(output x, double alpha, const node_options& o) {
  return unary("leaky_relu", x, o, {{"alpha", alpha}});
}
output hard_sigmoid(output x, double alpha, double beta, const node_options& o) {
  return unary("hard_sigmoid", x, o, {{"alpha", alpha}, {"beta", beta}});
}
output thresholded_relu(output x, double alpha, const node_options& o) {
  return unary("thresholded_relu", x, o, {{"alpha", alpha}});
}
output isinf(output x, bool detect_positive, bool detect_negative, const node_options& o) {
  return unary("isinf", x, o,
               {{"detect_positive", detect_positive}, {"detect_negative", detect_negative}});
}
output clamp(output x, double lo, double hi, const node_options& o) {
  graph_builder& b = x.builder();
  const output low = maximum(x, scalar(b, lo, x.dtype_of()));
  return minimum(low, scalar(b, hi, x.dtype_of()), o);
}

output add(output x, output y, const node_options& o) {
  return binary("add", x, y, o);
}
output sub(output x, output y, const node_options& o) {
  return binary("sub", x, y, o);
}
output mul(output x, output y, const node_options& o) {
  return binary("mul", x, y, o);
}
output div(output x, output y, const node_options& o) {
  return binary("div", x, y, o);
}
output pow(output x, output y, const node_options& o) {
  return binary("pow", x, y, o);
}
output maximum(output x, output y, const node_options& o) {
  return binary("maximum", x, y, o);
}
output minimum(output x, output y, const node_options& o) {
  return binary("minimum", x, y, o);
}
output mod(output x, output y, bool fmod, const node_options& o) {
  return x.builder().add1("mod", {x, y}, {{"fmod", fmod}}, o);
}
output equal(output x, output y, const node_options& o) {
  return binary("equal", x, y, o);
}
output not_equal(output x, output y, const node_options& o) {
  return binary("not_equal", x, y, o);
}
output less(output x, output y, const node_options& o) {
  return binary("less", x, y, o);
}
output less_equal(output x, output y, const node_options& o) {
  return binary("less_equal", x, y, o);
}
output greater(output x, output y, const node_options& o) {
  return binary("greater", x, y, o);
}
output greater_equal(output x, output y, const node_options& o) {
  return binary("greater_equal", x, y, o);
}
output logical_and(output x, output y, const node_options& o) {
  return binary("logical_and", x, y, o);
}
output logical_or(output x, output y, const node_options& o) {
  return binary("logical_or", x, y, o);
}
output logical_not(output x, const node_options& o) {
  return unary("logical_not", x, o);
}

output where(output condition, output x, output y, const node_options& o) {
  return condition.builder().add1("where", {condition, x, y}, {}, o);
}

output cast(output x, dtype to, const node_options& o) {
  return unary("cast", x, o, {{"to", to}});
}

output fill(graph_builder& b, dtype t, shape s, double value, const node_options& o) {
  return b.add1("fill", {}, {{"dtype", t}, {"shape", std::move(s)}, {"value", value}}, o);
}
output zeros(graph_builder& b, dtype t, shape s, const node_options& o) {
  return b.add1("zeros", {}, {{"dtype", t}, {"shape", std::move(s)}}, o);
}
output ones(graph_builder& b, dtype t, shape s, const node_options& o) {
  return b.add1("ones", {}, {{"dtype", t}, {"shape", std::move(s)}}, o);
}
output range(graph_builder& b, double start, double limit, double delta, dtype t,
             const node_options& o) {
  return b.add1("range", {}, {{"start", start}, {"limit", limit}, {"delta", delta}, {"dtype", t}},
                o);
}
output dynamic_range(output start, output limit, output delta, const node_options& o) {
  return start.builder().add1("dynamic_range", {start, limit, delta}, {}, o);
}
namespace {
// A generator node of the random family: its two parameters are named `a` and `b`.
output random_node(graph_builder& g, const char* op, dtype t, shape s, std::int64_t seed,
                   const char* a, double av, const char* b, double bv, const node_options& o) {
  return g.add1(op, {}, {{"dtype", t}, {"shape", std::move(s)}, {"seed", seed}, {a, av}, {b, bv}},
                o);
}
}  // namespace

output random_uniform(graph_builder& b, dtype t, shape s, std::int64_t seed, double minval,
                      double maxval, const node_options& o) {
  return random_node(b, "random_uniform", t, std::move(s), seed, "minval", minval, "maxval", maxval, o);
}
output random_normal(graph_builder& b, dtype t, shape s, std::int64_t seed, double mean,
                     double stddev, const node_options& o) {
  return random_node(b, "random_normal", t, std::move(s), seed, "mean", mean, "stddev", stddev, o);
}
output random_uniform_per_run(graph_builder& b, dtype t, shape s, std::int64_t seed,
                              double minval, double maxval, const node_options& o) {
  return random_node(b, "random_uniform_per_run", t, std::move(s), seed, "minval", minval,
                     "maxval", maxval, o);
}
output random_normal_per_run(graph_builder& b, dtype t, shape s, std::int64_t seed, double mean,
                             double stddev, const node_options& o) {
  return random_node(b, "random_normal_per_run", t, std::move(s), seed, "mean", mean, "stddev",
                     stddev, o);
}

}  // namespace loom::ops

namespace loom {
namespace {
output scalar_like(const output& like, double v) {
  return ops::scalar(like.builder(), v, like.dtype_of());
}
}  // namespace

output operator+(output x, output y) {
  return ops::add(x, y);
}
output operator-(output x, output y) {
  return ops::sub(x, y);
}
output operator*(output x, output y) {
  return ops::mul(x, y);
}
output operator/(output x, output y) {
  return ops::div(x, y);
}
output operator-(output x) {
  return ops::neg(x);
}
output operator+(output x, double y) {
  return ops::add(x, scalar_like(x, y));
}
output operator+(double x, output y) {
  return ops::add(scalar_like(y, x), y);
}
output operator-(output x, double y) {
  return ops::sub(x, scalar_like(x, y));
}
output operator-(double x, output y) {
  return ops::sub(scalar_like(y, x), y);
}
output operator*(output x, double y) {
  return ops::mul(x, scalar_like(x, y));
}
output operator*(double x, output y) {
  return ops::mul(scalar_like(y, x), y);
}
output operator/(output x, double y) {
  return ops::div(x, scalar_like(x, y));
}
output operator/(double x, output y) {
  return ops::div(scalar_like(y, x), y);
}

}  // namespace loom
