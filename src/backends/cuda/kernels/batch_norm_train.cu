// CUDA passes of the training batch norm (launchers in batch_norm_train.cuh): per-channel
// sums, one block a channel, and the element-wise normalising / dx pass.
#include <cstdint>
#include <type_traits>

#include "batch_norm_train.cuh"
#include "reduction_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace rdev;

// The offset of value k of channel c (k < outer · inner).
__device__ __forceinline__ std::int64_t at(std::int64_t k, std::int64_t c, std::int64_t channels,
                                           std::int64_t inner) {
  return ((k / inner) * channels + c) * inner + k % inner;
}

struct pair_sum {
  double a;
  double b;
};

template <class T>
__global__ void channel_sums_kernel(const T* x, const T* dy, const double* centre, double* out,
                                    std::int64_t count, std::int64_t channels,
                                    std::int64_t inner) {
  __shared__ block_scratch scratch;
  const std::int64_t c = blockIdx.x;
  // Forward: deviations from the channel's first value; backward: from the saved mean.
  const double shift = dy == nullptr ? static_cast<double>(load(x[at(0, c, channels, inner)]))
                                     : centre[c];
  double s1 = 0;
  double s2 = 0;
  for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const std::int64_t i = at(k, c, channels, inner);
    const double u = static_cast<double>(load(x[i])) - shift;
    if (dy == nullptr) {
      s1 += u;
      s2 += u * u;
    } else {
      const double g = static_cast<double>(load(dy[i]));
      s1 += g;
      s2 += g * u;
    }
  }
  const pair_sum total = block_allreduce(
      pair_sum{s1, s2}, [](pair_sum p, pair_sum q) { return pair_sum{p.a + q.a, p.b + q.b}; },
      pair_sum{0, 0}, scratch);
  if (threadIdx.x != 0) return;
  if (dy == nullptr) {
    const double n = static_cast<double>(count);
    out[c] = shift + total.a / n;
    out[channels + c] = fmax(0.0, total.b - total.a * total.a / n);
  } else {
    out[c] = total.a;
    out[channels + c] = total.b;
  }
}

template <class T>
__global__ void apply_kernel(const T* x, const T* dy, T* out, const acc_t<T>* coef,
                             std::int64_t total, std::int64_t channels, std::int64_t inner) {
  using C = acc_t<T>;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < total; i += step) {
    const std::int64_t c = (i / inner) % channels;
    const C u = static_cast<C>(load(x[i])) - coef[c];
    const C a = coef[channels + c];
    const C b = coef[3 * channels + c];
    if (dy == nullptr) {
      out[i] = store<T>(u * a + b);
    } else {
      out[i] = store<T>(static_cast<C>(load(dy[i])) * a + u * coef[2 * channels + c] + b);
    }
  }
}

}  // namespace

bool batch_norm_train_supports(elem_type t) {
  return t == elem_type::f32 || t == elem_type::f64 || t == elem_type::f16 ||
         t == elem_type::bf16;
}

void launch_batch_norm_channel_sums(elem_type t, const void* x, const void* dy,
                                    const double* centre, double* out, std::int64_t outer,
                                    std::int64_t channels, std::int64_t inner,
                                    cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int threads = 256;
    channel_sums_kernel<T><<<static_cast<unsigned>(channels), threads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), centre, out, outer * inner,
        channels, inner);
  });
}

void launch_batch_norm_apply(elem_type t, const void* x, const void* dy, void* out,
                             const void* coef, std::int64_t outer, std::int64_t channels,
                             std::int64_t inner, cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t total = outer * channels * inner;
    constexpr int threads = 256;
    apply_kernel<T><<<grid_for(ceil_div(total, threads)), threads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(out),
        static_cast<const acc_t<T>*>(coef), total, channels, inner);
  });
}

}  // namespace loom::cuda::kernels
