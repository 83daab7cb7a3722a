// CUDA kernel of bias_add (launcher in bias_add.cuh): one thread per element, in 32-bit
// index arithmetic when the tensor allows (64-bit division costs several times more).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "bias_add.cuh"
#include "reduction_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace rdev;

template <class T, class I>
__global__ void bias_add_kernel(const T* x, const T* bias, T* out, I count, I channels, I inner) {
  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < count; i += step) {
    const I c = (inner == 1 ? i : i / inner) % channels;
    if constexpr (is_half_like<T> || std::is_floating_point_v<T>) {
      out[i] = store<T>(load(x[i]) + load(bias[c]));
    } else {
      out[i] = static_cast<T>(x[i] + bias[c]);
    }
  }
}

template <class T>
void bias_add_typed(const T* x, const T* bias, T* out, std::int64_t count, std::int64_t channels,
                    std::int64_t inner, cudaStream_t s) {
  constexpr int threads = 256;
  const auto grid = static_cast<unsigned>(
      std::clamp<std::int64_t>((count + threads - 1) / threads, 1, std::int64_t{1} << 16));
  // i + step must not overflow I: 32-bit indices only well below 2^31.
  if (count < (std::int64_t{1} << 30)) {
    bias_add_kernel<T, std::int32_t><<<grid, threads, 0, s>>>(
        x, bias, out, static_cast<std::int32_t>(count), static_cast<std::int32_t>(channels),
        static_cast<std::int32_t>(inner));
  } else {
    bias_add_kernel<T, std::int64_t><<<grid, threads, 0, s>>>(x, bias, out, count, channels, inner);
  }
}

}  // namespace

bool bias_add_supports(elem_type t) {
  return t != elem_type::boolean;
}

void launch_bias_add(elem_type t, const void* x, const void* bias, void* out, std::int64_t count,
                     std::int64_t channels, std::int64_t inner, cudaStream_t stream) {
  if (count <= 0) return;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    bias_add_typed<T>(static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(out),
                      count, channels, inner, stream);
  };
  switch (t) {
    case elem_type::f32:
      return go(float{});
    case elem_type::f64:
      return go(double{});
    case elem_type::f16:
      return go(f16{});
    case elem_type::bf16:
      return go(bf16{});
    case elem_type::i32:
      return go(std::int32_t{});
    case elem_type::i64:
      return go(std::int64_t{});
    case elem_type::i8:
      return go(std::int8_t{});
    case elem_type::u8:
      return go(std::uint8_t{});
    case elem_type::boolean:
      return;
  }
}

}  // namespace loom::cuda::kernels
