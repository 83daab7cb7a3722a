// CPU kernels of softmax, log_softmax and softmax_cross_entropy (layer_norm's are in
// normalization_kernels.cpp).
//
// Each works on a dense view of its input split around the axis as [outer, n, inner]
// (split_at, loom/graph/ops/reduction_rules.hpp). Softmax subtracts the maximum along the
// axis before exponentiating, so any finite input gives finite output; sums of exponentials
// are carried in double (Note [blocked summation]). 16-bit floats compute in float through a
// per-task scratch row and round once, on the final store; log_softmax along a row keeps its
// exponentials there for their sum (its output may be its input's buffer).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_isa.hpp"
#include "elementwise_math.hpp"
#include "reduction_common.hpp"

namespace loom::cpu {
namespace {

using namespace reduction;
constexpr device_type cpu = device_type::cpu;

// Approximate nanoseconds per element of an exp-bound loop, for parallel_for.
constexpr double exp_cost = 4.0;

// e^v in the compute type: float through the element-wise family's branch-free fast_exp
// (within 2 ulp; loops over it vectorise), double through libm.
template <class C>
inline C exp_c(C v) noexcept {
  if constexpr (std::is_same_v<C, float>) {
    return ew::fast_exp(v);
  } else {
    return std::exp(v);
  }
}

// The maximum of n elements of a dense row, NaN ignored (a NaN reaches the outputs through
// exp(NaN - m) anyway).
template <class T>
compute_t<T> row_max(const T* x, std::int64_t n) noexcept {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, C>) {
    bool nan = false;
    return extreme<true>(x, n, nan);
  } else {
    C m = -std::numeric_limits<C>::infinity();
    for (std::int64_t i = 0; i < n; ++i) {
      const C v = load(x[i]);
      m = v > m ? v : m;
    }
    return m;
  }
}

// ---- softmax / log_softmax --------------------------------------------------------------

// One row (inner == 1) of n elements.
template <class T, bool Log>
[[gnu::always_inline]] inline void softmax_row(const T* x, T* y, std::int64_t n,
                                               compute_t<T>* scratch) {
  using C = compute_t<T>;
  const C m = row_max(x, n);
  if constexpr (Log) {
    // The exponentials go to the scratch row (y may be x), then their blocked sum.
    for (std::int64_t i = 0; i < n; ++i) scratch[i] = exp_c(load(x[i]) - m);
    const double sum = blocked_sum_dense(scratch, n);
    const C ls = static_cast<C>(std::log(sum));
    for (std::int64_t i = 0; i < n; ++i) y[i] = store<T>((load(x[i]) - m) - ls);
  } else {
    // Exponentials go straight to y when T computes as itself (in place is fine: x[i] is
    // read before y[i] is written), else to the float scratch row.
    C* e = nullptr;
    if constexpr (std::is_same_v<T, C>) {
      e = y;
    } else {
      e = scratch;
    }
    for (std::int64_t i = 0; i < n; ++i) e[i] = exp_c(load(x[i]) - m);
    const double sum = blocked_sum_dense(e, n);
    const C inv = static_cast<C>(1.0 / sum);
    for (std::int64_t i = 0; i < n; ++i) y[i] = store<T>(e[i] * inv);
  }
}

constexpr std::int64_t col_block = 64;

// Columns [j0, j0 + w) of one [n, inner] slab: x and y point at (0, j0).
template <class T, bool Log>
[[gnu::always_inline]] inline void softmax_cols(const T* x, T* y, std::int64_t n,
                                                std::int64_t inner, std::int64_t w,
                                                compute_t<T>* scratch) {
  using C = compute_t<T>;
  C m[col_block];
  double sum[col_block];
  std::fill(m, m + w, -std::numeric_limits<C>::infinity());
  std::fill(sum, sum + w, 0.0);
  for (std::int64_t i = 0; i < n; ++i) {
    const T* row = x + i * inner;
    for (std::int64_t j = 0; j < w; ++j) {
      const C v = load(row[j]);
      m[j] = v > m[j] ? v : m[j];
    }
  }
  if constexpr (Log) {
    for (std::int64_t i = 0; i < n; ++i) {
      const T* row = x + i * inner;
      for (std::int64_t j = 0; j < w; ++j) {
        sum[j] += static_cast<double>(exp_c(load(row[j]) - m[j]));
      }
    }
    C ls[col_block];
    for (std::int64_t j = 0; j < w; ++j) ls[j] = static_cast<C>(std::log(sum[j]));
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < w; ++j) {
        y[i * inner + j] = store<T>((load(x[i * inner + j]) - m[j]) - ls[j]);
      }
    }
  } else {
    C* e = nullptr;
    std::int64_t es = w;
    if constexpr (std::is_same_v<T, C>) {
      e = y;
      es = inner;
    } else {
      e = scratch;
    }
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < w; ++j) {
        const C v = exp_c(load(x[i * inner + j]) - m[j]);
        e[i * es + j] = v;
        sum[j] += static_cast<double>(v);
      }
    }
    C inv[col_block];
    for (std::int64_t j = 0; j < w; ++j) inv[j] = static_cast<C>(1.0 / sum[j]);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j < w; ++j) y[i * inner + j] = store<T>(e[i * es + j] * inv[j]);
    }
  }
}

// Tasks [lo, hi) of softmax_into when sp.inner is 1: rows of n.
template <class T, bool Log>
[[gnu::always_inline]] inline void softmax_row_tasks(const T* x, T* y, const axis_split& sp,
                                                     std::int64_t lo, std::int64_t hi,
                                                     compute_t<T>* scratch) {
  const std::int64_t n = sp.n;
  for (std::int64_t o = lo; o < hi; ++o) softmax_row<T, Log>(x + o * n, y + o * n, n, scratch);
}

// Tasks [lo, hi) of softmax_into when sp.inner is not 1: blocks of col_block columns of an
// [n, inner] slab.
template <class T, bool Log>
[[gnu::always_inline]] inline void softmax_block_tasks(const T* x, T* y, const axis_split& sp,
                                                       std::int64_t lo, std::int64_t hi,
                                                       compute_t<T>* scratch) {
  const std::int64_t n = sp.n;
  const std::int64_t blocks = (sp.inner + col_block - 1) / col_block;
  for (std::int64_t u = lo; u < hi; ++u) {
    const std::int64_t o = u / blocks;
    const std::int64_t j0 = (u % blocks) * col_block;
    const std::int64_t off = o * n * sp.inner + j0;
    softmax_cols<T, Log>(x + off, y + off, n, sp.inner, std::min(col_block, sp.inner - j0),
                         scratch);
  }
}

// Note [softmax instruction sets]
// Softmax is bound by fast_exp, which the baseline build (SSE2 on x86-64) vectorises 4
// floats wide. The loops are therefore compiled three times, as the fused element-wise
// kernel's are (Note [fused instruction sets]): baseline, AVX2 and (GCC) AVX-512, picked
// once per process and capped by LOOM_MAX_CPU_ISA. On one thread of the development
// machine (AMD EPYC), float32 along the last axis ([8, 128, 128], a transformer's attention
// softmax) takes 1.9 ns per element in the baseline and 1.0 in AVX2 or AVX-512; along a
// middle axis ([16, 128, 64], axis 1) 2.1, 1.1 and 0.8 ns. The variants give the same bits:
// the loops use IEEE arithmetic and bit operations only, each lane's operations are the
// baseline's, the blocked sum's 8 lanes and the order it combines them in are written out
// (Note [blocked summation]), a column block's sums are one double per column, and the
// wide variants are compiled with fp-contract=off so that no a * b + c becomes an FMA
// (AVX-512 implies FMA; cpu_isa.hpp's LOOM_ISA_* attributes). Every dtype runs the same loops; 16-bit types compute in float,
// double's exponentials stay libm calls.

// The task loops, one pair of functions per instruction set (each loop a function of its
// own, so that GCC inlines fast_exp into both: one function holding both loops grew past
// its inlining limits and called fast_exp out of line, at the baseline's speed).
#define LOOM_SOFTMAX_TASKS(isa, target_attr)                                                     \
  template <class T, bool Log>                                                                   \
  target_attr void softmax_rows_##isa(const T* x, T* y, const axis_split& sp, std::int64_t lo,   \
                                      std::int64_t hi, compute_t<T>* scratch) {                  \
    softmax_row_tasks<T, Log>(x, y, sp, lo, hi, scratch);                                        \
  }                                                                                              \
  template <class T, bool Log>                                                                   \
  target_attr void softmax_blocks_##isa(const T* x, T* y, const axis_split& sp, std::int64_t lo, \
                                        std::int64_t hi, compute_t<T>* scratch) {                \
    softmax_block_tasks<T, Log>(x, y, sp, lo, hi, scratch);                                      \
  }
LOOM_SOFTMAX_TASKS(baseline, LOOM_ISA_BASELINE)
#if LOOM_ISA_HAS_AVX2
LOOM_SOFTMAX_TASKS(avx2, LOOM_ISA_AVX2)
#endif
#if LOOM_ISA_HAS_AVX512
LOOM_SOFTMAX_TASKS(avx512, LOOM_ISA_AVX512)
#endif
#undef LOOM_SOFTMAX_TASKS

template <class T>
using softmax_task_fn = void (*)(const T* x, T* y, const axis_split& sp, std::int64_t lo,
                                 std::int64_t hi, compute_t<T>* scratch);

// The task loop for `sp` in the widest variant allowed (Note [softmax instruction sets]).
template <class T, bool Log>
softmax_task_fn<T> softmax_tasks(const axis_split& sp) {
  const bool rows = sp.inner == 1;
  switch (widest_cpu_isa()) {
    case isa_cap::avx512:
#if LOOM_ISA_HAS_AVX512
      return rows ? softmax_rows_avx512<T, Log> : softmax_blocks_avx512<T, Log>;
#endif
    case isa_cap::avx2:
#if LOOM_ISA_HAS_AVX2
      return rows ? softmax_rows_avx2<T, Log> : softmax_blocks_avx2<T, Log>;
#endif
    case isa_cap::baseline:
      break;
  }
  return rows ? softmax_rows_baseline<T, Log> : softmax_blocks_baseline<T, Log>;
}

template <class T, bool Log>
void softmax_into(kernel_context& ctx, const T* x, T* y, const axis_split& sp) {
  using C = compute_t<T>;
  // A row of exponentials: 16-bit types' softmax, and every log_softmax along rows.
  const bool scratch_needed = sp.inner == 1 ? (!std::is_same_v<T, C> || Log) : (!std::is_same_v<T, C> && !Log);
  const bool rows = sp.inner == 1;
  const std::int64_t width = rows ? sp.n : sp.n * col_block;  // elements per task
  const std::int64_t tasks = rows ? sp.outer : sp.outer * ((sp.inner + col_block - 1) / col_block);
  const softmax_task_fn<T> run = softmax_tasks<T, Log>(sp);
  ctx.parallel_for(tasks, exp_cost * static_cast<double>(width),
                   [&](std::int64_t b, std::int64_t e) {
                     std::vector<C> scratch(scratch_needed ? static_cast<std::size_t>(width) : 0);
                     run(x, y, sp, b, e, scratch.data());
                   });
}

template <bool Log>
class softmax_kernel final : public common::axis_kernel_base {
 public:
  using axis_kernel_base::axis_kernel_base;

  void compute(kernel_context& ctx) override {
    tensor hold;
    const tensor& x = dense_input(ctx, 0, hold);
    const axis_split sp = along(ctx, x.shape()).split;
    tensor& y = ctx.forward_input_or_allocate_output(0, 0, x.shape());
    if (x.num_elements() == 0) return;
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        softmax_into<T, Log>(ctx, x.data<T>(), y.data<T>(), sp);
      } else {
        ctx.fail("{} has no kernel for {}", Log ? "log_softmax" : "softmax", to_string(x.type()));
      }
    });
  }
};

// ---- softmax_cross_entropy --------------------------------------------------------------

// Note [xent as its unfused form]
// softmax_xent_fusion replaces -reduce_sum(one_hot(labels) * log_softmax(logits)) with this
// op, and a pass never changes an answer, so the loss is computed as that form computes it,
// to the bit: y = log_softmax's row, (x - m) - log(sum of exp(x - m)) with the same max,
// the same blocked sum and the same rounding to T, and loss = -y[label] (the products with
// one_hot's zeros add only zeros: -0 for a loss of exactly 0, as the form's negated sum
// gives). One more rule comes from those zeros: 0 * -inf is NaN, so a row where y of any
// other class is -inf (a logit of -inf, or x - m overflowing: 3e38 and -3e38 in one row;
// in float16, y past -65504) has a NaN loss in the form, and here too, not the finite
// loss the label's own term would give.

template <class T, class L>
void xent_into(kernel_context& ctx, const T* x, const L* labels, T* loss, T* backprop,
               std::int64_t rows, std::int64_t classes) {
  using C = compute_t<T>;
  // Labels first, serially, so the error names the first bad row whatever the threads do.
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto l = static_cast<std::int64_t>(labels[r]);
    if (l < 0 || l >= classes) {
      ctx.fail("label {} in row {} is outside [0, {}) (logits of shape [{}, {}])", l, r, classes,
               rows, classes);
    }
  }
  ctx.parallel_for(
      rows, exp_cost * static_cast<double>(classes), [&](std::int64_t b, std::int64_t e) {
        std::vector<C> scratch(std::is_same_v<T, C> ? 0 : static_cast<std::size_t>(classes));
        for (std::int64_t r = b; r < e; ++r) {
          const T* xr = x + r * classes;
          T* br = backprop + r * classes;
          const auto l = static_cast<std::int64_t>(labels[r]);
          const C m = row_max(xr, classes);
          const C at_label = load(xr[l]) - m;  // read before br (maybe xr's buffer) is written
          // The smallest x - m of the other classes (Note [xent as its unfused form]); NaN
          // is skipped, it reaches the loss through the sum anyway.
          C lowest = std::numeric_limits<C>::infinity();
          for (std::int64_t i = 0; i < classes; ++i) {
            const C d = load(xr[i]) - m;
            lowest = ((i != l) & (d < lowest)) ? d : lowest;
          }
          C* ex = nullptr;
          if constexpr (std::is_same_v<T, C>) {
            ex = br;
          } else {
            ex = scratch.data();
          }
          for (std::int64_t i = 0; i < classes; ++i) ex[i] = exp_c(load(xr[i]) - m);
          const double sum = blocked_sum_dense(ex, classes);
          const C inv = static_cast<C>(1.0 / sum);
          const C at_label_p = ex[l] * inv;  // ex may be br: read before the loop scales it
          for (std::int64_t i = 0; i < classes; ++i) br[i] = store<T>(ex[i] * inv);
          br[l] = store<T>(at_label_p - C(1));
          const auto ls = static_cast<C>(std::log(sum));
          const C lowest_y = load(store<T>(lowest - ls));  // as log_softmax stores it
          loss[r] = lowest_y == -std::numeric_limits<C>::infinity()
                        ? store<T>(std::numeric_limits<C>::quiet_NaN())
                        : store<T>(-(at_label - ls));
        }
      });
}

class xent_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;

  void compute(kernel_context& ctx) override {
    tensor hold_x;
    tensor hold_l;
    const tensor& x = dense_input(ctx, 0, hold_x);
    const tensor& labels = dense_input(ctx, 1, hold_l);
    common::apply_rule(ctx, [&] { reduction_rules::check_xent_shapes(x.shape(), labels.shape()); });
    const std::int64_t rows = x.dim(0);
    const std::int64_t classes = x.dim(1);
    tensor& backprop = ctx.forward_input_or_allocate_output(0, 1, x.shape());
    tensor& loss = ctx.allocate_output(0, shape{rows});
    if (rows == 0) return;
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        if (labels.type() == dtype::i32) {
          xent_into<T>(ctx, x.data<T>(), labels.data<std::int32_t>(), loss.data<T>(),
                       backprop.data<T>(), rows, classes);
        } else {
          xent_into<T>(ctx, x.data<T>(), labels.data<std::int64_t>(), loss.data<T>(),
                       backprop.data<T>(), rows, classes);
        }
      } else {
        ctx.fail("softmax_cross_entropy has no kernel for {}", to_string(x.type()));
      }
    });
  }
};

}  // namespace

void register_softmax_kernels(kernel_registry& r) {
  r.add(make_kernel_def<softmax_kernel<false>>("softmax", cpu));
  r.add(make_kernel_def<softmax_kernel<true>>("log_softmax", cpu));
  r.add(make_kernel_def<xent_kernel>("softmax_cross_entropy", cpu));
}

}  // namespace loom::cpu
