// fused_matmul's element-wise epilogue (epilogue.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "epilogue.cuh"

namespace loom::cuda::kernels {
namespace {

// Widening and rounding: float for the 16-bit types, the type itself otherwise.
__device__ __forceinline__ float widen(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ double widen(double x) {
  return x;
}

template <class T, class C>
__device__ __forceinline__ T narrow(C x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return static_cast<T>(x);
  }
}

// The activations of nn_fused.cpp's act_* functors, in C (float or double).
__device__ __forceinline__ float activate(float x, epilogue_activation a) {
  switch (a) {
    case epilogue_activation::relu:
      return x < 0.0f ? 0.0f : x;  // NaN passes through
    case epilogue_activation::gelu:
      return 0.5f * x * erfcf(-x * 1.41421356237309504880f / 2.0f);
    case epilogue_activation::gelu_tanh: {
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return x / (1.0f + expf(-2.0f * u));
    }
    case epilogue_activation::tanh:
      return tanhf(x);
    case epilogue_activation::sigmoid:
      return 1.0f / (1.0f + expf(-x));
    default:
      return x;
  }
}

__device__ __forceinline__ double activate(double x, epilogue_activation a) {
  switch (a) {
    case epilogue_activation::relu:
      return x < 0.0 ? 0.0 : x;
    case epilogue_activation::gelu:
      return 0.5 * x * erfc(-x * 1.41421356237309504880 / 2.0);
    case epilogue_activation::gelu_tanh: {
      const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
      return x / (1.0 + exp(-2.0 * u));
    }
    case epilogue_activation::tanh:
      return tanh(x);
    case epilogue_activation::sigmoid:
      return 1.0 / (1.0 + exp(-x));
    default:
      return x;
  }
}

// Grid-stride over the n = rows * columns elements (int64 indices: outputs may pass 2^31).
template <class T>
__global__ void epilogue_kernel(T* out, const T* bias, const T* residual, std::int64_t n,
                                std::int64_t columns, epilogue_activation act) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    auto v = widen(out[i]);
    if (bias != nullptr) v += widen(bias[i % columns]);
    if (residual != nullptr) v += widen(residual[i]);
    out[i] = narrow<T>(activate(v, act));
  }
}

template <class T>
cudaError_t launch(void* out, const void* bias, const void* residual, std::int64_t rows,
                   std::int64_t columns, epilogue_activation act, cudaStream_t stream) {
  const std::int64_t n = rows * columns;
  if (n <= 0) return cudaSuccess;
  constexpr int threads = 256;
  // Enough blocks to fill any current GPU several times over; the loop covers the rest.
  const std::int64_t blocks = std::min<std::int64_t>((n + threads - 1) / threads, 65536);
  epilogue_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      static_cast<T*>(out), static_cast<const T*>(bias), static_cast<const T*>(residual), n,
      columns, act);
  return cudaGetLastError();
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
      return launch<__half>(out, bias, residual, rows, columns, act, stream);
    case epilogue_type::bf16:
      return launch<__nv_bfloat16>(out, bias, residual, rows, columns, act, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace loom::cuda::kernels
