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
#include "kernel/common/normalization_helpers.hpp"
#include "kernel/common/variable_kernels.hpp"

namespace loom::cpu {

void register_batch_norm_train_kernels(kernel_registry& registry);

namespace {

using namespace reduction;
using namespace batch_norm;
constexpr device_type cpu = device_type::cpu;

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
      for_float_type(ctx, ctx.input(0).type(), [&](auto tag) {
        using T = decltype(tag);
        tensor hold;
        task_args<T> a;
        a.p.x = common::dense_input(ctx, 0, hold).template data<T>();
        a.p.g = g;
        std::vector<double> mean;
        std::vector<double> m2;
        channel_moments<T>(ctx, a, mean, m2, false);
        std::copy(mean.begin(), mean.end(), packed.begin() + 1);
        std::copy(m2.begin(), m2.end(), packed.begin() + 1 + g.channels);
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
