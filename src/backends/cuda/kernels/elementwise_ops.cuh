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

}  // namespace loom::cuda::kernels::dev
