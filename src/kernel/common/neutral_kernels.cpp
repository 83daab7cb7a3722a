// The kernels every device shares (neutral_kernels.hpp).
#include "neutral_kernels.hpp"

#include "apply_rule.hpp"
#include "array_views.hpp"
#include "loom/core/dtype.hpp"
#include "loom/device/device.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::common {
namespace {

using ints = std::vector<std::int64_t>;

// A placeholder's (or a plan's _arg's) value comes from the feeds; the executor never runs
// this kernel unless the feed is missing.
class placeholder_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    ctx.fail("placeholder '{}' needs a feed ({}{})", ctx.node().name,
             to_string(ctx.node().attr<dtype>("dtype")),
             to_string(ctx.node().attr<shape>("shape")));
  }
};

class no_op_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& /*ctx*/) override {}
};

// The receiving side of a transfer: a tensor already on this device passes as it is; any
// other becomes a new buffer of this device (copy_from_host: on a GPU from the host through
// the h2d stream, or from another GPU).
class recv_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    if (in.device() == ctx.device().id()) {
      ctx.set_output(0, in);
      return;
    }
    ctx.set_output(0, ctx.device().copy_from_host(in));
  }
  bool is_cheap() const noexcept override { return false; }
};

class squeeze_kernel final : public op_kernel {
 public:
  explicit squeeze_kernel(const kernel_construction& c)
      : op_kernel(c), axes_(c.attr<ints>("axes")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto drop =
        apply_rule(ctx, [&] { return array_rules::squeezed_dims(in.shape(), axes_, text_of(in)); });
    ctx.set_output(0, squeeze_view(in, drop));
  }

 private:
  ints axes_;
};

class expand_dims_kernel final : public op_kernel {
 public:
  explicit expand_dims_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const std::size_t at = apply_rule(
        ctx, [&] { return array_rules::expand_dims_position(axis_, in.rank(), text_of(in)); });
    ctx.set_output(0, expand_dims_view(in, at));
  }

 private:
  std::int64_t axis_;
};

class broadcast_to_kernel final : public op_kernel {
 public:
  explicit broadcast_to_kernel(const kernel_construction& c)
      : op_kernel(c), target_(c.attr<shape>("shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    apply_rule(ctx, [&] { array_rules::check_broadcast(in.shape(), target_, text_of(in)); });
    ctx.set_output(0, broadcast_view(in, target_));
  }

 private:
  shape target_;
};

void register_for(kernel_registry& r, device_type device, const std::string& label) {
  const auto any = type_constraint(all_types());
  const auto fed = type_constraint(all_types(), "dtype");
  r.add(make_kernel_def<placeholder_kernel>("placeholder", device, fed, label));
  // A plan's fed values (Note [fed values in rewritten graphs]): filled by the executor,
  // never computed; a kernel so that placement can weigh them like placeholders.
  r.add(make_kernel_def<placeholder_kernel>("_arg", device, fed, label));
  r.add(make_kernel_def<identity_kernel>("identity", device, any, label));
  r.add(make_kernel_def<no_op_kernel>("no_op", device, {}, label));
  r.add(make_kernel_def<recv_kernel>("_recv", device, any, label));
  r.add(make_kernel_def<squeeze_kernel>("squeeze", device, any, label));
  r.add(make_kernel_def<expand_dims_kernel>("expand_dims", device, any, label));
  r.add(make_kernel_def<broadcast_to_kernel>("broadcast_to", device, any, label));
}

}  // namespace

void register_device_neutral_kernels(kernel_registry& registry) {
  register_for(registry, device_type::cpu, "reference");
  register_for(registry, device_type::cuda, "cuda");
}

}  // namespace loom::common
