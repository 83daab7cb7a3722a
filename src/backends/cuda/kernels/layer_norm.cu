// CUDA kernels of layer_norm and layer_norm_grad (launchers in layer_norm.cuh; Note [cuda
// layer_norm], Note [cuda deterministic reductions]).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "layer_norm.cuh"
#include "reduction_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace rdev;

constexpr int max_threads = 1024;
constexpr std::int64_t warp_row_max = 256;  // rows up to this long: a warp each
constexpr int col_tile = 32;  // dgamma/dbeta: columns per block
constexpr int col_rows = 8;   // dgamma/dbeta: thread rows per block
constexpr std::int64_t target_blocks = 1024;



template <class C>
struct sum2 {
  C a;
  C b;
};

struct plus2 {
  template <class P>
  __device__ __forceinline__ P operator()(P x, P y) const {
    return P{x.a + y.a, x.b + y.b};
  }
};

// A row's statistics from its centre and centred sums Σd, Σd² (Note [cuda layer_norm]):
// delta = Σd / n (the mean is centre + delta) and rstd, in double.
struct row_stats {
  double delta;
  double rstd;
};

template <class C>
__device__ __forceinline__ row_stats finish_row(C centre, sum2<C> d, double dn, double eps) {
  const auto s1 = static_cast<double>(d.a);
  const auto s2 = static_cast<double>(d.b);
  // An infinite centre makes s1 NaN; the mean is then the infinity itself.
  const double delta = isfinite(static_cast<double>(centre)) ? s1 / dn : 0.0;
  // An infinite Σd² is an infinite variance, as mean(square(d)) gives it (the CPU kernel's
  // rule: the correction term can overflow with it, and inf - inf would make the row NaN).
  double var = isinf(s2) ? s2 : (s2 - s1 * (s1 / dn)) / dn;
  var = var < 0.0 ? 0.0 : var;  // rounding only; NaN stays NaN
  return {delta, 1.0 / sqrt(var + eps)};
}

// A team per row (Note [cuda layer_norm]).
template <class T>
__global__ void __launch_bounds__(max_threads)
    layer_norm_kernel(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd,
                      std::int64_t rows, std::int64_t n, double eps, bool whole_block,
                      bool cached) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ block_scratch scratch;
  const team t = make_team(whole_block);
  C* cache = cached ? reinterpret_cast<C*>(dyn_smem) : nullptr;  // block teams only
  const auto dn = static_cast<double>(n);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * t.per_block;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * t.per_block + t.index; r < rows;
       r += step) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    // Each thread touches only elements i = rank (mod size), so y may be x. The passes over
    // global memory take four elements per step, loads first, so that four are in flight.
    const std::int64_t ts = t.size;
    C s = 0;
    std::int64_t i = t.rank;
    for (; i + 3 * ts < n; i += 4 * ts) {
      const C v0 = load(xr[i]);
      const C v1 = load(xr[i + ts]);
      const C v2 = load(xr[i + 2 * ts]);
      const C v3 = load(xr[i + 3 * ts]);
      if (cache != nullptr) {
        cache[i] = v0;
        cache[i + ts] = v1;
        cache[i + 2 * ts] = v2;
        cache[i + 3 * ts] = v3;
      }
      s += (v0 + v1) + (v2 + v3);
    }
    for (; i < n; i += ts) {
      const C v = load(xr[i]);
      if (cache != nullptr) cache[i] = v;
      s += v;
    }
    s = team_allreduce(t, s, plus{}, C(0), scratch);
    const auto centre = static_cast<C>(static_cast<double>(s) / dn);
    sum2<C> d{C(0), C(0)};
    for (i = t.rank; i < n; i += ts) {
      const C u = (cache != nullptr ? cache[i] : load(xr[i])) - centre;
      d.a += u;
      d.b += u * u;
    }
    d = team_allreduce(t, d, plus2{}, sum2<C>{C(0), C(0)}, scratch);
    const auto [delta, rs] = finish_row(centre, d, dn, eps);
    const auto rc = static_cast<C>(rs);
    const C dr = static_cast<C>(delta) * rc;
    auto xv = [&](std::int64_t k) { return cache != nullptr ? cache[k] : load(xr[k]); };
    auto yv = [&](C v, C g, C b) { return store<T>(((v - centre) * rc - dr) * g + b); };
    i = t.rank;
    for (; i + 3 * ts < n; i += 4 * ts) {
      C v[4];
      C g[4];
      C b[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[k] = xv(i + k * ts);
        g[k] = load(gamma[i + k * ts]);
        b[k] = load(beta[i + k * ts]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) yr[i + k * ts] = yv(v[k], g[k], b[k]);
    }
    for (; i < n; i += ts) yr[i] = yv(xv(i), load(gamma[i]), load(beta[i]));
    if (t.rank == 0) {
      mean[r] = store<T>(static_cast<double>(centre) + delta);
      rstd[r] = store<T>(rs);
    }
  }
}

// Rows of f32 with n % 4 == 0 and n <= 128 K, 16-byte aligned: a warp per row with the row
// in registers (K float4 per lane), so x is read from memory once and every access is 16
// bytes wide; the numerics are layer_norm_kernel's (Note [cuda layer_norm]). With rows of a
// few KiB, the block-per-row kernel above spent its time in block barriers and shared memory.
template <int K>
__global__ void __launch_bounds__(256)
    layer_norm_f32_rows_in_registers(const float* x, const float* gamma, const float* beta,
                                     float* y, float* mean, float* rstd, std::int64_t rows,
                                     std::int64_t n, double eps) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps_per_block = blockDim.x >> 5;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * warps_per_block;
  const std::int64_t n4 = n >> 2;
  const auto dn = static_cast<double>(n);
  const auto* g4 = reinterpret_cast<const float4*>(gamma);
  const auto* b4 = reinterpret_cast<const float4*>(beta);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * warps_per_block +
                        (static_cast<std::int64_t>(threadIdx.x) >> 5);
       r < rows; r += step) {
    const auto* xr = reinterpret_cast<const float4*>(x + r * n);
    float4 v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const std::int64_t j = k * 32 + lane;
      v[k] = j < n4 ? xr[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) s += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    s = warp_allreduce(s, plus{});
    const auto centre = static_cast<float>(static_cast<double>(s) / dn);
    sum2<float> d{0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k * 32 + lane < n4) {
        const float u0 = v[k].x - centre;
        const float u1 = v[k].y - centre;
        const float u2 = v[k].z - centre;
        const float u3 = v[k].w - centre;
        d.a += (u0 + u1) + (u2 + u3);
        d.b += (u0 * u0 + u1 * u1) + (u2 * u2 + u3 * u3);
      }
    }
    d = warp_allreduce(d, plus2{});
    const auto [delta, rs] = finish_row(centre, d, dn, eps);
    const auto rc = static_cast<float>(rs);
    const float dr = static_cast<float>(delta) * rc;
    auto* yr = reinterpret_cast<float4*>(y + r * n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const std::int64_t j = k * 32 + lane;
      if (j < n4) {
        const float4 g = g4[j];
        const float4 b = b4[j];
        float4 o;
        o.x = ((v[k].x - centre) * rc - dr) * g.x + b.x;
        o.y = ((v[k].y - centre) * rc - dr) * g.y + b.y;
        o.z = ((v[k].z - centre) * rc - dr) * g.z + b.z;
        o.w = ((v[k].w - centre) * rc - dr) * g.w + b.w;
        yr[j] = o;
      }
    }
    if (lane == 0) {
      mean[r] = static_cast<float>(static_cast<double>(centre) + delta);
      rstd[r] = static_cast<float>(rs);
    }
  }
}

// Launches layer_norm_f32_rows_in_registers when the shape and pointers suit it; false when
// they do not.
bool launch_f32_rows_in_registers(const float* x, const float* gamma, const float* beta,
                                  float* y, float* mean, float* rstd, std::int64_t rows,
                                  std::int64_t n, double eps, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (n == 0 || n % 4 != 0 || n > 128 * 16 || !aligned(x) || !aligned(gamma) || !aligned(beta) ||
      !aligned(y)) {
    return false;
  }
  constexpr int threads = 256;  // eight rows per block
  const unsigned grid = grid_for(ceil_div(rows, threads / 32));
  const std::int64_t chunks = ceil_div(n, 128);
  auto go = [&](auto k) {
    layer_norm_f32_rows_in_registers<decltype(k)::value>
        <<<grid, threads, 0, stream>>>(x, gamma, beta, y, mean, rstd, rows, n, eps);
  };
  if (chunks <= 1) {
    go(std::integral_constant<int, 1>{});
  } else if (chunks <= 2) {
    go(std::integral_constant<int, 2>{});
  } else if (chunks <= 4) {
    go(std::integral_constant<int, 4>{});
  } else if (chunks <= 8) {
    go(std::integral_constant<int, 8>{});
  } else {
    go(std::integral_constant<int, 16>{});
  }
  return true;
}

// dx, a team per row (Note [cuda layer_norm]); the cache holds dy·g and x.
template <class T>
__global__ void __launch_bounds__(max_threads)
    layer_norm_dx_kernel(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                         T* dx, std::int64_t rows, std::int64_t n, bool whole_block, bool cached) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ block_scratch scratch;
  const team t = make_team(whole_block);
  C* cache = cached ? reinterpret_cast<C*>(dyn_smem) : nullptr;
  const auto dn = static_cast<double>(n);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * t.per_block;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * t.per_block + t.index; r < rows;
       r += step) {
    const T* dyr = dy + r * n;
    const T* xr = x + r * n;
    T* dxr = dx + r * n;
    const C m = load(mean[r]);
    const C rc = load(rstd[r]);
    // Each thread touches only elements i = rank (mod size), so dx may be dy; four elements
    // per step, loads first (as the forward).
    const std::int64_t ts = t.size;
    sum2<C> s{C(0), C(0)};
    auto add = [&](std::int64_t k, C d, C xv, C g) {
      const C gd = d * g;
      if (cache != nullptr) {
        cache[k] = gd;
        cache[n + k] = xv;
      }
      s.a += gd;
      s.b += gd * ((xv - m) * rc);
    };
    std::int64_t i = t.rank;
    for (; i + 3 * ts < n; i += 4 * ts) {
      C d[4];
      C xv[4];
      C g[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        d[k] = load(dyr[i + k * ts]);
        xv[k] = load(xr[i + k * ts]);
        g[k] = load(gamma[i + k * ts]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) add(i + k * ts, d[k], xv[k], g[k]);
    }
    for (; i < n; i += ts) add(i, load(dyr[i]), load(xr[i]), load(gamma[i]));
    s = team_allreduce(t, s, plus2{}, sum2<C>{C(0), C(0)}, scratch);
    const auto rd = static_cast<double>(rc);
    const auto k1 = static_cast<C>(rd * static_cast<double>(s.a) / dn);
    const auto k3 = static_cast<C>(rd * rd * static_cast<double>(s.b) / dn);
    auto dxv = [&](C gd, C xv) { return store<T>(gd * rc - (xv - m) * k3 - k1); };
    if (cache != nullptr) {
      for (i = t.rank; i < n; i += ts) dxr[i] = dxv(cache[i], cache[n + i]);
    } else {
      i = t.rank;
      for (; i + 3 * ts < n; i += 4 * ts) {
        C gd[4];
        C xv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          gd[k] = load(dyr[i + k * ts]) * load(gamma[i + k * ts]);
          xv[k] = load(xr[i + k * ts]);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) dxr[i + k * ts] = dxv(gd[k], xv[k]);
      }
      for (; i < n; i += ts) dxr[i] = dxv(load(dyr[i]) * load(gamma[i]), load(xr[i]));
    }
  }
}

// dgamma/dbeta partials: unit = (chunk of rows, tile of 32 columns), a block of 32 x 8
// threads each; partial[c][0][j] = Σ dy·xhat, partial[c][1][j] = Σ dy over chunk c's rows.
template <class T>
__global__ void layer_norm_partials_kernel(const T* dy, const T* x, const T* mean, const T* rstd,
                                           compute_t<T>* partial, std::int64_t rows, std::int64_t n,
                                           std::int64_t chunks, std::int64_t chunk_rows) {
  using C = compute_t<T>;
  __shared__ C tile_g[col_rows][col_tile];
  __shared__ C tile_b[col_rows][col_tile];
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  const std::int64_t tiles = ceil_div(n, col_tile);
  const std::int64_t units = chunks * tiles;
  for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const std::int64_t j = (u % tiles) * col_tile + tx;
    const std::int64_t c = u / tiles;
    const std::int64_t b = c * chunk_rows;
    const std::int64_t e = b + chunk_rows < rows ? b + chunk_rows : rows;
    C pg = 0;
    C pb = 0;
    if (j < n) {
      for (std::int64_t r = b + ty; r < e; r += col_rows) {
        const C d = load(dy[r * n + j]);
        pg += d * ((load(x[r * n + j]) - load(mean[r])) * load(rstd[r]));
        pb += d;
      }
    }
    tile_g[ty][tx] = pg;
    tile_b[ty][tx] = pb;
    __syncthreads();
    if (ty == 0 && j < n) {
      C g = tile_g[0][tx];
      C bb = tile_b[0][tx];
#pragma unroll
      for (int k = 1; k < col_rows; ++k) {
        g += tile_g[k][tx];
        bb += tile_b[k][tx];
      }
      partial[(2 * c) * n + j] = g;
      partial[(2 * c + 1) * n + j] = bb;
    }
    __syncthreads();  // the tiles are rewritten by the next unit
  }
}

// dgamma[j], dbeta[j]: the chunks' partials added in chunk order, in double.
template <class T>
__global__ void layer_norm_param_grads_kernel(const compute_t<T>* partial, T* dgamma, T* dbeta,
                                              std::int64_t chunks, std::int64_t n) {
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double g = 0;
    double b = 0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      g += static_cast<double>(partial[(2 * c) * n + j]);
      b += static_cast<double>(partial[(2 * c + 1) * n + j]);
    }
    dgamma[j] = store<T>(g);
    dbeta[j] = store<T>(b);
  }
}

// Rows per dgamma/dbeta chunk, from (rows, n) only: enough chunks to give the GPU about
// target_blocks blocks, with at least 16 rows each.
std::int64_t chunk_rows_for(std::int64_t rows, std::int64_t n) {
  const std::int64_t tiles = ceil_div(n, col_tile);
  const std::int64_t chunks =
      std::clamp<std::int64_t>(ceil_div(target_blocks, tiles), 1, ceil_div(rows, 16));
  return ceil_div(rows, chunks);
}

}  // namespace

bool layer_norm_supports(elem_type t) {
  return t == elem_type::f32 || t == elem_type::f64 || t == elem_type::f16 || t == elem_type::bf16;
}

void launch_layer_norm(elem_type t, const void* x, const void* gamma, const void* beta, void* y,
                       void* mean, void* rstd, std::int64_t rows, std::int64_t n, double epsilon,
                       cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      if (rows > 0 &&
          launch_f32_rows_in_registers(static_cast<const float*>(x),
                                       static_cast<const float*>(gamma),
                                       static_cast<const float*>(beta), static_cast<float*>(y),
                                       static_cast<float*>(mean), static_cast<float*>(rstd), rows,
                                       n, epsilon, stream)) {
        return;
      }
    }
    const row_launch l = plan_row_teams(n, warp_row_max, sizeof(compute_t<T>));
    layer_norm_kernel<T><<<grid_for(ceil_div(rows, l.per_block)), l.threads, l.smem, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta),
        static_cast<T*>(y), static_cast<T*>(mean), static_cast<T*>(rstd), rows, n, epsilon,
        l.whole_block, l.cached);
  });
}

std::size_t layer_norm_grad_temp_bytes(elem_type t, std::int64_t rows, std::int64_t n) {
  const std::int64_t chunks = ceil_div(rows, chunk_rows_for(rows, n));
  const std::size_t c_bytes = t == elem_type::f64 ? sizeof(double) : sizeof(float);
  return static_cast<std::size_t>(2 * chunks * n) * c_bytes;
}

void launch_layer_norm_grad(elem_type t, const void* dy, const void* x, const void* gamma,
                            const void* mean, const void* rstd, void* dx, void* dgamma, void* dbeta,
                            void* temp, std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  visit_float(t, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* dyp = static_cast<const T*>(dy);
    const T* xp = static_cast<const T*>(x);
    const T* mp = static_cast<const T*>(mean);
    const T* rp = static_cast<const T*>(rstd);
    C* partial = static_cast<C*>(temp);
    // dgamma and dbeta first: they read dy, whose buffer dx may be.
    const std::int64_t chunk_rows = chunk_rows_for(rows, n);
    const std::int64_t chunks = ceil_div(rows, chunk_rows);
    layer_norm_partials_kernel<T>
        <<<grid_for(chunks * ceil_div(n, col_tile)), dim3(col_tile, col_rows), 0, stream>>>(
            dyp, xp, mp, rp, partial, rows, n, chunks, chunk_rows);
    layer_norm_param_grads_kernel<T><<<grid_for(ceil_div(n, 256)), 256, 0, stream>>>(
        partial, static_cast<T*>(dgamma), static_cast<T*>(dbeta), chunks, n);
    const row_launch l = plan_row_teams(n, warp_row_max, 2 * sizeof(C));
    layer_norm_dx_kernel<T><<<grid_for(ceil_div(rows, l.per_block)), l.threads, l.smem, stream>>>(
        dyp, xp, static_cast<const T*>(gamma), mp, rp, static_cast<T*>(dx), rows, n, l.whole_block,
        l.cached);
  });
}

}  // namespace loom::cuda::kernels
