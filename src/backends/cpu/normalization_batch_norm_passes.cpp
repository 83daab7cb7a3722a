// The passes of the CPU's training batch norm kernels (batch_norm_passes.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "batch_norm_passes.hpp"
#include "cpu_isa.hpp"
#include "kernel/common/batch_norm_train_math.hpp"
#include "row_sums.hpp"

namespace loom::cpu::batch_norm {
namespace {

using reduction::load;
using reduction::store;

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

// Rows of a block in the rows layout: about 32 KiB of values (read twice, from L1/L2), at
// least 8 rows and at most 1024.
std::int64_t block_rows_for(std::int64_t channels, std::size_t value_bytes) {
  const auto row = static_cast<std::int64_t>(value_bytes) * std::max<std::int64_t>(channels, 1);
  return std::clamp<std::int64_t>((std::int64_t{32} << 10) / row, 8, 1024);
}

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

// out = (v - cm) · a + b over [0, n).
template <class C, int L>
[[gnu::always_inline]] inline void affine_centred(const C* v, C* out, std::int64_t n, C cm, C a,
                                                  C b, bool stream) noexcept {
  std::int64_t i = 0;
  for (; i + L <= n; i += L) put<C, L>(out + i, (vload<C, L>(v + i) - cm) * a + b, stream);
  for (; i < n; ++i) out[i] = (v[i] - cm) * a + b;
}

// Σ dy and Σ dy (x - cm) over [0, n), carried in double every `row_block` values.
template <class C, int L>
[[gnu::always_inline]] inline void grad_sums(const C* dy, const C* x, std::int64_t n, C cm,
                                             double& sdy, double& sdyx) noexcept {
  using V = vec<C, L>;
  sdy = 0;
  sdyx = 0;
  for (std::int64_t blk = 0; blk < n; blk += row_block) {
    const std::int64_t e = std::min(n, blk + row_block);
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
    const C rm = static_cast<C>(row_sum<C, L>(row, inner) / static_cast<double>(inner));
    double d1 = 0;
    double d2 = 0;
    centred_sums<C, L>(row, inner, rm, d1, d2);
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

}  // namespace

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
  // The blocks merged in block order.
  common::batch_norm_train::statistics merged{std::move(mean), std::move(m2), 0.0};
  for (std::int64_t b = 0; b < blocks; ++b) {
    const auto nb = static_cast<double>(std::min(a.p.block_rows, g.outer - b * a.p.block_rows));
    common::batch_norm_train::merge(merged, nb, a.p.s1 + b * g.channels,
                                    a.p.s2 + b * g.channels);
  }
  mean = std::move(merged.mean);
  m2 = std::move(merged.m2);
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

// Streaming stores for `out` of x's geometry (Note [batch norm streaming stores]).
template <class T>
bool stream_out(const T* out, const T* in, const rules::batch_norm_geometry& g) {
  const auto row = static_cast<std::int64_t>(sizeof(T)) * (g.inner > 1 ? g.inner : g.channels);
  return should_stream(out, in, static_cast<std::int64_t>(sizeof(T)) * g.count() * g.channels,
                       row);
}

#define LOOM_BATCH_NORM_PASSES(T)                                                           \
  template void channel_moments<T>(kernel_context&, task_args<T>&, std::vector<double>&,   \
                                   std::vector<double>&, bool);                             \
  template void channel_grad_sums<T>(kernel_context&, task_args<T>&, std::vector<double>&, \
                                     std::vector<double>&, bool);                           \
  template void second_pass<T>(kernel_context&, task_args<T>&, bool);                       \
  template bool stream_out<T>(const T*, const T*, const rules::batch_norm_geometry&);
LOOM_BATCH_NORM_PASSES(float)
LOOM_BATCH_NORM_PASSES(double)
LOOM_BATCH_NORM_PASSES(half)
LOOM_BATCH_NORM_PASSES(bfloat16)
#undef LOOM_BATCH_NORM_PASSES

}  // namespace loom::cpu::batch_norm
