// Gradients of the element-wise ops (elementwise_ops.cpp). y is the forward output, dy its
// gradient; binary ops reduce each input's gradient back to its shape (unbroadcast).
#include <cmath>
#include <numbers>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/math.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;

// A unary op's gradient from (x, y, dy).
template <class F>
gradient_fn unary(F f) {
  return [f](const gradient_context& c) -> grads {
    return {f(c, c.input(0), c.output_of(0), c.grad(0))};
  };
}

grads gelu_grad(const gradient_context& c) {
  const output x = c.input(0);
  const output dy = c.grad(0);
  if (c.attr<std::string>("approximate") == "tanh") {
    // y = x * s, s = sigmoid(2u), u = k (x + 0.044715 x^3):
    // dy/dx = s + x s (1 - s) 2 k (1 + 3 * 0.044715 x^2).
    constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
    const output x2 = x * x;
    const output u = (x + x2 * x * 0.044715) * k;
    const output s = ops::sigmoid(u * 2.0);
    const output du = (x2 * (3.0 * 0.044715) + 1.0) * (2.0 * k);
    return {dy * (s + x * s * (1.0 - s) * du)};
  }
  // y = x Phi(x): dy/dx = Phi(x) + x phi(x).
  const output phi_big = (ops::erf(x * (1.0 / std::numbers::sqrt2)) + 1.0) * 0.5;
  const output phi = ops::exp(x * x * -0.5) * (1.0 / std::sqrt(2.0 * std::numbers::pi));
  return {dy * (phi_big + x * phi)};
}

// d|x| = sign(x) dx, with sign(0) = 0 (as TensorFlow and PyTorch).
output sign_times(const gradient_context& c, output x, output dy) {
  const dtype t = c.input_type(0);
  const output zero = c.scalar(0.0, t);
  return ops::where(ops::greater(x, zero), dy, ops::where(ops::less(x, zero), -dy, zero));
}

grads max_min_grad(const gradient_context& c, bool is_max) {
  // The gradient goes to x where x wins (ties to x, as TensorFlow), else to y.
  const output x = c.input(0);
  const output y = c.input(1);
  const output dy = c.grad(0);
  const output zero = c.scalar(0.0, c.input_type(0));
  const output x_wins = is_max ? ops::greater_equal(x, y) : ops::less_equal(x, y);
  return {c.unbroadcast(ops::where(x_wins, dy, zero), 0),
          c.unbroadcast(ops::where(x_wins, zero, dy), 1)};
}

// x > 0 ? dy * pos : dy * neg, for the activations that switch at 0 (elu, selu, celu,
// leaky_relu): at x = 0 the left side's slope, as PyTorch.
output switch_at_zero(const gradient_context& c, output x, output pos, output neg) {
  return ops::where(ops::greater(x, c.scalar(0.0, c.input_type(0))), pos, neg);
}

grads hard_swish_grad(const gradient_context& c) {
  // y = x t, t = clamp(x / 6 + 1/2, 0, 1): 0 below -3, 1 above 3, x / 3 + 1/2 between (the
  // kinks take the middle's, as PyTorch).
  const output x = c.input(0);
  const output dy = c.grad(0);
  const dtype t = c.input_type(0);
  const output inner = ops::where(ops::greater(x, c.scalar(3.0, t)), dy, dy * (x / 3.0 + 0.5));
  return {ops::where(ops::less(x, c.scalar(-3.0, t)), c.scalar(0.0, t), inner)};
}

grads mod_grad(const gradient_context& c) {
  // z = x - q y with q the integer quotient (floored, or truncated for fmod): dz/dx = 1,
  // dz/dy = -q. q is (x - z) / y rounded (exact but for the division's rounding).
  const output x = c.input(0);
  const output y = c.input(1);
  const output dy = c.grad(0);
  const output q = ops::round((x - c.output_of(0)) / y);
  return {c.unbroadcast(dy, 0), c.unbroadcast(-(dy * q), 1)};
}

}  // namespace

void register_elementwise_gradients(gradient_registry& r) {
  r.add("neg", unary([](auto&, output, output, output dy) { return -dy; }));
  r.add("abs", unary([](auto& c, output x, output, output dy) { return sign_times(c, x, dy); }));
  r.add("exp", unary([](auto&, output, output y, output dy) { return dy * y; }));
  r.add("log", unary([](auto&, output x, output, output dy) { return dy / x; }));
  r.add("sqrt", unary([](auto&, output, output y, output dy) { return dy / (y * 2.0); }));
  r.add("rsqrt", unary([](auto&, output, output y, output dy) { return dy * (y * y * y) * -0.5; }));
  r.add("tanh", unary([](auto&, output, output y, output dy) { return dy * (1.0 - y * y); }));
  r.add("sigmoid", unary([](auto&, output, output y, output dy) { return dy * (y * (1.0 - y)); }));
  // From the output: y > 0 exactly where x > 0. One fused pass (relu_grad).
  r.add("relu", unary([](auto& c, output, output y, output dy) {
          return c.builder().add1("relu_grad", {dy, y});
        }));
  r.add("gelu", gelu_grad);
  r.add("erf", unary([](auto&, output x, output, output dy) {
          return dy * ops::exp(-(x * x)) * (2.0 / std::sqrt(std::numbers::pi));
        }));
  r.add("square", unary([](auto&, output x, output, output dy) { return dy * (x * 2.0); }));
  r.add("reciprocal", unary([](auto&, output, output y, output dy) { return -(dy * (y * y)); }));

  r.add("sin", unary([](auto&, output x, output, output dy) { return dy * ops::cos(x); }));
  r.add("cos", unary([](auto&, output x, output, output dy) { return -(dy * ops::sin(x)); }));
  r.add("tan", unary([](auto&, output, output y, output dy) { return dy * (y * y + 1.0); }));
  r.add("asin",
        unary([](auto&, output x, output, output dy) { return dy * ops::rsqrt(1.0 - x * x); }));
  r.add("acos",
        unary([](auto&, output x, output, output dy) { return -(dy * ops::rsqrt(1.0 - x * x)); }));
  r.add("atan", unary([](auto&, output x, output, output dy) { return dy / (x * x + 1.0); }));
  r.add("sinh", unary([](auto&, output x, output, output dy) { return dy * ops::cosh(x); }));
  r.add("cosh", unary([](auto&, output x, output, output dy) { return dy * ops::sinh(x); }));
  r.add("asinh",
        unary([](auto&, output x, output, output dy) { return dy * ops::rsqrt(x * x + 1.0); }));
  r.add("acosh",
        unary([](auto&, output x, output, output dy) { return dy * ops::rsqrt(x * x - 1.0); }));
  r.add("atanh", unary([](auto&, output x, output, output dy) { return dy / (1.0 - x * x); }));
  r.add("log1p", unary([](auto&, output x, output, output dy) { return dy / (x + 1.0); }));
  r.add("expm1", unary([](auto&, output, output y, output dy) { return dy * (y + 1.0); }));
  r.add("softplus", unary([](auto&, output x, output, output dy) { return dy * ops::sigmoid(x); }));
  r.add("softsign", unary([](auto&, output x, output, output dy) {
          const output d = ops::abs(x) + 1.0;
          return dy / (d * d);
        }));
  // y = x s, s = sigmoid(x): dy/dx = s (1 + x (1 - s)).
  r.add("silu", unary([](auto&, output x, output, output dy) {
          const output s = ops::sigmoid(x);
          return dy * (s * (x * (1.0 - s) + 1.0));
        }));
  // y = x t, t = tanh(softplus(x)): dy/dx = t + x sigmoid(x) (1 - t^2).
  r.add("mish", unary([](auto&, output x, output, output dy) {
          const output t = ops::tanh(ops::softplus(x));
          return dy * (t + x * ops::sigmoid(x) * (1.0 - t * t));
        }));
  r.add("hard_swish", hard_swish_grad);
  // From the output where x <= 0: alpha e^x = y + alpha.
  r.add("elu", unary([](auto& c, output x, output y, output dy) {
          return switch_at_zero(c, x, dy, dy * (y + c.template attr<double>("alpha")));
        }));
  // gamma alpha e^x = y + gamma alpha.
  r.add("selu", unary([](auto& c, output x, output y, output dy) {
          const double gamma = c.template attr<double>("gamma");
          const double ga = gamma * c.template attr<double>("alpha");
          return switch_at_zero(c, x, dy * gamma, dy * (y + ga));
        }));
  // e^(x / alpha) = y / alpha + 1.
  r.add("celu", unary([](auto& c, output x, output y, output dy) {
          return switch_at_zero(c, x, dy, dy * (y / c.template attr<double>("alpha") + 1.0));
        }));
  r.add("leaky_relu", unary([](auto& c, output x, output, output dy) {
          return switch_at_zero(c, x, dy, dy * c.template attr<double>("alpha"));
        }));
  // alpha inside (0, 1) (where the clamp is not active), else 0.
  r.add("hard_sigmoid", unary([](auto& c, output x, output, output dy) {
          const double alpha = c.template attr<double>("alpha");
          const output u = x * alpha + c.template attr<double>("beta");
          const output zero = c.scalar(0.0, c.input_type(0));
          const output inside =
              ops::logical_and(ops::greater(u, zero), ops::less(u, c.scalar(1.0, c.input_type(0))));
          return ops::where(inside, dy * alpha, zero);
        }));
  r.add("thresholded_relu", unary([](auto& c, output x, output, output dy) {
          const output above =
              ops::greater(x, c.scalar(c.template attr<double>("alpha"), c.input_type(0)));
          return ops::where(above, dy, c.scalar(0.0, c.input_type(0)));
        }));

  r.add("add", [](const gradient_context& c) -> grads {
    return {c.unbroadcast(c.grad(0), 0), c.unbroadcast(c.grad(0), 1)};
  });
  r.add("sub", [](const gradient_context& c) -> grads {
    return {c.unbroadcast(c.grad(0), 0), c.unbroadcast(-c.grad(0), 1)};
  });
  r.add("mul", [](const gradient_context& c) -> grads {
    const output dy = c.grad(0);
    return {c.unbroadcast(dy * c.input(1), 0), c.unbroadcast(dy * c.input(0), 1)};
  });
  r.add("div", [](const gradient_context& c) -> grads {
    // z = x / y: dz/dx = 1 / y, dz/dy = -z / y.
    const output dy = c.grad(0);
    const output y = c.input(1);
    return {c.unbroadcast(dy / y, 0), c.unbroadcast(-(dy * c.output_of(0)) / y, 1)};
  });
  r.add("pow", [](const gradient_context& c) -> grads {
    // z = x^y: dz/dx = y x^(y-1); dz/dy = z log x (0 where x <= 0, as TensorFlow).
    const output x = c.input(0);
    const output y = c.input(1);
    const output z = c.output_of(0);
    const output dy = c.grad(0);
    const output zero = c.scalar(0.0, c.input_type(0));
    const output dx = dy * y * ops::pow(x, y - 1.0);
    const output positive = ops::greater(x, zero);
    const output log_x = ops::log(ops::where(positive, x, c.scalar(1.0, c.input_type(0))));
    const output dyy = ops::where(positive, dy * z * log_x, zero);
    return {c.unbroadcast(dx, 0), c.unbroadcast(dyy, 1)};
  });
  r.add("mod", mod_grad);
  r.add("maximum", [](const gradient_context& c) { return max_min_grad(c, true); });
  r.add("minimum", [](const gradient_context& c) { return max_min_grad(c, false); });
  r.add("where", [](const gradient_context& c) -> grads {
    const output cond = c.input(0);
    const output dy = c.grad(0);
    const output zero = c.scalar(0.0, c.input_type(1));
    return {std::nullopt, c.unbroadcast(ops::where(cond, dy, zero), 1),
            c.unbroadcast(ops::where(cond, zero, dy), 2)};
  });
  r.add("cast", [](const gradient_context& c) -> grads {
    // Between float types the gradient casts back; to or from an integer, none flows.
    const dtype from = c.input_type(0);
    if (!is_floating(from) || !is_floating(c.forward().outputs[0].type)) return {std::nullopt};
    return {ops::cast(c.grad(0), from)};
  });

  // No gradient flows through comparisons, logic, constants, random numbers, the rounding
  // functions and sign (zero almost everywhere) and the predicates.
  for (const char* op :
       {"equal",       "not_equal",      "less",          "less_equal", "greater", "greater_equal",
        "logical_and", "logical_or",     "logical_not",   "fill",       "zeros",   "ones",
        "range",       "random_uniform", "random_normal", "floor",      "ceil",    "round",
        "sign",        "isnan",          "isinf",         "isfinite",   "dynamic_range",
        "random_uniform_per_run", "random_normal_per_run"}) {
    r.add_none(op);
  }
}

}  // namespace loom
