// The CUDA array kernels (array.cuh): strided copy, pad, gather, one_hot, gather_grad,
// gather_elements and gather_nd.
// Element-moving kernels are instantiated per element size; indices are unravelled in 32-bit
// arithmetic when the element count allows (64-bit division is several times slower on the
// GPU), else in 64-bit.
#include <cub/device/device_radix_sort.cuh>

#include "array.cuh"
#include "elementwise_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

bool movable(std::size_t elem_bytes) {
  return elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8;
}

/// Calls f(B{}) with B the unsigned integer of `elem_bytes` bytes (which must be movable).
template <class F>
void visit_bits(std::size_t elem_bytes, F&& f) {
  switch (elem_bytes) {
    case 1:
      f(std::uint8_t{});
      break;
    case 2:
      f(std::uint16_t{});
      break;
    case 4:
      f(std::uint32_t{});
      break;
    default:
      f(std::uint64_t{});
      break;
  }
}

/// Calls f(B{}, Ix{}) with B as visit_bits's and Ix the index type (int64 when `index64`,
/// else int32).
template <class F>
void visit_bits_and_index(std::size_t elem_bytes, bool index64, F&& f) {
  visit_bits(elem_bytes, [&](auto btag) {
    if (index64) {
      f(btag, std::int64_t{});
    } else {
      f(btag, std::int32_t{});
    }
  });
}

// ---- strided copy ----------------------------------------------------------------------------

template <class B>
__global__ void copy_kernel(const B* __restrict__ src, B* __restrict__ dst, ew_layout l) {
  const std::int64_t n = l.count;
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    std::int64_t off[2];
    offsets<2>(l, i, off);
    dst[off[1]] = src[off[0]];
  }
}

// Note [cuda tiled transpose]: a copy whose source is dense along one dimension (R) and whose
// destination is dense along another (C) -- a transpose, possibly batched -- would read or
// write with a stride in the element-wise copy. It goes through 32 x 32 tiles in shared memory
// instead: a tile is read with neighbouring threads on neighbouring source elements and
// written with neighbouring threads on neighbouring destination elements, so both sides
// coalesce. dims are (batch, R, C); the batch loop, like the tile loop, is grid-stride.
constexpr int tile = 32;
constexpr int tile_rows = 8;  // blockDim.y: each thread moves tile / tile_rows elements

struct transpose_shape {
  std::int64_t batch, rows, cols;   // B, R, C
  std::int64_t src_batch, src_col;  // source strides along B and C (1 along R)
  std::int64_t dst_batch, dst_row;  // destination strides along B and R (1 along C)
};

template <class B>
__global__ void transpose_kernel(const B* __restrict__ src, B* __restrict__ dst,
                                 transpose_shape t) {
  __shared__ B buf[tile][tile + 1];  // +1: columns fall in different banks
  const std::int64_t tiles_r = (t.rows + tile - 1) / tile;
  const std::int64_t tiles_c = (t.cols + tile - 1) / tile;
  const std::int64_t tiles = t.batch * tiles_r * tiles_c;
  // The loop bound depends on the block only, so every thread reaches each __syncthreads.
  for (std::int64_t k = blockIdx.x; k < tiles; k += gridDim.x) {
    const std::int64_t c0 = (k % tiles_c) * tile;
    const std::int64_t r0 = (k / tiles_c % tiles_r) * tile;
    const std::int64_t b = k / (tiles_c * tiles_r);
    const B* s = src + b * t.src_batch;
    B* d = dst + b * t.dst_batch;
    // buf[j][x] = element (r0 + x, c0 + j): threads along R read the source densely.
    for (int j = threadIdx.y; j < tile; j += tile_rows) {
      const std::int64_t r = r0 + threadIdx.x;
      const std::int64_t c = c0 + j;
      if (r < t.rows && c < t.cols) buf[j][threadIdx.x] = s[c * t.src_col + r];
    }
    __syncthreads();
    // Threads along C write the destination densely.
    for (int j = threadIdx.y; j < tile; j += tile_rows) {
      const std::int64_t r = r0 + j;
      const std::int64_t c = c0 + threadIdx.x;
      if (r < t.rows && c < t.cols) d[r * t.dst_row + c] = buf[threadIdx.x][j];
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
}

// The tiled transpose's shape for a copy layout, when it is one (Note [cuda tiled transpose]).
bool as_transpose(const ew_layout& l, transpose_shape& t) {
  if (l.rank != 2 && l.rank != 3) return false;
  const int r = l.rank - 2;  // R's dimension; C is r + 1
  const std::int64_t* src = l.strides[0];
  const std::int64_t* dst = l.strides[1];
  if (src[r] != 1 || dst[r + 1] != 1 || src[r + 1] == 1) return false;
  // Too narrow a tile wastes most of its threads; the element-wise copy does as well there.
  if (l.dims[r] < 8 || l.dims[r + 1] < 8) return false;
  t.batch = l.rank == 3 ? l.dims[0] : 1;
  t.rows = l.dims[r];
  t.cols = l.dims[r + 1];
  t.src_batch = l.rank == 3 ? src[0] : 0;
  t.src_col = src[r + 1];
  t.dst_batch = l.rank == 3 ? dst[0] : 0;
  t.dst_row = dst[r];
  return true;
}

// ---- pad -------------------------------------------------------------------------------------

// The input offset of output element i, or -1 when it lies in the padding.
template <class I>
__device__ __forceinline__ std::int64_t pad_source(const pad_layout& l, I i) {
  I rest = i;
  std::int64_t at = 0;
  bool inside = true;
#pragma unroll
  for (int j = 0; j < pad_max_dims; ++j) {
    const int d = l.rank - 1 - j;
    if (d < 0) break;
    const I n = static_cast<I>(l.out_dims[d]);
    const std::int64_t k = static_cast<std::int64_t>(rest % n) - l.before[d];
    rest /= n;
    inside = inside && k >= 0 && k < l.in_dims[d];
    at += k * l.in_strides[d];
  }
  return inside ? at : -1;
}

template <class B>
__global__ void pad_kernel(const B* __restrict__ in, B* __restrict__ out, B value, pad_layout l) {
  const std::int64_t n = l.count;
  const bool small = n <= std::int64_t{0xffffffff};
  for (std::int64_t i = first_item(); i < n; i += grid_step()) {
    const std::int64_t at = small ? pad_source<std::uint32_t>(l, static_cast<std::uint32_t>(i))
                                  : pad_source<std::int64_t>(l, i);
    out[i] = at >= 0 ? in[at] : value;
  }
}

// ---- gather and one_hot ----------------------------------------------------------------------

// u = (o * k + j) * inner + c  ->  params[(o * n + idx[j]) * inner + c] (idx[j] + n for a
// negative index with `wrap`), or zero bits.
template <class I, class B, class Ix>
__device__ __forceinline__ B gather_one(const B* params, const Ix* idx, I u, I n, I inner, I k,
                                        bool wrap) {
  const I c = u % inner;
  const I row = u / inner;
  const I j = row % k;
  const I o = row / k;
  auto v = static_cast<std::int64_t>(idx[j]);
  if (wrap && v < 0) v += static_cast<std::int64_t>(n);
  if (v < 0 || v >= static_cast<std::int64_t>(n)) return B{0};
  return params[(static_cast<std::int64_t>(o) * static_cast<std::int64_t>(n) + v) *
                    static_cast<std::int64_t>(inner) +
                static_cast<std::int64_t>(c)];
}

template <class B, class Ix>
__global__ void gather_kernel(const B* __restrict__ params, const Ix* __restrict__ idx,
                              B* __restrict__ out, std::int64_t n, std::int64_t inner,
                              std::int64_t k, std::int64_t total, bool wrap) {
  // Every index below fits 32 bits when the output's element count and the gathered
  // dimension do.
  const bool small = total <= std::int64_t{0xffffffff} && n <= std::int64_t{0xffffffff};
  for (std::int64_t u = first_item(); u < total; u += grid_step()) {
    out[u] = small ? gather_one<std::uint32_t>(
                         params, idx, static_cast<std::uint32_t>(u), static_cast<std::uint32_t>(n),
                         static_cast<std::uint32_t>(inner), static_cast<std::uint32_t>(k), wrap)
                   : gather_one<std::int64_t>(params, idx, u, n, inner, k, wrap);
  }
}

// u = (p * depth + d) * suffix + s  ->  idx[p * suffix + s] == d ? on : off.
template <class I, class B, class Ix>
__device__ __forceinline__ B one_hot_one(const Ix* idx, I u, I depth, I suffix, B on, B off) {
  const I s = u % suffix;
  const I row = u / suffix;
  const I d = row % depth;
  const I p = row / depth;
  const auto v = static_cast<std::int64_t>(
      idx[static_cast<std::int64_t>(p) * static_cast<std::int64_t>(suffix) +
          static_cast<std::int64_t>(s)]);
  return v == static_cast<std::int64_t>(d) ? on : off;
}

template <class B, class Ix>
__global__ void one_hot_kernel(const Ix* __restrict__ idx, B* __restrict__ out, std::int64_t depth,
                               std::int64_t suffix, std::int64_t total, B on, B off) {
  const bool small = total <= std::int64_t{0xffffffff};
  for (std::int64_t u = first_item(); u < total; u += grid_step()) {
    out[u] = small ? one_hot_one<std::uint32_t>(idx, static_cast<std::uint32_t>(u),
                                                static_cast<std::uint32_t>(depth),
                                                static_cast<std::uint32_t>(suffix), on, off)
                   : one_hot_one<std::int64_t>(idx, u, depth, suffix, on, off);
  }
}

// ---- gather_grad -----------------------------------------------------------------------------

// The sum type of gather_grad, as on CPU: float for float32 and the 16-bit floats, double for
// float64, uint64 for integers (wrapping, as the integer's own addition would).
template <class T>
using sum_t = std::conditional_t<std::is_integral_v<T>, std::uint64_t,
                                 std::conditional_t<std::is_same_v<T, double>, double, float>>;

template <class T>
__device__ __forceinline__ sum_t<T> to_sum(T v) {
  return static_cast<sum_t<T>>(load(v));
}

template <class T>
__device__ __forceinline__ T from_sum(sum_t<T> v) {
  if constexpr (is_half_like<T>) {
    return store<T>(v);
  } else {
    return static_cast<T>(v);  // integers: modulo 2^bits
  }
}

// keys[j] = idx[j], or n for an index outside [0, n) (a bucket nobody reads); values[j] = j.
template <class Ix>
__global__ void bucket_keys_kernel(const Ix* __restrict__ idx, std::uint64_t* __restrict__ keys,
                                   std::int64_t* __restrict__ positions, std::int64_t n,
                                   std::int64_t count) {
  for (std::int64_t j = first_item(); j < count; j += grid_step()) {
    const auto v = static_cast<std::int64_t>(idx[j]);
    keys[j] = static_cast<std::uint64_t>(v >= 0 && v < n ? v : n);
    positions[j] = j;
  }
}

// starts[r] = the first position of sorted_keys holding r or more, for r <= n.
__global__ void bucket_starts_kernel(const std::uint64_t* __restrict__ sorted_keys,
                                     std::int64_t* __restrict__ starts, std::int64_t n,
                                     std::int64_t count) {
  for (std::int64_t r = first_item(); r <= n; r += grid_step()) {
    std::int64_t lo = 0;
    std::int64_t hi = count;
    const auto key = static_cast<std::uint64_t>(r);
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (sorted_keys[mid] < key) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    starts[r] = lo;
  }
}

// out[(o * n + r) * inner + c] = sum over q in [starts[r], starts[r + 1]) of
// dy[(o * count + order[q]) * inner + c]: neighbouring threads take neighbouring columns, so
// the reads of dy and the writes coalesce.
template <class T>
__global__ void gather_grad_sum_kernel(const T* __restrict__ dy,
                                       const std::int64_t* __restrict__ order,
                                       const std::int64_t* __restrict__ starts, T* __restrict__ out,
                                       std::int64_t n, std::int64_t inner, std::int64_t count,
                                       std::int64_t total) {
  for (std::int64_t u = first_item(); u < total; u += grid_step()) {
    const std::int64_t c = u % inner;
    const std::int64_t row = u / inner;
    const std::int64_t r = row % n;
    const std::int64_t o = row / n;
    const T* base = dy + o * count * inner + c;
    sum_t<T> acc{0};
    for (std::int64_t q = starts[r]; q < starts[r + 1]; ++q) acc += to_sum(base[order[q] * inner]);
    out[u] = from_sum<T>(acc);
  }
}

// The scratch of gather_grad, carved in this order, each part aligned to 256 bytes.
struct gather_grad_parts {
  std::uint64_t* keys_in;
  std::uint64_t* keys_out;
  std::int64_t* positions_in;
  std::int64_t* positions_out;
  std::int64_t* starts;
  void* sort_temp;
  std::size_t sort_temp_bytes;
  std::size_t total;
};

std::size_t align_up(std::size_t v) {
  return (v + 255) / 256 * 256;
}

// Bits the keys 0..n take.
int key_bits(std::int64_t n) {
  int bits = 1;
  while (bits < 64 && (std::uint64_t{1} << bits) <= static_cast<std::uint64_t>(n)) ++bits;
  return bits;
}

// The sort's own temporary bytes (a size query: nothing runs).
std::size_t sort_temp_bytes(std::int64_t count, std::int64_t n) {
  std::size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
                                  static_cast<std::uint64_t*>(nullptr),
                                  static_cast<const std::int64_t*>(nullptr),
                                  static_cast<std::int64_t*>(nullptr), count, 0, key_bits(n));
  return bytes;
}

gather_grad_parts carve(void* scratch, std::int64_t count, std::int64_t n) {
  gather_grad_parts p{};
  auto* at = static_cast<unsigned char*>(scratch);
  std::size_t used = 0;
  const auto take = [&](std::size_t bytes) {
    void* here = at == nullptr ? nullptr : at + used;
    used += align_up(bytes);
    return here;
  };
  const auto items = static_cast<std::size_t>(count);
  p.keys_in = static_cast<std::uint64_t*>(take(items * sizeof(std::uint64_t)));
  p.keys_out = static_cast<std::uint64_t*>(take(items * sizeof(std::uint64_t)));
  p.positions_in = static_cast<std::int64_t*>(take(items * sizeof(std::int64_t)));
  p.positions_out = static_cast<std::int64_t*>(take(items * sizeof(std::int64_t)));
  p.starts =
      static_cast<std::int64_t*>(take(static_cast<std::size_t>(n + 1) * sizeof(std::int64_t)));
  p.sort_temp_bytes = sort_temp_bytes(count, n);
  p.sort_temp = take(p.sort_temp_bytes);
  p.total = used;
  return p;
}

// ---- gather_elements and gather_nd ----------------------------------------------------------

// The index wrapped into [0, n), or -1 when it lies outside [-n, n).
__device__ __forceinline__ std::int64_t wrapped(std::int64_t v, std::int64_t n) {
  if (v < 0) v += n;
  return v >= 0 && v < n ? v : -1;
}

template <class B, class Ix>
__global__ void gather_elements_kernel(const B* __restrict__ data, const Ix* __restrict__ idx,
                                       B* __restrict__ out, elements_layout l) {
  for (std::int64_t u = first_item(); u < l.count; u += grid_step()) {
    std::int64_t rest = u;
    std::int64_t at = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
      const std::int64_t i = rest % l.dims[d];
      rest /= l.dims[d];
      if (d != l.axis) at += i * l.data_strides[d];
    }
    const std::int64_t v = wrapped(static_cast<std::int64_t>(idx[u]), l.n);
    out[u] = v < 0 ? B{0} : data[at + v * l.data_strides[l.axis]];
  }
}

template <class B, class Ix>
__global__ void gather_nd_kernel(const B* __restrict__ data, const Ix* __restrict__ idx,
                                 B* __restrict__ out, nd_layout l) {
  for (std::int64_t u = first_item(); u < l.count; u += grid_step()) {
    const std::int64_t t = u / l.slice;
    const std::int64_t e = u % l.slice;
    std::int64_t at = (t / l.tuples) * l.batch_stride + e;
    bool inside = true;
    for (int k = 0; k < l.q; ++k) {
      const std::int64_t v = wrapped(static_cast<std::int64_t>(idx[t * l.q + k]), l.dims[k]);
      inside = inside && v >= 0;
      at += v * l.dim_strides[k];
    }
    out[u] = inside ? data[at] : B{0};
  }
}

}  // namespace

bool launch_copy(std::size_t elem_bytes, const void* src, void* dst, const ew_layout& layout,
                 cudaStream_t stream) {
  if (!movable(elem_bytes)) return false;
  if (layout.count <= 0) return true;
  transpose_shape t{};
  const bool tiled = as_transpose(layout, t);
  visit_bits(elem_bytes, [&](auto tag) {
    using B = decltype(tag);
    if (tiled) {
      const std::int64_t tiles =
          t.batch * ((t.rows + tile - 1) / tile) * ((t.cols + tile - 1) / tile);
      constexpr std::int64_t cap = 65535 * 8;
      transpose_kernel<B>
          <<<static_cast<unsigned>(tiles < cap ? tiles : cap), dim3(tile, tile_rows), 0, stream>>>(
              static_cast<const B*>(src), static_cast<B*>(dst), t);
    } else {
      copy_kernel<B><<<grid_for(layout.count), block_threads, 0, stream>>>(
          static_cast<const B*>(src), static_cast<B*>(dst), layout);
    }
  });
  return true;
}

bool launch_pad(std::size_t elem_bytes, const void* in, void* out, std::uint64_t value_bits,
                const pad_layout& layout, cudaStream_t stream) {
  if (!movable(elem_bytes)) return false;
  if (layout.count <= 0) return true;
  visit_bits(elem_bytes, [&](auto tag) {
    using B = decltype(tag);
    pad_kernel<B><<<grid_for(layout.count), block_threads, 0, stream>>>(
        static_cast<const B*>(in), static_cast<B*>(out), static_cast<B>(value_bits), layout);
  });
  return true;
}

bool launch_gather(std::size_t elem_bytes, bool index64, bool wrap_negative, const void* params,
                   const void* indices, void* out, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, std::int64_t k, cudaStream_t stream) {
  if (!movable(elem_bytes)) return false;
  const std::int64_t total = outer * k * inner;
  if (total <= 0) return true;
  visit_bits(elem_bytes, [&](auto tag) {
    using B = decltype(tag);
    const auto* p = static_cast<const B*>(params);
    auto* o = static_cast<B*>(out);
    if (index64) {
      gather_kernel<B><<<grid_for(total), block_threads, 0, stream>>>(
          p, static_cast<const std::int64_t*>(indices), o, n, inner, k, total, wrap_negative);
    } else {
      gather_kernel<B><<<grid_for(total), block_threads, 0, stream>>>(
          p, static_cast<const std::int32_t*>(indices), o, n, inner, k, total, wrap_negative);
    }
  });
  return true;
}

bool launch_one_hot(std::size_t elem_bytes, bool index64, const void* indices, void* out,
                    std::int64_t prefix, std::int64_t depth, std::int64_t suffix,
                    std::uint64_t on_bits, std::uint64_t off_bits, cudaStream_t stream) {
  if (!movable(elem_bytes)) return false;
  const std::int64_t total = prefix * depth * suffix;
  if (total <= 0) return true;
  visit_bits(elem_bytes, [&](auto tag) {
    using B = decltype(tag);
    auto* o = static_cast<B*>(out);
    const auto on = static_cast<B>(on_bits);
    const auto off = static_cast<B>(off_bits);
    if (index64) {
      one_hot_kernel<B><<<grid_for(total), block_threads, 0, stream>>>(
          static_cast<const std::int64_t*>(indices), o, depth, suffix, total, on, off);
    } else {
      one_hot_kernel<B><<<grid_for(total), block_threads, 0, stream>>>(
          static_cast<const std::int32_t*>(indices), o, depth, suffix, total, on, off);
    }
  });
  return true;
}

std::size_t gather_grad_scratch_bytes(std::int64_t count, std::int64_t n) {
  return carve(nullptr, count, n).total;
}

cudaError_t launch_gather_grad(elem_type t, bool index64, const void* dy, const void* indices,
                               void* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
                               std::int64_t count, void* scratch, std::size_t scratch_bytes,
                               cudaStream_t stream) {
  const std::int64_t total = outer * n * inner;
  if (t == elem_type::boolean) return cudaErrorInvalidValue;
  if (total <= 0 || count <= 0) return cudaSuccess;
  const gather_grad_parts p = carve(scratch, count, n);
  if (scratch == nullptr || scratch_bytes < p.total) return cudaErrorInvalidValue;

  if (index64) {
    bucket_keys_kernel<<<grid_for(count), block_threads, 0, stream>>>(
        static_cast<const std::int64_t*>(indices), p.keys_in, p.positions_in, n, count);
  } else {
    bucket_keys_kernel<<<grid_for(count), block_threads, 0, stream>>>(
        static_cast<const std::int32_t*>(indices), p.keys_in, p.positions_in, n, count);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  std::size_t temp_bytes = p.sort_temp_bytes;
  // Radix sort is stable: positions with one key keep their increasing order.
  if (const cudaError_t e = cub::DeviceRadixSort::SortPairs(
          p.sort_temp, temp_bytes, p.keys_in, p.keys_out, p.positions_in, p.positions_out, count, 0,
          key_bits(n), stream);
      e != cudaSuccess) {
    return e;
  }
  bucket_starts_kernel<<<grid_for(n + 1), block_threads, 0, stream>>>(p.keys_out, p.starts, n,
                                                                      count);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  bool known = true;
  visit(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      known = false;
    } else {
      gather_grad_sum_kernel<T><<<grid_for(total), block_threads, 0, stream>>>(
          static_cast<const T*>(dy), p.positions_out, p.starts, static_cast<T*>(out), n, inner,
          count, total);
    }
  });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

bool launch_gather_elements(std::size_t elem_bytes, bool index64, const void* data,
                            const void* indices, void* out, const elements_layout& layout,
                            cudaStream_t stream) {
  if (!movable(elem_bytes) || layout.rank > select_max_dims) return false;
  if (layout.count <= 0) return true;
  visit_bits_and_index(elem_bytes, index64, [&](auto btag, auto itag) {
    using B = decltype(btag);
    using Ix = decltype(itag);
    gather_elements_kernel<B><<<grid_for(layout.count), block_threads, 0, stream>>>(
        static_cast<const B*>(data), static_cast<const Ix*>(indices), static_cast<B*>(out),
        layout);
  });
  return true;
}

bool launch_gather_nd(std::size_t elem_bytes, bool index64, const void* data, const void* indices,
                      void* out, const nd_layout& layout, cudaStream_t stream) {
  if (!movable(elem_bytes) || layout.q > select_max_dims) return false;
  if (layout.count <= 0) return true;
  visit_bits_and_index(elem_bytes, index64, [&](auto btag, auto itag) {
    using B = decltype(btag);
    using Ix = decltype(itag);
    gather_nd_kernel<B><<<grid_for(layout.count), block_threads, 0, stream>>>(
        static_cast<const B*>(data), static_cast<const Ix*>(indices), static_cast<B*>(out),
        layout);
  });
  return true;
}

}  // namespace loom::cuda::kernels
