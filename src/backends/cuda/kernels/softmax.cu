// CUDA kernels of softmax, log_softmax and softmax_cross_entropy (launchers in softmax.cuh;
// Note [cuda softmax], Note [cuda deterministic reductions]).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "reduction_device.cuh"
#include "softmax.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace rdev;

constexpr int max_threads = 1024;
constexpr std::int64_t warp_row_max = 512;  // rows up to this long: a warp each



__device__ __forceinline__ float exp_c(float v) {
  return expf(v);
}
__device__ __forceinline__ double exp_c(double v) {
  return exp(v);
}

template <class C>
__device__ __forceinline__ C neg_inf() {
  return -std::numeric_limits<C>::infinity();
}

// A team per row of n elements (Note [cuda softmax]).
template <class T, bool Log>
__global__ void __launch_bounds__(max_threads)
    softmax_rows_kernel(const T* x, T* y, std::int64_t rows, std::int64_t n, bool whole_block,
                        bool cached) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ block_scratch scratch;
  const team t = make_team(whole_block);
  C* cache = cached ? reinterpret_cast<C*>(dyn_smem) : nullptr;  // block teams only
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * t.per_block;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * t.per_block + t.index; r < rows;
       r += step) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    // Each thread touches only elements i = rank (mod size): its own reads come before its
    // own writes, so y may be x.
    const std::int64_t ts = t.size;
    C m = neg_inf<C>();
    auto take = [&](std::int64_t k, C v) {
      if (cache != nullptr) cache[k] = v;
      m = max_ignore_nan{}(m, v);
    };
    std::int64_t i = t.rank;
    for (; i + 3 * ts < n; i += 4 * ts) {  // four loads in flight
      C v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = load(xr[i + k * ts]);
#pragma unroll
      for (int k = 0; k < 4; ++k) take(i + k * ts, v[k]);
    }
    for (; i < n; i += ts) take(i, load(xr[i]));
    m = team_allreduce(t, m, max_ignore_nan{}, neg_inf<C>(), scratch);
    C s = 0;
    for (i = t.rank; i < n; i += ts) {
      const C e = exp_c((cache != nullptr ? cache[i] : load(xr[i])) - m);
      if (!Log && cache != nullptr) cache[i] = e;
      s += e;
    }
    s = team_allreduce(t, s, plus{}, C(0), scratch);
    if constexpr (Log) {
      const auto ls = static_cast<C>(log(static_cast<double>(s)));
      for (i = t.rank; i < n; i += ts) {
        const C v = cache != nullptr ? cache[i] : load(xr[i]);
        yr[i] = store<T>((v - m) - ls);
      }
    } else {
      const auto inv = static_cast<C>(1.0 / static_cast<double>(s));
      for (i = t.rank; i < n; i += ts) {
        const C e = cache != nullptr ? cache[i] : exp_c(load(xr[i]) - m);
        yr[i] = store<T>(e * inv);
      }
    }
  }
}

// A thread per column of [outer, n, inner] (inner > 1).
template <class T, bool Log>
__global__ void softmax_cols_kernel(const T* x, T* y, std::int64_t outer, std::int64_t n,
                                    std::int64_t inner) {
  using C = compute_t<T>;
  const std::int64_t columns = outer * inner;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       q < columns; q += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t off = (q / inner) * n * inner + q % inner;
    const T* xc = x + off;
    T* yc = y + off;
    C m = neg_inf<C>();
    for (std::int64_t i = 0; i < n; ++i) m = max_ignore_nan{}(m, load(xc[i * inner]));
    C s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += exp_c(load(xc[i * inner]) - m);
    if constexpr (Log) {
      const auto ls = static_cast<C>(log(static_cast<double>(s)));
      for (std::int64_t i = 0; i < n; ++i) yc[i * inner] = store<T>((load(xc[i * inner]) - m) - ls);
    } else {
      const auto inv = static_cast<C>(1.0 / static_cast<double>(s));
      for (std::int64_t i = 0; i < n; ++i)
        yc[i * inner] = store<T>(exp_c(load(xc[i * inner]) - m) * inv);
    }
  }
}

// A team per row of logits (Note [cuda softmax]); backprop may be the logits' buffer.
template <class T, class L>
__global__ void __launch_bounds__(max_threads)
    xent_kernel(const T* x, const L* labels, T* loss, T* backprop, std::int64_t rows,
                std::int64_t classes, bool whole_block, bool cached) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ block_scratch scratch;
  const team t = make_team(whole_block);
  C* cache = cached ? reinterpret_cast<C*>(dyn_smem) : nullptr;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * t.per_block;
  const C nan = std::numeric_limits<C>::quiet_NaN();
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * t.per_block + t.index; r < rows;
       r += step) {
    const T* xr = x + r * classes;
    T* br = backprop + r * classes;
    const auto l = static_cast<long long>(labels[r]);
    const bool bad = l < 0 || l >= classes;
    C m = neg_inf<C>();
    for (std::int64_t i = t.rank; i < classes; i += t.size) {
      const C v = load(xr[i]);
      if (cache != nullptr) cache[i] = v;
      m = max_ignore_nan{}(m, v);
    }
    m = team_allreduce(t, m, max_ignore_nan{}, neg_inf<C>(), scratch);
    // Every thread reads the label's logit before the team's next reduction, after which
    // backprop (maybe the logits' buffer) is written.
    const C at_label = bad ? nan : load(xr[l]) - m;
    // The smallest x - m of the other classes, as -(the largest m - x), NaN skipped (Note
    // [xent as its unfused form] in src/backends/cpu/reduction_softmax.cpp).
    C neg_lowest = neg_inf<C>();
    for (std::int64_t i = t.rank; i < classes; i += t.size) {
      if (i == l) continue;
      const C d = (cache != nullptr ? cache[i] : load(xr[i])) - m;
      neg_lowest = max_ignore_nan{}(neg_lowest, -d);
    }
    neg_lowest = team_allreduce(t, neg_lowest, max_ignore_nan{}, neg_inf<C>(), scratch);
    C s = 0;
    for (std::int64_t i = t.rank; i < classes; i += t.size) {
      const C e = exp_c((cache != nullptr ? cache[i] : load(xr[i])) - m);
      if (cache != nullptr) cache[i] = e;
      s += e;
    }
    s = team_allreduce(t, s, plus{}, C(0), scratch);
    team_sync(t);
    const auto inv = static_cast<C>(1.0 / static_cast<double>(s));
    for (std::int64_t i = t.rank; i < classes; i += t.size) {
      const C e = cache != nullptr ? cache[i] : exp_c(load(xr[i]) - m);
      const C p = e * inv;
      br[i] = store<T>(bad ? nan : (i == l ? p - C(1) : p));
    }
    if (t.rank == 0) {
      // loss = -y[label] of log_softmax's row; NaN where one_hot's 0 meets a -inf y
      // (Note [xent as its unfused form]).
      const auto ls = static_cast<C>(log(static_cast<double>(s)));
      const bool zero_times_inf = load(store<T>(-neg_lowest - ls)) == neg_inf<C>();
      loss[r] = store<T>(bad || zero_times_inf ? nan : -(at_label - ls));
    }
  }
}

template <class T, bool Log>
void softmax_typed(const T* x, T* y, std::int64_t outer, std::int64_t n, std::int64_t inner,
                   cudaStream_t s) {
  using C = compute_t<T>;
  if (inner == 1) {
    const row_launch l = plan_row_teams(n, warp_row_max, sizeof(C));
    softmax_rows_kernel<T, Log><<<grid_for(ceil_div(outer, l.per_block)), l.threads, l.smem, s>>>(
        x, y, outer, n, l.whole_block, l.cached);
  } else {
    softmax_cols_kernel<T, Log>
        <<<grid_for(ceil_div(outer * inner, 256)), 256, 0, s>>>(x, y, outer, n, inner);
  }
}

}  // namespace

bool softmax_supports(elem_type t) {
  return t == elem_type::f32 || t == elem_type::f64 || t == elem_type::f16 || t == elem_type::bf16;
}

void launch_softmax(elem_type t, bool log, const void* x, void* y, std::int64_t outer,
                    std::int64_t n, std::int64_t inner, cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x);
    T* yp = static_cast<T*>(y);
    if (log) {
      softmax_typed<T, true>(xp, yp, outer, n, inner, stream);
    } else {
      softmax_typed<T, false>(xp, yp, outer, n, inner, stream);
    }
  });
}

void launch_softmax_xent(elem_type t, bool labels_i32, const void* logits, const void* labels,
                         void* loss, void* backprop, std::int64_t rows, std::int64_t classes,
                         cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const row_launch l = plan_row_teams(classes, warp_row_max, sizeof(C));
    const unsigned grid = grid_for(ceil_div(rows, l.per_block));
    const T* xp = static_cast<const T*>(logits);
    if (labels_i32) {
      xent_kernel<T, std::int32_t><<<grid, l.threads, l.smem, stream>>>(
          xp, static_cast<const std::int32_t*>(labels), static_cast<T*>(loss),
          static_cast<T*>(backprop), rows, classes, l.whole_block, l.cached);
    } else {
      xent_kernel<T, std::int64_t><<<grid, l.threads, l.smem, stream>>>(
          xp, static_cast<const std::int64_t*>(labels), static_cast<T*>(loss),
          static_cast<T*>(backprop), rows, classes, l.whole_block, l.cached);
    }
  });
}

}  // namespace loom::cuda::kernels
