// The CUDA kernels of batch normalisation in training (ops in
// src/graph/ops/normalization_train_ops.cpp): batch_norm_train, sync_batch_norm,
// batch_norm_stats, batch_norm_train_grad, batch_norm_grad_reduce and batch_norm_grad_elemt.
// The passes over x run on the GPU (kernels/batch_norm_train.cu: per-channel sums in
// float64, one block a channel; the element-wise normalising and dx passes); the
// per-channel arithmetic between them is the CPU kernels' own, on the host
// (kernel/common/batch_norm_train_math.hpp): each node copies its [2, C] sums to the host and
// its [4, C] coefficients back, a stream synchronisation per node, so that both devices
// compute the same values and fail alike. Not yet run on a GPU.
#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "cuda_kernels.hpp"
#include "kernel/common/batch_norm_train_math.hpp"
#include "kernel/common/normalization_helpers.hpp"
#include "kernel/common/variable_kernels.hpp"
#include "kernels/batch_norm_train.cuh"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "reduction_common.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;
namespace math = common::batch_norm_train;
namespace rules = normalization_rules;
using reduction::elem_of;

// A device tensor's values on the host, as doubles (waits for the compute stream).
std::vector<double> host_values(launch_scope& scope, const tensor& t) {
  if (t.num_elements() == 0) return {};
  return math::read_vector(scope.dev.copy_to_host(t, scope.dev.pinned_host()));
}

// `v` as a new device tensor of dtype `t` and shape `s`.
tensor device_values(launch_scope& scope, dtype t, const shape& s, const std::vector<double>& v) {
  tensor host = memory::host_tensor(t, s);
  math::write_vector(host, v);
  return scope.dev.copy_from_host(host);
}

// x's dtype checked against the passes' (the node fails otherwise).
void check_dtype(const kernel_context& ctx, dtype t) {
  if (!kernels::batch_norm_train_supports(elem_of(t))) {
    ctx.fail("{} has no kernel for {}", ctx.node().op(), to_string(t));
  }
}

// Per-channel sums of x (and dy) on the device, on the host as [2, C] doubles.
std::vector<double> channel_sums(kernel_context& ctx, launch_scope& scope, const tensor& x,
                                 const tensor* dy, const tensor* centre,
                                 const rules::batch_norm_geometry& g) {
  if (g.channels == 0) return {};  // no channel: nothing to launch (a grid of 0 blocks fails)
  tensor out = ctx.allocate_temp(dtype::f64, shape{2, g.channels});
  kernels::launch_batch_norm_channel_sums(elem_of(x.type()), x.raw_data(),
                                          dy ? dy->raw_data() : nullptr,
                                          centre ? centre->data<double>() : nullptr,
                                          out.data<double>(), g.outer, g.channels, g.inner,
                                          scope.stream);
  check_launch(ctx, "batch_norm channel sums");
  return host_values(scope, out);
}

// x's per-channel means and m2 over its `count` values per channel, from the device.
math::statistics moments(kernel_context& ctx, launch_scope& scope, const tensor& x,
                         const rules::batch_norm_geometry& g) {
  math::statistics st = math::zero_statistics(g.channels, static_cast<double>(g.count()));
  if (g.count() == 0) return st;
  const std::vector<double> sums = channel_sums(ctx, scope, x, nullptr, nullptr, g);
  st.mean.assign(sums.begin(), sums.begin() + g.channels);
  st.m2.assign(sums.begin() + g.channels, sums.end());
  return st;
}

// The coefficients [4, C] (cm, a, q, b) on the device, in x's compute type.
template <class C>
tensor coefficients_on_device(launch_scope& scope, const std::vector<C>& cm,
                              const std::vector<C>& a, const std::vector<C>& q,
                              const std::vector<C>& b) {
  std::vector<double> all;
  for (const auto* v : {&cm, &a, &q, &b}) {
    for (const C e : *v) all.push_back(static_cast<double>(e));
  }
  const auto ch = static_cast<std::int64_t>(cm.size());
  return device_values(scope, std::is_same_v<C, double> ? dtype::f64 : dtype::f32, shape{4, ch},
                       all);
}

// Calls f(C{}) with x's compute type: double for float64, float otherwise.
template <class F>
void with_compute_type(dtype t, F&& f) {
  if (t == dtype::f64) {
    f(double{});
  } else {
    f(float{});
  }
}

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
    check_dtype(ctx, ctx.input(0).type());
    launch_scope scope(ctx);
    const tensor x = ctx.input_contiguous(0);
    const std::int64_t ch = g.channels;
    math::statistics st;
    if (sync_) {
      st = math::merge_gathered(ctx, scope.dev.copy_to_host(ctx.input_contiguous(5),
                                                            scope.dev.pinned_host()),
                                ch);
      math::check_count(ctx, st.count, true);
    } else {
      math::check_count(ctx, static_cast<double>(g.count()), false);
      st = moments(ctx, scope, x, g);
    }
    const std::vector<double> scale = host_values(scope, ctx.input(1));
    const std::vector<double> bias = host_values(scope, ctx.input(2));
    std::vector<double> invstd(static_cast<std::size_t>(ch));
    tensor& y = ctx.allocate_output(0, x.shape());
    with_compute_type(x.type(), [&](auto tag) {
      using C = decltype(tag);
      std::vector<C> cm(invstd.size()), a(invstd.size()), q(invstd.size()), b(invstd.size());
      for (std::size_t i = 0; i < invstd.size(); ++i) {
        const auto f = math::forward_coefficients<C>(st.mean[i], st.m2[i], st.count, eps_,
                                                     scale[i], bias[i]);
        invstd[i] = f.invstd;
        cm[i] = f.cm;
        a[i] = f.a;
        b[i] = f.b;
      }
      if (g.count() == 0) return;
      const tensor coef = coefficients_on_device(scope, cm, a, q, b);
      kernels::launch_batch_norm_apply(elem_of(x.type()), x.raw_data(), nullptr, y.raw_data(),
                                       coef.raw_data(), g.outer, ch, g.inner, scope.stream);
      check_launch(ctx, ctx.node().op().c_str());
    });
    const dtype sd = math::statistics_type(x.type());
    ctx.set_output(1, device_values(scope, sd, shape{ch}, st.mean));
    ctx.set_output(2, device_values(scope, sd, shape{ch}, invstd));
    update_running(ctx, scope, st);
  }

 private:
  // The running statistics (PyTorch's rule: math::update_running), replaced by new values.
  void update_running(kernel_context& ctx, launch_scope& scope, const math::statistics& s) {
    auto& vm = ctx.variables().get(running_mean_.name);
    auto& vv = ctx.variables().get(running_var_.name);
    const std::scoped_lock lock(vm.mutex, vv.mutex);
    running_mean_.check(ctx, vm, ctx.input(3), true);
    running_var_.check(ctx, vv, ctx.input(4), true);
    const auto on_host = [&](const tensor& v) {
      return math::read_vector(v.device() == ctx.device().id()
                                   ? scope.dev.copy_to_host(v, scope.dev.pinned_host())
                                   : memory::contiguous_copy(v, memory::host_resource::instance(),
                                                             device_id{}));
    };
    std::vector<double> rm = on_host(vm.value);
    std::vector<double> rv = on_host(vv.value);
    math::update_running(rm, rv, s, momentum_);
    vm.value = device_values(scope, vm.value.type(), vm.value.shape(), rm);
    vv.value = device_values(scope, vv.value.type(), vv.value.shape(), rv);
  }

  double eps_;
  double momentum_;
  std::string format_;
  bool sync_;
  common::update_target running_mean_;
  common::update_target running_var_;
};

class stats_kernel final : public op_kernel {
 public:
  explicit stats_kernel(const kernel_construction& c)
      : op_kernel(c), format_(c.attr<std::string>("data_format")) {}

  void compute(kernel_context& ctx) override {
    const auto g = math::stats_geometry(ctx, format_);
    check_dtype(ctx, ctx.input(0).type());
    launch_scope scope(ctx);
    const math::statistics st = moments(ctx, scope, ctx.input_contiguous(0), g);
    ctx.set_output(0, device_values(scope, math::statistics_type(ctx.input(0).type()),
                                    shape{1, 2 * g.channels + 1}, math::packed_statistics(st)));
  }

 private:
  std::string format_;
};

class backward_kernel final : public op_kernel {
 public:
  using part = math::backward_part;

  explicit backward_kernel(const kernel_construction& c)
      : op_kernel(c),
        format_(c.attr<std::string>("data_format")),
        part_(math::backward_part_of(c)) {}

  void compute(kernel_context& ctx) override {
    const auto g = math::backward_geometry(ctx, format_);
    check_dtype(ctx, ctx.input(1).type());
    launch_scope scope(ctx);
    const std::int64_t ch = g.channels;
    const tensor dy = ctx.input_contiguous(0);
    const tensor x = ctx.input_contiguous(1);
    const std::vector<double> scale = host_values(scope, ctx.input(2));
    const std::vector<double> mean = host_values(scope, ctx.input(3));
    const std::vector<double> invstd = host_values(scope, ctx.input(4));
    std::vector<double> sdy(static_cast<std::size_t>(ch), 0.0);
    std::vector<double> sdyx(sdy.size(), 0.0);
    double count = static_cast<double>(g.count());
    if (part_ == part::elemt) {
      math::unpack_sums(ctx, scope.dev.copy_to_host(ctx.input_contiguous(5), scope.dev.pinned_host()),
                        ch, sdy, sdyx, count);
    } else if (g.count() > 0) {
      const tensor centre = device_values(scope, dtype::f64, shape{ch}, mean);
      const std::vector<double> sums = channel_sums(ctx, scope, x, &dy, &centre, g);
      sdy.assign(sums.begin(), sums.begin() + ch);
      sdyx.assign(sums.begin() + ch, sums.end());
    }
    if (part_ != part::reduce) {
      tensor& dx = ctx.allocate_output(0, x.shape());
      if (g.count() > 0) {
        with_compute_type(x.type(), [&](auto tag) {
          using C = decltype(tag);
          std::vector<C> cm(sdy.size()), a(sdy.size()), q(sdy.size()), b(sdy.size());
          for (std::size_t i = 0; i < sdy.size(); ++i) {
            const math::split_mean<C> m(mean[i]);
            const auto k =
                math::backward_coefficients<C>(sdy[i], sdyx[i], count, scale[i], invstd[i], m.delta);
            cm[i] = m.cm;
            a[i] = k.a;
            q[i] = k.q;
            b[i] = k.b;
          }
          const tensor coef = coefficients_on_device(scope, cm, a, q, b);
          kernels::launch_batch_norm_apply(elem_of(x.type()), x.raw_data(), dy.raw_data(),
                                           dx.raw_data(), coef.raw_data(), g.outer, ch, g.inner,
                                           scope.stream);
          check_launch(ctx, ctx.node().op().c_str());
        });
      }
    }
    if (part_ == part::elemt) return;
    std::vector<double> dscale(sdy.size());
    for (std::size_t i = 0; i < dscale.size(); ++i) dscale[i] = sdyx[i] * invstd[i];
    const dtype u = ctx.input(2).type();
    ctx.set_output(1, device_values(scope, u, shape{ch}, dscale));
    ctx.set_output(2, device_values(scope, u, shape{ch}, sdy));
    if (part_ == part::reduce) {
      ctx.set_output(0, device_values(scope, math::statistics_type(x.type()), shape{2 * ch + 1},
                                      math::packed_sums(sdy, sdyx, count)));
    }
  }

 private:
  std::string format_;
  part part_;
};

}  // namespace

void register_batch_norm_train_kernels(kernel_registry& r) {
  r.add(make_kernel_def<forward_kernel>("batch_norm_train", gpu, "cuda"));
  r.add(make_kernel_def<forward_kernel>("sync_batch_norm", gpu, "cuda"));
  r.add(make_kernel_def<stats_kernel>("batch_norm_stats", gpu, "cuda"));
  r.add(make_kernel_def<backward_kernel>("batch_norm_train_grad", gpu, "cuda"));
  r.add(make_kernel_def<backward_kernel>("batch_norm_grad_reduce", gpu, "cuda"));
  r.add(make_kernel_def<backward_kernel>("batch_norm_grad_elemt", gpu, "cuda"));
}

}  // namespace loom::cuda
