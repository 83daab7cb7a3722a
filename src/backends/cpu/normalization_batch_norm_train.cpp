// The CPU kernels of batch normalisation in training (ops in
// src/graph/ops/normalization_train_ops.cpp): batch_norm_train and batch_norm_train_grad, one
// node each way, and the pieces of sync_batch_norm (batch_norm_stats, sync_batch_norm,
// batch_norm_grad_reduce, batch_norm_grad_elemt). Note [batch norm training kernels].
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "cpu_isa.hpp"
#include "kernel/common/normalization_helpers.hpp"
#include "kernel/common/variable_kernels.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
#include "reduction_common.hpp"
#include "vector_lanes.hpp"

namespace loom::cpu {

void register_batch_norm_train_kernels(kernel_registry& registry);

namespace {

using namespace reduction;
namespace rules = normalization_rules;
constexpr device_type cpu = device_type::cpu;

// Note [batch norm training kernels]
// x is seen as [outer, C, inner] (rules::batch_norm_geometry). Two layouts of the work:
//  - channel planes (inner > 1: NCHW): a task takes whole channels; for each, the statistics
//    pass reads the channel's `outer` rows of `inner` values, and the normalising pass
//    (backward: the dx pass) follows at once, while the channel is still in L2 (a channel
//    of a [32, 64, 28, 28] batch is 100 KB): x comes from memory once, not twice. Each row
//    is summed in vector lanes, then its deviations from its own mean (the corrected
//    two-pass algorithm, exact in its lanes for a row in L1), and the rows' (count, mean,
//    m2) are merged in double by Chan et al.'s parallel update, in row order;
//  - rows (inner == 1: NHWC, and rank 2): x is [rows, C] with C contiguous; blocks of rows
//    (their size a function of the shape only, never of the thread count) get per-channel
//    (mean, m2) in one pass, in vector lanes across the channels (tiles of channels kept
//    in registers), and the blocks are merged in block order. The normalising (dx) pass is
//    a second pass over the blocks.
// No E[x²] - E[x]² anywhere: a channel of mean 1e4 and unit spread keeps its variance to
// float32 rounding (tested against float64). The mean enters the normalising pass as
// cm + delta, cm the mean rounded to the compute type and delta the rest, folded into the
// shift: y = (x - cm) a + (bias - delta a), and x - cm is exact for x near the mean, so y
// keeps its accuracy too (as layer_norm's rows do). The results do not depend on the thread
// count. 16-bit values are widened to float as they are loaded.
// Every loop is compiled for the baseline ISA, AVX2 and AVX-512 (Note [fused instruction
// sets] in fused_elementwise.cpp), chosen per call.

// Rows of a block in the rows layout: about 32 KiB of values (read twice, from L1/L2), at
// least 8 rows and at most 1024.
std::int64_t block_rows_for(std::int64_t channels, std::size_t value_bytes) {
  const auto row = static_cast<std::int64_t>(value_bytes) * std::max<std::int64_t>(channels, 1);
  return std::clamp<std::int64_t>((std::int64_t{32} << 10) / row, 8, 1024);
}

// (count, mean, m2) of a set of values, merged in double (Chan, Golub & LeVeque).
struct moments {
  double n = 0;
  double mean = 0;
  double m2 = 0;
  void merge(double nb, double mean_b, double m2_b) noexcept {
    if (nb <= 0) return;
    const double total = n + nb;
    const double d = mean_b - mean;
    mean += d * (nb / total);
    m2 += m2_b + d * d * (n * nb / total);
    n = total;
  }
};

// Per-channel values the passes read, in the compute type C. The mean enters as cm + delta
// (Note [batch norm training kernels]); the passes subtract cm only, and delta's share is
// folded into b (and, for the sums, corrected in double).
template <class C>
struct channel_coeffs {
  std::vector<C> cm;          // the mean rounded to C
  std::vector<double> delta;  // mean - cm
  std::vector<C> a;           // scale · invstd
  std::vector<C> b;           // forward: bias - delta · a; backward: -a · mean(dy) - delta · q
  std::vector<C> q;           // backward: -a · invstd² · mean(dy (x - mean))
  explicit channel_coeffs(std::int64_t channels)
      : cm(static_cast<std::size_t>(channels)),
        delta(cm.size()),
        a(cm.size()),
        b(cm.size()),
        q(cm.size()) {}
  void set_mean(std::int64_t c, double mean) {
    const auto i = static_cast<std::size_t>(c);
    cm[i] = static_cast<C>(mean);
    delta[i] = mean - static_cast<double>(cm[i]);
  }
};

// What every pass reads and writes; pointers not used by a pass stay null.
template <class T>
struct pass_args {
  using C = compute_t<T>;
  const T* x = nullptr;
  const T* dy = nullptr;
  T* out = nullptr;  // y or dx
  rules::batch_norm_geometry g;
  const channel_coeffs<C>* k = nullptr;
  // Statistics out (forward: mean and m2 per channel or per (block, channel); backward: Σdy
  // and Σ dy (x - mean)).
  double* s1 = nullptr;
  double* s2 = nullptr;
  std::int64_t block_rows = 0;
  bool stream = false;  // out with streaming stores (Note [batch norm streaming stores])
};

// Note [batch norm streaming stores]
// y (dx) is written with non-temporal stores when it is at least stream_min_bytes, not in
// x's (dy's) buffer, float32 or float64, and made of whole cache lines: every row (a
// channel plane's row, or a row of channels) starts 64-byte aligned and fills whole lines,
// as layer_norm's rows do (Note [layer_norm streaming stores] in normalization_kernels.cpp):
// a plain store first reads each line for ownership, which streaming skips; rows that share
// lines would leave partial lines to the write-combining buffers, which costs far more
// (a [64, 256, 14, 14] forward went from 1.3 to 2.6 ms with 784-byte rows streamed).
constexpr std::int64_t stream_min_bytes = std::int64_t{8} << 20;

// Whether `out` (of `bytes`, rows of `row_bytes`, `in` the input it may have taken the
// buffer of) should be written with streaming stores.
template <class T>
bool should_stream(const T* out, const T* in, std::int64_t bytes, std::int64_t row_bytes) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return out != in && bytes >= stream_min_bytes && row_bytes % 64 == 0 &&
           reinterpret_cast<std::uintptr_t>(out) % 64 == 0;
  }
#endif
  (void)out;
  (void)in;
  (void)bytes;
  (void)row_bytes;
  return false;
}

// v at p: streamed (p 16-byte aligned) or stored.
template <class C, int L>
[[gnu::always_inline]] inline void put(C* p, const vec<C, L>& v, bool stream) noexcept {
  if (stream) {
    vstream<C, L>(p, v);
  } else {
    vstore<C, L>(p, v);
  }
}

// ---- row loops (L lanes of C) --------------------------------------------------------------

// Values a lane sum takes before it is carried in double (Note [blocked summation]): the
// rounding error of a sum grows with the adds in one lane.
constexpr std::int64_t chunk = 512;

// Σ v[0, n), in lanes, carried in double every `chunk` values.
template <class C, int L>
[[gnu::always_inline]] inline double sum_of(const C* v, std::int64_t n) noexcept {
  using V = vec<C, L>;
  double total = 0;
  for (std::int64_t b = 0; b < n; b += chunk) {
    const std::int64_t e = std::min(n, b + chunk);
    V a0{}, a1{};
    std::int64_t i = b;
    for (; i + 2 * L <= e; i += 2 * L) {
      a0 += vload<C, L>(v + i);
      a1 += vload<C, L>(v + i + L);
    }
    for (; i + L <= e; i += L) a0 += vload<C, L>(v + i);
    C t = hsum<C, L>(a0 + a1);
    for (; i < e; ++i) t += v[i];
    total += static_cast<double>(t);
  }
  return total;
}

// Σ (v - m) and Σ (v - m)² over [0, n) (the first corrects m's rounding), carried in double
// every `chunk` values.
template <class C, int L>
[[gnu::always_inline]] inline void deviations(const C* v, std::int64_t n, C m, double& d1,
                                              double& d2) noexcept {
  using V = vec<C, L>;
  d1 = 0;
  d2 = 0;
  for (std::int64_t b = 0; b < n; b += chunk) {
    const std::int64_t e = std::min(n, b + chunk);
    V s0{}, s1{}, q0{}, q1{};
    std::int64_t i = b;
    for (; i + 2 * L <= e; i += 2 * L) {
      const V u0 = vload<C, L>(v + i) - m;
      const V u1 = vload<C, L>(v + i + L) - m;
      s0 += u0;
      s1 += u1;
      q0 += u0 * u0;
      q1 += u1 * u1;
    }
    for (; i + L <= e; i += L) {
      const V u = vload<C, L>(v + i) - m;
      s0 += u;
      q0 += u * u;
    }
    C t1 = hsum<C, L>(s0 + s1);
    C t2 = hsum<C, L>(q0 + q1);
    for (; i < e; ++i) {
      const C u = v[i] - m;
      t1 += u;
      t2 += u * u;
    }
    d1 += static_cast<double>(t1);
    d2 += static_cast<double>(t2);
  }
}

// out = (v - cm) · a + b over [0, n).
template <class C, int L>
[[gnu::always_inline]] inline void affine_centred(const C* v, C* out, std::int64_t n, C cm, C a,
                                                  C b, bool stream) noexcept {
  std::int64_t i = 0;
  for (; i + L <= n; i += L) put<C, L>(out + i, (vload<C, L>(v + i) - cm) * a + b, stream);
  for (; i < n; ++i) out[i] = (v[i] - cm) * a + b;
}

// Σ dy and Σ dy (x - cm) over [0, n), carried in double every `chunk` values.
template <class C, int L>
[[gnu::always_inline]] inline void grad_sums(const C* dy, const C* x, std::int64_t n, C cm,
                                             double& sdy, double& sdyx) noexcept {
  using V = vec<C, L>;
  sdy = 0;
  sdyx = 0;
  for (std::int64_t blk = 0; blk < n; blk += chunk) {
    const std::int64_t e = std::min(n, blk + chunk);
    V a0{}, a1{}, b0{}, b1{};
    std::int64_t i = blk;
    for (; i + 2 * L <= e; i += 2 * L) {
      const V g0 = vload<C, L>(dy + i);
      const V g1 = vload<C, L>(dy + i + L);
      a0 += g0;
      a1 += g1;
      b0 += g0 * (vload<C, L>(x + i) - cm);
      b1 += g1 * (vload<C, L>(x + i + L) - cm);
    }
    for (; i + L <= e; i += L) {
      const V g = vload<C, L>(dy + i);
      a0 += g;
      b0 += g * (vload<C, L>(x + i) - cm);
    }
    C t1 = hsum<C, L>(a0 + a1);
    C t2 = hsum<C, L>(b0 + b1);
    for (; i < e; ++i) {
      t1 += dy[i];
      t2 += dy[i] * (x[i] - cm);
    }
    sdy += static_cast<double>(t1);
    sdyx += static_cast<double>(t2);
  }
}

// dx = dy · a + (x - cm) · q + b over [0, n).
template <class C, int L>
[[gnu::always_inline]] inline void grad_apply(const C* dy, const C* x, C* dx, std::int64_t n, C cm,
                                              C a, C q, C b, bool stream) noexcept {
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    put<C, L>(dx + i, vload<C, L>(dy + i) * a + (vload<C, L>(x + i) - cm) * q + b, stream);
  }
  for (; i < n; ++i) dx[i] = dy[i] * a + (x[i] - cm) * q + b;
}

// ---- widening of 16-bit rows -----------------------------------------------------------------

// A row of T as C: the row itself for f32 and f64, widened into `scratch` for 16-bit types.
template <class T>
[[gnu::always_inline]] inline const compute_t<T>* as_c(const T* p, std::int64_t n,
                                                       compute_t<T>* scratch) noexcept {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    (void)n;
    (void)scratch;
    return p;
  } else {
    for (std::int64_t i = 0; i < n; ++i) scratch[i] = load(p[i]);
    return scratch;
  }
}

// Where to compute a row of T that goes to `p`: p itself, or `scratch` (then narrowed).
template <class T>
[[gnu::always_inline]] inline compute_t<T>* out_c(T* p, compute_t<T>* scratch) noexcept {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    (void)scratch;
    return p;
  } else {
    return scratch;
  }
}

template <class T>
[[gnu::always_inline]] inline void narrow(const compute_t<T>* c, T* p, std::int64_t n) noexcept {
  if constexpr (!std::is_same_v<T, compute_t<T>>) {
    for (std::int64_t i = 0; i < n; ++i) p[i] = store<T>(c[i]);
  }
}

// Scratch rows for 16-bit types (none for f32 and f64).
template <class T>
std::vector<compute_t<T>> scratch_for(std::int64_t n, int rows) {
  return std::vector<compute_t<T>>(
      std::is_same_v<T, compute_t<T>> ? 0 : static_cast<std::size_t>(n * rows));
}

// ---- channel planes (inner > 1) ----------------------------------------------------------------

// (count, mean, m2) of channel c.
template <class T, int L>
[[gnu::always_inline]] inline moments plane_moments(const pass_args<T>& p, std::int64_t c,
                                                    compute_t<T>* scratch) {
  using C = compute_t<T>;
  const std::int64_t inner = p.g.inner;
  moments m;
  for (std::int64_t o = 0; o < p.g.outer; ++o) {
    const C* row = as_c(p.x + (o * p.g.channels + c) * inner, inner, scratch);
    const C rm = static_cast<C>(sum_of<C, L>(row, inner) / static_cast<double>(inner));
    double d1 = 0;
    double d2 = 0;
    deviations<C, L>(row, inner, rm, d1, d2);
    const double n = static_cast<double>(inner);
    m.merge(n, static_cast<double>(rm) + d1 / n, std::max(0.0, d2 - d1 * d1 / n));
  }
  return m;
}

template <class T, int L>
[[gnu::always_inline]] inline void plane_normalize(const pass_args<T>& p, std::int64_t c,
                                                   compute_t<T>* scratch) {
  using C = compute_t<T>;
  const std::int64_t inner = p.g.inner;
  const auto i = static_cast<std::size_t>(c);
  const channel_coeffs<C>& k = *p.k;
  for (std::int64_t o = 0; o < p.g.outer; ++o) {
    const std::int64_t at = (o * p.g.channels + c) * inner;
    C* dst = out_c(p.out + at, scratch + inner);
    affine_centred<C, L>(as_c(p.x + at, inner, scratch), dst, inner, k.cm[i], k.a[i], k.b[i],
                         p.stream);
    narrow<T>(dst, p.out + at, inner);
  }
}

template <class T, int L>
[[gnu::always_inline]] inline void plane_grad_sums(const pass_args<T>& p, std::int64_t c,
                                                   compute_t<T>* scratch, double& sdy,
                                                   double& sdyx) {
  using C = compute_t<T>;
  const std::int64_t inner = p.g.inner;
  const auto i = static_cast<std::size_t>(c);
  sdy = 0;
  sdyx = 0;
  for (std::int64_t o = 0; o < p.g.outer; ++o) {
    const std::int64_t at = (o * p.g.channels + c) * inner;
    double a = 0;
    double b = 0;
    grad_sums<C, L>(as_c(p.dy + at, inner, scratch), as_c(p.x + at, inner, scratch + inner),
                    inner, p.k->cm[i], a, b);
    sdy += a;
    sdyx += b;
  }
  sdyx -= p.k->delta[i] * sdy;  // Σ dy (x - mean) = Σ dy (x - cm) - delta Σ dy
}

template <class T, int L>
[[gnu::always_inline]] inline void plane_grad_apply(const pass_args<T>& p, std::int64_t c,
                                                    compute_t<T>* scratch) {
  using C = compute_t<T>;
  const std::int64_t inner = p.g.inner;
  const auto i = static_cast<std::size_t>(c);
  const channel_coeffs<C>& k = *p.k;
  for (std::int64_t o = 0; o < p.g.outer; ++o) {
    const std::int64_t at = (o * p.g.channels + c) * inner;
    C* dst = out_c(p.out + at, scratch + 2 * inner);
    grad_apply<C, L>(as_c(p.dy + at, inner, scratch), as_c(p.x + at, inner, scratch + inner), dst,
                     inner, k.cm[i], k.a[i], k.q[i], k.b[i], p.stream);
    narrow<T>(dst, p.out + at, inner);
  }
}

// ---- rows (inner == 1) -----------------------------------------------------------------------
//
// x is [rows, C]. A block of rows is worked in tiles of W = K·L channels: for each tile, the
// rows of the block one after another, with the tile's per-channel values (accumulators or
// coefficients) in registers, so that each element costs one load (and one store); the
// block (about 32 KiB) stays in L1/L2 while its tiles pass over it. Channels past the last
// whole tile go one at a time.

constexpr int tile_vectors = 2;  // K

// Rows a per-channel sum takes before it is carried in double.
constexpr std::int64_t flush_rows = 32;

// K vectors of C from W values of T at p.
template <class T, int L, int K>
[[gnu::always_inline]] inline void load_tile(const T* p, vec<compute_t<T>, L> (&v)[K]) noexcept {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, C>) {
    for (int k = 0; k < K; ++k) v[k] = vload<C, L>(p + k * L);
  } else {
    C t[K * L];
    for (int i = 0; i < K * L; ++i) t[i] = load(p[i]);
    for (int k = 0; k < K; ++k) v[k] = vload<C, L>(t + k * L);
  }
}

template <class T, int L, int K>
[[gnu::always_inline]] inline void store_tile(T* p, const vec<compute_t<T>, L> (&v)[K],
                                              bool stream) noexcept {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, C>) {
    for (int k = 0; k < K; ++k) put<C, L>(p + k * L, v[k], stream);
  } else {
    (void)stream;
    C t[K * L];
    for (int k = 0; k < K; ++k) vstore<C, L>(t + k * L, v[k]);
    for (int i = 0; i < K * L; ++i) p[i] = store<T>(t[i]);
  }
}

// Adds v's lanes to acc[0, W) and clears v.
template <class C, int L, int K>
[[gnu::always_inline]] inline void carry(double* acc, vec<C, L> (&v)[K]) noexcept {
  for (int k = 0; k < K; ++k) {
    C t[L];
    std::memcpy(t, &v[k], sizeof t);
    for (int l = 0; l < L; ++l) acc[k * L + l] += static_cast<double>(t[l]);
    v[k] = vec<C, L>{};
  }
}

// The rows of block b.
template <class T>
std::pair<std::int64_t, std::int64_t> block_range(const pass_args<T>& p, std::int64_t b) {
  const std::int64_t r0 = b * p.block_rows;
  return {r0, std::min(p.g.outer, r0 + p.block_rows)};
}

// Block b's per-channel mean and m2 into s1/s2 [b, C]: one pass, deviations from a shift
// (the block's first row, a value of each channel: nothing cancels unless a channel's spread
// is far below its distance from that value), m2 corrected for the shift's distance from the
// mean (Σd² - (Σd)²/n).
template <class T, int L>
[[gnu::always_inline]] inline void block_moments(const pass_args<T>& p, std::int64_t b) {
  using C = compute_t<T>;
  using V = vec<C, L>;
  constexpr int K = tile_vectors;
  constexpr int W = K * L;
  const std::int64_t ch = p.g.channels;
  const auto [r0, r1] = block_range(p, b);
  const double inv_n = 1.0 / static_cast<double>(r1 - r0);
  const auto finish = [&](std::int64_t c, C shift, double d1, double d2) {
    p.s1[b * ch + c] = static_cast<double>(shift) + d1 * inv_n;
    p.s2[b * ch + c] = std::max(0.0, d2 - d1 * d1 * inv_n);
  };
  std::int64_t c0 = 0;
  for (; c0 + W <= ch; c0 += W) {
    V shift[K];
    load_tile<T, L, K>(p.x + r0 * ch + c0, shift);
    V s[K] = {};
    V q[K] = {};
    double ts[W] = {};
    double tq[W] = {};
    for (std::int64_t r = r0; r < r1; ++r) {
      V v[K];
      load_tile<T, L, K>(p.x + r * ch + c0, v);
      for (int k = 0; k < K; ++k) {
        const V u = v[k] - shift[k];
        s[k] += u;
        q[k] += u * u;
      }
      if ((r - r0) % flush_rows == flush_rows - 1) {
        carry<C, L, K>(ts, s);
        carry<C, L, K>(tq, q);
      }
    }
    carry<C, L, K>(ts, s);
    carry<C, L, K>(tq, q);
    C sh[W];
    for (int k = 0; k < K; ++k) vstore<C, L>(sh + k * L, shift[k]);
    for (int i = 0; i < W; ++i) finish(c0 + i, sh[i], ts[i], tq[i]);
  }
  for (; c0 < ch; ++c0) {
    const C shift = load(p.x[r0 * ch + c0]);
    C s = 0;
    C q = 0;
    double ts = 0;
    double tq = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      const C u = load(p.x[r * ch + c0]) - shift;
      s += u;
      q += u * u;
      if ((r - r0) % flush_rows == flush_rows - 1) {
        ts += static_cast<double>(s);
        tq += static_cast<double>(q);
        s = q = 0;
      }
    }
    finish(c0, shift, ts + static_cast<double>(s), tq + static_cast<double>(q));
  }
}

// Block b: out = (x - cm) · a + b per channel.
template <class T, int L>
[[gnu::always_inline]] inline void block_normalize(const pass_args<T>& p, std::int64_t b) {
  using C = compute_t<T>;
  using V = vec<C, L>;
  constexpr int K = tile_vectors;
  constexpr int W = K * L;
  const std::int64_t ch = p.g.channels;
  const auto [r0, r1] = block_range(p, b);
  const channel_coeffs<C>& k = *p.k;
  std::int64_t c0 = 0;
  for (; c0 + W <= ch; c0 += W) {
    V cm[K], a[K], bb[K];
    for (int j = 0; j < K; ++j) {
      cm[j] = vload<C, L>(k.cm.data() + c0 + j * L);
      a[j] = vload<C, L>(k.a.data() + c0 + j * L);
      bb[j] = vload<C, L>(k.b.data() + c0 + j * L);
    }
    for (std::int64_t r = r0; r < r1; ++r) {
      V v[K];
      load_tile<T, L, K>(p.x + r * ch + c0, v);
      for (int j = 0; j < K; ++j) v[j] = (v[j] - cm[j]) * a[j] + bb[j];
      store_tile<T, L, K>(p.out + r * ch + c0, v, p.stream);
    }
  }
  for (; c0 < ch; ++c0) {
    const auto i = static_cast<std::size_t>(c0);
    for (std::int64_t r = r0; r < r1; ++r) {
      p.out[r * ch + c0] = store<T>((load(p.x[r * ch + c0]) - k.cm[i]) * k.a[i] + k.b[i]);
    }
  }
}

// Block b's per-channel Σ dy and Σ dy (x - mean) into s1/s2 [b, C].
template <class T, int L>
[[gnu::always_inline]] inline void block_grad_sums(const pass_args<T>& p, std::int64_t b) {
  using C = compute_t<T>;
  using V = vec<C, L>;
  constexpr int K = tile_vectors;
  constexpr int W = K * L;
  const std::int64_t ch = p.g.channels;
  const auto [r0, r1] = block_range(p, b);
  const channel_coeffs<C>& k = *p.k;
  const auto finish = [&](std::int64_t c, double sdy, double sdyx) {
    p.s1[b * ch + c] = sdy;
    p.s2[b * ch + c] = sdyx - k.delta[static_cast<std::size_t>(c)] * sdy;
  };
  std::int64_t c0 = 0;
  for (; c0 + W <= ch; c0 += W) {
    V cm[K];
    for (int j = 0; j < K; ++j) cm[j] = vload<C, L>(k.cm.data() + c0 + j * L);
    V s[K] = {};
    V q[K] = {};
    double ts[W] = {};
    double tq[W] = {};
    for (std::int64_t r = r0; r < r1; ++r) {
      V g[K];
      V v[K];
      load_tile<T, L, K>(p.dy + r * ch + c0, g);
      load_tile<T, L, K>(p.x + r * ch + c0, v);
      for (int j = 0; j < K; ++j) {
        s[j] += g[j];
        q[j] += g[j] * (v[j] - cm[j]);
      }
      if ((r - r0) % flush_rows == flush_rows - 1) {
        carry<C, L, K>(ts, s);
        carry<C, L, K>(tq, q);
      }
    }
    carry<C, L, K>(ts, s);
    carry<C, L, K>(tq, q);
    for (int i = 0; i < W; ++i) finish(c0 + i, ts[i], tq[i]);
  }
  for (; c0 < ch; ++c0) {
    const C cm = k.cm[static_cast<std::size_t>(c0)];
    C s = 0;
    C q = 0;
    double ts = 0;
    double tq = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      const C g = load(p.dy[r * ch + c0]);
      s += g;
      q += g * (load(p.x[r * ch + c0]) - cm);
      if ((r - r0) % flush_rows == flush_rows - 1) {
        ts += static_cast<double>(s);
        tq += static_cast<double>(q);
        s = q = 0;
      }
    }
    finish(c0, ts + static_cast<double>(s), tq + static_cast<double>(q));
  }
}

// Block b: dx = dy · a + (x - cm) · q + b per channel.
template <class T, int L>
[[gnu::always_inline]] inline void block_grad_apply(const pass_args<T>& p, std::int64_t b) {
  using C = compute_t<T>;
  using V = vec<C, L>;
  constexpr int K = tile_vectors;
  constexpr int W = K * L;
  const std::int64_t ch = p.g.channels;
  const auto [r0, r1] = block_range(p, b);
  const channel_coeffs<C>& k = *p.k;
  std::int64_t c0 = 0;
  for (; c0 + W <= ch; c0 += W) {
    V cm[K], a[K], q[K], bb[K];
    for (int j = 0; j < K; ++j) {
      cm[j] = vload<C, L>(k.cm.data() + c0 + j * L);
      a[j] = vload<C, L>(k.a.data() + c0 + j * L);
      q[j] = vload<C, L>(k.q.data() + c0 + j * L);
      bb[j] = vload<C, L>(k.b.data() + c0 + j * L);
    }
    for (std::int64_t r = r0; r < r1; ++r) {
      V g[K];
      V v[K];
      load_tile<T, L, K>(p.dy + r * ch + c0, g);
      load_tile<T, L, K>(p.x + r * ch + c0, v);
      for (int j = 0; j < K; ++j) v[j] = g[j] * a[j] + (v[j] - cm[j]) * q[j] + bb[j];
      store_tile<T, L, K>(p.out + r * ch + c0, v, p.stream);
    }
  }
  for (; c0 < ch; ++c0) {
    const auto i = static_cast<std::size_t>(c0);
    for (std::int64_t r = r0; r < r1; ++r) {
      const C g = load(p.dy[r * ch + c0]);
      p.out[r * ch + c0] =
          store<T>(g * k.a[i] + (load(p.x[r * ch + c0]) - k.cm[i]) * k.q[i] + k.b[i]);
    }
  }
}

// ---- tasks -------------------------------------------------------------------------------------

// What a task does over [lo, hi) (channels for the plane tasks, blocks or rows for the rest).
enum class task : std::uint8_t {
  plane_moments,     // s1/s2 [c] = mean, m2
  plane_forward,     // moments, then (coefficients by the callback) normalise
  plane_normalize,   // normalise with k
  plane_grad_sums,   // s1/s2 [c] = Σdy, Σ dy (x - mean)
  plane_backward,    // sums, then (coefficients by the callback) dx
  plane_grad_apply,  // dx with k
  block_moments,     // s1/s2 [block, c] = mean, m2
  block_normalize,
  block_grad_sums,   // s1/s2 [block, c] = Σdy, Σ dy (x - mean)
  block_grad_apply,
};

// Between the two halves of a fused plane task: turns channel c's statistics (s1, s2) into
// its coefficients (in the channel_coeffs the args point at).
using plane_hook = void (*)(const void* self, std::int64_t c);

template <class T>
struct task_args {
  pass_args<T> p;
  plane_hook hook = nullptr;
  const void* self = nullptr;
};

// Makes f(c) (which must outlive the tasks) the hook of `a`.
template <class T, class F>
void set_hook(task_args<T>& a, const F& f) {
  a.self = &f;
  a.hook = [](const void* self, std::int64_t c) { (*static_cast<const F*>(self))(c); };
}

template <class T, int L>
[[gnu::always_inline]] inline void run_task(task t, const task_args<T>& a, std::int64_t lo,
                                            std::int64_t hi) {
  const pass_args<T>& p = a.p;
  const std::int64_t width = p.g.inner > 1 ? p.g.inner : p.g.channels;
  std::vector<compute_t<T>> scratch = scratch_for<T>(p.g.inner > 1 ? width : 0, 3);
  compute_t<T>* s = scratch.data();
  for (std::int64_t i = lo; i < hi; ++i) {
    switch (t) {
      case task::plane_moments:
      case task::plane_forward: {
        const moments m = plane_moments<T, L>(p, i, s);
        p.s1[i] = m.mean;
        p.s2[i] = m.m2;
        if (t == task::plane_forward) {
          a.hook(a.self, i);
          plane_normalize<T, L>(p, i, s);
        }
        break;
      }
      case task::plane_normalize:
        plane_normalize<T, L>(p, i, s);
        break;
      case task::plane_grad_sums:
      case task::plane_backward:
        plane_grad_sums<T, L>(p, i, s, p.s1[i], p.s2[i]);
        if (t == task::plane_backward) {
          a.hook(a.self, i);
          plane_grad_apply<T, L>(p, i, s);
        }
        break;
      case task::plane_grad_apply:
        plane_grad_apply<T, L>(p, i, s);
        break;
      case task::block_moments:
        block_moments<T, L>(p, i);
        break;
      case task::block_normalize:
        block_normalize<T, L>(p, i);
        break;
      case task::block_grad_sums:
        block_grad_sums<T, L>(p, i);
        break;
      case task::block_grad_apply:
        block_grad_apply<T, L>(p, i);
        break;
    }
  }
  if (p.stream) stream_fence();
}

template <class T>
LOOM_ISA_BASELINE void run_baseline(task t, const task_args<T>& a, std::int64_t lo,
                                    std::int64_t hi) {
  run_task<T, static_cast<int>(16 / sizeof(compute_t<T>))>(t, a, lo, hi);
}
#if LOOM_ISA_HAS_AVX2
template <class T>
LOOM_ISA_AVX2 void run_avx2(task t, const task_args<T>& a, std::int64_t lo, std::int64_t hi) {
  run_task<T, static_cast<int>(32 / sizeof(compute_t<T>))>(t, a, lo, hi);
}
#endif
#if LOOM_ISA_HAS_AVX512
template <class T>
LOOM_ISA_AVX512 void run_avx512(task t, const task_args<T>& a, std::int64_t lo,
                                std::int64_t hi) {
  run_task<T, static_cast<int>(64 / sizeof(compute_t<T>))>(t, a, lo, hi);
}
#endif

// Runs task t over [0, n) on the device's threads, in the widest instruction set built.
template <class T>
void run_parallel(kernel_context& ctx, task t, const task_args<T>& a, std::int64_t n,
                  double cost_per_item) {
  const isa_cap isa = widest_cpu_isa();
  ctx.parallel_for(n, cost_per_item, [&](std::int64_t lo, std::int64_t hi) {
#if LOOM_ISA_HAS_AVX512
    if (isa == isa_cap::avx512) return run_avx512<T>(t, a, lo, hi);
#endif
#if LOOM_ISA_HAS_AVX2
    if (isa != isa_cap::baseline) return run_avx2<T>(t, a, lo, hi);
#endif
    (void)isa;
    run_baseline<T>(t, a, lo, hi);
  });
}

// ---- per-channel vectors of any float dtype ---------------------------------------------------

std::vector<double> read_vector(const tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.num_elements()));
  visit_dtype(t.type(), [&](auto tag) {
    using V = decltype(tag);
    if constexpr (float_type_v<V>) {
      const V* p = t.data<V>();
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(load(p[i]));
    }
  });
  return v;
}

void write_vector(tensor& t, const std::vector<double>& v) {
  visit_dtype(t.type(), [&](auto tag) {
    using V = decltype(tag);
    if constexpr (float_type_v<V>) {
      V* p = t.data<V>();
      for (std::size_t i = 0; i < v.size(); ++i) p[i] = store<V>(v[i]);
    }
  });
}

// ---- the statistics and gradient sums of a whole x ------------------------------------------

// The batch's per-channel mean and m2 (s1, s2 of `a`), and (fused, planes only) the
// normalising pass with coefficients the hook computes from them.
template <class T>
void channel_moments(kernel_context& ctx, task_args<T>& a, std::vector<double>& mean,
                     std::vector<double>& m2, bool fused) {
  const rules::batch_norm_geometry& g = a.p.g;
  const auto n = static_cast<std::size_t>(g.channels);
  mean.assign(n, 0.0);
  m2.assign(n, 0.0);
  const double per_channel = static_cast<double>(g.count());
  if (g.inner > 1) {
    a.p.s1 = mean.data();
    a.p.s2 = m2.data();
    run_parallel<T>(ctx, fused ? task::plane_forward : task::plane_moments, a, g.channels,
                    (fused ? 5.0 : 2.5) * per_channel);
    return;
  }
  a.p.block_rows = block_rows_for(g.channels, sizeof(compute_t<T>));
  const std::int64_t blocks = (g.outer + a.p.block_rows - 1) / a.p.block_rows;
  tensor part = ctx.allocate_temp(dtype::f64, shape{2, blocks, g.channels});
  a.p.s1 = part.data<double>();
  a.p.s2 = a.p.s1 + blocks * g.channels;
  run_parallel<T>(ctx, task::block_moments, a, blocks,
                  3.0 * static_cast<double>(a.p.block_rows * g.channels));
  // The blocks merged in block order (moments::merge; the weights are the same for every
  // channel, so a block merges as a vector over the channels).
  double merged = 0;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const auto nb = static_cast<double>(std::min(a.p.block_rows, g.outer - b * a.p.block_rows));
    const double total = merged + nb;
    const double f = nb / total;
    const double h = merged * nb / total;
    const double* mb = a.p.s1 + b * g.channels;
    const double* qb = a.p.s2 + b * g.channels;
    for (std::size_t c = 0; c < mean.size(); ++c) {
      const double d = mb[c] - mean[c];
      mean[c] += d * f;
      m2[c] += qb[c] + d * d * h;
    }
    merged = total;
  }
}

// The batch's per-channel Σdy and Σ dy (x - mean) (k's means set), and (fused, planes
// only) the dx pass with the coefficients the hook computes from them.
template <class T>
void channel_grad_sums(kernel_context& ctx, task_args<T>& a, std::vector<double>& sdy,
                       std::vector<double>& sdyx, bool fused) {
  const rules::batch_norm_geometry& g = a.p.g;
  sdy.assign(static_cast<std::size_t>(g.channels), 0.0);
  sdyx.assign(sdy.size(), 0.0);
  const double per_channel = static_cast<double>(g.count());
  if (g.inner > 1) {
    a.p.s1 = sdy.data();
    a.p.s2 = sdyx.data();
    run_parallel<T>(ctx, fused ? task::plane_backward : task::plane_grad_sums, a, g.channels,
                    (fused ? 6.0 : 3.0) * per_channel);
    return;
  }
  a.p.block_rows = block_rows_for(g.channels, 2 * sizeof(compute_t<T>));
  const std::int64_t blocks = (g.outer + a.p.block_rows - 1) / a.p.block_rows;
  tensor part = ctx.allocate_temp(dtype::f64, shape{2, blocks, g.channels});
  a.p.s1 = part.data<double>();
  a.p.s2 = a.p.s1 + blocks * g.channels;
  run_parallel<T>(ctx, task::block_grad_sums, a, blocks,
                  3.0 * static_cast<double>(a.p.block_rows * g.channels));
  for (std::int64_t b = 0; b < blocks; ++b) {
    for (std::int64_t c = 0; c < g.channels; ++c) {
      sdy[static_cast<std::size_t>(c)] += a.p.s1[b * g.channels + c];
      sdyx[static_cast<std::size_t>(c)] += a.p.s2[b * g.channels + c];
    }
  }
}

// The normalising (or dx) pass over all of x, unfused.
template <class T>
void second_pass(kernel_context& ctx, task_args<T>& a, bool backward) {
  const rules::batch_norm_geometry& g = a.p.g;
  if (g.inner > 1) {
    run_parallel<T>(ctx, backward ? task::plane_grad_apply : task::plane_normalize, a,
                    g.channels, 2.0 * static_cast<double>(g.count()));
    return;
  }
  a.p.block_rows = block_rows_for(g.channels, (backward ? 3 : 2) * sizeof(compute_t<T>));
  const std::int64_t blocks = (g.outer + a.p.block_rows - 1) / a.p.block_rows;
  run_parallel<T>(ctx, backward ? task::block_grad_apply : task::block_normalize, a, blocks,
                  2.0 * static_cast<double>(a.p.block_rows * g.channels));
}

// ---- kernels ------------------------------------------------------------------------------------

// Streaming stores for `out` of x's geometry (Note [batch norm streaming stores]).
template <class T>
bool stream_out(const T* out, const T* in, const rules::batch_norm_geometry& g) {
  const auto row = static_cast<std::int64_t>(sizeof(T)) * (g.inner > 1 ? g.inner : g.channels);
  return should_stream(out, in, static_cast<std::int64_t>(sizeof(T)) * g.count() * g.channels,
                       row);
}

rules::batch_norm_geometry geometry_of(const kernel_context& ctx, std::size_t x_input,
                                       const std::array<const shape*, 4>& params,
                                       const std::array<const char*, 4>& names,
                                       const std::string& format) {
  return common::apply_rule(ctx, [&] {
    const shape& x = ctx.input(x_input).shape();
    return rules::batch_norm_geometry_of(x, params, rules::batch_norm_channel_axis(format, x.rank()),
                                         names);
  });
}

// The forward ops: batch_norm_train (statistics of this batch) and sync_batch_norm (merged
// from every rank's packed statistics, input 5).
class forward_kernel final : public op_kernel {
 public:
  explicit forward_kernel(const kernel_construction& c)
      : op_kernel(c),
        eps_(c.attr<double>("epsilon")),
        momentum_(c.attr<double>("momentum")),
        format_(c.attr<std::string>("data_format")),
        sync_(c.node().op() == "sync_batch_norm"),
        running_mean_(c, 3),
        running_var_(c, 4) {}

  void compute(kernel_context& ctx) override {
    const auto g = geometry_of(
        ctx, 0,
        {&ctx.input(1).shape(), &ctx.input(2).shape(), &ctx.input(3).shape(),
         &ctx.input(4).shape()},
        {"scale", "bias", "running_mean", "running_var"}, format_);
    visit_dtype(ctx.input(0).type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        compute_typed<T>(ctx, g);
      } else {
        ctx.fail("{} has no kernel for {}", ctx.node().op(), to_string(ctx.input(0).type()));
      }
    });
  }

 private:
  template <class T>
  void compute_typed(kernel_context& ctx, const rules::batch_norm_geometry& g) {
    using C = compute_t<T>;
    tensor hold_x;
    const tensor& x = common::dense_input(ctx, 0, hold_x);
    const std::vector<double> scale = read_vector(ctx.input_contiguous(1));
    const std::vector<double> bias = read_vector(ctx.input_contiguous(2));
    const std::int64_t ch = g.channels;
    tensor& y = ctx.forward_input_or_allocate_output(0, 0, x.shape());
    const dtype st = x.type() == dtype::f64 ? dtype::f64 : dtype::f32;
    tensor& mean_out = ctx.allocate_output(1, st, shape{ch});
    tensor& invstd_out = ctx.allocate_output(2, st, shape{ch});

    channel_coeffs<C> k(ch);
    task_args<T> a;
    a.p.x = x.data<T>();
    a.p.out = y.data<T>();
    a.p.g = g;
    a.p.k = &k;
    a.p.stream = stream_out(a.p.out, a.p.x, g);
    std::vector<double> mean;
    std::vector<double> m2;
    double count = static_cast<double>(g.count());
    std::vector<double> invstd(static_cast<std::size_t>(ch));
    // Channel c's coefficients from its mean and m2 (over `count` values).
    const auto coefficients = [&](std::int64_t c) {
      const auto i = static_cast<std::size_t>(c);
      invstd[i] = 1.0 / std::sqrt(m2[i] / count + eps_);
      k.set_mean(c, mean[i]);
      const double ai = scale[i] * invstd[i];
      k.a[i] = static_cast<C>(ai);
      k.b[i] = static_cast<C>(bias[i] - k.delta[i] * ai);
    };
    if (sync_) {
      merge_gathered(ctx, ch, count, mean, m2);
      check_count(ctx, count);
      if (g.count() > 0) {
        for (std::int64_t c = 0; c < ch; ++c) coefficients(c);
        second_pass<T>(ctx, a, false);
      }
    } else {
      check_count(ctx, count);
      const bool fused = g.inner > 1;
      set_hook(a, coefficients);
      channel_moments<T>(ctx, a, mean, m2, fused);
      if (!fused) {
        for (std::int64_t c = 0; c < ch; ++c) coefficients(c);
        second_pass<T>(ctx, a, false);
      }
    }
    write_vector(mean_out, mean);
    write_vector(invstd_out, invstd);
    update_running(ctx, mean, m2, count);
  }

  // A batch statistic of fewer than 2 values has no unbiased variance (PyTorch refuses it too).
  void check_count(kernel_context& ctx, double count) const {
    if (count < 2) {
      ctx.fail("{} needs more than 1 value per channel in training, got {}{}", ctx.node().op(),
               count, sync_ ? " over all ranks" : fmt::format(" (x is {})", to_string(ctx.input(0).shape())));
    }
  }

  // The ranks' packed (count, mean, m2) rows (input 5), merged in rank order.
  void merge_gathered(kernel_context& ctx, std::int64_t ch, double& count,
                      std::vector<double>& mean, std::vector<double>& m2) const {
    const tensor gathered = ctx.input_contiguous(5);
    common::apply_rule(ctx, [&] {
      rules::check_batch_norm_packed(gathered.shape(), ch, true, "the gathered statistics");
    });
    const std::vector<double> rows = read_vector(gathered);
    const std::int64_t ranks = gathered.shape()[0];
    const std::int64_t w = 2 * ch + 1;
    mean.assign(static_cast<std::size_t>(ch), 0.0);
    m2.assign(mean.size(), 0.0);
    count = 0;
    for (std::int64_t r = 0; r < ranks; ++r) {
      const double n = rows[static_cast<std::size_t>(r * w)];
      if (!(n >= 0) || n != std::floor(n)) {
        ctx.fail("the gathered statistics of rank {} hold a count of {}", r, n);
      }
      count += n;
    }
    for (std::int64_t c = 0; c < ch; ++c) {
      moments m;
      for (std::int64_t r = 0; r < ranks; ++r) {
        const double* row = rows.data() + r * w;
        m.merge(row[0], row[1 + c], row[1 + ch + c]);
      }
      mean[static_cast<std::size_t>(c)] = m.mean;
      m2[static_cast<std::size_t>(c)] = m.m2;
    }
  }

  // running = (1 - momentum) running + momentum · batch statistic; the variance unbiased.
  void update_running(kernel_context& ctx, const std::vector<double>& mean,
                      const std::vector<double>& m2, double count) {
    const double unbias = count / (count - 1);
    auto update = [&](const common::update_target& target, std::size_t input, auto&& value) {
      auto& var = ctx.variables().get(target.name);
      const std::lock_guard lock(var.mutex);
      target.check(ctx, var, ctx.input(input), true);
      tensor& v = common::writable_value(ctx, var, input);
      std::vector<double> r = read_vector(v);
      for (std::size_t i = 0; i < r.size(); ++i) {
        r[i] = (1 - momentum_) * r[i] + momentum_ * value(i);
      }
      write_vector(v, r);
    };
    update(running_mean_, 3, [&](std::size_t i) { return mean[i]; });
    update(running_var_, 4, [&](std::size_t i) { return m2[i] / count * unbias; });
  }

  double eps_;
  double momentum_;
  std::string format_;
  bool sync_;
  common::update_target running_mean_;
  common::update_target running_var_;
};

// batch_norm_stats: this rank's packed (count, mean, m2).
class stats_kernel final : public op_kernel {
 public:
  explicit stats_kernel(const kernel_construction& c)
      : op_kernel(c), format_(c.attr<std::string>("data_format")) {}

  void compute(kernel_context& ctx) override {
    const auto g = geometry_of(ctx, 0, {}, rules::batch_norm_param_names, format_);
    const dtype st = ctx.input(0).type() == dtype::f64 ? dtype::f64 : dtype::f32;
    tensor& out = ctx.allocate_output(0, st, shape{1, 2 * g.channels + 1});
    std::vector<double> packed(static_cast<std::size_t>(2 * g.channels + 1), 0.0);
    packed[0] = static_cast<double>(g.count());
    if (g.count() > 0) {
      visit_dtype(ctx.input(0).type(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (float_type_v<T>) {
          tensor hold;
          task_args<T> a;
          a.p.x = common::dense_input(ctx, 0, hold).template data<T>();
          a.p.g = g;
          std::vector<double> mean;
          std::vector<double> m2;
          channel_moments<T>(ctx, a, mean, m2, false);
          std::copy(mean.begin(), mean.end(), packed.begin() + 1);
          std::copy(m2.begin(), m2.end(), packed.begin() + 1 + g.channels);
        } else {
          ctx.fail("batch_norm_stats has no kernel for {}", to_string(ctx.input(0).type()));
        }
      });
    }
    write_vector(out, packed);
  }

 private:
  std::string format_;
};

// The backward ops, all reading (dy, x, scale, mean, invstd): batch_norm_train_grad (dx,
// dscale, dbias), batch_norm_grad_reduce (the packed sums, dscale, dbias) and
// batch_norm_grad_elemt (dx from the packed sums of every rank, input 5).
class backward_kernel final : public op_kernel {
 public:
  enum class part : std::uint8_t { whole, reduce, elemt };

  explicit backward_kernel(const kernel_construction& c)
      : op_kernel(c),
        format_(c.attr<std::string>("data_format")),
        part_(c.node().op() == "batch_norm_grad_reduce"  ? part::reduce
              : c.node().op() == "batch_norm_grad_elemt" ? part::elemt
                                                             : part::whole) {}

  void compute(kernel_context& ctx) override {
    const auto g = geometry_of(
        ctx, 1, {&ctx.input(2).shape(), &ctx.input(3).shape(), &ctx.input(4).shape(), nullptr},
        {"scale", "mean", "invstd", ""}, format_);
    common::apply_rule(ctx, [&] { rules::check_batch_norm_dy(ctx.input(0).shape(), ctx.input(1).shape()); });
    visit_dtype(ctx.input(1).type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        compute_typed<T>(ctx, g);
      } else {
        ctx.fail("{} has no kernel for {}", ctx.node().op(), to_string(ctx.input(1).type()));
      }
    });
  }

 private:
  template <class T>
  void compute_typed(kernel_context& ctx, const rules::batch_norm_geometry& g) {
    using C = compute_t<T>;
    const std::int64_t ch = g.channels;
    tensor hold_dy;
    tensor hold_x;
    const tensor& dy = common::dense_input(ctx, 0, hold_dy);
    const tensor& x = common::dense_input(ctx, 1, hold_x);
    const std::vector<double> scale = read_vector(ctx.input_contiguous(2));
    const std::vector<double> mean = read_vector(ctx.input_contiguous(3));
    const std::vector<double> invstd = read_vector(ctx.input_contiguous(4));
    channel_coeffs<C> k(ch);
    for (std::int64_t c = 0; c < ch; ++c) k.set_mean(c, mean[static_cast<std::size_t>(c)]);
    task_args<T> a;
    a.p.x = x.data<T>();
    a.p.dy = dy.data<T>();
    a.p.g = g;
    a.p.k = &k;

    std::vector<double> sdy;
    std::vector<double> sdyx;
    double count = static_cast<double>(g.count());
    // Channel c's dx coefficients from the sums over `count` values.
    const auto coefficients = [&](std::int64_t c) {
      const auto i = static_cast<std::size_t>(c);
      const double ai = scale[i] * invstd[i];
      const double qi = count > 0 ? -ai * invstd[i] * invstd[i] * sdyx[i] / count : 0.0;
      k.a[i] = static_cast<C>(ai);
      k.q[i] = static_cast<C>(qi);
      k.b[i] = static_cast<C>((count > 0 ? -ai * sdy[i] / count : 0.0) - k.delta[i] * qi);
    };
    if (part_ == part::elemt) {
      const tensor sums = ctx.input_contiguous(5);
      common::apply_rule(ctx, [&] { rules::check_batch_norm_packed(sums.shape(), ch, false, "sums"); });
      const std::vector<double> packed = read_vector(sums);
      sdy.assign(packed.begin(), packed.begin() + ch);
      sdyx.assign(packed.begin() + ch, packed.begin() + 2 * ch);
      count = packed[static_cast<std::size_t>(2 * ch)];
      tensor& dx = ctx.forward_input_or_allocate_output(0, 0, x.shape());
      a.p.out = dx.data<T>();
      a.p.stream = stream_out(a.p.out, a.p.dy, g);
      if (g.count() == 0) return;
      for (std::int64_t c = 0; c < ch; ++c) coefficients(c);
      second_pass<T>(ctx, a, true);
      return;
    }
    const bool fused = part_ == part::whole && g.inner > 1;
    if (part_ == part::whole) {
      tensor& dx = ctx.forward_input_or_allocate_output(0, 0, x.shape());
      a.p.out = dx.data<T>();
      a.p.stream = stream_out(a.p.out, a.p.dy, g);
    }
    set_hook(a, coefficients);
    if (g.count() > 0) {
      channel_grad_sums<T>(ctx, a, sdy, sdyx, fused);
    } else {
      sdy.assign(static_cast<std::size_t>(ch), 0.0);
      sdyx.assign(sdy.size(), 0.0);
    }
    if (part_ == part::whole && !fused && g.count() > 0) {
      for (std::int64_t c = 0; c < ch; ++c) coefficients(c);
      second_pass<T>(ctx, a, true);
    }
    std::vector<double> dscale(static_cast<std::size_t>(ch));
    for (std::size_t i = 0; i < dscale.size(); ++i) dscale[i] = sdyx[i] * invstd[i];
    const dtype u = ctx.input(2).type();
    write_vector(ctx.allocate_output(1, u, shape{ch}), dscale);
    write_vector(ctx.allocate_output(2, u, shape{ch}), sdy);
    if (part_ == part::reduce) {
      std::vector<double> packed(sdy);
      packed.insert(packed.end(), sdyx.begin(), sdyx.end());
      packed.push_back(count);
      write_vector(ctx.allocate_output(0, mean_type(x), shape{2 * ch + 1}), packed);
    }
  }

  static dtype mean_type(const tensor& x) {
    return x.type() == dtype::f64 ? dtype::f64 : dtype::f32;
  }

  std::string format_;
  part part_;
};

}  // namespace

void register_batch_norm_train_kernels(kernel_registry& r) {
  r.add(make_kernel_def<forward_kernel>("batch_norm_train", cpu));
  r.add(make_kernel_def<forward_kernel>("sync_batch_norm", cpu));
  r.add(make_kernel_def<stats_kernel>("batch_norm_stats", cpu));
  r.add(make_kernel_def<backward_kernel>("batch_norm_train_grad", cpu));
  r.add(make_kernel_def<backward_kernel>("batch_norm_grad_reduce", cpu));
  r.add(make_kernel_def<backward_kernel>("batch_norm_grad_elemt", cpu));
}

}  // namespace loom::cpu
