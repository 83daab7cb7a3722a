// CPU kernels of reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod, reduce_l1,
// reduce_l2, reduce_sum_square, reduce_log_sum, reduce_log_sum_exp, reduce_any, reduce_all,
// argmax and argmin.
//
// Note [reduction geometry]
// A reduction sees its input (any strides) as two lists of dims: the kept dims, in output
// order, and the reduced dims, ordered by decreasing stride. Dims of size 1 are dropped and
// neighbours that address memory as one dim are merged, so a contiguous [N, M] reduced
// over axis 1 is one kept dim and one reduced dim whatever its original rank. Then:
//  - when the reduced dim with the smallest stride is smaller-strided than the innermost
//    kept dim ("inner" mode: reduce over the contiguous axis), each output reduces runs
//    along that dim with a vectorised loop (Note [blocked summation], Note [extreme with
//    SSE2]), combining runs along the other reduced dims;
//  - otherwise ("outer" mode: reduce over outer axes), each block of up to row_block
//    neighbouring outputs along the innermost kept dim accumulates whole rows, one reduced
//    index at a time, so the inner loop walks memory contiguously and vectorises across
//    outputs. Float sums add the rows in the inner mode's order (Note [sums in any layout]).
// parallel_for shares units of outputs (an output in inner mode, a row block in outer
// mode). With fewer units than threads and much to reduce (a full reduction, or [N, 4]
// over N), the outermost reduced dim is cut into chunks that are reduced in parallel, each
// over every output, and their partial results combined.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <span>
#include <vector>

#include "reduction_common.hpp"
#include "vector_lanes.hpp"

namespace loom::cpu {
namespace {

using namespace reduction;
constexpr device_type cpu = device_type::cpu;

using reduction_rules::reduce_kind;

template <class T>
inline constexpr bool reducible_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, half> ||
    std::is_same_v<T, bfloat16> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;

// Whether kind K has a kernel for T: any and all take bool alone; mean, l2, log_sum and
// log_sum_exp the float types; the others every reducible type.
template <class T, reduce_kind K>
inline constexpr bool supports_v =
    (K == reduce_kind::any || K == reduce_kind::all)
        ? std::is_same_v<T, bool>
        : reducible_v<T> &&
              ((K != reduce_kind::mean && K != reduce_kind::l2 && K != reduce_kind::log_sum &&
                K != reduce_kind::log_sum_exp) ||
               std::is_floating_point_v<compute_t<T>>);

// reduce_log_sum_exp's accumulator: the largest element m so far and Σ exp(x - m), so that
// log Σ exp(x) = m + log s never overflows (the online form of the max-shifted sum).
struct lse_acc {
  double m;
  double s;
};

// Two lse accumulators combined: the smaller's sum rescaled to the larger maximum. A NaN
// wins; an empty side (m = -inf) changes nothing; equal maxima (both +inf included) add.
inline lse_acc lse_combine(lse_acc a, lse_acc b) noexcept {
  if (a.m != a.m || b.m != b.m) return {std::numeric_limits<double>::quiet_NaN(), 1.0};
  if (a.m < b.m) std::swap(a, b);
  if (b.m == -std::numeric_limits<double>::infinity()) return a;
  if (a.m == b.m) return {a.m, a.s + b.s};
  return {a.m, a.s + b.s * std::exp(b.m - a.m)};
}

// How one kind of reduction accumulates T: the accumulator type A, its identity, how one
// element enters it (lift), how two combine, a run along one dim, a row of outputs, and the
// final value.
template <class T, reduce_kind K>
struct reducer {
  using C = compute_t<T>;
  static constexpr bool floating = std::is_floating_point_v<C>;
  // The sums: of x (sum, mean, log_sum), |x| (l1) or x² (l2, sum_square).
  static constexpr bool additive = K == reduce_kind::sum || K == reduce_kind::mean ||
                                   K == reduce_kind::l1 || K == reduce_kind::l2 ||
                                   K == reduce_kind::sum_square || K == reduce_kind::log_sum;
  // Sums of floats in double (Note [blocked summation]); integer sums and products wrap in
  // 64 bits (unsigned, so overflow is defined); max and min in the compute type; log_sum_exp
  // in an lse_acc; any and all in a byte (0 or 1: std::vector<bool> has no data()).
  using A = std::conditional_t<
      K == reduce_kind::log_sum_exp, lse_acc,
      std::conditional_t<K == reduce_kind::any || K == reduce_kind::all, std::uint8_t,
      std::conditional_t<additive, std::conditional_t<floating, double, std::uint64_t>,
                         std::conditional_t<K == reduce_kind::prod,
                                            std::conditional_t<floating, C, std::uint64_t>, C>>>>;

  // What an element adds to a sum: x, |x| or x² (V: the compute or the accumulator type).
  template <class V>
  static V term(V v) noexcept {
    if constexpr (K == reduce_kind::l1) {
      if constexpr (std::is_unsigned_v<V>) {
        return static_cast<std::int64_t>(v) < 0 ? V(0) - v : v;
      } else {
        return v < V(0) ? -v : v;
      }
    } else if constexpr (K == reduce_kind::l2 || K == reduce_kind::sum_square) {
      return v * v;
    } else {
      return v;
    }
  }

  static A identity() noexcept {
    if constexpr (K == reduce_kind::log_sum_exp) {
      return {-std::numeric_limits<double>::infinity(), 0.0};
    } else if constexpr (K == reduce_kind::any) {
      return 0;
    } else if constexpr (K == reduce_kind::all) {
      return 1;
    } else if constexpr (additive) {
      return A(0);
    } else if constexpr (K == reduce_kind::prod) {
      return A(1);
    } else if constexpr (K == reduce_kind::max) {
      return floating ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::lowest();
    } else {
      return floating ? std::numeric_limits<C>::infinity() : std::numeric_limits<C>::max();
    }
  }

  static A lift(T v) noexcept {
    if constexpr (K == reduce_kind::log_sum_exp) {
      return {static_cast<double>(load(v)), 1.0};
    } else if constexpr (K == reduce_kind::any || K == reduce_kind::all) {
      return v ? 1 : 0;
    } else if constexpr (floating) {
      return term(static_cast<A>(load(v)));
    } else if constexpr (K == reduce_kind::max || K == reduce_kind::min) {
      return v;
    } else {
      return term(static_cast<A>(static_cast<std::int64_t>(v)));
    }
  }

  // max/min: a NaN on either side wins (NumPy's maximum/minimum).
  static A combine(A a, A b) noexcept {
    if constexpr (K == reduce_kind::log_sum_exp) {
      return lse_combine(a, b);
    } else if constexpr (K == reduce_kind::any) {
      return a | b;
    } else if constexpr (K == reduce_kind::all) {
      return a & b;
    } else if constexpr (additive) {
      return a + b;
    } else if constexpr (K == reduce_kind::prod) {
      return a * b;
    } else if constexpr (K == reduce_kind::max) {
      if constexpr (floating) {
        return (b > a || b != b) ? b : a;
      } else {
        return b > a ? b : a;
      }
    } else {
      if constexpr (floating) {
        return (b < a || b != b) ? b : a;
      } else {
        return b < a ? b : a;
      }
    }
  }

  // The reduction of n elements p[0], p[s], ... (Unit: s == 1).
  template <bool Unit>
  static A run(const T* p, std::int64_t n, std::int64_t s) noexcept {
    if constexpr (additive && floating) {
      return blocked_sum<C>(n,
                            [p, s](std::int64_t i) { return term(load(p[Unit ? i : i * s])); });
    } else if constexpr (Unit && std::is_same_v<T, C> && floating &&
                         (K == reduce_kind::max || K == reduce_kind::min)) {
      bool nan = false;
      const C m = extreme<K == reduce_kind::max>(p, n, nan);
      return nan ? std::numeric_limits<C>::quiet_NaN() : m;
    } else {
      A r[8];
      for (auto& v : r) v = identity();
      std::int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; ++l) r[l] = combine(r[l], lift(p[Unit ? i + l : (i + l) * s]));
      }
      A t = combine(combine(combine(r[0], r[1]), combine(r[2], r[3])),
                    combine(combine(r[4], r[5]), combine(r[6], r[7])));
      for (; i < n; ++i) t = combine(t, lift(p[Unit ? i : i * s]));
      return t;
    }
  }

  // acc[j] = combine(acc[j], p[j * s]) for j in [0, w).
  template <bool Unit>
  static void add_row(A* __restrict acc, const T* __restrict p, std::int64_t w,
                      std::int64_t s) noexcept {
    for (std::int64_t j = 0; j < w; ++j) acc[j] = combine(acc[j], lift(p[Unit ? j : j * s]));
  }

  // The result as O: T, or float for a float16 / bfloat16 T (reduce_sum's output_type).
  template <class O = T>
  static O finish(A a, std::int64_t count) noexcept {
    if constexpr (K == reduce_kind::mean) {
      if (count == 0) return store<O>(std::numeric_limits<double>::quiet_NaN());
      return store<O>(a / static_cast<double>(count));
    } else if constexpr (K == reduce_kind::l2) {
      return store<O>(std::sqrt(a));
    } else if constexpr (K == reduce_kind::log_sum) {
      return store<O>(std::log(a));
    } else if constexpr (K == reduce_kind::log_sum_exp) {
      return store<O>(a.m + std::log(a.s));
    } else if constexpr (K == reduce_kind::any || K == reduce_kind::all) {
      return a != 0;
    } else if constexpr (!floating && K != reduce_kind::max && K != reduce_kind::min) {
      return static_cast<O>(static_cast<std::int64_t>(a));
    } else {
      return store<O>(a);
    }
  }
};

struct rdim {
  std::int64_t size;
  std::int64_t stride;
};

// See Note [reduction geometry]. `kept` and `red` are never empty: a {1, 0} stands in.
struct geometry {
  std::vector<rdim> kept;
  std::vector<rdim> red;
  std::int64_t num_out = 1;
  std::int64_t num_red = 1;
  bool inner = false;
};

void merge_into(std::vector<rdim>& out, rdim d) {
  if (!out.empty() && out.back().stride == d.stride * d.size) {
    out.back() = {out.back().size * d.size, d.stride};
  } else {
    out.push_back(d);
  }
}

// Sizes must be non-zero (the caller handles empty tensors first).
geometry make_geometry(const tensor& x, const std::vector<char>& reduced) {
  geometry g;
  std::vector<rdim> red;
  for (std::size_t k = 0; k < x.rank(); ++k) {
    const rdim d{x.dim(k), x.strides()[k]};
    (reduced[k] ? g.num_red : g.num_out) *= d.size;
    if (d.size == 1) continue;
    if (reduced[k])
      red.push_back(d);
    else
      merge_into(g.kept, d);
  }
  std::stable_sort(red.begin(), red.end(), [](const rdim& a, const rdim& b) {
    return std::llabs(a.stride) > std::llabs(b.stride);
  });
  for (const rdim& d : red) merge_into(g.red, d);
  if (g.kept.empty()) g.kept.push_back({1, 0});
  if (g.red.empty()) g.red.push_back({1, 0});
  const rdim& k = g.kept.back();
  const rdim& r = g.red.back();
  g.inner = k.size == 1 || (r.size != 1 && std::llabs(r.stride) < std::llabs(k.stride));
  return g;
}

// A multi-index over `dims` (outer to inner) and the memory offset it addresses.
class odometer {
 public:
  explicit odometer(std::span<const rdim> dims) : dims_(dims), idx_(dims.size(), 0) {}
  [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
  // Moves to the linear index `i` (row-major over dims).
  void seek(std::int64_t i) noexcept {
    offset_ = 0;
    for (std::size_t k = dims_.size(); k-- > 0;) {
      idx_[k] = i % dims_[k].size;
      i /= dims_[k].size;
      offset_ += idx_[k] * dims_[k].stride;
    }
  }
  // Moves to the next index, wrapping to 0 after the last.
  void next() noexcept {
    for (std::size_t k = dims_.size(); k-- > 0;) {
      offset_ += dims_[k].stride;
      if (++idx_[k] < dims_[k].size) return;
      offset_ -= dims_[k].stride * dims_[k].size;
      idx_[k] = 0;
    }
  }

 private:
  std::span<const rdim> dims_;
  std::vector<std::int64_t> idx_;
  std::int64_t offset_ = 0;
};

// Outputs one outer-mode row pass accumulates (its accumulators stay in L1/L2).
constexpr std::int64_t row_block = 2048;

// Note [sums in any layout]
// A float sum in outer mode adds the n rows of a run (the innermost reduced dim) for a row of
// outputs at once (their lanes in registers for a narrow row, else in memory, each input row
// read whole) in Note [blocked summation]'s order: lane l of each group of eight rows takes
// row l, blocks of 128 rows are combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
// and carried in double, the rows after the last full group are added to the tree's sum, and
// the run's total joins the output's accumulator in double, as the inner mode's blocked_sum
// does for a run along the contiguous axis. So an output gets the same bits whichever axis
// its elements lie along: the mean over the pixels of a channel-blocked tensor (outer mode,
// channels innermost) equals the mean over the pixels of the plain NCHW one (inner mode), bit
// for bit, which lets the channel-blocks pass take a global average in blocks
// (src/passes/conv_layout.cpp). Before, outer mode added every row in double. The same bits
// need the same runs (reduced dims that merge alike in both layouts) and the same chunks when
// few outputs share the threads: a float sum chooses chunks by its number of outputs in
// either mode.

// K neighbouring outputs (column q[0], q[col_stride], ...) of a run of n rows, their eight
// lanes held in registers (K columns of C: one SSE register each).
template <class R, bool Unit, int K, class T>
void add_run_in_lanes(const T* q, std::int64_t n, std::int64_t row_stride, std::int64_t col_stride,
                      typename R::A* __restrict acc) {
  using C = typename R::C;
  using V = vec<C, K>;
  constexpr std::int64_t block = 128;
  const auto row = [&](std::int64_t i) {
    const T* p = q + i * row_stride;
    C x[K];
    for (int j = 0; j < K; ++j) x[j] = R::term(load(p[Unit ? j : j * col_stride]));
    return vload<C, K>(x);
  };
  V r[8];
  const auto clear = [&] {
    for (V& lane : r) lane = V{};
  };
  const auto tree = [&] { return combine_lanes(r); };
  double run[K] = {};
  C t[K];
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    clear();
    for (std::int64_t k = 0; k < block; k += 8) {
      for (int l = 0; l < 8; ++l) r[l] += row(i + k + l);
    }
    vstore<C, K>(t, tree());
    for (int j = 0; j < K; ++j) run[j] += static_cast<double>(t[j]);
  }
  clear();
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) r[l] += row(i + l);
  }
  V sum = tree();
  for (; i < n; ++i) sum += row(i);
  vstore<C, K>(t, sum);
  for (int j = 0; j < K; ++j) acc[j] = R::combine(acc[j], run[j] + static_cast<double>(t[j]));
}

// The w outputs of a row from column q[0] on, their lanes in memory (`lanes`: 8 * w of C, for
// a wide row: each input row is read whole, once).
template <class R, bool Unit, class T>
void add_run_in_lane_rows(const T* q, std::int64_t n, std::int64_t row_stride, std::int64_t w,
                          std::int64_t col_stride, typename R::C* __restrict lanes, double* __restrict run,
                          typename R::A* __restrict acc) {
  using C = typename R::C;
  constexpr std::int64_t block = 128;
  const auto add_row = [&](C* __restrict lane, std::int64_t i) {
    const T* __restrict p = q + i * row_stride;
    for (std::int64_t j = 0; j < w; ++j) lane[j] += R::term(load(p[Unit ? j : j * col_stride]));
  };
  const auto tree = [&](std::int64_t j) {  // output j's lanes
    C r[8];
    for (int l = 0; l < 8; ++l) r[l] = lanes[l * w + j];
    return combine_lanes(r);
  };
  std::fill_n(run, w, 0.0);
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    std::fill_n(lanes, 8 * w, C{});
    for (std::int64_t k = 0; k < block; k += 8) {
      for (int l = 0; l < 8; ++l) add_row(lanes + l * w, i + k + l);
    }
    for (std::int64_t j = 0; j < w; ++j) run[j] += static_cast<double>(tree(j));
  }
  std::fill_n(lanes, 8 * w, C{});
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) add_row(lanes + l * w, i + l);
  }
  for (std::int64_t j = 0; j < w; ++j) lanes[j] = tree(j);  // reads output j's lanes, then writes lane 0's
  for (; i < n; ++i) add_row(lanes, i);
  for (std::int64_t j = 0; j < w; ++j) acc[j] = R::combine(acc[j], run[j] + static_cast<double>(lanes[j]));
}

// Outputs whose lanes a float sum keeps in registers (a row no wider) or in memory, a tile of
// this many at a time (8 KB of float lanes).
constexpr std::int64_t lanes_in_registers = 32;
constexpr std::int64_t lane_tile = 256;

// The w outputs from column q[0] on (w <= lane_tile), in the same order either way.
template <class R, bool Unit, class T>
void add_run_in_lanes(const T* q, std::int64_t n, std::int64_t row_stride, std::int64_t w, std::int64_t col_stride,
                      typename R::C* lanes, double* run, typename R::A* __restrict acc) {
  if (w > lanes_in_registers) {
    add_run_in_lane_rows<R, Unit>(q, n, row_stride, w, col_stride, lanes, run, acc);
    return;
  }
  constexpr int K = std::max<int>(1, 16 / static_cast<int>(sizeof(typename R::C)));
  std::int64_t j = 0;
  for (; j + K <= w; j += K) {
    add_run_in_lanes<R, Unit, K>(q + (Unit ? j : j * col_stride), n, row_stride, col_stride, acc + j);
  }
  for (; j < w; ++j) add_run_in_lanes<R, Unit, 1>(q + (Unit ? j : j * col_stride), n, row_stride, col_stride, acc + j);
}

// The accumulators of outputs [ob, oe) of `g` over `base`, into out[0, oe - ob).
template <class R, class T, class A>
void accumulate(const geometry& g, const T* base, std::int64_t ob, std::int64_t oe, A* out) {
  if (g.inner) {
    const rdim run = g.red.back();
    const std::int64_t runs = g.num_red / run.size;
    odometer ko(g.kept);
    ko.seek(ob);
    odometer ro(std::span<const rdim>(g.red.data(), g.red.size() - 1));
    auto body = [&]<bool Unit>() {
      for (std::int64_t o = ob; o < oe; ++o) {
        const T* p = base + ko.offset();
        A acc = R::template run<Unit>(p, run.size, run.stride);
        for (std::int64_t r = 1; r < runs; ++r) {
          ro.next();
          acc = R::combine(acc, R::template run<Unit>(p + ro.offset(), run.size, run.stride));
        }
        if (runs > 1) ro.next();  // back to the first run
        out[o - ob] = acc;
        ko.next();
      }
    };
    if (run.stride == 1)
      body.template operator()<true>();
    else
      body.template operator()<false>();
    return;
  }
  // Outer mode: rows of up to row_block outputs along the innermost kept dim; the
  // innermost reduced dim is walked directly, the others through an odometer.
  const rdim col = g.kept.back();
  const rdim rin = g.red.back();
  const std::int64_t row_sets = g.num_red / rin.size;
  odometer qo(std::span<const rdim>(g.kept.data(), g.kept.size() - 1));
  odometer ro(std::span<const rdim>(g.red.data(), g.red.size() - 1));
  constexpr bool float_sum = R::additive && R::floating;  // Note [sums in any layout]
  const std::int64_t tile = float_sum ? lane_tile : row_block;
  std::vector<A> acc(static_cast<std::size_t>(std::min(tile, col.size)));
  std::vector<typename R::C> lanes(float_sum && std::ssize(acc) > lanes_in_registers ? 8 * acc.size() : 0);
  std::vector<double> run(lanes.empty() ? 0 : acc.size());
  auto body = [&]<bool Unit>() {
    std::int64_t o = ob;
    while (o < oe) {
      const std::int64_t j0 = o % col.size;
      qo.seek(o / col.size);
      const std::int64_t j1 = std::min(col.size, j0 + (oe - o));
      for (std::int64_t jb = j0; jb < j1; jb += tile) {
        const std::int64_t w = std::min(tile, j1 - jb);
        std::fill_n(acc.data(), w, R::identity());
        const T* p = base + qo.offset() + jb * col.stride;
        for (std::int64_t rs = 0; rs < row_sets; ++rs) {
          const T* q = p + ro.offset();
          if constexpr (float_sum) {
            add_run_in_lanes<R, Unit>(q, rin.size, rin.stride, w, col.stride, lanes.data(), run.data(), acc.data());
          } else {
            for (std::int64_t r = 0; r < rin.size; ++r) {
              R::template add_row<Unit>(acc.data(), q + r * rin.stride, w, col.stride);
            }
          }
          ro.next();
        }
        std::copy_n(acc.data(), w, out + (o - ob) + (jb - j0));
      }
      o += j1 - j0;
    }
  };
  if (col.stride == 1)
    body.template operator()<true>();
  else
    body.template operator()<false>();
}

// O: the output's element type (T, or float for reduce_sum's float32 output_type of a 16-bit
// T: the same accumulation, one rounding fewer).
template <class T, reduce_kind K, class O = T>
void reduce_into(kernel_context& ctx, const tensor& x, const std::vector<char>& reduced,
                 tensor& out) {
  using R = reducer<T, K>;
  using A = typename R::A;
  const geometry g = make_geometry(x, reduced);
  const T* base = x.data<T>();
  O* y = out.data<O>();
  const std::int64_t count = g.num_red;
  const int threads = ctx.num_threads();
  // Units of parallel work over outputs: one output in inner mode, one row block of
  // outputs in outer mode, or 64 of a float sum's (consecutive units cover consecutive
  // outputs).
  constexpr bool float_sum = R::additive && R::floating;
  const std::int64_t col = g.kept.back().size;
  const std::int64_t width = g.inner ? 1 : (float_sum ? 64 : row_block);
  const std::int64_t blocks_per_col = (col + width - 1) / width;
  const std::int64_t units = g.num_out / col * blocks_per_col;
  auto unit_start = [&](std::int64_t u) { return u / blocks_per_col * col + (u % blocks_per_col) * width; };
  auto unit_end = [&](std::int64_t u) {  // one past unit u's last output
    return u / blocks_per_col * col + std::min(col, (u % blocks_per_col + 1) * width);
  };
  const std::int64_t red0 = g.red.front().size;
  const bool big = static_cast<double>(g.num_out) * static_cast<double>(g.num_red) >= 65536.0;
  // A float sum decides by its outputs, as the inner mode does whatever the layout, so that
  // both modes cut the same chunks (Note [sums in any layout]).
  if ((float_sum ? g.num_out : units) < threads && threads > 1 && big && red0 > 1) {
    // Too few units to share: reduce chunks of the outermost reduced dim in parallel, each
    // over every output, and combine their partial results.
    const std::int64_t chunks = std::min<std::int64_t>(red0, 4 * threads);
    std::vector<A> partial(static_cast<std::size_t>(chunks * g.num_out));
    const double chunk_cost = static_cast<double>(g.num_out) * static_cast<double>(g.num_red) /
                              static_cast<double>(chunks);
    ctx.parallel_for(chunks, chunk_cost, [&](std::int64_t cb, std::int64_t ce) {
      for (std::int64_t c = cb; c < ce; ++c) {
        const std::int64_t b = red0 * c / chunks;
        const std::int64_t e = red0 * (c + 1) / chunks;
        geometry part = g;
        part.red.front().size = e - b;
        part.num_red = g.num_red / red0 * (e - b);
        accumulate<R>(part, base + b * g.red.front().stride, 0, g.num_out,
                      partial.data() + c * g.num_out);
      }
    });
    for (std::int64_t o = 0; o < g.num_out; ++o) {
      A acc = partial[static_cast<std::size_t>(o)];
      for (std::int64_t c = 1; c < chunks; ++c) {
        acc = R::combine(acc, partial[static_cast<std::size_t>(c * g.num_out + o)]);
      }
      y[o] = R::template finish<O>(acc, count);
    }
    return;
  }
  const double unit_cost =
      static_cast<double>(g.num_out) * static_cast<double>(g.num_red) / static_cast<double>(units);
  ctx.parallel_for(units, unit_cost, [&](std::int64_t ub, std::int64_t ue) {
    const std::int64_t ob = unit_start(ub);
    const std::int64_t oe = unit_end(ue - 1);
    std::vector<A> acc(static_cast<std::size_t>(oe - ob));
    accumulate<R>(g, base, ob, oe, acc.data());
    for (std::int64_t o = ob; o < oe; ++o) {
      y[o] = R::template finish<O>(acc[static_cast<std::size_t>(o - ob)], count);
    }
  });
}

template <reduce_kind K>
class reduce_kernel final : public common::reduce_kernel_base<K> {
 public:
  using common::reduce_kernel_base<K>::reduce_kernel_base;

  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    const shape& s = x.shape();
    const reduction_rules::reduce_geometry rg = this->geometry(ctx, s);
    const std::int64_t num_red = rg.num_red;
    const std::int64_t num_out = rg.num_out;
    tensor& out = ctx.allocate_output(0, rg.output);
    if (num_out == 0) return;
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (supports_v<T, K>) {
        // reduce_sum's output_type: x's own, or float32 for a float16 / bfloat16 x.
        common::apply_rule(
            ctx, [&] { reduction_rules::check_sum_output_type(x.type(), out.type()); });
        const auto run = [&]<class O>() {
          if (num_red == 0) {
            using R = reducer<T, K>;
            std::fill_n(out.data<O>(), num_out, R::template finish<O>(R::identity(), 0));
          } else {
            reduce_into<T, K, O>(ctx, x, rg.reduced, out);
          }
        };
        if constexpr (K == reduce_kind::sum && is_16bit_float_v<T>) {
          if (out.type() == dtype::f32) return run.template operator()<float>();
        }
        run.template operator()<T>();
      } else {
        ctx.fail("{} has no kernel for {}", reduction_rules::op_name(K), to_string(x.type()));
      }
    });
  }
};

// ---- argmax, argmin ---------------------------------------------------------------------

template <class T>
inline constexpr bool argmax_type_v =
    reducible_v<T> || std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>;

// True when v at a later index replaces the best so far: larger (Min: smaller), equal when
// the last index is selected, or a NaN (NaN wins, as NumPy: the first NaN, or the last one
// when the last index is selected).
template <bool Min, class C>
inline bool beats(C v, C best, bool last) noexcept {
  if constexpr (std::is_floating_point_v<C>) {
    const bool vn = v != v;
    const bool bn = best != best;
    if (vn || bn) return vn && (!bn || last);
  }
  if constexpr (Min) {
    return v < best || (last && v == best);
  } else {
    return v > best || (last && v == best);
  }
}

template <bool Min, class T, class I>
void argmax_into(kernel_context& ctx, const T* x, I* y, const axis_split& sp, bool last) {
  using C = compute_t<T>;
  const std::int64_t n = sp.n;
  if (sp.inner == 1) {
    ctx.parallel_for(sp.outer, static_cast<double>(n), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t o = b; o < e; ++o) {
        const T* p = x + o * n;
        if constexpr (std::is_same_v<T, C> && std::is_floating_point_v<C>) {
          // The extreme first (vectorised), then its first (or last) index, or the NaN's.
          bool nan = false;
          const C m = extreme<!Min>(p, n, nan);
          const auto hit = [&](std::int64_t i) { return nan ? p[i] != p[i] : p[i] == m; };
          std::int64_t i = last ? n - 1 : 0;
          if (last) {
            while (i > 0 && !hit(i)) --i;
          } else {
            while (i + 1 < n && !hit(i)) ++i;
          }
          y[o] = static_cast<I>(i);
          continue;
        }
        C best = load(p[0]);
        std::int64_t bi = 0;
        for (std::int64_t i = 1; i < n; ++i) {
          const C v = load(p[i]);
          if (beats<Min>(v, best, last)) {
            best = v;
            bi = i;
          }
        }
        y[o] = static_cast<I>(bi);
      }
    });
    return;
  }
  constexpr std::int64_t w_max = 64;
  const std::int64_t blocks = (sp.inner + w_max - 1) / w_max;
  ctx.parallel_for(sp.outer * blocks, static_cast<double>(n * w_max),
                   [&](std::int64_t b, std::int64_t e) {
                     C best[w_max];
                     std::int64_t idx[w_max];
                     for (std::int64_t u = b; u < e; ++u) {
                       const std::int64_t o = u / blocks;
                       const std::int64_t j0 = (u % blocks) * w_max;
                       const std::int64_t w = std::min(w_max, sp.inner - j0);
                       const T* p = x + o * n * sp.inner + j0;
                       for (std::int64_t j = 0; j < w; ++j) {
                         best[j] = load(p[j]);
                         idx[j] = 0;
                       }
                       for (std::int64_t i = 1; i < n; ++i) {
                         const T* row = p + i * sp.inner;
                         for (std::int64_t j = 0; j < w; ++j) {
                           const C v = load(row[j]);
                           const bool take = beats<Min>(v, best[j], last);
                           best[j] = take ? v : best[j];
                           idx[j] = take ? i : idx[j];
                         }
                       }
                       I* out = y + o * sp.inner + j0;
                       for (std::int64_t j = 0; j < w; ++j) out[j] = static_cast<I>(idx[j]);
                     }
                   });
}

// argmax and argmin (common::arg_kernel_base reads which, and the attributes).
class argmax_kernel final : public common::arg_kernel_base {
 public:
  using arg_kernel_base::arg_kernel_base;

  void compute(kernel_context& ctx) override {
    tensor hold;
    const tensor& x = dense_input(ctx, 0, hold);
    const shape& s = x.shape();
    const reduction_rules::along_axis a = argmax_along(ctx, s, op_name());
    const axis_split& sp = a.split;
    tensor& out = ctx.allocate_output(0, reduction_rules::argmax_output(s, a.axis, keepdims_));
    if (sp.outer * sp.inner == 0) return;
    const dtype out_t = out.type();
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (argmax_type_v<T>) {
        const auto run = [&](auto* y) {
          if (is_min_) {
            argmax_into<true, T>(ctx, x.data<T>(), y, sp, last_);
          } else {
            argmax_into<false, T>(ctx, x.data<T>(), y, sp, last_);
          }
        };
        if (out_t == dtype::i32) {
          run(out.data<std::int32_t>());
        } else {
          run(out.data<std::int64_t>());
        }
      } else {
        ctx.fail("{} has no kernel for {}", op_name(), to_string(x.type()));
      }
    });
  }
};

}  // namespace

void register_reduce_kernels(kernel_registry& r) {
  r.add(make_kernel_def<reduce_kernel<reduce_kind::sum>>("reduce_sum", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::mean>>("reduce_mean", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::max>>("reduce_max", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::min>>("reduce_min", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::prod>>("reduce_prod", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::l1>>("reduce_l1", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::l2>>("reduce_l2", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::sum_square>>("reduce_sum_square", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::log_sum>>("reduce_log_sum", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::log_sum_exp>>("reduce_log_sum_exp", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::any>>("reduce_any", cpu));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::all>>("reduce_all", cpu));
  r.add(make_kernel_def<argmax_kernel>("argmax", cpu));
  r.add(make_kernel_def<argmax_kernel>("argmin", cpu));
}

}  // namespace loom::cpu
