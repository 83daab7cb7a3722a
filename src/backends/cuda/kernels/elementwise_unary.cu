// The unary element-wise kernels: one functor per op (elementwise_ops.cuh), computing one
// element in its compute type with the semantics of the CPU kernel
// (src/backends/cpu/elementwise_ops.hpp), and one grid-stride kernel per (op, dtype) the op
// takes, over flat or general layouts (Note [cuda element-wise layout]). Math is CUDA's
// correctly rounded-or-close libdevice functions (expf, tanhf, erff, ...), which agree with
// the CPU's to a few ulp.
#include <utility>

#include "elementwise.cuh"
#include "elementwise_device.cuh"
#include "elementwise_ops.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

struct logical_not_f {
  template <class T>
  static constexpr bool supports() {
    return std::is_same_v<T, bool>;
  }
  __device__ bool operator()(bool x) const { return !x; }
};

// y[i] = op(x[...]), R being T or bool (the predicates). Not __restrict__: y may be x's
// buffer (a result written in place), each element read by the thread that then writes it.
template <class Op, class T, class R>
__global__ void unary_kernel(const T* x, R* y, ew_layout l, Op op) {
  const std::int64_t n = l.count;
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    std::int64_t off[1];
    offsets<1>(l, i, off);
    y[i] = store<R>(op(load(x[off[0]])));
  }
}

template <class Op>
bool launch(elem_type t, const void* x, void* y, const ew_layout& l, cudaStream_t stream,
            Op op = Op{}) {
  return visit(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (Op::template supports<T>()) {
      using R = std::conditional_t<std::is_same_v<decltype(op(std::declval<compute_t<T>>())), bool>,
                                   bool, T>;
      if (l.count > 0) {
        unary_kernel<Op, T, R><<<grid_for(l.count), block_threads, 0, stream>>>(
            static_cast<const T*>(x), static_cast<R*>(y), l, op);
      }
      return true;
    } else {
      return false;
    }
  });
}

// The functor of an op with attributes, its values set from `a`.
template <class Op>
Op with_alpha(const unary_attrs& a) {
  Op op{};
  op.alpha = a.alpha;
  return op;
}

}  // namespace

bool launch_unary(unary_op op, elem_type t, const void* x, void* y, const ew_layout& layout,
                  cudaStream_t stream, const unary_attrs& attrs) {
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
    case unary_op::sin:
      return launch<sin_f>(t, x, y, layout, stream);
    case unary_op::cos:
      return launch<cos_f>(t, x, y, layout, stream);
    case unary_op::tan:
      return launch<tan_f>(t, x, y, layout, stream);
    case unary_op::asin:
      return launch<asin_f>(t, x, y, layout, stream);
    case unary_op::acos:
      return launch<acos_f>(t, x, y, layout, stream);
    case unary_op::atan:
      return launch<atan_f>(t, x, y, layout, stream);
    case unary_op::sinh:
      return launch<sinh_f>(t, x, y, layout, stream);
    case unary_op::cosh:
      return launch<cosh_f>(t, x, y, layout, stream);
    case unary_op::asinh:
      return launch<asinh_f>(t, x, y, layout, stream);
    case unary_op::acosh:
      return launch<acosh_f>(t, x, y, layout, stream);
    case unary_op::atanh:
      return launch<atanh_f>(t, x, y, layout, stream);
    case unary_op::log1p:
      return launch<log1p_f>(t, x, y, layout, stream);
    case unary_op::expm1:
      return launch<expm1_f>(t, x, y, layout, stream);
    case unary_op::floor:
      return launch<floor_f>(t, x, y, layout, stream);
    case unary_op::ceil:
      return launch<ceil_f>(t, x, y, layout, stream);
    case unary_op::round:
      return launch<round_f>(t, x, y, layout, stream);
    case unary_op::sign:
      return launch<sign_f>(t, x, y, layout, stream);
    case unary_op::softplus:
      return launch<softplus_f>(t, x, y, layout, stream);
    case unary_op::softsign:
      return launch<softsign_f>(t, x, y, layout, stream);
    case unary_op::silu:
      return launch<silu_f>(t, x, y, layout, stream);
    case unary_op::mish:
      return launch<mish_f>(t, x, y, layout, stream);
    case unary_op::hard_swish:
      return launch<hard_swish_f>(t, x, y, layout, stream);
    case unary_op::isnan:
      return launch<isnan_f>(t, x, y, layout, stream);
    case unary_op::isfinite:
      return launch<isfinite_f>(t, x, y, layout, stream);
    case unary_op::elu:
    case unary_op::selu:
    case unary_op::celu: {
      auto f = with_alpha<exp_linear_f>(attrs);
      f.beta = attrs.beta;
      f.gamma = attrs.gamma;
      return launch(t, x, y, layout, stream, f);
    }
    case unary_op::hard_sigmoid: {
      auto f = with_alpha<hard_sigmoid_f>(attrs);
      f.beta = attrs.beta;
      return launch(t, x, y, layout, stream, f);
    }
    case unary_op::leaky_relu:
      return launch(t, x, y, layout, stream, with_alpha<leaky_relu_f>(attrs));
    case unary_op::thresholded_relu:
      return launch(t, x, y, layout, stream, with_alpha<thresholded_relu_f>(attrs));
    case unary_op::isinf: {
      isinf_f f{};
      f.positive = attrs.detect_positive;
      f.negative = attrs.detect_negative;
      return launch(t, x, y, layout, stream, f);
    }
  }
  return false;
}

}  // namespace loom::cuda::kernels
