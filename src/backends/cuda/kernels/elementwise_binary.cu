// The binary element-wise kernels, with NumPy broadcasting through the layout (Note [cuda
// element-wise layout]): the CPU kernels' functors (src/kernel/common/elementwise_binary_ops.hpp;
// pow's own here), one grid-stride kernel per (op, dtype).
#include "elementwise.cuh"
#include "elementwise_device.cuh"
#include "kernel/common/elementwise_binary_ops.hpp"
#include "kernel/common/elementwise_unary_ops.hpp"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

__device__ __forceinline__ float m_pow(float a, float b) {
  return powf(a, b);
}
__device__ __forceinline__ double m_pow(double a, double b) {
  return pow(a, b);
}
__device__ __forceinline__ float m_fmod(float a, float b) {
  return fmodf(a, b);
}
__device__ __forceinline__ double m_fmod(double a, double b) {
  return fmod(a, b);
}

}  // namespace

// pow's functor; the other ops' but mod's are the CPU kernels'
// (src/kernel/common/elementwise_binary_ops.hpp). Outside the anonymous namespace, where nvcc
// takes the member variable template for one never defined.
struct pow_f {
  template <class T>
  static constexpr bool supports = dev::is_float<T>;
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    return m_pow(a, b);
  }
};

// mod's functor (`fmod` true: C's fmod; false: NumPy's mod), the integer and sign rules
// shared with the CPU (src/kernel/common/elementwise_unary_ops.hpp).
template <bool Fmod>
struct mod_f {
  template <class T>
  static constexpr bool supports = ew::is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  __device__ C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return ew::int_mod(a, b, !Fmod);
    } else {
      const C r = m_fmod(a, b);
      if constexpr (Fmod) {
        return r;
      } else {
        return ew::floor_mod_from_fmod(r, b);
      }
    }
  }
};

namespace {

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
    if constexpr (Op::template supports<T>) {
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
      return launch<ew::add_op>(t, a, b, out, layout, stream);
    case binary_op::sub:
      return launch<ew::sub_op>(t, a, b, out, layout, stream);
    case binary_op::mul:
      return launch<ew::mul_op>(t, a, b, out, layout, stream);
    case binary_op::div:
      return launch<ew::div_op>(t, a, b, out, layout, stream);
    case binary_op::pow:
      return launch<pow_f>(t, a, b, out, layout, stream);
    case binary_op::maximum:
      return launch<ew::maximum_op>(t, a, b, out, layout, stream);
    case binary_op::minimum:
      return launch<ew::minimum_op>(t, a, b, out, layout, stream);
    case binary_op::equal:
      return launch<ew::equal_op>(t, a, b, out, layout, stream);
    case binary_op::not_equal:
      return launch<ew::not_equal_op>(t, a, b, out, layout, stream);
    case binary_op::less:
      return launch<ew::less_op>(t, a, b, out, layout, stream);
    case binary_op::less_equal:
      return launch<ew::less_equal_op>(t, a, b, out, layout, stream);
    case binary_op::greater:
      return launch<ew::greater_op>(t, a, b, out, layout, stream);
    case binary_op::greater_equal:
      return launch<ew::greater_equal_op>(t, a, b, out, layout, stream);
    case binary_op::logical_and:
      return launch<ew::logical_and_op>(t, a, b, out, layout, stream);
    case binary_op::logical_or:
      return launch<ew::logical_or_op>(t, a, b, out, layout, stream);
    case binary_op::relu_grad:
      return launch<ew::relu_grad_op>(t, a, b, out, layout, stream);
    case binary_op::mod:
      return launch<mod_f<false>>(t, a, b, out, layout, stream);
    case binary_op::fmod:
      return launch<mod_f<true>>(t, a, b, out, layout, stream);
  }
  return false;
}

}  // namespace loom::cuda::kernels
