// Element-wise ops that need no math library, written once for the CPU kernels
// (src/backends/cpu/elementwise_ops.hpp) and the CUDA kernels (kernels/elementwise_ops.cuh,
// compiled by nvcc): sign, softsign, leaky_relu, hard_sigmoid, hard_swish, thresholded_relu,
// the predicates isnan / isinf / isfinite, and the remainder's sign fix-ups of mod. Each
// computes one element in its compute type (float for float16 / bfloat16). NaN propagates
// (Note [NaN rules] in elementwise_rules.hpp); infinities give what the defining formula
// gives in IEEE arithmetic, as ONNX's definitions and PyTorch do (softsign(inf) is
// inf / inf = NaN, hard_swish(-inf) is -inf * 0 = NaN), not the function's limit.
//
// The ops that call the math library (sin, softplus, elu, ...) are each device's own, as
// pow is: each device calls its own libm.
#pragma once

#include <type_traits>

#include "kernel/common/elementwise_rules.hpp"

#if defined(__CUDACC__)
#define LOOM_EW_OP __host__ __device__
#else
#define LOOM_EW_OP
#endif

namespace loom::ew {

/// -1, 0 or +1 by x's sign; NaN stays NaN and both zeros give +0 (NumPy's sign).
struct sign_fn {
  template <class C>
  LOOM_EW_OP C operator()(C x) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return static_cast<C>((x > 0) - (x < 0));
    } else {
      return x > C(0) ? C(1) : x < C(0) ? C(-1) : x == C(0) ? C(0) : x;
    }
  }
};

/// x / (1 + |x|); ±inf gives NaN (inf / inf), as ONNX's Softsign and torch.nn.Softsign.
struct softsign_fn {
  template <class C>
  LOOM_EW_OP C operator()(C x) const noexcept {
    return x / (C(1) + (x < C(0) ? -x : x));
  }
};

/// x < 0 ? alpha x : x (ONNX LeakyRelu); -0 and NaN pass through.
struct leaky_relu_fn {
  double alpha;
  template <class C>
  LOOM_EW_OP C operator()(C x) const noexcept {
    return x < C(0) ? C(alpha) * x : x;
  }
};

/// max(0, min(1, alpha x + beta)); NaN stays NaN.
struct hard_sigmoid_fn {
  double alpha;
  double beta;
  template <class C>
  LOOM_EW_OP C operator()(C x) const noexcept {
    return rules::maximum(C(0), rules::minimum(C(1), C(alpha) * x + C(beta)));
  }
};

/// x max(0, min(1, x / 6 + 1/2)): -0 at and below -3 (x * 0), NaN at -inf (-inf * 0, as
/// ONNX's HardSwish and torch.nn.Hardswish), x at and above 3; NaN stays NaN.
struct hard_swish_fn {
  template <class C>
  LOOM_EW_OP C operator()(C x) const noexcept {
    return x * rules::maximum(C(0), rules::minimum(C(1), x / C(6) + C(0.5)));
  }
};

/// x > alpha ? x : 0 (ONNX ThresholdedRelu); NaN stays NaN.
struct thresholded_relu_fn {
  double alpha;
  template <class C>
  LOOM_EW_OP C operator()(C x) const noexcept {
    return (x > C(alpha) || x != x) ? x : C(0);
  }
};

// ---- predicates (float in, bool out) ----------------------------------------------------------

struct isnan_fn {
  template <class C>
  LOOM_EW_OP bool operator()(C x) const noexcept {
    return x != x;
  }
};

/// ONNX IsInf: +inf when detect_positive, -inf when detect_negative.
struct isinf_fn {
  bool positive = true;
  bool negative = true;
  template <class C>
  LOOM_EW_OP bool operator()(C x) const noexcept {
    const bool inf = x == x && x - x != x - x;
    return inf && (x > C(0) ? positive : negative);
  }
};

struct isfinite_fn {
  template <class C>
  LOOM_EW_OP bool operator()(C x) const noexcept {
    return x - x == x - x;
  }
};

/// The functors above as X(name, takes_signed_integers): each device binds name_fn to its
/// dtypes (float types, and the signed integers where the flag is true) as its op name_op /
/// name_f.
#define LOOM_NEUTRAL_UNARY_OPS(X) \
  X(sign, true)                   \
  X(softsign, false)              \
  X(leaky_relu, false)            \
  X(hard_sigmoid, false)          \
  X(hard_swish, false)            \
  X(thresholded_relu, false)      \
  X(isnan, false)                 \
  X(isinf, false)                 \
  X(isfinite, false)

// ---- mod ------------------------------------------------------------------------------------

/// a mod b for integers: the remainder of division truncating toward zero (C's %,
/// `fmod`), or, when `floor`, with the divisor's sign (Python's and NumPy's %). INT_MIN mod
/// -1 is 0. A zero divisor gives 0: the CPU kernel fails the node first, as div does (Note
/// [cuda value checks] in src/backends/cuda/elementwise_kernels.cpp).
template <class C>
LOOM_EW_OP C int_mod(C a, C b, bool floor) noexcept {
  if (b == 0) return C{0};
  if constexpr (std::is_signed_v<C>) {
    if (b == C{-1}) return C{0};
  }
  C r = static_cast<C>(a % b);
  if constexpr (std::is_signed_v<C>) {
    if (floor && r != 0 && ((r < 0) != (b < 0))) r = static_cast<C>(r + b);
  }
  return r;
}

/// NumPy's float remainder from C's r = fmod(a, b): a nonzero r whose sign differs from b's
/// moves by b; a zero r takes b's sign (np.mod(-0.0, 3) = 0, np.mod(0, -3) = -0).
template <class C>
LOOM_EW_OP C floor_mod_from_fmod(C r, C b) noexcept {
  if (r != C(0)) {
    if ((r < C(0)) != (b < C(0))) r = r + b;
    return r;
  }
  return b < C(0) ? C(-0.0) : C(0);
}

}  // namespace loom::ew

#undef LOOM_EW_OP
