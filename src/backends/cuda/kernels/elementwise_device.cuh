// Device-side helpers of the element-wise and array kernels (included by .cu files only):
// element types and their compute types, integer arithmetic that wraps, conversions as the
// CPU kernels convert, layout unravelling (Note [cuda element-wise layout]) and launch shapes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "elementwise.cuh"
#include "kernel/common/elementwise_binary_ops.hpp"
#include "kernel/common/elementwise_convert.hpp"

namespace loom::cuda::kernels::dev {

// ---- element types ---------------------------------------------------------------------------

using f16 = __half;
using bf16 = __nv_bfloat16;

template <class T>
inline constexpr bool is_half_like = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;
template <class T>
inline constexpr bool is_float = std::is_floating_point_v<T> || is_half_like<T>;
using loom::ew::is_signed_int;

/// The type an element of T is computed in: float for the 16-bit floats, else T.
template <class T>
using compute_t = std::conditional_t<is_half_like<T>, float, T>;

template <class T>
__device__ __forceinline__ compute_t<T> load(T v) {
  if constexpr (std::is_same_v<T, f16>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}

/// A computed value as T (the 16-bit floats round to nearest even).
template <class T>
__device__ __forceinline__ T store(compute_t<T> v) {
  if constexpr (std::is_same_v<T, f16>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

/// Calls f(T{}) with the device type of `t`; returns f's result.
template <class F>
__host__ decltype(auto) visit(elem_type t, F&& f) {
  switch (t) {
    case elem_type::f64:
      return f(double{});
    case elem_type::f16:
      return f(f16{});
    case elem_type::bf16:
      return f(bf16{});
    case elem_type::i32:
      return f(std::int32_t{});
    case elem_type::i64:
      return f(std::int64_t{});
    case elem_type::i8:
      return f(std::int8_t{});
    case elem_type::u8:
      return f(std::uint8_t{});
    case elem_type::boolean:
      return f(bool{});
    case elem_type::f32:
      break;
  }
  return f(float{});
}

/// The unsigned integer of `bytes` bytes, for kernels that move bits.
template <std::size_t Bytes>
using bits_t = std::conditional_t<
    Bytes == 1, std::uint8_t,
    std::conditional_t<Bytes == 2, std::uint16_t,
                       std::conditional_t<Bytes == 4, std::uint32_t, std::uint64_t>>>;

// ---- integers that wrap (the host's, src/kernel/common/elementwise_binary_ops.hpp) ----------

using loom::ew::wrap_add;
using loom::ew::wrap_mul;
using loom::ew::wrap_neg;
using loom::ew::wrap_sub;

// ---- conversions (as src/kernel/common/elementwise_convert.hpp on the host) -----------------

/// x as integer type I: truncated toward zero, saturated at I's range, NaN -> 0 (the host's
/// function, src/kernel/common/elementwise_convert.hpp).
using loom::ew::saturate_cast;

/// A double as T, as cast converts one: bool is v != 0, integers saturate (the host's
/// loom::ew::from_double), the 16-bit floats round through float.
template <class T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (is_half_like<T>) {
    return store<T>(static_cast<float>(v));
  } else {
    return loom::ew::from_double<T>(v);
  }
}

// ---- layouts ---------------------------------------------------------------------------------

/// off[k] = input k's element offset for output element i, through dims unravelled in
/// index type I (general layouts only).
template <int K, class I>
__device__ __forceinline__ void unravel(const ew_layout& l, I i, std::int64_t (&off)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
  I rest = i;
#pragma unroll
  for (int j = 0; j < ew_max_dims; ++j) {
    const int d = l.rank - 1 - j;
    if (d < 0) break;
    const I n = static_cast<I>(l.dims[d]);
    const I c = rest % n;
    rest /= n;
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += static_cast<std::int64_t>(c) * l.strides[k][d];
  }
}

/// off[k] = input k's element offset for output element i (Note [cuda element-wise layout]).
template <int K>
__device__ __forceinline__ void offsets(const ew_layout& l, std::int64_t i,
                                        std::int64_t (&off)[K]) {
  if (l.rank == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = i * l.flat[k];
  } else if (l.count <= std::int64_t{0xffffffff}) {
    unravel<K, std::uint32_t>(l, static_cast<std::uint32_t>(i), off);
  } else {
    unravel<K, std::int64_t>(l, i, off);
  }
}

// ---- launch shapes ---------------------------------------------------------------------------

inline constexpr int block_threads = 256;

/// Blocks for a grid-stride loop over n > 0 items: one item per thread up to a cap, beyond
/// which each thread takes several (the cap keeps the grid within what any GPU accepts and
/// is ample to fill one).
inline unsigned grid_for(std::int64_t n) {
  const std::int64_t blocks = (n + block_threads - 1) / block_threads;
  constexpr std::int64_t cap = 65535 * 8;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

/// The first item of this thread and the grid-stride step, in 64-bit arithmetic.
__device__ __forceinline__ std::int64_t first_item() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_step() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace loom::cuda::kernels::dev
