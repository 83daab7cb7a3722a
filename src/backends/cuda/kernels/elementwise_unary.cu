// The unary element-wise kernels: one functor per op (elementwise_ops.cuh), computing one
// element in its compute type with the semantics of the CPU kernel
// (src/backends/cpu/elementwise_ops.hpp), and one grid-stride kernel per (op, dtype) the op
// takes, over flat or general layouts (Note [cuda element-wise layout]). Math is CUDA's
// correctly rounded-or-close libdevice functions (expf, tanhf, erff, ...), which agree with
// the CPU's to a few ulp.
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
