#include <cstdint>

#include "strided_copy.cuh"

namespace loom::cuda::kernels {
namespace {

// One thread per output element (grid-stride): the row-major index is unravelled against
// the view's sizes, innermost first, and mapped through its strides.
template <class T>
__global__ void strided_copy_kernel(const T* __restrict__ src, T* __restrict__ dst,
                                    strided_layout layout, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += step) {
    std::int64_t rest = i;
    std::int64_t offset = 0;
    for (int d = layout.rank - 1; d >= 0; --d) {
      const std::int64_t size = layout.sizes[d];
      const std::int64_t idx = rest % size;
      rest /= size;
      offset += idx * layout.strides[d];
    }
    dst[i] = src[offset];
  }
}

struct alignas(16) bytes16 {
  std::uint64_t lo, hi;
};

template <class T>
cudaError_t launch(const void* src, void* dst, const strided_layout& layout, std::int64_t n,
                   cudaStream_t stream) {
  constexpr int threads = 256;
  const std::int64_t blocks = (n + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  strided_copy_kernel<T>
      <<<grid, threads, 0, stream>>>(static_cast<const T*>(src), static_cast<T*>(dst), layout, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t strided_copy(const void* src, void* dst, std::size_t element_size,
                         const strided_layout& layout, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (element_size) {
    case 1:
      return launch<std::uint8_t>(src, dst, layout, n, stream);
    case 2:
      return launch<std::uint16_t>(src, dst, layout, n, stream);
    case 4:
      return launch<std::uint32_t>(src, dst, layout, n, stream);
    case 8:
      return launch<std::uint64_t>(src, dst, layout, n, stream);
    case 16:
      return launch<bytes16>(src, dst, layout, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace loom::cuda::kernels
