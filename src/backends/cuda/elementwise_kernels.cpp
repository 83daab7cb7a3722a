// CUDA kernels of the element-wise ops: the unary and binary math (with NumPy broadcasting;
// the unary ops' attributes, as elu's alpha, passed by value),
// cast, where, and the generators fill, zeros, ones and range. The device code is in
// kernels/elementwise_*.cu; this file checks arguments, allocates outputs (in place when the
// input's buffer is the node's alone, as on CPU) and describes operands to the kernels (Note
// [cuda element-wise layout] in kernels/elementwise.cuh). random_uniform and random_normal
// have no CUDA kernel: placement puts them on the CPU.
//
// The semantics, the registered dtypes and the error messages are the CPU kernels'
// (src/backends/cpu/elementwise_*.cpp), whose plan, checks and conversions this file shares
// (src/kernel/common/elementwise_*.hpp). Each
// kernel checks what it can before it touches CUDA (launch_scope), so a bad node fails the
// same way on both devices, with the same message.
//
// Note [cuda value checks]
// Checks that depend on the values in device memory -- an integer division by zero, a gather
// index out of range -- would need the host to wait for the GPU in the middle of a step,
// which would stall the stream for every node queued behind. The CUDA kernels do not make
// them: an integer divided by zero gives 0, gather gives zeros for an index outside the
// params, gather_grad ignores such an index (as TensorFlow's GPU kernels do), and one_hot
// gives off_value for it (as on CPU). The CPU kernels fail the node instead; run the graph on
// the CPU to find such an input.
#include <cstring>
#include <optional>

#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/elementwise_checks.hpp"
#include "kernel/common/elementwise_convert.hpp"
#include "kernel/common/elementwise_plan.hpp"
#include "kernels/elementwise.cuh"

namespace loom::cuda {

namespace kernels {
static_assert(static_cast<int>(elem_type::f32) == static_cast<int>(dtype::f32));
static_assert(static_cast<int>(elem_type::f64) == static_cast<int>(dtype::f64));
static_assert(static_cast<int>(elem_type::f16) == static_cast<int>(dtype::f16));
static_assert(static_cast<int>(elem_type::bf16) == static_cast<int>(dtype::bf16));
static_assert(static_cast<int>(elem_type::i32) == static_cast<int>(dtype::i32));
static_assert(static_cast<int>(elem_type::i64) == static_cast<int>(dtype::i64));
static_assert(static_cast<int>(elem_type::i8) == static_cast<int>(dtype::i8));
static_assert(static_cast<int>(elem_type::u8) == static_cast<int>(dtype::u8));
static_assert(static_cast<int>(elem_type::boolean) == static_cast<int>(dtype::boolean));
}  // namespace kernels

namespace {

// The kernels' code for a dtype.
kernels::elem_type elem_type_of(dtype t) {
  return static_cast<kernels::elem_type>(static_cast<int>(t));
}

// The layout of `inputs` (each broadcastable to `out`) against the dense output `out`
// (Note [cuda element-wise layout]); fails the node when more than kernels::ew_max_dims
// dimensions remain after merging.
template <std::size_t K>
kernels::ew_layout ew_layout_of(const kernel_context& ctx, const shape& out,
                                const std::array<const tensor*, K>& inputs) {
  static_assert(K >= 1 && K <= kernels::ew_max_inputs);
  kernels::ew_layout l;
  l.count = out.num_elements();
  bool flat = true;
  for (std::size_t k = 0; k < K; ++k) {
    const std::int64_t s = ew::flat_stride(*inputs[k], l.count);
    flat = flat && s >= 0;
    l.flat[k] = s;
  }
  if (flat) return l;
  const auto p = ew::make_plan<K + 1>(out, inputs);
  const std::size_t rank = p.dims.rank();
  if (rank > static_cast<std::size_t>(kernels::ew_max_dims)) {
    ctx.fail("the CUDA element-wise kernels take at most {} dimensions after merging; {} has {}",
             kernels::ew_max_dims, to_string(out), rank);
  }
  l.rank = static_cast<int>(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    l.dims[d] = p.dims[d];
    for (std::size_t k = 0; k < K; ++k) l.strides[k][d] = p.strides[k + 1][d];
  }
  return l;
}

using ew::broadcast_shape_of;
using ew::forward_or_allocate;
using ew_types = std::vector<dtype>;

// ---- unary -----------------------------------------------------------------------------------

// `bool_out`: the predicates, whose bool result cannot take x's buffer.
void run_unary(kernel_context& ctx, kernels::unary_op op, const kernels::unary_attrs& attrs = {},
               bool bool_out = false) {
  const tensor& x = ctx.input(0);
  const shape s = x.shape();
  const auto layout = ew_layout_of<1>(ctx, s, {&x});
  launch_scope scope(ctx);
  tensor& y = bool_out ? ctx.allocate_output(0, s) : forward_or_allocate(ctx, s, {0});
  if (!kernels::launch_unary(op, elem_type_of(x.type()), x.raw_data(), y.raw_data(), layout,
                             scope.stream, attrs)) {
    ctx.fail("{} does not take {}", ctx.node().op(), to_string(x.type()));
  }
  check_launch(ctx, ctx.node().op().c_str());
}

class unary_kernel final : public op_kernel {
 public:
  unary_kernel(const kernel_construction& c, kernels::unary_op op) : op_kernel(c), op_(op) {}
  void compute(kernel_context& ctx) override { run_unary(ctx, op_); }

 private:
  kernels::unary_op op_;
};

// The unary ops with attributes, and the predicates.
class attr_unary_kernel final : public op_kernel {
 public:
  attr_unary_kernel(const kernel_construction& c, kernels::unary_op op)
      : op_kernel(c), op_(op), attrs_(attrs_of(c, op)) {}
  void compute(kernel_context& ctx) override {
    using kernels::unary_op;
    const bool bool_out =
        op_ == unary_op::isnan || op_ == unary_op::isinf || op_ == unary_op::isfinite;
    run_unary(ctx, op_, attrs_, bool_out);
  }

 private:
  static kernels::unary_attrs attrs_of(const kernel_construction& c, kernels::unary_op op) {
    using kernels::unary_op;
    kernels::unary_attrs a;
    auto real = [&](const char* name) { return c.attr<double>(name); };
    if (op == unary_op::isinf) {
      a.detect_positive = c.attr<bool>("detect_positive");
      a.detect_negative = c.attr<bool>("detect_negative");
    } else if (op == unary_op::selu) {
      a.alpha = real("alpha");
      a.gamma = real("gamma");
    } else if (op == unary_op::celu) {
      a.alpha = real("alpha");
      a.beta = a.alpha;
    } else if (op == unary_op::hard_sigmoid) {
      a.alpha = real("alpha");
      a.beta = real("beta");
    } else if (op != unary_op::isnan && op != unary_op::isfinite) {
      a.alpha = real("alpha");
    }
    return a;
  }

  kernels::unary_op op_;
  kernels::unary_attrs attrs_;
};

class gelu_kernel final : public op_kernel {
 public:
  explicit gelu_kernel(const kernel_construction& c)
      : op_kernel(c), tanh_(c.attr<std::string>("approximate") == "tanh") {}
  void compute(kernel_context& ctx) override {
    run_unary(ctx, tanh_ ? kernels::unary_op::gelu_tanh : kernels::unary_op::gelu_erf);
  }

 private:
  bool tanh_;
};

// ---- binary ----------------------------------------------------------------------------------

class binary_kernel final : public op_kernel {
 public:
  // mod's attribute fmod picks the device op.
  binary_kernel(const kernel_construction& c, kernels::binary_op op, bool bool_out)
      : op_kernel(c),
        op_(op == kernels::binary_op::mod && c.attr<bool>("fmod") ? kernels::binary_op::fmod : op),
        bool_out_(bool_out) {}

  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    const tensor& y = ctx.input(1);
    const shape s = broadcast_shape_of(ctx, {&x.shape(), &y.shape()});
    const auto layout = ew_layout_of<2>(ctx, s, {&x, &y});
    launch_scope scope(ctx);
    // The result takes an input's buffer only when its elements are as wide (as on CPU).
    const dtype out_type = bool_out_ ? dtype::boolean : x.type();
    tensor& z = size_of(out_type) == size_of(x.type()) ? forward_or_allocate(ctx, s, {0, 1})
                                                       : ctx.allocate_output(0, s);
    if (!kernels::launch_binary(op_, elem_type_of(x.type()), x.raw_data(), y.raw_data(),
                                z.raw_data(), layout, scope.stream)) {
      ctx.fail("{} does not take {}", ctx.node().op(), to_string(x.type()));
    }
    check_launch(ctx, ctx.node().op().c_str());
  }

 private:
  kernels::binary_op op_;
  bool bool_out_;
};

// ---- cast, where -----------------------------------------------------------------------------

class cast_kernel final : public op_kernel {
 public:
  explicit cast_kernel(const kernel_construction& c) : op_kernel(c), to_(c.attr<dtype>("to")) {}

  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    if (x.type() == to_) {
      // Nothing to convert: the same tensor.
      ctx.set_output(0, x);
      return;
    }
    const shape s = x.shape();
    const auto layout = ew_layout_of<1>(ctx, s, {&x});
    launch_scope scope(ctx);
    tensor& y = size_of(x.type()) == size_of(to_) ? forward_or_allocate(ctx, s, {0})
                                                  : ctx.allocate_output(0, s);
    if (!kernels::launch_cast(elem_type_of(x.type()), elem_type_of(to_), x.raw_data(), y.raw_data(),
                              layout, scope.stream)) {
      ctx.fail("cannot cast {} to {}", to_string(x.type()), to_string(to_));
    }
    check_launch(ctx, "cast");
  }

 private:
  dtype to_;
};

class where_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;

  void compute(kernel_context& ctx) override {
    const tensor& c = ctx.input(0);
    const tensor& x = ctx.input(1);
    const tensor& y = ctx.input(2);
    const shape s = broadcast_shape_of(ctx, {&c.shape(), &x.shape(), &y.shape()});
    const auto layout = ew_layout_of<3>(ctx, s, {&c, &x, &y});
    launch_scope scope(ctx);
    tensor& z = forward_or_allocate(ctx, s, {1, 2});
    if (!kernels::launch_where(size_of(x.type()), c.data<bool>(), x.raw_data(), y.raw_data(),
                               z.raw_data(), layout, scope.stream)) {
      ctx.fail("where does not take {}", to_string(x.type()));
    }
    check_launch(ctx, "where");
  }
};

// ---- generators ------------------------------------------------------------------------------

class fill_kernel final : public op_kernel {
 public:
  // `value`: zeros' and ones' value; fill's comes from its attribute.
  fill_kernel(const kernel_construction& c, std::optional<double> value)
      : op_kernel(c),
        type_(c.attr<dtype>("dtype")),
        shape_(ew::generator_shape(c)),
        // The element's bits, made once as the CPU kernel makes the element.
        bits_(ew::element_bits(type_, value ? *value : c.attr<double>("value"))) {}

  void compute(kernel_context& ctx) override {
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, type_, shape_);
    if (!kernels::launch_fill(size_of(type_), bits_, out.raw_data(), out.num_elements(),
                              scope.stream)) {
      ctx.fail("{} does not make {}", ctx.node().op(), to_string(type_));
    }
    check_launch(ctx, "fill");
  }

 private:
  dtype type_;
  shape shape_;
  std::uint64_t bits_;
};

class range_kernel final : public op_kernel {
 public:
  explicit range_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("dtype")),
        shape_(ew::generator_shape(c)),
        start_(c.attr<double>("start")),
        delta_(c.attr<double>("delta")) {}

  void compute(kernel_context& ctx) override {
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, type_, shape_);
    if (!kernels::launch_range(elem_type_of(type_), start_, delta_, out.raw_data(),
                               out.num_elements(), scope.stream)) {
      ctx.fail("range does not make {}", to_string(type_));
    }
    check_launch(ctx, "range");
  }

 private:
  dtype type_;
  shape shape_;
  double start_;
  double delta_;
};

// ---- registration ----------------------------------------------------------------------------

template <class K, class... Args>
kernel_def def_with(std::string op, std::vector<std::pair<std::string, std::vector<dtype>>> c,
                    Args... args) {
  kernel_def d;
  d.op = std::move(op);
  d.device = device_type::cuda;
  d.constraints = std::move(c);
  d.label = "cuda";
  d.create = [args...](const kernel_construction& kc) -> std::unique_ptr<op_kernel> {
    return std::make_unique<K>(kc, args...);
  };
  return d;
}

// T in `types`, or no constraint for the ops without a type attribute (bool only).
std::vector<std::pair<std::string, std::vector<dtype>>> on_t(ew_types types) {
  if (types.empty()) return {};
  return type_constraint(std::move(types));
}

}  // namespace

void register_elementwise_kernels(kernel_registry& r) {
  using kernels::binary_op;
  using kernels::unary_op;
  const ew_types& fl = float_types();
  const ew_types sig{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                     dtype::i32, dtype::i64, dtype::i8};
  const ew_types& num = numeric_types();
  const ew_types& all = all_types();

  r.add(def_with<unary_kernel>("neg", on_t(sig), unary_op::neg));
  r.add(def_with<unary_kernel>("abs", on_t(sig), unary_op::abs));
  r.add(def_with<unary_kernel>("exp", on_t(fl), unary_op::exp));
  r.add(def_with<unary_kernel>("log", on_t(fl), unary_op::log));
  r.add(def_with<unary_kernel>("sqrt", on_t(fl), unary_op::sqrt));
  r.add(def_with<unary_kernel>("rsqrt", on_t(fl), unary_op::rsqrt));
  r.add(def_with<unary_kernel>("tanh", on_t(fl), unary_op::tanh));
  r.add(def_with<unary_kernel>("sigmoid", on_t(fl), unary_op::sigmoid));
  r.add(def_with<unary_kernel>("relu", on_t(num), unary_op::relu));
  r.add(def_with<gelu_kernel>("gelu", on_t(fl)));
  r.add(def_with<unary_kernel>("erf", on_t(fl), unary_op::erf));
  r.add(def_with<unary_kernel>("square", on_t(sig), unary_op::square));
  r.add(def_with<unary_kernel>("reciprocal", on_t(fl), unary_op::reciprocal));
  r.add(def_with<unary_kernel>("logical_not", on_t({}), unary_op::logical_not));

  r.add(def_with<unary_kernel>("sin", on_t(fl), unary_op::sin));
  r.add(def_with<unary_kernel>("cos", on_t(fl), unary_op::cos));
  r.add(def_with<unary_kernel>("tan", on_t(fl), unary_op::tan));
  r.add(def_with<unary_kernel>("asin", on_t(fl), unary_op::asin));
  r.add(def_with<unary_kernel>("acos", on_t(fl), unary_op::acos));
  r.add(def_with<unary_kernel>("atan", on_t(fl), unary_op::atan));
  r.add(def_with<unary_kernel>("sinh", on_t(fl), unary_op::sinh));
  r.add(def_with<unary_kernel>("cosh", on_t(fl), unary_op::cosh));
  r.add(def_with<unary_kernel>("asinh", on_t(fl), unary_op::asinh));
  r.add(def_with<unary_kernel>("acosh", on_t(fl), unary_op::acosh));
  r.add(def_with<unary_kernel>("atanh", on_t(fl), unary_op::atanh));
  r.add(def_with<unary_kernel>("log1p", on_t(fl), unary_op::log1p));
  r.add(def_with<unary_kernel>("expm1", on_t(fl), unary_op::expm1));
  r.add(def_with<unary_kernel>("floor", on_t(fl), unary_op::floor));
  r.add(def_with<unary_kernel>("ceil", on_t(fl), unary_op::ceil));
  r.add(def_with<unary_kernel>("round", on_t(fl), unary_op::round));
  r.add(def_with<unary_kernel>("softplus", on_t(fl), unary_op::softplus));
  r.add(def_with<unary_kernel>("softsign", on_t(fl), unary_op::softsign));
  r.add(def_with<unary_kernel>("silu", on_t(fl), unary_op::silu));
  r.add(def_with<unary_kernel>("mish", on_t(fl), unary_op::mish));
  r.add(def_with<unary_kernel>("hard_swish", on_t(fl), unary_op::hard_swish));
  r.add(def_with<unary_kernel>("sign", on_t(sig), unary_op::sign));
  r.add(def_with<attr_unary_kernel>("elu", on_t(fl), unary_op::elu));
  r.add(def_with<attr_unary_kernel>("selu", on_t(fl), unary_op::selu));
  r.add(def_with<attr_unary_kernel>("celu", on_t(fl), unary_op::celu));
  r.add(def_with<attr_unary_kernel>("leaky_relu", on_t(fl), unary_op::leaky_relu));
  r.add(def_with<attr_unary_kernel>("hard_sigmoid", on_t(fl), unary_op::hard_sigmoid));
  r.add(def_with<attr_unary_kernel>("thresholded_relu", on_t(fl), unary_op::thresholded_relu));
  r.add(def_with<attr_unary_kernel>("isnan", on_t(fl), unary_op::isnan));
  r.add(def_with<attr_unary_kernel>("isinf", on_t(fl), unary_op::isinf));
  r.add(def_with<attr_unary_kernel>("isfinite", on_t(fl), unary_op::isfinite));

  r.add(def_with<binary_kernel>("add", on_t(num), binary_op::add, false));
  r.add(def_with<binary_kernel>("sub", on_t(num), binary_op::sub, false));
  r.add(def_with<binary_kernel>("mul", on_t(num), binary_op::mul, false));
  r.add(def_with<binary_kernel>("div", on_t(num), binary_op::div, false));
  r.add(def_with<binary_kernel>("pow", on_t(fl), binary_op::pow, false));
  r.add(def_with<binary_kernel>("maximum", on_t(num), binary_op::maximum, false));
  r.add(def_with<binary_kernel>("minimum", on_t(num), binary_op::minimum, false));
  r.add(def_with<binary_kernel>("equal", on_t(all), binary_op::equal, true));
  r.add(def_with<binary_kernel>("not_equal", on_t(all), binary_op::not_equal, true));
  r.add(def_with<binary_kernel>("less", on_t(num), binary_op::less, true));
  r.add(def_with<binary_kernel>("less_equal", on_t(num), binary_op::less_equal, true));
  r.add(def_with<binary_kernel>("greater", on_t(num), binary_op::greater, true));
  r.add(def_with<binary_kernel>("greater_equal", on_t(num), binary_op::greater_equal, true));
  r.add(def_with<binary_kernel>("logical_and", on_t({}), binary_op::logical_and, true));
  r.add(def_with<binary_kernel>("logical_or", on_t({}), binary_op::logical_or, true));
  r.add(def_with<binary_kernel>("relu_grad", on_t(num), binary_op::relu_grad, false));
  r.add(def_with<binary_kernel>("mod", on_t(num), binary_op::mod, false));

  r.add(def_with<cast_kernel>("cast", on_t(all)));
  r.add(def_with<where_kernel>("where", on_t(all)));

  const auto any = type_constraint(all, "dtype");
  r.add(def_with<fill_kernel>("fill", any, std::optional<double>()));
  r.add(def_with<fill_kernel>("zeros", any, std::optional<double>(0.0)));
  r.add(def_with<fill_kernel>("ones", any, std::optional<double>(1.0)));
  r.add(def_with<range_kernel>("range", type_constraint(num, "dtype")));
}

}  // namespace loom::cuda
