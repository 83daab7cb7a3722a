// The unary element-wise ops of the CUDA kernels, one functor each, computing one element in
// its compute type (float for float16 / bfloat16) with the semantics of the CPU kernels
// (src/backends/cpu/elementwise_ops.hpp): the unary kernels (elementwise_unary.cu) and
// fused_matmul's epilogue (epilogue.cu) both compute with these, so an epilogue's
// activation is bit for bit the unfused op's. relu follows Note [NaN rules]
// (src/kernel/common/elementwise_rules.hpp), which the CPU kernels and the generated fused code
// share. Included by .cu files only.
#pragma once

#include "elementwise_device.cuh"
#include "kernel/common/elementwise_rules.hpp"
#include "kernel/common/elementwise_unary_ops.hpp"

namespace loom::cuda::kernels::dev {

template <class T>
inline constexpr bool is_signed_number = is_float<T> || is_signed_int<T>;

// Float and double overloads for the functors that call the math library.
__device__ __forceinline__ float m_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double m_exp(double x) {
  return exp(x);
}
__device__ __forceinline__ float m_log(float x) {
  return logf(x);
}
__device__ __forceinline__ double m_log(double x) {
  return log(x);
}
__device__ __forceinline__ float m_sqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double m_sqrt(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float m_tanh(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double m_tanh(double x) {
  return tanh(x);
}
__device__ __forceinline__ float m_erf(float x) {
  return erff(x);
}
__device__ __forceinline__ double m_erf(double x) {
  return erf(x);
}
__device__ __forceinline__ float m_erfc(float x) {
  return erfcf(x);
}
__device__ __forceinline__ double m_erfc(double x) {
  return erfc(x);
}
__device__ __forceinline__ float m_fabs(float x) {
  return fabsf(x);
}
__device__ __forceinline__ double m_fabs(double x) {
  return fabs(x);
}

#define LOOM_M1(name, f32, f64)                      \
  __device__ __forceinline__ float name(float x) {   \
    return f32(x);                                   \
  }                                                  \
  __device__ __forceinline__ double name(double x) { \
    return f64(x);                                   \
  }
LOOM_M1(m_sin, sinf, sin)
LOOM_M1(m_cos, cosf, cos)
LOOM_M1(m_tan, tanf, tan)
LOOM_M1(m_asin, asinf, asin)
LOOM_M1(m_acos, acosf, acos)
LOOM_M1(m_atan, atanf, atan)
LOOM_M1(m_sinh, sinhf, sinh)
LOOM_M1(m_cosh, coshf, cosh)
LOOM_M1(m_asinh, asinhf, asinh)
LOOM_M1(m_acosh, acoshf, acosh)
LOOM_M1(m_atanh, atanhf, atanh)
LOOM_M1(m_log1p, log1pf, log1p)
LOOM_M1(m_expm1, expm1f, expm1)
LOOM_M1(m_floor, floorf, floor)
LOOM_M1(m_ceil, ceilf, ceil)
LOOM_M1(m_rint, rintf, rint)
#undef LOOM_M1

struct neg_f {
  template <class T>
  static constexpr bool supports() {
    return is_signed_number<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return wrap_neg(x);
  }
};

struct abs_f {
  template <class T>
  static constexpr bool supports() {
    return is_signed_number<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return x < 0 ? wrap_neg(x) : x;
    } else {
      return m_fabs(x);
    }
  }
};

struct exp_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return m_exp(x);
  }
};

struct log_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return m_log(x);
  }
};

struct sqrt_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return m_sqrt(x);
  }
};

// 1 / sqrt(x), as the CPU computes it (rsqrtf is less accurate).
struct rsqrt_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return C{1} / m_sqrt(x);
  }
};

struct tanh_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return m_tanh(x);
  }
};

struct sigmoid_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return C{1} / (C{1} + m_exp(-x));
  }
};

struct relu_f {
  template <class T>
  static constexpr bool supports() {
    return !std::is_same_v<T, bool>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else {
      return loom::rules::relu(x);  // NaN and -0 pass through (Note [NaN rules])
    }
  }
};

// x * Phi(x) = x/2 * erfc(-x / sqrt 2), accurate in the left tail.
struct gelu_erf_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    constexpr C sqrt2 = C(1.4142135623730950488);
    return C(0.5) * x * m_erfc(-x * sqrt2 / C{2});
  }
};

// x/2 * (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), as x * sigmoid(2u).
struct gelu_tanh_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    constexpr C k = C(0.7978845608028654);  // sqrt(2 / pi)
    const C u = k * (x + C(0.044715) * x * x * x);
    return x / (C{1} + m_exp(C{-2} * u));
  }
};

struct erf_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return m_erf(x);
  }
};

struct square_f {
  template <class T>
  static constexpr bool supports() {
    return is_signed_number<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return wrap_mul(x, x);
    } else {
      return x * x;
    }
  }
};

struct reciprocal_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  template <class C>
  __device__ C operator()(C x) const {
    return C{1} / x;
  }
};

// ---- the math library's functions, the activations and the predicates -----------------------

#define LOOM_LIBM_F(name, fn)            \
  struct name {                          \
    template <class T>                   \
    static constexpr bool supports() {   \
      return is_float<T>;                \
    }                                    \
    template <class C>                   \
    __device__ C operator()(C x) const { \
      return fn(x);                      \
    }                                    \
  };
LOOM_LIBM_F(sin_f, m_sin)
LOOM_LIBM_F(cos_f, m_cos)
LOOM_LIBM_F(tan_f, m_tan)
LOOM_LIBM_F(asin_f, m_asin)
LOOM_LIBM_F(acos_f, m_acos)
LOOM_LIBM_F(atan_f, m_atan)
LOOM_LIBM_F(sinh_f, m_sinh)
LOOM_LIBM_F(cosh_f, m_cosh)
LOOM_LIBM_F(asinh_f, m_asinh)
LOOM_LIBM_F(acosh_f, m_acosh)
LOOM_LIBM_F(atanh_f, m_atanh)
LOOM_LIBM_F(log1p_f, m_log1p)
LOOM_LIBM_F(expm1_f, m_expm1)
LOOM_LIBM_F(floor_f, m_floor)
LOOM_LIBM_F(ceil_f, m_ceil)
LOOM_LIBM_F(round_f, m_rint)  // halves to even
#undef LOOM_LIBM_F

// What the functors over the float types say of themselves.
struct float_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
};

/// log(1 + e^x) as max(x, 0) + log1p(e^-|x|).
struct softplus_f : float_f {
  template <class C>
  __device__ C operator()(C x) const {
    return (x > C(0) ? x : C(0)) + m_log1p(m_exp(-m_fabs(x)));
  }
};

/// x sigmoid(x); -inf gives NaN (-inf * 0), as the CPU's silu_op.
struct silu_f : float_f {
  template <class C>
  __device__ C operator()(C x) const {
    return x / (C{1} + m_exp(-x));
  }
};

/// x tanh(softplus(x)); -inf gives NaN (-inf * 0), as the CPU's mish_op.
struct mish_f : float_f {
  template <class C>
  __device__ C operator()(C x) const {
    return x * m_tanh(softplus_f{}(x));
  }
};

/// elu, selu and celu: x > 0 ? gamma x : gamma (alpha (e^(x / beta) - 1)), as the CPU's
/// exp_linear_op.
struct exp_linear_f : float_f {
  double alpha;
  double beta = 1.0;
  double gamma = 1.0;
  template <class C>
  __device__ C operator()(C x) const {
    return C(gamma) * (x > C(0) ? x : C(alpha) * m_expm1(x / C(beta)));
  }
};

// The device-neutral ones (src/kernel/common/elementwise_unary_ops.hpp), with their dtypes.
template <class Fn, bool Signed = false>
struct neutral_f : Fn {
  template <class T>
  static constexpr bool supports() {
    return Signed ? is_signed_number<T> : is_float<T>;
  }
};
#define LOOM_NEUTRAL_F(name, with_signed) \
  using name##_f = neutral_f<loom::ew::name##_fn, with_signed>;
LOOM_NEUTRAL_UNARY_OPS(LOOM_NEUTRAL_F)
#undef LOOM_NEUTRAL_F

}  // namespace loom::cuda::kernels::dev
