// The passes over x that the CPU's training batch norm kernels are made of
// (normalization_batch_norm_train.cpp): the statistics, the gradient sums and the
// normalising (dx) pass, in both layouts, compiled per instruction set
// (normalization_batch_norm_passes.cpp). Note [batch norm training kernels].
#pragma once

#include <cstdint>
#include <vector>

#include "kernel/common/batch_norm_train_math.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
#include "loom/kernel/op_kernel.hpp"
#include "reduction_common.hpp"

namespace loom::cpu::batch_norm {

using reduction::compute_t;
namespace rules = normalization_rules;

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
    const common::batch_norm_train::split_mean<C> m(mean);
    cm[static_cast<std::size_t>(c)] = m.cm;
    delta[static_cast<std::size_t>(c)] = m.delta;
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

// The batch's per-channel mean and m2 (over g.count() values each) into mean and m2, and
// (fused: channel planes only) the normalising pass, with coefficients the hook computes
// from them channel by channel. a.p.x and, fused, a.p.out and a.p.k set.
template <class T>
void channel_moments(kernel_context& ctx, task_args<T>& a, std::vector<double>& mean,
                     std::vector<double>& m2, bool fused);

// The batch's per-channel Σdy and Σ dy (x - mean) (a.p.k's means set), and (fused: channel
// planes only) the dx pass with the coefficients the hook computes from them.
template <class T>
void channel_grad_sums(kernel_context& ctx, task_args<T>& a, std::vector<double>& sdy,
                       std::vector<double>& sdyx, bool fused);

// The normalising (backward: dx) pass over all of x, with a.p.k's coefficients.
template <class T>
void second_pass(kernel_context& ctx, task_args<T>& a, bool backward);

// Whether `out`, of x's geometry, is written with streaming stores (Note [batch norm
// streaming stores]); `in` is the input whose buffer it may have taken.
template <class T>
bool stream_out(const T* out, const T* in, const rules::batch_norm_geometry& g);

#define LOOM_BATCH_NORM_PASSES(T)                                                              \
  extern template void channel_moments<T>(kernel_context&, task_args<T>&, std::vector<double>&, \
                                          std::vector<double>&, bool);                          \
  extern template void channel_grad_sums<T>(kernel_context&, task_args<T>&,                     \
                                            std::vector<double>&, std::vector<double>&, bool);  \
  extern template void second_pass<T>(kernel_context&, task_args<T>&, bool);                    \
  extern template bool stream_out<T>(const T*, const T*, const rules::batch_norm_geometry&);
LOOM_BATCH_NORM_PASSES(float)
LOOM_BATCH_NORM_PASSES(double)
LOOM_BATCH_NORM_PASSES(half)
LOOM_BATCH_NORM_PASSES(bfloat16)
#undef LOOM_BATCH_NORM_PASSES

}  // namespace loom::cpu::batch_norm
