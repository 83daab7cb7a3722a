// The binary element-wise kernels, with NumPy broadcasting through the layout (Note [cuda
// element-wise layout]): one functor per op with the semantics of the CPU kernel
// (src/backends/cpu/elementwise_binary.cpp), one grid-stride kernel per (op, dtype).
#include "backends/elementwise_rules.hpp"
#include "elementwise.cuh"
#include "elementwise_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

template <class T>
inline constexpr bool is_number = !std::is_same_v<T, bool>;

__device__ __forceinline__ float m_pow(float a, float b) {
  return powf(a, b);
}
__device__ __forceinline__ double m_pow(double a, double b) {
  return pow(a, b);
}

struct add_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return wrap_add(a, b);
    } else {
      return a + b;
    }
  }
};

struct sub_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return wrap_sub(a, b);
    } else {
      return a - b;
    }
  }
};

struct mul_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return wrap_mul(a, b);
    } else {
      return a * b;
    }
  }
};

// Integer division truncates toward zero; a zero divisor gives 0 and INT_MIN / -1 wraps to
// INT_MIN (the CPU kernel fails the node for a zero divisor before its loop; Note [cuda value
// checks] in elementwise_kernels.cpp).
struct div_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) return C{0};
      if constexpr (std::is_signed_v<C>) {
        if (b == C{-1}) return wrap_neg(a);
      }
      return static_cast<C>(a / b);
    } else {
      return a / b;
    }
  }
};

struct pow_f {
  template <class T>
  static constexpr bool supports() {
    return is_float<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    return m_pow(a, b);
  }
};

// NumPy's maximum / minimum: NaN on either side gives NaN.
struct maximum_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      return loom::rules::maximum(a, b);  // Note [NaN rules]
    } else {
      return a > b ? a : b;
    }
  }
};

struct minimum_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      return loom::rules::minimum(a, b);  // Note [NaN rules]
    } else {
      return a < b ? a : b;
    }
  }
};

#define LOOM_CUDA_COMPARISON(name, expr, types)  \
  struct name {                                  \
    template <class T>                           \
    static constexpr bool supports() {           \
      return types;                              \
    }                                            \
    static constexpr bool bool_out = true;       \
    template <class C>                           \
    __device__ bool operator()(C a, C b) const { \
      return expr;                               \
    }                                            \
  };
LOOM_CUDA_COMPARISON(equal_f, a == b, true)
LOOM_CUDA_COMPARISON(not_equal_f, a != b, true)
LOOM_CUDA_COMPARISON(less_f, a < b, is_number<T>)
LOOM_CUDA_COMPARISON(less_equal_f, a <= b, is_number<T>)
LOOM_CUDA_COMPARISON(greater_f, a > b, is_number<T>)
LOOM_CUDA_COMPARISON(greater_equal_f, a >= b, is_number<T>)
LOOM_CUDA_COMPARISON(logical_and_f, (a & b) != 0, (std::is_same_v<T, bool>))
LOOM_CUDA_COMPARISON(logical_or_f, (a | b) != 0, (std::is_same_v<T, bool>))
#undef LOOM_CUDA_COMPARISON

// relu's gradient from its output: dy where y > 0, else 0.
struct relu_grad_f {
  template <class T>
  static constexpr bool supports() {
    return is_number<T>;
  }
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C dy, C y) const {
    return loom::rules::relu_grad(dy, y);  // Note [NaN rules]
  }
};

// out[i] = op(a[...], b[...]). Not __restrict__: out may be a's or b's buffer (in place), each
// element read by the thread that then writes it.
template <class Op, class T, class R>
__global__ void binary_kernel(const T* a, const T* b, R* out, ew_layout l) {
  const Op op;
  const std::int64_t n = l.count;
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    std::int64_t off[2];
    offsets<2>(l, i, off);
    out[i] = store<R>(op(load(a[off[0]]), load(b[off[1]])));
  }
}

template <class Op>
bool launch(elem_type t, const void* a, const void* b, void* out, const ew_layout& l,
            cudaStream_t stream) {
  return visit(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (Op::template supports<T>()) {
      using R = std::conditional_t<Op::bool_out, bool, T>;
      if (l.count > 0) {
        binary_kernel<Op, T, R><<<grid_for(l.count), block_threads, 0, stream>>>(
            static_cast<const T*>(a), static_cast<const T*>(b), static_cast<R*>(out), l);
      }
      return true;
    } else {
      return false;
    }
  });
}

}  // namespace

bool launch_binary(binary_op op, elem_type t, const void* a, const void* b, void* out,
                   const ew_layout& layout, cudaStream_t stream) {
  switch (op) {
    case binary_op::add:
      return launch<add_f>(t, a, b, out, layout, stream);
    case binary_op::sub:
      return launch<sub_f>(t, a, b, out, layout, stream);
    case binary_op::mul:
      return launch<mul_f>(t, a, b, out, layout, stream);
    case binary_op::div:
      return launch<div_f>(t, a, b, out, layout, stream);
    case binary_op::pow:
      return launch<pow_f>(t, a, b, out, layout, stream);
    case binary_op::maximum:
      return launch<maximum_f>(t, a, b, out, layout, stream);
    case binary_op::minimum:
      return launch<minimum_f>(t, a, b, out, layout, stream);
    case binary_op::equal:
      return launch<equal_f>(t, a, b, out, layout, stream);
    case binary_op::not_equal:
      return launch<not_equal_f>(t, a, b, out, layout, stream);
    case binary_op::less:
      return launch<less_f>(t, a, b, out, layout, stream);
    case binary_op::less_equal:
      return launch<less_equal_f>(t, a, b, out, layout, stream);
    case binary_op::greater:
      return launch<greater_f>(t, a, b, out, layout, stream);
    case binary_op::greater_equal:
      return launch<greater_equal_f>(t, a, b, out, layout, stream);
    case binary_op::logical_and:
      return launch<logical_and_f>(t, a, b, out, layout, stream);
    case binary_op::logical_or:
      return launch<logical_or_f>(t, a, b, out, layout, stream);
    case binary_op::relu_grad:
      return launch<relu_grad_f>(t, a, b, out, layout, stream);
  }
  return false;
}

}  // namespace loom::cuda::kernels
