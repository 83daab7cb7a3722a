#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "update.cuh"

namespace loom::cuda::kernels {
namespace {

template <class T>
__device__ T combine(T a, T b, bool subtract) {
  return subtract ? a - b : a + b;
}
template <>
__device__ __half combine(__half a, __half b, bool subtract) {
  const float x = __half2float(a), y = __half2float(b);
  return __float2half(subtract ? x - y : x + y);
}
template <>
__device__ __nv_bfloat16 combine(__nv_bfloat16 a, __nv_bfloat16 b, bool subtract) {
  const float x = __bfloat162float(a), y = __bfloat162float(b);
  return __float2bfloat16(subtract ? x - y : x + y);
}

template <class T>
__global__ void update_kernel(T* __restrict__ dst, const T* __restrict__ src, std::int64_t n,
                              bool subtract) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    dst[i] = combine(dst[i], src[i], subtract);
  }
}

template <class T>
cudaError_t launch(void* dst, const void* src, std::int64_t n, bool subtract, cudaStream_t stream) {
  constexpr int threads = 256;
  const std::int64_t blocks = (n + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  update_kernel<T>
      <<<grid, threads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), n, subtract);
  return cudaGetLastError();
}

}  // namespace

cudaError_t update(update_type t, void* dst, const void* src, std::int64_t n, bool subtract,
                   cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (t) {
    case update_type::f32:
      return launch<float>(dst, src, n, subtract, stream);
    case update_type::f64:
      return launch<double>(dst, src, n, subtract, stream);
    case update_type::f16:
      return launch<__half>(dst, src, n, subtract, stream);
    case update_type::bf16:
      return launch<__nv_bfloat16>(dst, src, n, subtract, stream);
    case update_type::i32:
      return launch<int>(dst, src, n, subtract, stream);
    case update_type::i64:
      return launch<long long>(dst, src, n, subtract, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace loom::cuda::kernels
