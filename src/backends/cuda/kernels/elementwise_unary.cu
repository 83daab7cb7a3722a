// The unary element-wise kernels: one functor per op, computing one element in its compute
// type with the semantics of the CPU kernel (src/backends/cpu/elementwise_unary.cpp), and one
// grid-stride kernel per (op, dtype) the op takes, over flat or general layouts (Note [cuda
// element-wise layout]). Math is CUDA's correctly rounded-or-close libdevice functions (expf,
// tanhf, erff, ...), which agree with the CPU's to a few ulp.
#include "elementwise.cuh"
#include "elementwise_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

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
      // NaN < 0 is false: NaN passes through.
      return x < C{0} ? C{0} : x;
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

struct logical_not_f {
  template <class T>
  static constexpr bool supports() {
    return std::is_same_v<T, bool>;
  }
  __device__ bool operator()(bool x) const { return !x; }
};

// y[i] = op(x[...]). Not __restrict__: y may be x's buffer (a result written in place), each
// element read by the thread that then writes it.
template <class Op, class T>
__global__ void unary_kernel(const T* x, T* y, ew_layout l) {
  const Op op;
  const std::int64_t n = l.count;
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    std::int64_t off[1];
    offsets<1>(l, i, off);
    y[i] = store<T>(op(load(x[off[0]])));
  }
}

template <class Op>
bool launch(elem_type t, const void* x, void* y, const ew_layout& l, cudaStream_t stream) {
  return visit(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (Op::template supports<T>()) {
      if (l.count > 0) {
        unary_kernel<Op, T><<<grid_for(l.count), block_threads, 0, stream>>>(
            static_cast<const T*>(x), static_cast<T*>(y), l);
      }
      return true;
    } else {
      return false;
    }
  });
}

}  // namespace

bool launch_unary(unary_op op, elem_type t, const void* x, void* y, const ew_layout& layout,
                  cudaStream_t stream) {
  switch (op) {
    case unary_op::neg:
      return launch<neg_f>(t, x, y, layout, stream);
    case unary_op::abs:
      return launch<abs_f>(t, x, y, layout, stream);
    case unary_op::exp:
      return launch<exp_f>(t, x, y, layout, stream);
    case unary_op::log:
      return launch<log_f>(t, x, y, layout, stream);
    case unary_op::sqrt:
      return launch<sqrt_f>(t, x, y, layout, stream);
    case unary_op::rsqrt:
      return launch<rsqrt_f>(t, x, y, layout, stream);
    case unary_op::tanh:
      return launch<tanh_f>(t, x, y, layout, stream);
    case unary_op::sigmoid:
      return launch<sigmoid_f>(t, x, y, layout, stream);
    case unary_op::relu:
      return launch<relu_f>(t, x, y, layout, stream);
    case unary_op::gelu_erf:
      return launch<gelu_erf_f>(t, x, y, layout, stream);
    case unary_op::gelu_tanh:
      return launch<gelu_tanh_f>(t, x, y, layout, stream);
    case unary_op::erf:
      return launch<erf_f>(t, x, y, layout, stream);
    case unary_op::square:
      return launch<square_f>(t, x, y, layout, stream);
    case unary_op::reciprocal:
      return launch<reciprocal_f>(t, x, y, layout, stream);
    case unary_op::logical_not:
      return launch<logical_not_f>(t, x, y, layout, stream);
  }
  return false;
}

}  // namespace loom::cuda::kernels
