// cast, where and the generators fill and range on the GPU (CPU: elementwise_cast.cpp and
// elementwise_generators.cpp). where and fill move bits, so they are instantiated per element
// size; cast per (from, to) pair.
#include "elementwise.cuh"
#include "elementwise_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

// ---- cast ------------------------------------------------------------------------------------

// One element From -> To in compute types, as the CPU's cast_op: the 16-bit floats arrive
// and leave as float; float to integer truncates and saturates (NaN -> 0); integer to integer
// wraps; to bool is x != 0.
template <class From, class To>
__device__ __forceinline__ To cast_one(From v) {
  using in_t = compute_t<From>;
  using out_t = compute_t<To>;
  const in_t x = load(v);
  if constexpr (std::is_same_v<To, bool>) {
    return x != in_t{0};
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<in_t>) {
    return saturate_cast<To>(x);
  } else {
    return store<To>(static_cast<out_t>(x));
  }
}

// Not __restrict__: y may be x's buffer when the types have one size (a cast in place).
template <class From, class To>
__global__ void cast_kernel(const From* x, To* y, ew_layout l) {
  const std::int64_t n = l.count;
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    std::int64_t off[1];
    offsets<1>(l, i, off);
    y[i] = cast_one<From, To>(x[off[0]]);
  }
}

// ---- where -----------------------------------------------------------------------------------

template <class B>
__global__ void where_kernel(const bool* c, const B* x, const B* y, B* out, ew_layout l) {
  const std::int64_t n = l.count;
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    std::int64_t off[3];
    offsets<3>(l, i, off);
    out[i] = c[off[0]] ? x[off[1]] : y[off[2]];
  }
}

template <class B>
void launch_where_bits(const bool* c, const void* x, const void* y, void* out, const ew_layout& l,
                       cudaStream_t stream) {
  where_kernel<B><<<grid_for(l.count), block_threads, 0, stream>>>(
      c, static_cast<const B*>(x), static_cast<const B*>(y), static_cast<B*>(out), l);
}

// ---- fill and range --------------------------------------------------------------------------

template <class B>
__global__ void fill_kernel(B* __restrict__ out, B value, std::int64_t n) {
  for (std::int64_t i = first_item(); i < n; i += grid_step()) out[i] = value;
}

template <class B>
void launch_fill_bits(std::uint64_t bits, void* out, std::int64_t n, cudaStream_t stream) {
  fill_kernel<B>
      <<<grid_for(n), block_threads, 0, stream>>>(static_cast<B*>(out), static_cast<B>(bits), n);
}

// start + i * delta with the multiply and the add rounded separately, as the CPU (which has
// no fused multiply-add at its baseline) computes it.
template <class T>
__global__ void range_kernel(T* __restrict__ out, double start, double delta, std::int64_t n) {
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    out[i] = from_double<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), delta)));
  }
}

bool movable(std::size_t elem_bytes) {
  return elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8;
}

}  // namespace

bool launch_cast(elem_type from, elem_type to, const void* x, void* y, const ew_layout& layout,
                 cudaStream_t stream) {
  if (layout.count <= 0) return from != to;
  return visit(from, [&](auto from_tag) {
    using From = decltype(from_tag);
    return visit(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      if constexpr (std::is_same_v<From, To>) {
        return false;  // no kernel for what is not a conversion
      } else {
        cast_kernel<From, To><<<grid_for(layout.count), block_threads, 0, stream>>>(
            static_cast<const From*>(x), static_cast<To*>(y), layout);
        return true;
      }
    });
  });
}

bool launch_where(std::size_t elem_bytes, const bool* c, const void* x, const void* y, void* out,
                  const ew_layout& layout, cudaStream_t stream) {
  if (layout.count <= 0) return movable(elem_bytes);
  switch (elem_bytes) {
    case 1:
      launch_where_bits<std::uint8_t>(c, x, y, out, layout, stream);
      return true;
    case 2:
      launch_where_bits<std::uint16_t>(c, x, y, out, layout, stream);
      return true;
    case 4:
      launch_where_bits<std::uint32_t>(c, x, y, out, layout, stream);
      return true;
    case 8:
      launch_where_bits<std::uint64_t>(c, x, y, out, layout, stream);
      return true;
    default:
      return false;
  }
}

bool launch_fill(std::size_t elem_bytes, std::uint64_t bits, void* out, std::int64_t count,
                 cudaStream_t stream) {
  if (count <= 0) return movable(elem_bytes);
  switch (elem_bytes) {
    case 1:
      launch_fill_bits<std::uint8_t>(bits, out, count, stream);
      return true;
    case 2:
      launch_fill_bits<std::uint16_t>(bits, out, count, stream);
      return true;
    case 4:
      launch_fill_bits<std::uint32_t>(bits, out, count, stream);
      return true;
    case 8:
      launch_fill_bits<std::uint64_t>(bits, out, count, stream);
      return true;
    default:
      return false;
  }
}

bool launch_range(elem_type t, double start, double delta, void* out, std::int64_t count,
                  cudaStream_t stream) {
  return visit(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return false;
    } else {
      if (count > 0) {
        range_kernel<T><<<grid_for(count), block_threads, 0, stream>>>(static_cast<T*>(out), start,
                                                                       delta, count);
      }
      return true;
    }
  });
}

}  // namespace loom::cuda::kernels
