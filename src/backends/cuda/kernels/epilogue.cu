// fused_matmul's element-wise epilogue (epilogue.cuh): bias, residual and activation, each
// step as the unfused op's kernel computes and rounds it (Note [cuda matmul epilogues]).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "elementwise_device.cuh"
#include "elementwise_ops.cuh"
#include "epilogue.cuh"

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

// Grid-stride over the n = rows * columns elements (int64 indices: outputs may pass 2^31).
// Each step is the unfused op's: bias_add's and add's float add, then the activation's
// functor (elementwise_ops.cuh), every value rounded to T as those kernels store it
// (load(store<T>(v)): no change for float and double).
template <class T, class Act>
__global__ void epilogue_kernel(T* out, const T* bias, const T* residual, std::int64_t n,
                                std::int64_t columns) {
  const Act act;
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
                        std::int64_t columns, cudaStream_t stream) {
  constexpr int threads = 256;
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const std::int64_t blocks = std::min<std::int64_t>((n + threads - 1) / threads, 65536);
  epilogue_kernel<T, Act>
      <<<static_cast<unsigned>(blocks), threads, 0, stream>>>(out, bias, residual, n, columns);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch(void* out_v, const void* bias_v, const void* residual_v, std::int64_t rows,
                   std::int64_t columns, epilogue_activation act, cudaStream_t stream) {
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
    case epilogue_activation::none:
      break;
  }
  return launch_with<T, no_activation>(out, bias, residual, n, columns, stream);
}

}  // namespace

cudaError_t matmul_epilogue(void* out, const void* bias, const void* residual, std::int64_t rows,
                            std::int64_t columns, epilogue_type type, epilogue_activation act,
                            cudaStream_t stream) {
  switch (type) {
    case epilogue_type::f32:
      return launch<float>(out, bias, residual, rows, columns, act, stream);
    case epilogue_type::f64:
      return launch<double>(out, bias, residual, rows, columns, act, stream);
    case epilogue_type::f16:
      return launch<f16>(out, bias, residual, rows, columns, act, stream);
    case epilogue_type::bf16:
      return launch<bf16>(out, bias, residual, rows, columns, act, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace loom::cuda::kernels
