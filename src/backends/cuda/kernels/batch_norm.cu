// CUDA kernel of batch_norm (launcher in batch_norm.cuh): a grid-stride loop over the
// elements, each finding its channel and applying that channel's a and b.
#include <cstdint>
#include <type_traits>

#include "batch_norm.cuh"
#include "reduction_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace rdev;

template <class T>
__global__ void batch_norm_kernel(const T* x, const T* scale, const T* bias, const T* mean,
                                  const T* var, T* y, std::int64_t total, std::int64_t channels,
                                  std::int64_t inner, double epsilon) {
  using C = acc_t<T>;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += step) {
    const std::int64_t c = (i / inner) % channels;
    const C a = static_cast<C>(load(scale[c])) /
                sqrt(static_cast<C>(load(var[c])) + static_cast<C>(epsilon));
    const C b = static_cast<C>(load(bias[c])) - static_cast<C>(load(mean[c])) * a;
    y[i] = store<T>(static_cast<C>(load(x[i])) * a + b);
  }
}

}  // namespace

bool batch_norm_supports(elem_type t) {
  return t == elem_type::f32 || t == elem_type::f64 || t == elem_type::f16 ||
         t == elem_type::bf16;
}

void launch_batch_norm(elem_type t, const void* x, const void* scale, const void* bias,
                       const void* mean, const void* var, void* y, std::int64_t outer,
                       std::int64_t channels, std::int64_t inner, double epsilon,
                       cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t total = outer * channels * inner;
    constexpr int threads = 256;
    batch_norm_kernel<T><<<grid_for(ceil_div(total, threads)), threads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias),
        static_cast<const T*>(mean), static_cast<const T*>(var), static_cast<T*>(y), total,
        channels, inner, epsilon);
  });
}

}  // namespace loom::cuda::kernels
