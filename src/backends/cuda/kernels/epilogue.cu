// fused_matmul's element-wise epilogue (epilogue.cuh): bias, residual and activation, each
// step as the unfused op's kernel computes and rounds it (Note [cuda matmul epilogues]).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "elementwise_device.cuh"
#include "elementwise_ops.cuh"
#include "epilogue.cuh"
#include "kernel/common/elementwise_binary_ops.hpp"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

// No activation: the value as it is.
struct no_activation {
  template <class C>
  __device__ C operator()(C x) const {
    return x;
  }
};

// Activation clip's bounds as given (the attributes' doubles).
struct clip_bounds {
  double lo;
  double hi;
};

// Activation clip in compute type C: the unfused maximum(x, lo) then minimum(., hi), x
// first (Note [clip activation] in nn_rules.hpp). Their results are one of their operands,
// values of T already, so rounding each to T as the unfused kernels do changes nothing.
template <class C>
struct clip_f {
  C lo;
  C hi;
  __device__ C operator()(C x) const { return ew::minimum_op{}(ew::maximum_op{}(x, lo), hi); }
};

// The activation functor for elements of T: clip's bounds become values of T (as scalar
// constants of T hold them) in T's compute type; the other functors as they are.
template <class T, class Act>
__device__ __forceinline__ auto bind_activation(Act a) {
  if constexpr (std::is_same_v<Act, clip_bounds>) {
    using C = compute_t<T>;
    return clip_f<C>{load(store<T>(static_cast<C>(a.lo))), load(store<T>(static_cast<C>(a.hi)))};
  } else {
    return a;
  }
}

// Grid-stride over the n = rows * columns elements (int64 indices: outputs may pass 2^31).
// Each step is the unfused op's: bias_add's and add's float add, then the activation's
// functor (elementwise_ops.cuh), every value rounded to T as those kernels store it
// (load(store<T>(v)): no change for float and double).
template <class T, class Act>
__global__ void epilogue_kernel(T* out, const T* bias, const T* residual, std::int64_t n,
                                std::int64_t columns, Act act_arg) {
  const auto act = bind_activation<T>(act_arg);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    auto v = load(out[i]);
    if (bias != nullptr) v = load(store<T>(v + load(bias[i % columns])));
    if (residual != nullptr) v = load(store<T>(v + load(residual[i])));
    out[i] = store<T>(act(v));
  }
}

template <class T, class Act>
cudaError_t launch_with(T* out, const T* bias, const T* residual, std::int64_t n,
                        std::int64_t columns, cudaStream_t stream, Act act = Act{}) {
  constexpr int threads = 256;
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const std::int64_t blocks = std::min<std::int64_t>((n + threads - 1) / threads, 65536);
  epilogue_kernel<T, Act>
      <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(out, bias, residual, n, columns, act);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch(void* out_v, const void* bias_v, const void* residual_v, std::int64_t rows,
                   std::int64_t columns, epilogue_activation act, clip_bounds clip,
                   cudaStream_t stream) {
  const std::int64_t n = rows * columns;
  if (n <= 0) return cudaSuccess;
  auto* out = static_cast<T*>(out_v);
  const auto* bias = static_cast<const T*>(bias_v);
  const auto* residual = static_cast<const T*>(residual_v);
  switch (act) {
    case epilogue_activation::relu:
      return launch_with<T, relu_f>(out, bias, residual, n, columns, stream);
    case epilogue_activation::gelu:
      return launch_with<T, gelu_erf_f>(out, bias, residual, n, columns, stream);
    case epilogue_activation::gelu_tanh:
      return launch_with<T, gelu_tanh_f>(out, bias, residual, n, columns, stream);
    case epilogue_activation::tanh:
      return launch_with<T, tanh_f>(out, bias, residual, n, columns, stream);
    case epilogue_activation::sigmoid:
      return launch_with<T, sigmoid_f>(out, bias, residual, n, columns, stream);
    case epilogue_activation::clip:
      return launch_with<T, clip_bounds>(out, bias, residual, n, columns, stream, clip);
    case epilogue_activation::none:
      break;
  }
  return launch_with<T, no_activation>(out, bias, residual, n, columns, stream);
}

}  // namespace

cudaError_t matmul_epilogue(void* out, const void* bias, const void* residual, std::int64_t rows,
                            std::int64_t columns, epilogue_type type, epilogue_activation act,
                            double clip_min, double clip_max, cudaStream_t stream) {
  const clip_bounds clip{clip_min, clip_max};
  switch (type) {
    case epilogue_type::f32:
      return launch<float>(out, bias, residual, rows, columns, act, clip, stream);
    case epilogue_type::f64:
      return launch<double>(out, bias, residual, rows, columns, act, clip, stream);
    case epilogue_type::f16:
      return launch<f16>(out, bias, residual, rows, columns, act, clip, stream);
    case epilogue_type::bf16:
      return launch<bf16>(out, bias, residual, rows, columns, act, clip, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace loom::cuda::kernels
