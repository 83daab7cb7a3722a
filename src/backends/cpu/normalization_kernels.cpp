// The normalization family's CPU kernels: layer_norm and layer_norm_grad (ops in
// src/graph/ops/normalization_ops.cpp, shape rules in loom/graph/ops/normalization_rules.hpp).
//
// Both view x as [rows, n]: the leading dims [0, axis) flattened into rows, the normalised
// dims [axis, rank) into n, and work a row at a time (Note [layer_norm row kernels]); large
// outputs are written with streaming stores (Note [layer_norm streaming stores]).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_isa.hpp"
#include "row_sums.hpp"
#include "kernel/common/normalization_helpers.hpp"
#include "reduction_common.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOOM_LAYER_NORM_AVX2 1
#else
#define LOOM_LAYER_NORM_AVX2 0
#endif

namespace loom::cpu {
namespace {

using namespace reduction;
constexpr device_type cpu = device_type::cpu;

// Note [layer_norm row kernels]
// Both kernels work a row (or four) at a time, so a row (n elements of x, and of dy for the
// gradient) comes from memory once and stays in L1/L2 for the passes over it:
//  - forward: Σx gives a centre c (the mean rounded to the compute type C), one pass over
//    the cached row gives the centred sums Σd and Σd², d = x - c, and one pass writes
//    y = ((x - c) - delta) rstd gamma + beta, where delta = Σd / n makes c + delta the
//    mean. The variance is the corrected two-pass algorithm (Chan, Golub & LeVeque):
//    var = (Σd² - (Σd)²/n) / n, the second term removing the rounding of c; nothing
//    cancels as in E[x²] - E[x]², and x - c is exact for x near c, so a row of mean 1e4
//    and spread 1e-2 keeps its variance and its y (tested against a long double loop).
//    The loop that writes row r's y also sums row r + 1 (normalize_row_sum_next, the same
//    adds in the same order as row_sum), so the next row's loads from memory overlap this
//    row's arithmetic: 2.3 -> 2.0 ms on [4096, 1024] f32 at 2 threads here.
//  - backward: one pass over four rows together gives each row's sums Σ dy·gamma and
//    Σ dy·gamma·xhat and adds dy·xhat and dy to the dgamma / dbeta accumulators (read and
//    written once per four rows); a second pass per row writes
//    dx = rstd (dy·gamma - mean(dy·gamma) - xhat mean(dy·gamma·xhat)).
// Sums along a row run in vector lanes of C (float for f32, f16 and bf16; double for f64)
// with several independent accumulators, carried in double every `row_block` elements as
// in Note [blocked summation]. 16-bit rows are widened into a float scratch row first and
// rounded once, on the store.
//
// dgamma and dbeta: the rows are cut into groups whose size depends only on (rows, n),
// never on the thread count. A group adds its rows' terms in C and flushes them into
// double every `flush_rows` rows; the groups' sums are added in group order at the end.
// The results are therefore bitwise the same for any number of threads.
//
// The vector code uses GCC/Clang vector extensions. On x86-64 the row loops are compiled
// twice, for the baseline ISA (SSE2: 16-byte vectors) that the rest of loom builds for and
// for AVX2 with FMA (32-byte vectors), and the kernel picks one per call: AVX2 where the
// CPU has it, unless the environment caps it with LOOM_MAX_CPU_ISA=baseline (the cap the
// fused element-wise kernel reads too; docs/runtime.md), which the tests use to run both.

constexpr std::int64_t flush_rows = 32;     // rows a group sums in C before carrying in double
constexpr std::int64_t max_groups = 64;     // dgamma/dbeta groups: enough ranges for the threads
constexpr std::int64_t min_group_rows = 8;  // a group's flush costs about as much as a row
constexpr std::int64_t max_partial_elements = std::int64_t{1} << 19;  // groups * n, at most

// ---- forward ----------------------------------------------------------------------------

// y = ((x - c) r - delta r) g + b over [0, n), where c + delta is the mean: x - c is exact
// for x near c, so a large mean costs y no accuracy (as the mean rounded to C would). y may
// be x (each element is read before it is written).
template <bool Stream, class C, int L>
[[gnu::always_inline]] inline void normalize_row(const C* x, const C* g, const C* b, C* y,
                                                 std::int64_t n, C c, C delta, C r) noexcept {
  const C dr = delta * r;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    vput<Stream, C, L>(
        y + i, ((vload<C, L>(x + i) - c) * r - dr) * vload<C, L>(g + i) + vload<C, L>(b + i));
  }
  for (; i < n; ++i) y[i] = ((x[i] - c) * r - dr) * g[i] + b[i];
}

// normalize_row, and in the same loop Σ xn[0, n) for the next row, exactly as row_sum adds
// it, so that the next row's loads from memory overlap this row's arithmetic instead of
// waiting for it (Note [layer_norm row kernels]). xn must not overlap y.
template <bool Stream, class C, int L>
[[gnu::always_inline]] inline double normalize_row_sum_next(const C* x, const C* g, const C* b,
                                                            C* y, std::int64_t n, C c, C delta, C r,
                                                            const C* xn) noexcept {
  using V = vec<C, L>;
  const C dr = delta * r;
  const auto yv = [&](std::int64_t i) {
    return ((vload<C, L>(x + i) - c) * r - dr) * vload<C, L>(g + i) + vload<C, L>(b + i);
  };
  double total = 0;
  for (std::int64_t blk = 0; blk < n; blk += row_block) {
    const std::int64_t e = std::min(n, blk + row_block);
    std::int64_t i = blk;
    V a0{}, a1{}, a2{}, a3{};
    for (; i + 4 * L <= e; i += 4 * L) {
      vput<Stream, C, L>(y + i, yv(i));
      a0 += vload<C, L>(xn + i);
      vput<Stream, C, L>(y + i + L, yv(i + L));
      a1 += vload<C, L>(xn + i + L);
      vput<Stream, C, L>(y + i + 2 * L, yv(i + 2 * L));
      a2 += vload<C, L>(xn + i + 2 * L);
      vput<Stream, C, L>(y + i + 3 * L, yv(i + 3 * L));
      a3 += vload<C, L>(xn + i + 3 * L);
    }
    for (; i + L <= e; i += L) {
      vput<Stream, C, L>(y + i, yv(i));
      a0 += vload<C, L>(xn + i);
    }
    C t = hsum<C, L>((a0 + a1) + (a2 + a3));
    for (; i < e; ++i) {
      y[i] = ((x[i] - c) * r - dr) * g[i] + b[i];
      t += xn[i];
    }
    total += static_cast<double>(t);
  }
  return total;
}

template <class T>
struct forward_args {
  const T* x = nullptr;
  const compute_t<T>* gamma = nullptr;  // in C (16-bit parameters widened once per call)
  const compute_t<T>* beta = nullptr;
  T* y = nullptr;  // may be x's buffer (Note [buffer forwarding])
  T* mean = nullptr;
  T* rstd = nullptr;
  std::int64_t n = 0;
  double eps = 0;
  bool stream = false;  // y with streaming stores (Note [layer_norm streaming stores])
};

// Rows [r0, r1) of the forward pass (Note [layer_norm row kernels]); Stream: a.stream.
template <bool Stream, class T, int L>
[[gnu::always_inline]] inline void forward_rows(const forward_args<T>& a, std::int64_t r0,
                                                std::int64_t r1) {
  using C = compute_t<T>;
  constexpr bool widened = !std::is_same_v<T, C>;
  const std::int64_t n = a.n;
  const auto dn = static_cast<double>(n);
  std::vector<C> scratch(widened ? static_cast<std::size_t>(n) : 0);
  // Σx of row r; f32 and f64 rows get it from the previous row's normalize pass.
  double sum = 0;
  if constexpr (!widened) {
    if (n > 0 && r0 < r1) sum = row_sum<C, L>(a.x + r0 * n, n);
  }
  for (std::int64_t r = r0; r < r1; ++r) {
    if (n == 0) {  // the mean of nothing
      a.mean[r] = store<T>(std::numeric_limits<double>::quiet_NaN());
      a.rstd[r] = store<T>(std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    const C* xr = nullptr;
    C* yr = nullptr;
    if constexpr (widened) {
      for (std::int64_t i = 0; i < n; ++i)
        scratch[static_cast<std::size_t>(i)] = load(a.x[r * n + i]);
      xr = scratch.data();
      yr = scratch.data();
      sum = row_sum<C, L>(xr, n);
    } else {
      xr = a.x + r * n;
      yr = a.y + r * n;
    }
    const auto centre = static_cast<C>(sum / dn);
    double s1 = 0;
    double s2 = 0;
    centred_sums<C, L>(xr, n, centre, s1, s2);
    // The mean is centre + delta; an infinite centre makes s1 NaN, and the mean is then the
    // infinity itself.
    const double delta = std::isfinite(centre) ? s1 / dn : 0.0;
    const double mean = static_cast<double>(centre) + delta;
    // An infinite Σd² is an infinite variance, as mean(square(d)) gives it (rstd 0, y =
    // beta): the correction term, tiny beside Σd², can overflow with it (float64 values
    // near the largest finite), and inf - inf would make the row NaN.
    double var = std::isinf(s2) ? s2 : (s2 - s1 * (s1 / dn)) / dn;
    var = var < 0.0 ? 0.0 : var;  // rounding only; NaN stays NaN
    const double rstd = 1.0 / std::sqrt(var + a.eps);
    if constexpr (!widened) {
      if (r + 1 < r1) {
        sum = normalize_row_sum_next<Stream, C, L>(xr, a.gamma, a.beta, yr, n, centre,
                                                   static_cast<C>(delta), static_cast<C>(rstd),
                                                   a.x + (r + 1) * n);
      } else {
        normalize_row<Stream, C, L>(xr, a.gamma, a.beta, yr, n, centre, static_cast<C>(delta),
                                    static_cast<C>(rstd));
      }
    } else {
      normalize_row<false, C, L>(xr, a.gamma, a.beta, yr, n, centre, static_cast<C>(delta),
                                 static_cast<C>(rstd));
    }
    if constexpr (widened) {
      for (std::int64_t i = 0; i < n; ++i)
        a.y[r * n + i] = store<T>(scratch[static_cast<std::size_t>(i)]);
    }
    a.mean[r] = store<T>(mean);
    a.rstd[r] = store<T>(rstd);
  }
  if constexpr (Stream) stream_fence();
}

// ---- backward ---------------------------------------------------------------------------

// Pass 1 over R rows at once (dy[k], x[k], m[k], r[k] for row k): s1[k] = Σ dy g and
// s2[k] = Σ dy g xhat with xhat = (x - m) r; adds dy xhat to pg and dy to pb, row 0 first
// (the same sums, in the same order, as R calls for one row each), so that pg, pb and g are
// loaded and stored once per R rows.
template <class C, int L, int R>
[[gnu::always_inline]] inline void grad_rows_sums(const C* const* dy, const C* const* x, const C* g,
                                                  const C* m, const C* r, std::int64_t n, C* pg,
                                                  C* pb, double* s1, double* s2) noexcept {
  using V = vec<C, L>;
  for (int k = 0; k < R; ++k) s1[k] = s2[k] = 0;
  for (std::int64_t b = 0; b < n; b += row_block) {
    const std::int64_t e = std::min(n, b + row_block);
    std::int64_t i = b;
    V a[R];
    V c[R];
    for (int k = 0; k < R; ++k) a[k] = c[k] = V{};
    for (; i + L <= e; i += L) {
      const V gv = vload<C, L>(g + i);
      V pgv = vload<C, L>(pg + i);
      V pbv = vload<C, L>(pb + i);
      for (int k = 0; k < R; ++k) {
        const V d = vload<C, L>(dy[k] + i);
        const V xh = (vload<C, L>(x[k] + i) - m[k]) * r[k];
        const V gd = d * gv;
        a[k] += gd;
        c[k] += gd * xh;
        pgv += d * xh;
        pbv += d;
      }
      vstore<C, L>(pg + i, pgv);
      vstore<C, L>(pb + i, pbv);
    }
    for (int k = 0; k < R; ++k) {
      C t1 = hsum<C, L>(a[k]);
      C t2 = hsum<C, L>(c[k]);
      for (std::int64_t j = i; j < e; ++j) {
        const C xh = (x[k][j] - m[k]) * r[k];
        const C gd = dy[k][j] * g[j];
        t1 += gd;
        t2 += gd * xh;
        pg[j] += dy[k][j] * xh;
        pb[j] += dy[k][j];
      }
      s1[k] += static_cast<double>(t1);
      s2[k] += static_cast<double>(t2);
    }
  }
}

// Pass 2 over one row: dx = dy g r - (x - m) k3 - k1, with k1 = r mean(dy g) and
// k3 = r² mean(dy g xhat). dx may be dy (each element is read before it is written).
template <bool Stream, class C, int L>
[[gnu::always_inline]] inline void grad_row_dx(const C* dy, const C* x, const C* g, C m, C r, C k1,
                                               C k3, std::int64_t n, C* dx) noexcept {
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    vput<Stream, C, L>(
        dx + i, vload<C, L>(dy + i) * vload<C, L>(g + i) * r - (vload<C, L>(x + i) - m) * k3 - k1);
  }
  for (; i < n; ++i) dx[i] = dy[i] * g[i] * r - (x[i] - m) * k3 - k1;
}

template <class T>
struct backward_args {
  const T* dy = nullptr;
  const T* x = nullptr;
  const compute_t<T>* gamma = nullptr;  // in C
  const T* mean = nullptr;
  const T* rstd = nullptr;
  T* dx = nullptr;            // may be dy's buffer
  double* partial = nullptr;  // [groups][2][n]: each group's dgamma and dbeta sums
  std::int64_t rows = 0;
  std::int64_t n = 0;
  std::int64_t group_rows = 1;
  bool stream = false;  // dx with streaming stores (Note [layer_norm streaming stores])
};

// Rows processed together by pass 1 (grad_rows_sums).
constexpr int rows_at_once = 4;

// Rows [r0, r0 + R) of a group: pass 1 over the R rows together, then pass 2 row by row
// (the rows are still in L1/L2).
template <bool Stream, class T, int L, int R>
[[gnu::always_inline]] inline void backward_rows(const backward_args<T>& a, std::int64_t r0,
                                                 compute_t<T>* pg, compute_t<T>* pb,
                                                 compute_t<T>* scratch) {
  using C = compute_t<T>;
  constexpr bool widened = !std::is_same_v<T, C>;
  const std::int64_t n = a.n;
  const auto dn = static_cast<double>(n);
  const C* dy[R];
  const C* x[R];
  C* dx[R];
  C m[R];
  C rs[R];
  for (int k = 0; k < R; ++k) {
    const std::int64_t r = r0 + k;
    if constexpr (widened) {
      C* s = scratch + 2 * k * n;
      for (std::int64_t i = 0; i < n; ++i) {
        s[i] = load(a.dy[r * n + i]);
        s[n + i] = load(a.x[r * n + i]);
      }
      dy[k] = s;
      x[k] = s + n;
      dx[k] = s;  // in place over dy: pass 2 reads each dy before writing its dx
    } else {
      dy[k] = a.dy + r * n;
      x[k] = a.x + r * n;
      dx[k] = a.dx + r * n;
    }
    m[k] = load(a.mean[r0 + k]);
    rs[k] = load(a.rstd[r0 + k]);
  }
  double s1[R];
  double s2[R];
  grad_rows_sums<C, L, R>(dy, x, a.gamma, m, rs, n, pg, pb, s1, s2);
  for (int k = 0; k < R; ++k) {
    const auto rd = static_cast<double>(rs[k]);
    grad_row_dx<Stream && !widened, C, L>(dy[k], x[k], a.gamma, m[k], rs[k],
                                          static_cast<C>(rd * s1[k] / dn),
                                          static_cast<C>(rd * rd * s2[k] / dn), n, dx[k]);
    if constexpr (widened) {
      T* out = a.dx + (r0 + k) * n;
      for (std::int64_t i = 0; i < n; ++i) out[i] = store<T>(dx[k][i]);
    }
  }
}

// Row groups [g0, g1) of the backward pass (Note [layer_norm row kernels]); Stream:
// a.stream.
template <bool Stream, class T, int L>
[[gnu::always_inline]] inline void backward_groups(const backward_args<T>& a, std::int64_t g0,
                                                   std::int64_t g1) {
  using C = compute_t<T>;
  constexpr bool widened = !std::is_same_v<T, C>;
  static_assert(flush_rows % rows_at_once == 0);
  const std::int64_t n = a.n;
  const auto un = static_cast<std::size_t>(n);
  std::vector<C> acc(2 * un);  // the group's dgamma and dbeta terms since the last flush
  std::vector<C> scratch(widened ? 2 * rows_at_once * un : 0);
  C* pg = acc.data();
  C* pb = acc.data() + n;
  for (std::int64_t grp = g0; grp < g1; ++grp) {
    double* dg = a.partial + grp * 2 * n;
    double* db = dg + n;
    std::fill(dg, dg + 2 * n, 0.0);
    const std::int64_t begin = grp * a.group_rows;
    const std::int64_t end = std::min(a.rows, begin + a.group_rows);
    std::int64_t r = begin;
    while (r < end) {
      // Rows up to the next flush, rows_at_once at a time while that many remain.
      const std::int64_t stop = std::min(end, r + flush_rows);
      for (; r + rows_at_once <= stop; r += rows_at_once) {
        backward_rows<Stream, T, L, rows_at_once>(a, r, pg, pb, scratch.data());
      }
      for (; r < stop; ++r) backward_rows<Stream, T, L, 1>(a, r, pg, pb, scratch.data());
      for (std::int64_t i = 0; i < n; ++i) {
        dg[i] += static_cast<double>(pg[i]);
        db[i] += static_cast<double>(pb[i]);
      }
      std::fill(acc.begin(), acc.end(), C(0));
    }
  }
}

// ---- dispatch ---------------------------------------------------------------------------

template <class T>
void forward_rows_baseline(const forward_args<T>& a, std::int64_t r0, std::int64_t r1) {
  constexpr int lanes = 16 / sizeof(compute_t<T>);
  if (a.stream) return forward_rows<true, T, lanes>(a, r0, r1);
  forward_rows<false, T, lanes>(a, r0, r1);
}
template <class T>
void backward_groups_baseline(const backward_args<T>& a, std::int64_t g0, std::int64_t g1) {
  constexpr int lanes = 16 / sizeof(compute_t<T>);
  if (a.stream) return backward_groups<true, T, lanes>(a, g0, g1);
  backward_groups<false, T, lanes>(a, g0, g1);
}

#if LOOM_LAYER_NORM_AVX2
template <class T>
[[gnu::target("avx2,fma")]] void forward_rows_avx2(const forward_args<T>& a, std::int64_t r0,
                                                   std::int64_t r1) {
  constexpr int lanes = 32 / sizeof(compute_t<T>);
  if (a.stream) return forward_rows<true, T, lanes>(a, r0, r1);
  forward_rows<false, T, lanes>(a, r0, r1);
}
template <class T>
[[gnu::target("avx2,fma")]] void backward_groups_avx2(const backward_args<T>& a, std::int64_t g0,
                                                      std::int64_t g1) {
  constexpr int lanes = 32 / sizeof(compute_t<T>);
  if (a.stream) return backward_groups<true, T, lanes>(a, g0, g1);
  backward_groups<false, T, lanes>(a, g0, g1);
}
#endif

// Note [layer_norm streaming stores]
// y (forward) and dx (backward) are written with non-temporal stores when the output is at
// least stream_min_bytes: far larger than the L2 caches, so its lines would leave the
// cache before anyone reads them anyway, and a plain store first reads each line from
// memory (read for ownership) to overwrite all of it. Streaming skips that read: a third
// of the forward's memory traffic (read x, write y) and a quarter of the backward's. On the
// development machine (2 cores, 2 MiB L2 each) the [4096, 1024] f32 forward went from
// 2.3 to 1.9 ms at 2 threads, and a consumer reading y right after took 0.15 ms more, so
// the pair still gained. Only f32 and f64 outputs stream (16-bit rows are stored element by
// element from a scratch row), only where every row starts 16-byte aligned, and never in
// place (y in x's buffer, dx in dy's: those lines are in the cache already). A task ends
// with sfence, before parallel_for's completion makes its results visible.
constexpr std::int64_t stream_min_bytes = std::int64_t{8} << 20;

// Whether rows of n elements of T written at `out` should stream (Note [layer_norm
// streaming stores]); `in` is the input whose buffer out may have taken.
template <class T>
bool should_stream(const T* out, const T* in, std::int64_t rows, std::int64_t n) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const auto bytes = static_cast<std::int64_t>(sizeof(T)) * n;
    return out != in && bytes * rows >= stream_min_bytes && bytes % 16 == 0 &&
           reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  }
#endif
  (void)out;
  (void)in;
  (void)rows;
  (void)n;
  return false;
}

// Whether this call may use the AVX2 row loops (Note [layer_norm row kernels]).
bool use_avx2() noexcept {
#if LOOM_LAYER_NORM_AVX2
  static const bool cpu_has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (!cpu_has) return false;
  return cpu::max_cpu_isa() != cpu::isa_cap::baseline;
#else
  return false;
#endif
}

/// Parameters (gamma, beta) in the compute type: the tensor's own data for f32 and f64, a
/// widened copy in `hold` for 16-bit types.
template <class T>
const compute_t<T>* params_in_c(const tensor& p, std::vector<compute_t<T>>& hold) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return p.data<T>();
  } else {
    const T* src = p.data<T>();
    hold.resize(static_cast<std::size_t>(p.num_elements()));
    for (std::size_t i = 0; i < hold.size(); ++i) hold[i] = load(src[i]);
    return hold.data();
  }
}

// ---- kernels ----------------------------------------------------------------------------

class layer_norm_kernel final : public common::layer_norm_kernel_base {
 public:
  explicit layer_norm_kernel(const kernel_construction& c)
      : layer_norm_kernel_base(c), eps_(c.attr<double>("epsilon")) {}

  void compute(kernel_context& ctx) override {
    const normalization_rules::layer_norm_geometry g = forward_geometry(ctx);
    const common::layer_norm_tensors io(ctx, g);
    const tensor& x = io.x;
    const std::int64_t rows = g.rows;
    const std::int64_t n = g.n;
    if (rows == 0) return;
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        std::vector<compute_t<T>> hold_gc;
        std::vector<compute_t<T>> hold_bc;
        forward_args<T> a;
        a.x = x.data<T>();
        a.gamma = params_in_c<T>(io.gamma, hold_gc);
        a.beta = params_in_c<T>(io.beta, hold_bc);
        a.y = io.y.data<T>();
        a.mean = io.mean.data<T>();
        a.rstd = io.rstd.data<T>();
        a.n = n;
        a.eps = eps_;
        a.stream = should_stream(a.y, a.x, rows, n);
        const bool avx2 = use_avx2();
        ctx.parallel_for(rows, 1.5 * static_cast<double>(n) + 20.0,
                         [&](std::int64_t b, std::int64_t e) {
#if LOOM_LAYER_NORM_AVX2
                           if (avx2) return forward_rows_avx2<T>(a, b, e);
#endif
                           forward_rows_baseline<T>(a, b, e);
                         });
        (void)avx2;
      } else {
        ctx.fail("layer_norm has no kernel for {}", to_string(x.type()));
      }
    });
  }

 private:
  double eps_;
};

// Rows per dgamma/dbeta group: a function of (rows, n) only, so the sums do not depend on
// the thread count (Note [layer_norm row kernels]). At most max_groups groups and
// max_partial_elements partial sums of each of dgamma and dbeta, and at least
// min_group_rows rows each.
std::int64_t group_rows_for(std::int64_t rows, std::int64_t n) {
  const std::int64_t groups =
      std::clamp<std::int64_t>(max_partial_elements / std::max<std::int64_t>(n, 1), 1, max_groups);
  return std::max<std::int64_t>(min_group_rows, (rows + groups - 1) / groups);
}

class layer_norm_grad_kernel final : public common::layer_norm_kernel_base {
 public:
  using layer_norm_kernel_base::layer_norm_kernel_base;

  void compute(kernel_context& ctx) override {
    const normalization_rules::layer_norm_geometry g = backward_geometry(ctx);
    const common::layer_norm_grad_tensors io(ctx, g);
    visit_dtype(io.x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        compute_typed<T>(ctx, io.dy, io.x, io.gamma, io.mean, io.rstd, io.dx, io.dgamma,
                         io.dbeta, g.rows, g.n);
      } else {
        ctx.fail("layer_norm_grad has no kernel for {}", to_string(io.x.type()));
      }
    });
  }

 private:
  template <class T>
  static void compute_typed(kernel_context& ctx, const tensor& dy, const tensor& x,
                            const tensor& gamma, const tensor& mean, const tensor& rstd, tensor& dx,
                            tensor& dgamma, tensor& dbeta, std::int64_t rows, std::int64_t n) {
    T* dg = dgamma.data<T>();
    T* db = dbeta.data<T>();
    if (rows == 0 || n == 0) {  // sums over no rows: zeros
      std::fill(dg, dg + n, store<T>(0.0));
      std::fill(db, db + n, store<T>(0.0));
      return;
    }
    std::vector<compute_t<T>> hold_gc;
    backward_args<T> a;
    a.dy = dy.data<T>();
    a.x = x.data<T>();
    a.gamma = params_in_c<T>(gamma, hold_gc);
    a.mean = mean.data<T>();
    a.rstd = rstd.data<T>();
    a.dx = dx.data<T>();
    a.rows = rows;
    a.n = n;
    a.group_rows = group_rows_for(rows, n);
    a.stream = should_stream(a.dx, a.dy, rows, n);
    const std::int64_t groups = (rows + a.group_rows - 1) / a.group_rows;
    tensor partial = ctx.allocate_temp(dtype::f64, shape{groups, 2, n});
    a.partial = partial.data<double>();
    const bool avx2 = use_avx2();
    ctx.parallel_for(groups, 3.0 * static_cast<double>(a.group_rows * n) + 20.0,
                     [&](std::int64_t b, std::int64_t e) {
#if LOOM_LAYER_NORM_AVX2
                       if (avx2) return backward_groups_avx2<T>(a, b, e);
#endif
                       backward_groups_baseline<T>(a, b, e);
                     });
    (void)avx2;
    // The groups' sums, in group order, over blocks of columns (each group's partial row
    // is read contiguously).
    const double* p = a.partial;
    constexpr std::int64_t cols = 256;
    ctx.parallel_for((n + cols - 1) / cols, 2.0 * static_cast<double>(groups * cols),
                     [&](std::int64_t b, std::int64_t e) {
                       double sg[cols];
                       double sb[cols];
                       for (std::int64_t blk = b; blk < e; ++blk) {
                         const std::int64_t i0 = blk * cols;
                         const std::int64_t w = std::min(cols, n - i0);
                         std::fill(sg, sg + w, 0.0);
                         std::fill(sb, sb + w, 0.0);
                         for (std::int64_t g = 0; g < groups; ++g) {
                           const double* pg = p + 2 * g * n + i0;
                           const double* pb = pg + n;
                           for (std::int64_t i = 0; i < w; ++i) {
                             sg[i] += pg[i];
                             sb[i] += pb[i];
                           }
                         }
                         for (std::int64_t i = 0; i < w; ++i) {
                           dg[i0 + i] = store<T>(sg[i]);
                           db[i0 + i] = store<T>(sb[i]);
                         }
                       }
                     });
  }
};

}  // namespace

void register_batch_norm_kernels(kernel_registry& registry);  // normalization_batch_norm.cpp
// normalization_batch_norm_train.cpp
void register_batch_norm_train_kernels(kernel_registry& registry);

void register_normalization_kernels(kernel_registry& r) {
  r.add(make_kernel_def<layer_norm_kernel>("layer_norm", cpu));
  r.add(make_kernel_def<layer_norm_grad_kernel>("layer_norm_grad", cpu));
  register_batch_norm_kernels(r);
  register_batch_norm_train_kernels(r);
}

}  // namespace loom::cpu
