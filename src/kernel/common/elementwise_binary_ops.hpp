// The binary element-wise ops, one functor each, and the integer arithmetic that wraps, written
// once for the CPU kernels (elementwise_binary.cpp, fused_elementwise.cpp, nn_fused.cpp, through
// src/backends/cpu/elementwise_ops.hpp) and the CUDA kernels (kernels/elementwise_binary.cu,
// compiled by nvcc): a functor computes one element in its compute type (float for float16 /
// bfloat16), so both devices compute each op with the same code. NaN, infinities and signed
// zeros follow Note [NaN rules] (elementwise_rules.hpp).
//
// Each functor says which element types T its op takes (`supports<T>`) and whether it returns
// bool (`bool_out`). pow is not here: each device calls its own libm.
#pragma once

#include <type_traits>

#include "kernel/common/elementwise_rules.hpp"

#if defined(__CUDACC__)
#define LOOM_EW_FN __host__ __device__ __forceinline__
#define LOOM_EW_OP __host__ __device__
#else
#define LOOM_EW_FN inline
#define LOOM_EW_OP
#endif

namespace loom::ew {

template <class T>
inline constexpr bool is_signed_int = std::is_integral_v<T>&& std::is_signed_v<T>;
template <class T>
inline constexpr bool is_number = !std::is_same_v<T, bool>;

// ---- integers that wrap ------------------------------------------------------------------------

// NumPy's behaviour, and no undefined behaviour: wider signed integers compute in their
// unsigned type, where overflow wraps; int8 and uint8 promote to int, where they cannot
// overflow, and convert back modulo 2^8.
template <class T>
LOOM_EW_FN T wrap_add(T a, T b) noexcept {
  if constexpr (is_signed_int<T> && sizeof(T) >= sizeof(int)) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return static_cast<T>(a + b);
  }
}
template <class T>
LOOM_EW_FN T wrap_sub(T a, T b) noexcept {
  if constexpr (is_signed_int<T> && sizeof(T) >= sizeof(int)) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return static_cast<T>(a - b);
  }
}
template <class T>
LOOM_EW_FN T wrap_mul(T a, T b) noexcept {
  if constexpr (is_signed_int<T> && sizeof(T) >= sizeof(int)) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return static_cast<T>(a * b);
  }
}
template <class T>
LOOM_EW_FN T wrap_neg(T a) noexcept {
  if constexpr (std::is_integral_v<T>) {
    return wrap_sub(T{0}, a);
  } else {
    return -a;
  }
}

// ---- arithmetic --------------------------------------------------------------------------------

// What the ops over numbers that return their operands' type say of themselves.
struct number_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
};

// add, sub, mul: integers wrap (wrap_add, wrap_sub, wrap_mul), floats as IEEE.
#define LOOM_ARITHMETIC(name, wrap, op)                \
  struct name : number_op {                            \
    template <class C>                                 \
    LOOM_EW_OP C operator()(C a, C b) const noexcept { \
      if constexpr (std::is_integral_v<C>) {           \
        return wrap(a, b);                             \
      } else {                                         \
        return a op b;                                 \
      }                                                \
    }                                                  \
  };
LOOM_ARITHMETIC(add_op, wrap_add, +)
LOOM_ARITHMETIC(sub_op, wrap_sub, -)
LOOM_ARITHMETIC(mul_op, wrap_mul, *)
#undef LOOM_ARITHMETIC

// Integer division truncates toward zero, as C's does; INT_MIN / -1 wraps to INT_MIN. A zero
// divisor gives 0 here: the CPU kernel fails the node before its loop (div_kernel), so the
// guard only keeps the loop free of undefined behaviour; the CUDA kernel cannot look (Note
// [cuda value checks] in src/backends/cuda/elementwise_kernels.cpp).
struct div_op : number_op {
  template <class C>
  LOOM_EW_OP C operator()(C a, C b) const noexcept {
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

// NumPy's maximum / minimum (Note [NaN rules]): NaN on either side gives NaN; a tie gives b.
#define LOOM_EXTREMUM(name, rule, cmp)                 \
  struct name : number_op {                            \
    template <class C>                                 \
    LOOM_EW_OP C operator()(C a, C b) const noexcept { \
      if constexpr (std::is_floating_point_v<C>) {     \
        return rules::rule(a, b);                      \
      } else {                                         \
        return a cmp b ? a : b;                        \
      }                                                \
    }                                                  \
  };
LOOM_EXTREMUM(maximum_op, maximum, >)
LOOM_EXTREMUM(minimum_op, minimum, <)
#undef LOOM_EXTREMUM

// ---- comparisons and logic ---------------------------------------------------------------------

#define LOOM_COMPARISON(name, expr, types)                \
  struct name {                                           \
    template <class T>                                    \
    static constexpr bool supports = types;               \
    static constexpr bool bool_out = true;                \
    template <class C>                                    \
    LOOM_EW_OP bool operator()(C a, C b) const noexcept { \
      return expr;                                        \
    }                                                     \
  };
LOOM_COMPARISON(equal_op, a == b, true)
LOOM_COMPARISON(not_equal_op, a != b, true)
LOOM_COMPARISON(less_op, a < b, is_number<T>)
LOOM_COMPARISON(less_equal_op, a <= b, is_number<T>)
LOOM_COMPARISON(greater_op, a > b, is_number<T>)
LOOM_COMPARISON(greater_equal_op, a >= b, is_number<T>)
LOOM_COMPARISON(logical_and_op, (a & b) != 0, (std::is_same_v<T, bool>))
LOOM_COMPARISON(logical_or_op, (a | b) != 0, (std::is_same_v<T, bool>))
#undef LOOM_COMPARISON

// relu's gradient from its output: dy where y > 0, else 0 (one pass, where the composed
// form would be greater + where; Note [NaN rules]).
struct relu_grad_op : number_op {
  template <class C>
  LOOM_EW_OP C operator()(C dy, C y) const noexcept {
    return rules::relu_grad(dy, y);
  }
};

}  // namespace loom::ew

#undef LOOM_EW_OP
#undef LOOM_EW_FN
