// CUDA kernels of reduce_sum / mean / max / min / prod / l1 / l2 / sum_square / log_sum /
// log_sum_exp / any / all and argmax (launchers in reduction.cuh;
// Note [cuda reduction plan], Note [cuda deterministic reductions]).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "reduction.cuh"
#include "reduction_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace rdev;

// How one kind of reduction accumulates T (as the CPU kernels' reducer, reduction_reduce.cpp):
// the accumulator A, its identity, how an element enters it, how two combine, the result.
// reduce_log_sum_exp's accumulator (as the CPU's lse_acc): the largest element m so far and
// Σ exp(x - m).
struct lse_acc {
  double m;
  double s;
};

template <class T, reduce_op K>
struct reducer {
  using C = compute_t<T>;
  static constexpr bool floating = !std::is_integral_v<C>;
  // The sums: of x (sum, mean, log_sum), |x| (l1) or x² (l2, sum_square).
  static constexpr bool additive = K == reduce_op::sum || K == reduce_op::mean ||
                                   K == reduce_op::l1 || K == reduce_op::l2 ||
                                   K == reduce_op::sum_square || K == reduce_op::log_sum;
  static constexpr bool logical = K == reduce_op::any || K == reduce_op::all;
  // Float sums in double (16-bit floats in float), integer sums and products wrapping in 64
  // bits, float products and max/min in the compute type, log_sum_exp in an lse_acc, any
  // and all in an int (0 or 1).
  using A = std::conditional_t<
      K == reduce_op::log_sum_exp, lse_acc,
      std::conditional_t<
          logical, int,
          std::conditional_t<
              additive,
              std::conditional_t<floating, std::conditional_t<is_half_like<T>, float, double>,
                                 unsigned long long>,
              std::conditional_t<K == reduce_op::prod,
                                 std::conditional_t<floating, C, unsigned long long>, C>>>>;

  // What an element adds to a sum: x, |x| or x².
  __device__ static A term(A v) {
    if constexpr (K == reduce_op::l1) {
      if constexpr (std::is_unsigned_v<A>) {
        return static_cast<long long>(v) < 0 ? A(0) - v : v;
      } else {
        return v < A(0) ? -v : v;
      }
    } else if constexpr (K == reduce_op::l2 || K == reduce_op::sum_square) {
      return v * v;
    } else {
      return v;
    }
  }

  __device__ static A identity() {
    if constexpr (K == reduce_op::log_sum_exp) {
      return lse_acc{-std::numeric_limits<double>::infinity(), 0.0};
    } else if constexpr (logical) {
      return K == reduce_op::all ? 1 : 0;
    } else if constexpr (additive) {
      return A(0);
    } else if constexpr (K == reduce_op::prod) {
      return A(1);
    } else if constexpr (K == reduce_op::max) {
      return floating ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::lowest();
    } else {
      return floating ? std::numeric_limits<C>::infinity() : std::numeric_limits<C>::max();
    }
  }

  // An element of the input (partials of a first pass enter through partial_reducer).
  __device__ static A lift(T v) {
    if constexpr (K == reduce_op::log_sum_exp) {
      return lse_acc{static_cast<double>(load(v)), 1.0};
    } else if constexpr (logical) {
      return v ? 1 : 0;
    } else if constexpr (floating) {
      return term(static_cast<A>(load(v)));
    } else if constexpr (K == reduce_op::max || K == reduce_op::min) {
      return v;
    } else {
      return term(static_cast<A>(static_cast<long long>(v)));
    }
  }

  // max/min: a NaN on either side wins (NumPy's maximum/minimum). log_sum_exp rescales the
  // smaller maximum's sum to the larger (a NaN wins; an empty side changes nothing).
  __device__ static A combine(A a, A b) {
    if constexpr (K == reduce_op::log_sum_exp) {
      if (a.m != a.m || b.m != b.m) return lse_acc{nan(""), 1.0};
      if (a.m < b.m) {
        const lse_acc t = a;
        a = b;
        b = t;
      }
      if (b.m == -std::numeric_limits<double>::infinity()) return a;
      if (a.m == b.m) return lse_acc{a.m, a.s + b.s};
      return lse_acc{a.m, a.s + b.s * exp(b.m - a.m)};
    } else if constexpr (K == reduce_op::any) {
      return a | b;
    } else if constexpr (K == reduce_op::all) {
      return a & b;
    } else if constexpr (additive) {
      return a + b;
    } else if constexpr (K == reduce_op::prod) {
      return a * b;
    } else if constexpr (K == reduce_op::max) {
      return (b > a || b != b) ? b : a;
    } else {
      return (b < a || b != b) ? b : a;
    }
  }

  __device__ static T finish(A a, std::int64_t count) {
    if constexpr (K == reduce_op::mean) {
      return store<T>(static_cast<double>(a) / static_cast<double>(count));
    } else if constexpr (K == reduce_op::l2) {
      return store<T>(sqrt(static_cast<double>(a)));
    } else if constexpr (K == reduce_op::log_sum) {
      return store<T>(log(static_cast<double>(a)));
    } else if constexpr (K == reduce_op::log_sum_exp) {
      return store<T>(a.m + log(a.s));
    } else if constexpr (logical) {
      return a != 0;
    } else if constexpr (!floating && K != reduce_op::max && K != reduce_op::min) {
      return static_cast<T>(static_cast<long long>(a));
    } else {
      return store<T>(a);
    }
  }
};

// R for a second pass over a first pass's partial accumulators: they enter as they are.
template <class R>
struct partial_reducer : R {
  __device__ static typename R::A lift(typename R::A v) { return v; }
};

// R (a float reducer) over 16-bit inputs In, each widened exactly on entry: reduce_sum's
// float32 output_type, the float reduction of cast(x, float32) without the cast.
template <class R, class In>
struct widened_reducer : R {
  __device__ static typename R::A lift(In v) { return R::lift(load(v)); }
};

template <class R>
struct combine_fn {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return R::combine(a, b);
  }
};

template <class T, reduce_op K>
inline constexpr bool supported_v =
    (K == reduce_op::any || K == reduce_op::all)
        ? std::is_same_v<T, bool>
        : !((K == reduce_op::mean || K == reduce_op::l2 || K == reduce_op::log_sum ||
             K == reduce_op::log_sum_exp) &&
            std::is_integral_v<T>) &&
              (std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_like<T> ||
               std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>);

constexpr int block_threads = 256;
constexpr int col_tile = 32;                  // columns per block in column mode
constexpr int col_rows = 8;                   // thread rows per block in column mode
constexpr std::int64_t short_row = 256;       // rows up to this long: a warp per row
constexpr std::int64_t target_blocks = 1024;  // enough blocks to fill a large GPU



// Rows of n (inner == 1): unit u = row * chunks + chunk; a team per unit. With `finish`, out
// is T[rows] (chunks must be 1); else out is A[rows * chunks].
template <class In, class R, class T>
__global__ void reduce_rows_kernel(const In* x, void* out, std::int64_t rows, std::int64_t n,
                                   std::int64_t chunks, std::int64_t chunk_len, bool finish,
                                   std::int64_t count, bool whole_block) {
  using A = typename R::A;
  __shared__ block_scratch scratch;
  const team t = make_team(whole_block);
  const std::int64_t units = rows * chunks;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * t.per_block;
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * t.per_block + t.index; u < units;
       u += step) {
    const std::int64_t row = u / chunks;
    const std::int64_t b = (u % chunks) * chunk_len;
    const std::int64_t e = b + chunk_len < n ? b + chunk_len : n;
    const In* p = x + row * n;
    A acc = R::identity();
    const std::int64_t ts = t.size;
    std::int64_t i = b + t.rank;
    for (; i + 3 * ts < e; i += 4 * ts) {  // four loads in flight, combined in order
      const In v0 = p[i];
      const In v1 = p[i + ts];
      const In v2 = p[i + 2 * ts];
      const In v3 = p[i + 3 * ts];
      acc =
          R::combine(R::combine(R::combine(R::combine(acc, R::lift(v0)), R::lift(v1)), R::lift(v2)),
                     R::lift(v3));
    }
    for (; i < e; i += ts) acc = R::combine(acc, R::lift(p[i]));
    acc = team_allreduce(t, acc, combine_fn<R>{}, R::identity(), scratch);
    if (t.rank == 0) {
      if (finish) {
        static_cast<T*>(out)[row] = R::finish(acc, count);
      } else {
        static_cast<A*>(out)[u] = acc;
      }
    }
  }
}

// Columns of [outer, n, inner]: unit = (o, chunk, tile of 32 columns); a block of 32 x 8
// threads per unit, the 8 thread rows splitting the chunk's rows. With `finish`, out is
// T[outer, inner]; else A[outer, chunks, inner].
template <class In, class R, class T>
__global__ void reduce_cols_kernel(const In* x, void* out, std::int64_t outer, std::int64_t n,
                                   std::int64_t inner, std::int64_t chunks, std::int64_t chunk_len,
                                   bool finish, std::int64_t count) {
  using A = typename R::A;
  __shared__ alignas(16) unsigned char raw[col_rows * col_tile * sizeof(A)];
  A* tile = reinterpret_cast<A*>(raw);
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const std::int64_t tiles = (inner + col_tile - 1) / col_tile;
  const std::int64_t units = outer * chunks * tiles;
  for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const std::int64_t j = (u % tiles) * col_tile + tx;
    const std::int64_t c = (u / tiles) % chunks;
    const std::int64_t o = u / tiles / chunks;
    const std::int64_t b = c * chunk_len;
    const std::int64_t e = b + chunk_len < n ? b + chunk_len : n;
    A acc = R::identity();
    if (j < inner) {
      const In* p = x + o * n * inner + j;
      std::int64_t r = b + ty;
      for (; r + 3 * col_rows < e; r += 4 * col_rows) {  // four loads in flight, in order
        const In v0 = p[r * inner];
        const In v1 = p[(r + col_rows) * inner];
        const In v2 = p[(r + 2 * col_rows) * inner];
        const In v3 = p[(r + 3 * col_rows) * inner];
        acc = R::combine(
            R::combine(R::combine(R::combine(acc, R::lift(v0)), R::lift(v1)), R::lift(v2)),
            R::lift(v3));
      }
      for (; r < e; r += col_rows) acc = R::combine(acc, R::lift(p[r * inner]));
    }
    tile[ty * col_tile + tx] = acc;
    __syncthreads();
    if (ty == 0 && j < inner) {
      A a = tile[tx];
#pragma unroll
      for (int k = 1; k < col_rows; ++k) a = R::combine(a, tile[k * col_tile + tx]);
      if (finish) {
        static_cast<T*>(out)[o * inner + j] = R::finish(a, count);
      } else {
        static_cast<A*>(out)[(o * chunks + c) * inner + j] = a;
      }
    }
    __syncthreads();  // the tile is rewritten by the next unit
  }
}

template <class In, class R, class T>
void rows_pass(const In* x, void* out, std::int64_t rows, std::int64_t n, std::int64_t chunks,
               std::int64_t chunk_len, bool finish, std::int64_t count, cudaStream_t s) {
  const bool whole_block = chunk_len > short_row;
  const std::int64_t per_block = whole_block ? 1 : block_threads / 32;
  reduce_rows_kernel<In, R, T>
      <<<grid_for(ceil_div(rows * chunks, per_block)), block_threads, 0, s>>>(
          x, out, rows, n, chunks, chunk_len, finish, count, whole_block);
}

template <class In, class R, class T>
void cols_pass(const In* x, void* out, std::int64_t outer, std::int64_t n, std::int64_t inner,
               std::int64_t chunks, std::int64_t chunk_len, bool finish, std::int64_t count,
               cudaStream_t s) {
  const std::int64_t units = outer * chunks * ceil_div(inner, col_tile);
  reduce_cols_kernel<In, R, T><<<grid_for(units), dim3(col_tile, col_rows), 0, s>>>(
      x, out, outer, n, inner, chunks, chunk_len, finish, count);
}

// The passes of `plan` over x (In elements) by reducer R, into y (Out elements).
template <class In, class R, class Out>
void reduce_with(const reduce_plan& p, const void* xv, void* y, void* temp, cudaStream_t s) {
  using A = typename R::A;
  const In* x = static_cast<const In*>(xv);
  const std::int64_t count = p.n;
  if (p.inner == 1) {
    if (p.chunks == 1) {
      rows_pass<In, R, Out>(x, y, p.outer, p.n, 1, p.n, true, count, s);
    } else {
      rows_pass<In, R, Out>(x, temp, p.outer, p.n, p.chunks, p.chunk_len, false, count, s);
      rows_pass<A, partial_reducer<R>, Out>(static_cast<const A*>(temp), y, p.outer, p.chunks, 1,
                                            p.chunks, true, count, s);
    }
    return;
  }
  if (p.chunks == 1) {
    cols_pass<In, R, Out>(x, y, p.outer, p.n, p.inner, 1, p.n, true, count, s);
  } else {
    cols_pass<In, R, Out>(x, temp, p.outer, p.n, p.inner, p.chunks, p.chunk_len, false, count, s);
    cols_pass<A, partial_reducer<R>, Out>(static_cast<const A*>(temp), y, p.outer, p.chunks,
                                          p.inner, 1, p.chunks, true, count, s);
  }
}

// Calls f(T{}, op constant) for t and op (bool only for any and all).
template <class F>
void visit_reduce(elem_type t, reduce_op op, F&& f) {
  if (t == elem_type::boolean) {
    if (op == reduce_op::any) f(bool{}, std::integral_constant<reduce_op, reduce_op::any>{});
    if (op == reduce_op::all) f(bool{}, std::integral_constant<reduce_op, reduce_op::all>{});
    return;
  }
  visit_type(t, [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case reduce_op::sum:
        return f(tag, std::integral_constant<reduce_op, reduce_op::sum>{});
      case reduce_op::mean:
        return f(tag, std::integral_constant<reduce_op, reduce_op::mean>{});
      case reduce_op::max:
        return f(tag, std::integral_constant<reduce_op, reduce_op::max>{});
      case reduce_op::min:
        return f(tag, std::integral_constant<reduce_op, reduce_op::min>{});
      case reduce_op::prod:
        return f(tag, std::integral_constant<reduce_op, reduce_op::prod>{});
      case reduce_op::l1:
        return f(tag, std::integral_constant<reduce_op, reduce_op::l1>{});
      case reduce_op::l2:
        return f(tag, std::integral_constant<reduce_op, reduce_op::l2>{});
      case reduce_op::sum_square:
        return f(tag, std::integral_constant<reduce_op, reduce_op::sum_square>{});
      case reduce_op::log_sum:
        return f(tag, std::integral_constant<reduce_op, reduce_op::log_sum>{});
      case reduce_op::log_sum_exp:
        return f(tag, std::integral_constant<reduce_op, reduce_op::log_sum_exp>{});
      case reduce_op::any:
      case reduce_op::all:
        return;  // bool only (above)
    }
    (void)sizeof(T);
  });
}

// ---- argmax -----------------------------------------------------------------------------

// A candidate: value (widened so warps can shuffle it) and index (-1: none yet).
template <class V>
struct arg_pair {
  V v;
  long long i;
};

// The better of two candidates: a NaN beats any number (the first NaN wins), a larger value
// (Min: a smaller one) beats the other, and ties go to the smaller index (NumPy's argmax), or
// to the larger one with Last (ONNX's select_last_index, for NaNs too).
template <bool Min, bool Last>
struct arg_better {
  template <class P>
  __device__ P operator()(P a, P b) const {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    const bool na = a.v != a.v;
    const bool nb = b.v != b.v;
    const P tie = (a.i < b.i) != Last ? a : b;
    if (na || nb) {
      if (na && nb) return tie;
      return na ? a : b;
    }
    if (Min ? a.v < b.v : a.v > b.v) return a;
    if (Min ? b.v < a.v : b.v > a.v) return b;
    return tie;
  }
};

template <class T>
using arg_value_t = std::conditional_t<sizeof(compute_t<T>) < 4, int, compute_t<T>>;

template <class T, bool Min, bool Last>
__global__ void argmax_rows_kernel(const T* x, void* y, bool out_i32, std::int64_t rows,
                                   std::int64_t n, bool whole_block) {
  using V = arg_value_t<T>;
  using P = arg_pair<V>;
  __shared__ block_scratch scratch;
  const team t = make_team(whole_block);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * t.per_block;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * t.per_block + t.index; r < rows;
       r += step) {
    const T* p = x + r * n;
    P best{V{}, -1};
    for (std::int64_t i = t.rank; i < n; i += t.size) {
      best = arg_better<Min, Last>{}(best, P{static_cast<V>(load(p[i])), i});
    }
    best = team_allreduce(t, best, arg_better<Min, Last>{}, P{V{}, -1}, scratch);
    if (t.rank == 0) {
      if (out_i32) {
        static_cast<std::int32_t*>(y)[r] = static_cast<std::int32_t>(best.i);
      } else {
        static_cast<std::int64_t*>(y)[r] = best.i;
      }
    }
  }
}

// One thread per output column of [outer, n, inner]: consecutive threads read consecutive
// columns of a row.
template <class T, bool Min, bool Last>
__global__ void argmax_cols_kernel(const T* x, void* y, bool out_i32, std::int64_t outer,
                                   std::int64_t n, std::int64_t inner) {
  using V = arg_value_t<T>;
  using P = arg_pair<V>;
  const std::int64_t outputs = outer * inner;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       q < outputs; q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t o = q / inner;
    const std::int64_t j = q % inner;
    const T* p = x + o * n * inner + j;
    P best{static_cast<V>(load(p[0])), 0};
    for (std::int64_t i = 1; i < n; ++i) {
      best = arg_better<Min, Last>{}(best, P{static_cast<V>(load(p[i * inner])), i});
    }
    if (out_i32) {
      static_cast<std::int32_t*>(y)[q] = static_cast<std::int32_t>(best.i);
    } else {
      static_cast<std::int64_t*>(y)[q] = best.i;
    }
  }
}

template <class B>
__global__ void fill_kernel(B* p, std::int64_t count, B value) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

}  // namespace

bool reduce_supports(elem_type t, reduce_op op) {
  bool ok = false;
  visit_reduce(t, op, [&](auto tag, auto k) {
    using T = decltype(tag);
    ok = supported_v<T, decltype(k)::value>;
  });
  return ok;
}

reduce_plan plan_reduce(elem_type t, reduce_op op, std::int64_t outer, std::int64_t n,
                        std::int64_t inner, bool widen) {
  reduce_plan p;
  p.outer = outer;
  p.n = n;
  p.inner = inner;
  p.chunk_len = n;
  // Cut n when the launch would have too few blocks and n is long enough to share.
  std::int64_t chunks = 1;
  if (inner == 1) {
    const std::int64_t blocks = n > short_row ? outer : ceil_div(outer, block_threads / 32);
    if (blocks < target_blocks && n >= 8192) {
      chunks = std::min(ceil_div(n, 4096), ceil_div(target_blocks, blocks));
    }
  } else {
    const std::int64_t blocks = outer * ceil_div(inner, col_tile);
    if (blocks < target_blocks && n >= 256) {
      chunks = std::min(ceil_div(n, 128), ceil_div(target_blocks, blocks));
    }
  }
  if (chunks > 1) {
    p.chunk_len = ceil_div(n, chunks);
    p.chunks = ceil_div(n, p.chunk_len);  // no empty pieces
    std::size_t acc_bytes = 0;
    visit_reduce(widen ? elem_type::f32 : t, op, [&](auto tag, auto k) {
      using T = decltype(tag);
      constexpr reduce_op K = decltype(k)::value;
      if constexpr (supported_v<T, K>) acc_bytes = sizeof(typename reducer<T, K>::A);
    });
    p.temp_bytes = static_cast<std::size_t>(outer * p.chunks * inner) * acc_bytes;
  }
  return p;
}

void launch_reduce(const reduce_plan& plan, elem_type t, reduce_op op, const void* x, void* y,
                   void* temp, cudaStream_t stream, bool widen) {
  if (widen) {  // a float16 / bfloat16 sum into float32
    if (op != reduce_op::sum) return;
    if (t == elem_type::f16) {
      reduce_with<f16, widened_reducer<reducer<float, reduce_op::sum>, f16>, float>(
          plan, x, y, temp, stream);
    } else if (t == elem_type::bf16) {
      reduce_with<bf16, widened_reducer<reducer<float, reduce_op::sum>, bf16>, float>(
          plan, x, y, temp, stream);
    }
    return;
  }
  visit_reduce(t, op, [&](auto tag, auto k) {
    using T = decltype(tag);
    constexpr reduce_op K = decltype(k)::value;
    if constexpr (supported_v<T, K>) reduce_with<T, reducer<T, K>, T>(plan, x, y, temp, stream);
  });
}

void launch_fill(void* p, std::int64_t count, int elem_bytes, std::uint64_t bits,
                 cudaStream_t stream) {
  if (count <= 0) return;
  const unsigned grid = grid_for(std::min<std::int64_t>(ceil_div(count, block_threads), 4096));
  switch (elem_bytes) {
    case 1:
      fill_kernel<<<grid, block_threads, 0, stream>>>(static_cast<std::uint8_t*>(p), count,
                                                      static_cast<std::uint8_t>(bits));
      break;
    case 2:
      fill_kernel<<<grid, block_threads, 0, stream>>>(static_cast<std::uint16_t*>(p), count,
                                                      static_cast<std::uint16_t>(bits));
      break;
    case 4:
      fill_kernel<<<grid, block_threads, 0, stream>>>(static_cast<std::uint32_t*>(p), count,
                                                      static_cast<std::uint32_t>(bits));
      break;
    default:
      fill_kernel<<<grid, block_threads, 0, stream>>>(static_cast<std::uint64_t*>(p), count,
                                                      static_cast<std::uint64_t>(bits));
      break;
  }
}

bool argmax_supports(elem_type t) {
  return t != elem_type::boolean;
}

void launch_argmax(elem_type t, bool out_i32, bool is_min, bool last, const void* x, void* y,
                   std::int64_t outer, std::int64_t n, std::int64_t inner, cudaStream_t stream) {
  visit_type(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    const auto launch = [&](auto min_tag, auto last_tag) {
      constexpr bool Min = decltype(min_tag)::value;
      constexpr bool Last = decltype(last_tag)::value;
      if (inner == 1) {
        const bool whole_block = n > short_row;
        const std::int64_t per_block = whole_block ? 1 : block_threads / 32;
        argmax_rows_kernel<T, Min, Last>
            <<<grid_for(ceil_div(outer, per_block)), block_threads, 0, stream>>>(
                xp, y, out_i32, outer, n, whole_block);
      } else {
        argmax_cols_kernel<T, Min, Last>
            <<<grid_for(ceil_div(outer * inner, block_threads)), block_threads, 0, stream>>>(
                xp, y, out_i32, outer, n, inner);
      }
    };
    using yes = std::true_type;
    using no = std::false_type;
    if (is_min && last) {
      launch(yes{}, yes{});
    } else if (is_min) {
      launch(yes{}, no{});
    } else if (last) {
      launch(no{}, yes{});
    } else {
      launch(no{}, no{});
    }
  });
}

}  // namespace loom::cuda::kernels
