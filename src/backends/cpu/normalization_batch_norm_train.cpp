// The CPU kernels of batch normalisation in training (ops in
// src/graph/ops/normalization_train_ops.cpp): batch_norm_train and batch_norm_train_grad, one
// node each way, and the pieces of sync_batch_norm (batch_norm_stats, sync_batch_norm,
// batch_norm_grad_reduce, batch_norm_grad_elemt), over the passes of batch_norm_passes.hpp
// (Note [batch norm training kernels] in normalization_batch_norm_passes.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <vector>

#include "batch_norm_passes.hpp"
#include "kernel/common/batch_norm_train_math.hpp"
#include "kernel/common/normalization_helpers.hpp"
#include "kernel/common/variable_kernels.hpp"

namespace loom::cpu {

void register_batch_norm_train_kernels(kernel_registry& registry);

namespace {

using namespace reduction;
using namespace batch_norm;
namespace math = common::batch_norm_train;
using math::read_vector;
using math::write_vector;
constexpr device_type cpu = device_type::cpu;

// ---- kernels ------------------------------------------------------------------------------------

// f(T{}) for a float dtype t; the node fails for any other.
template <class F>
void for_float_type(const kernel_context& ctx, dtype t, F&& f) {
  visit_dtype(t, [&](auto tag) {
    if constexpr (float_type_v<decltype(tag)>) {
      f(tag);
    } else {
      ctx.fail("{} has no kernel for {}", ctx.node().op(), to_string(t));
    }
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
    const auto g = math::forward_geometry(ctx, format_);
    for_float_type(ctx, ctx.input(0).type(), [&](auto tag) { compute_typed<decltype(tag)>(ctx, g); });
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
    const dtype st = math::statistics_type(x.type());
    tensor& mean_out = ctx.allocate_output(1, st, shape{ch});
    tensor& invstd_out = ctx.allocate_output(2, st, shape{ch});

    channel_coeffs<C> k(ch);
    task_args<T> a;
    a.p.x = x.data<T>();
    a.p.out = y.data<T>();
    a.p.g = g;
    a.p.k = &k;
    a.p.stream = stream_out(a.p.out, a.p.x, g);
    math::statistics stats;
    stats.count = static_cast<double>(g.count());
    std::vector<double> invstd(static_cast<std::size_t>(ch));
    // Channel c's coefficients from its mean and m2.
    const auto coefficients = [&](std::int64_t c) {
      const auto i = static_cast<std::size_t>(c);
      const auto f = math::forward_coefficients<C>(stats.mean[i], stats.m2[i], stats.count, eps_,
                                                   scale[i], bias[i]);
      invstd[i] = f.invstd;
      k.cm[i] = f.cm;
      k.delta[i] = f.delta;
      k.a[i] = f.a;
      k.b[i] = f.b;
    };
    if (sync_) {
      stats = math::merge_gathered(ctx, ctx.input_contiguous(5), ch);
      math::check_count(ctx, stats.count, true);
      if (g.count() > 0) {
        for (std::int64_t c = 0; c < ch; ++c) coefficients(c);
        second_pass<T>(ctx, a, false);
      }
    } else {
      math::check_count(ctx, stats.count, false);
      const bool fused = g.inner > 1;
      set_hook(a, coefficients);
      channel_moments<T>(ctx, a, stats.mean, stats.m2, fused);
      if (!fused) {
        for (std::int64_t c = 0; c < ch; ++c) coefficients(c);
        second_pass<T>(ctx, a, false);
      }
    }
    write_vector(mean_out, stats.mean);
    write_vector(invstd_out, invstd);
    update_running(ctx, stats);
  }

  // The running statistics, updated in place (PyTorch's rule: math::update_running).
  void update_running(kernel_context& ctx, const math::statistics& s) {
    auto& vm = ctx.variables().get(running_mean_.name);
    auto& vv = ctx.variables().get(running_var_.name);
    const std::scoped_lock lock(vm.mutex, vv.mutex);
    running_mean_.check(ctx, vm, ctx.input(3), true);
    running_var_.check(ctx, vv, ctx.input(4), true);
    tensor& m = common::writable_value(ctx, vm, 3);
    tensor& v = common::writable_value(ctx, vv, 4);
    std::vector<double> rm = read_vector(m);
    std::vector<double> rv = read_vector(v);
    math::update_running(rm, rv, s, momentum_);
    write_vector(m, rm);
    write_vector(v, rv);
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
    const auto g = math::stats_geometry(ctx, format_);
    tensor& out = ctx.allocate_output(0, math::statistics_type(ctx.input(0).type()),
                                      shape{1, 2 * g.channels + 1});
    math::statistics st = math::zero_statistics(g.channels, static_cast<double>(g.count()));
    if (g.count() > 0) {
      for_float_type(ctx, ctx.input(0).type(), [&](auto tag) {
        using T = decltype(tag);
        tensor hold;
        task_args<T> a;
        a.p.x = common::dense_input(ctx, 0, hold).template data<T>();
        a.p.g = g;
        channel_moments<T>(ctx, a, st.mean, st.m2, false);
      });
    }
    write_vector(out, math::packed_statistics(st));
  }

 private:
  std::string format_;
};

// The backward ops, all reading (dy, x, scale, mean, invstd): batch_norm_train_grad (dx,
// dscale, dbias), batch_norm_grad_reduce (the packed sums, dscale, dbias) and
// batch_norm_grad_elemt (dx from the packed sums of every rank, input 5).
class backward_kernel final : public op_kernel {
 public:
  using part = math::backward_part;

  explicit backward_kernel(const kernel_construction& c)
      : op_kernel(c),
        format_(c.attr<std::string>("data_format")),
        part_(math::backward_part_of(c)) {}

  void compute(kernel_context& ctx) override {
    const auto g = math::backward_geometry(ctx, format_);
    for_float_type(ctx, ctx.input(1).type(), [&](auto tag) { compute_typed<decltype(tag)>(ctx, g); });
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
      const auto b = math::backward_coefficients<C>(sdy[i], sdyx[i], count, scale[i], invstd[i],
                                                    k.delta[i]);
      k.a[i] = b.a;
      k.q[i] = b.q;
      k.b[i] = b.b;
    };
    if (part_ == part::elemt) {
      math::unpack_sums(ctx, ctx.input_contiguous(5), ch, sdy, sdyx, count);
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
      write_vector(ctx.allocate_output(0, math::statistics_type(x.type()), shape{2 * ch + 1}),
                   math::packed_sums(sdy, sdyx, count));
    }
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
