// Device-side helpers of the reduction family's CUDA kernels (reduction.cu, softmax.cu,
// layer_norm.cu; included by .cu files only): 16-bit loads and stores, warp and block
// reductions, "teams" (a warp or a whole block working on one row), and the dispatch on
// the element type.
//
// Note [cuda deterministic reductions]
// Every reduction here combines values in an order fixed by the shapes alone: each thread
// folds its elements in index order, a warp combines its lanes by a fixed shuffle tree, a
// block its warps through shared memory in warp order, and where a reduction is split over
// blocks (chunks), the per-chunk partials are written to a temporary and combined in chunk
// order by a second kernel. No atomics touch a result, and launch shapes depend only on the
// tensor's shape, so a run on the same GPU gives the same bits every time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels::rdev {

using f16 = __half;
using bf16 = __nv_bfloat16;

template <class T>
inline constexpr bool is_half_like = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

/// The type an element of T is computed in: float for the 16-bit floats, else T.
template <class T>
using compute_t = std::conditional_t<is_half_like<T>, float, T>;

/// The type row statistics accumulate in: float for f32, f16 and bf16, double for f64.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

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

/// A computed value (any arithmetic type) as T: 16-bit floats through float, rounded to
/// nearest even, as the CPU kernels store them.
template <class T, class V>
__device__ __forceinline__ T store(V v) {
  if constexpr (std::is_same_v<T, f16>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

constexpr unsigned full_mask = 0xffffffffu;

/// v from lane (this lane ^ o) of the warp: arithmetic values directly, small structs (such
/// as argmax's value-index pairs) word by word.
template <class A>
__device__ __forceinline__ A shuffle_xor(A v, int o) {
  if constexpr (std::is_arithmetic_v<A>) {
    return __shfl_xor_sync(full_mask, v, o);
  } else {
    static_assert(sizeof(A) % 4 == 0, "shuffle_xor: size must be a multiple of 4 bytes");
    unsigned w[sizeof(A) / 4];
    std::memcpy(w, &v, sizeof(A));
#pragma unroll
    for (unsigned& x : w) x = __shfl_xor_sync(full_mask, x, o);
    std::memcpy(&v, w, sizeof(A));
    return v;
  }
}

/// Combines the 32 lanes' values with f by a butterfly: every lane gets the result. All 32
/// lanes must call it. f must be commutative for the lanes to agree bit for bit (sums and
/// products are; max/min may differ only in the sign of a zero).
template <class A, class F>
__device__ __forceinline__ A warp_allreduce(A v, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, shuffle_xor(v, o));
  return v;
}

/// Shared memory for block_allreduce of values of up to 16 bytes: one slot per warp.
struct block_scratch {
  alignas(16) unsigned char bytes[32 * 16];
};

/// Combines every thread's value of a 1-D block (blockDim.x a multiple of 32) with f; every
/// thread gets the result. All threads of the block must call it (it synchronises).
template <class A, class F>
__device__ __forceinline__ A block_allreduce(A v, F f, A identity, block_scratch& s) {
  static_assert(sizeof(A) <= 16, "block_allreduce: value too large");
  A* slots = reinterpret_cast<A*>(s.bytes);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  v = warp_allreduce(v, f);
  __syncthreads();  // slots may still be read by the previous call
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  A w = lane < warps ? slots[lane] : identity;
  w = warp_allreduce(w, f);  // every warp folds the warps' values the same way
  return w;
}

/// Threads that work on one row together: a warp (several teams per block) or the whole
/// block (one team). Decided per launch, so the branch is uniform.
struct team {
  int size;   // 32, or blockDim.x
  int rank;   // this thread's index in the team
  int index;  // the team's index in the block
  int per_block;
  bool whole_block;
};

__device__ __forceinline__ team make_team(bool whole_block) {
  team t;
  t.whole_block = whole_block;
  if (whole_block) {
    t.size = static_cast<int>(blockDim.x);
    t.rank = static_cast<int>(threadIdx.x);
    t.index = 0;
    t.per_block = 1;
  } else {
    t.size = 32;
    t.rank = static_cast<int>(threadIdx.x) & 31;
    t.index = static_cast<int>(threadIdx.x) >> 5;
    t.per_block = static_cast<int>(blockDim.x) >> 5;
  }
  return t;
}

/// The team-wide combination of v (every member gets it). Every member must call it.
template <class A, class F>
__device__ __forceinline__ A team_allreduce(const team& t, A v, F f, A identity, block_scratch& s) {
  if (t.whole_block) return block_allreduce(v, f, identity, s);
  return warp_allreduce(v, f);
}

/// How a kernel with a team per row is launched: a warp per row (eight rows per block) for
/// rows of up to `warp_row_max` elements; else a block per row of up to 1024 threads (about
/// four elements each), with the row cached in `cache_per_element` bytes per element of
/// dynamic shared memory when that fits in 47 KiB (a block may have 48 KiB without opting
/// in, and the kernels' static shared memory takes 512 bytes of it).
struct row_launch {
  bool whole_block = false;
  int threads = 256;
  std::int64_t per_block = 8;
  bool cached = false;
  std::size_t smem = 0;
};

inline row_launch plan_row_teams(std::int64_t n, std::int64_t warp_row_max,
                                 std::size_t cache_per_element) {
  row_launch l;
  if (n <= warp_row_max) return l;
  l.whole_block = true;
  const std::int64_t quarter = (n + 3) / 4;
  l.threads = static_cast<int>(quarter >= 1024 ? 1024 : (quarter + 31) / 32 * 32);
  l.per_block = 1;
  const std::size_t bytes = static_cast<std::size_t>(n) * cache_per_element;
  if (bytes <= 47 * 1024) {
    l.cached = true;
    l.smem = bytes;
  }
  return l;
}

/// Waits for the team (a warp or the block) and orders its memory accesses.
__device__ __forceinline__ void team_sync(const team& t) {
  if (t.whole_block) {
    __syncthreads();
  } else {
    __syncwarp();
  }
}

struct plus {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};

/// The larger of a and b, ignoring NaN unless both are (a row's maximum for softmax).
struct max_ignore_nan {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return (b > a || a != a) ? b : a;
  }
};

// ---- launch shapes and dispatch on the element type (host code of the .cu files) ----------

/// The most blocks one launch asks for.
inline constexpr std::int64_t max_grid = std::int64_t{1} << 20;

/// ⌈a / b⌉ for a >= 0, b > 0.
__host__ __device__ inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

/// A grid of `blocks` blocks, clamped to [1, max_grid].
inline unsigned grid_for(std::int64_t blocks) {
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, max_grid));
}

/// Calls f(T{}) for the device type of t; nothing for boolean.
template <class F>
void visit_type(elem_type t, F&& f) {
  switch (t) {
    case elem_type::f32:
      return f(float{});
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
      return;
  }
}

/// Calls f(T{}) for the device type of t when it is a float type; nothing otherwise.
template <class F>
void visit_float(elem_type t, F&& f) {
  visit_type(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T> || is_half_like<T>) f(tag);
  });
}

}  // namespace loom::cuda::kernels::rdev
