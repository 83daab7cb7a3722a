// The CPU element-wise ops, one functor each, computing one element in its compute type
// (float for float16 / bfloat16, Note [element-wise iteration]): the unfused kernels
// (elementwise_unary.cpp, elementwise_binary.cpp), the fused element-wise kernel
// (fused_elementwise.cpp) and the matmul / conv2d epilogues (nn_fused.cpp) all compute
// with these, so a fused kernel computes each op exactly as the op's own kernel does (a
// graph pass never changes an answer). NaN, infinities and signed zeros follow Note [NaN
// rules] (src/kernel/common/elementwise_rules.hpp), shared with the CUDA kernels; the binary
// ops but pow are the CUDA kernels' own functors (src/kernel/common/elementwise_binary_ops.hpp).
//
// Each functor says which element types T its op takes (`supports<T>`); binary ones say
// whether they return bool (`bool_out`).
#pragma once

#include <cmath>
#include <numbers>
#include <type_traits>

#include "elementwise_loop.hpp"
#include "elementwise_math.hpp"
#include "kernel/common/elementwise_binary_ops.hpp"
#include "kernel/common/elementwise_rules.hpp"

namespace loom::cpu::ew {

template <class T>
inline constexpr bool is_float = std::is_floating_point_v<T> || is_half_like<T>;
template <class T>
inline constexpr bool is_signed_number = is_float<T> || is_signed_int<T>;
using loom::ew::is_number;

// ---- unary -------------------------------------------------------------------------------------

struct neg_op {
  template <class T>
  static constexpr bool supports = is_signed_number<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return wrap_neg(x);
  }
};

struct abs_op {
  template <class T>
  static constexpr bool supports = is_signed_number<T>;
  template <class C>
  C operator()(C x) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return x < 0 ? wrap_neg(x) : x;
    } else {
      return std::fabs(x);
    }
  }
};

struct exp_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  float operator()(float x) const noexcept { return fast_exp(x); }
  double operator()(double x) const noexcept { return std::exp(x); }
};

struct log_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return std::log(x);
  }
};

struct sqrt_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return std::sqrt(x);
  }
};

struct rsqrt_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return C{1} / std::sqrt(x);
  }
};

struct tanh_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  float operator()(float x) const noexcept { return fast_tanh(x); }
  double operator()(double x) const noexcept { return std::tanh(x); }
};

struct sigmoid_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  float operator()(float x) const noexcept { return fast_sigmoid(x); }
  double operator()(double x) const noexcept { return 1.0 / (1.0 + std::exp(-x)); }
};

struct relu_op {
  template <class T>
  static constexpr bool supports = !std::is_same_v<T, bool>;
  template <class C>
  C operator()(C x) const noexcept {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else {
      return rules::relu(x);  // Note [NaN rules]: NaN and -0 pass through
    }
  }
};

// x * Phi(x) = x/2 * erfc(-x / sqrt 2): erfc keeps the left tail accurate, where 1 + erf
// would cancel.
struct gelu_erf_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return C{0.5} * x * std::erfc(-x * std::numbers::sqrt2_v<C> / C{2});
  }
};

// x/2 * (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), written as x * sigmoid(2u),
// which does not cancel for negative x.
struct gelu_tanh_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  static constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
  float operator()(float x) const noexcept {
    const float u = static_cast<float>(k) * (x + 0.044715f * x * x * x);
    return x * fast_sigmoid(2.0f * u);
  }
  double operator()(double x) const noexcept {
    const double u = k * (x + 0.044715 * x * x * x);
    return x / (1.0 + std::exp(-2.0 * u));
  }
};

struct erf_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return std::erf(x);
  }
};

struct square_op {
  template <class T>
  static constexpr bool supports = is_signed_number<T>;
  template <class C>
  C operator()(C x) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return wrap_mul(x, x);
    } else {
      return x * x;
    }
  }
};

struct reciprocal_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return C{1} / x;
  }
};

struct logical_not_op {
  template <class T>
  static constexpr bool supports = std::is_same_v<T, bool>;
  bool operator()(bool x) const noexcept { return !x; }
};

// ---- binary (src/kernel/common/elementwise_binary_ops.hpp, but pow) ---------------------------

using loom::ew::add_op;
using loom::ew::div_op;
using loom::ew::equal_op;
using loom::ew::greater_equal_op;
using loom::ew::greater_op;
using loom::ew::less_equal_op;
using loom::ew::less_op;
using loom::ew::logical_and_op;
using loom::ew::logical_or_op;
using loom::ew::maximum_op;
using loom::ew::minimum_op;
using loom::ew::mul_op;
using loom::ew::not_equal_op;
using loom::ew::relu_grad_op;
using loom::ew::sub_op;

struct pow_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    return std::pow(a, b);
  }
};

}  // namespace loom::cpu::ew
