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
#include <limits>
#include <numbers>
#include <type_traits>

#include "elementwise_loop.hpp"
#include "elementwise_math.hpp"
#include "kernel/common/elementwise_binary_ops.hpp"
#include "kernel/common/elementwise_rules.hpp"
#include "kernel/common/elementwise_unary_ops.hpp"

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

// ---- unary math of the C library (float types) -------------------------------------------------

#define LOOM_LIBM_OP(name, fn)                    \
  struct name {                                   \
    template <class T>                            \
    static constexpr bool supports = is_float<T>; \
    template <class C>                            \
    C operator()(C x) const noexcept {            \
      return fn(x);                               \
    }                                             \
  };
LOOM_LIBM_OP(sin_op, std::sin)
LOOM_LIBM_OP(cos_op, std::cos)
LOOM_LIBM_OP(tan_op, std::tan)
LOOM_LIBM_OP(asin_op, std::asin)
LOOM_LIBM_OP(acos_op, std::acos)
LOOM_LIBM_OP(atan_op, std::atan)
LOOM_LIBM_OP(sinh_op, std::sinh)
LOOM_LIBM_OP(cosh_op, std::cosh)
LOOM_LIBM_OP(asinh_op, std::asinh)
LOOM_LIBM_OP(acosh_op, std::acosh)
LOOM_LIBM_OP(atanh_op, std::atanh)
LOOM_LIBM_OP(log1p_op, std::log1p)
LOOM_LIBM_OP(expm1_op, std::expm1)
LOOM_LIBM_OP(floor_op, std::floor)
LOOM_LIBM_OP(ceil_op, std::ceil)
// Halves to even: rint in the default rounding mode (round-to-nearest-even), as np.round.
LOOM_LIBM_OP(round_op, std::rint)
#undef LOOM_LIBM_OP

// ---- activations (float types) ---------------------------------------------------------------

/// log(1 + e^x) as max(x, 0) + log1p(e^-|x|): no overflow for large x, no loss for small.
struct softplus_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return (x > C(0) ? x : C(0)) + std::log1p(std::exp(-std::fabs(x)));
  }
};

/// x sigmoid(x); -inf gives NaN (-inf * 0), as torch.nn.SiLU.
struct silu_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  float operator()(float x) const noexcept { return x * fast_sigmoid(x); }
  double operator()(double x) const noexcept { return x / (1.0 + std::exp(-x)); }
};

/// x tanh(softplus(x)); -inf gives NaN (-inf * 0), as ONNX's Mish and torch.nn.Mish.
struct mish_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  template <class C>
  C operator()(C x) const noexcept {
    return x * std::tanh(softplus_op{}(x));
  }
};

/// x > 0 ? gamma x : gamma (alpha (e^(x / beta) - 1)): elu (gamma = beta = 1), selu
/// (beta = 1) and celu (gamma = 1, beta = alpha), each as ONNX defines it (a factor of 1 and
/// a division by 1 are exact).
struct exp_linear_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  double alpha;
  double beta = 1.0;
  double gamma = 1.0;
  template <class C>
  C operator()(C x) const noexcept {
    return C(gamma) * (x > C(0) ? x : C(alpha) * std::expm1(x / C(beta)));
  }
};

// The device-neutral ones (src/kernel/common/elementwise_unary_ops.hpp), with their dtypes.
template <class Fn, bool Signed = false>
struct neutral_op : Fn {
  template <class T>
  static constexpr bool supports = Signed ? is_signed_number<T> : is_float<T>;
};
#define LOOM_NEUTRAL_OP(name, with_signed) \
  using name##_op = neutral_op<loom::ew::name##_fn, with_signed>;
LOOM_NEUTRAL_UNARY_OPS(LOOM_NEUTRAL_OP)
#undef LOOM_NEUTRAL_OP

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

/// The remainder with the divisor's sign (`fmod` false: NumPy's mod, Python's %) or with
/// the dividend's (`fmod` true: C's fmod and %). Integers: loom::ew::int_mod.
struct mod_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  bool fmod = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return loom::ew::int_mod(a, b, !fmod);
    } else {
      const C r = std::fmod(a, b);
      return fmod ? r : loom::ew::floor_mod_from_fmod(r, b);
    }
  }
};

}  // namespace loom::cpu::ew
