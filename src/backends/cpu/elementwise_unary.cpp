// CPU kernels of the unary element-wise ops: neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid,
// relu, gelu, erf, square, reciprocal, logical_not; the trigonometric and hyperbolic functions
// and their inverses, log1p, expm1, floor, ceil, round, sign; the activations softplus,
// softsign, silu, mish, hard_swish and, with attributes, elu, selu, celu, leaky_relu,
// hard_sigmoid, thresholded_relu; the predicates isnan, isinf, isfinite (bool results).
//
// Each op is a functor of elementwise_ops.hpp computing one element in its compute type
// (float for float16 and bfloat16, see Note [element-wise iteration]); unary_kernel<Op>
// dispatches on the dtype once per call and runs the functor over the tensor, in place when
// the input's buffer is the node's alone.
#include "cpu_kernels.hpp"
#include "elementwise_kernels.hpp"
#include "elementwise_loop.hpp"
#include "elementwise_ops.hpp"

namespace loom::cpu {
namespace {

using namespace ew;

// Approximate cost of one element in nanoseconds, for splitting work across threads.
constexpr double cheap = 0.5;
constexpr double transcendental = 4.0;
constexpr double libm = 15.0;

// Runs `op` over input 0 for its dtype (T), or fails for a dtype the op does not take
// (the registry's constraints keep such nodes away; a hand-made node could still ask).
template <class Op>
void dispatch_unary(kernel_context& ctx, const Op& op, double cost) {
  const dtype t = ctx.input(0).type();
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (Op::template supports<T>) {
      run_unary<T, T>(ctx, op, is_half_like<T> ? cost + 2.0 : cost);
    } else {
      ctx.fail("{} does not take {}", ctx.node().op(), to_string(t));
    }
  });
}

template <class Op>
class unary_kernel final : public op_kernel {
 public:
  unary_kernel(const kernel_construction& c, double cost) : op_kernel(c), cost_(cost) {}
  void compute(kernel_context& ctx) override { dispatch_unary(ctx, Op{}, cost_); }

 private:
  double cost_;
};

class gelu_kernel final : public op_kernel {
 public:
  explicit gelu_kernel(const kernel_construction& c)
      : op_kernel(c), tanh_(c.attr<std::string>("approximate") == "tanh") {}
  void compute(kernel_context& ctx) override {
    if (tanh_) {
      dispatch_unary(ctx, gelu_tanh_op{}, transcendental);
    } else {
      dispatch_unary(ctx, gelu_erf_op{}, libm);
    }
  }

 private:
  bool tanh_;
};

// The ops whose functor holds attribute values (make_op reads them from the node).
template <class Op, Op (*make_op)(const kernel_construction&)>
class attr_unary_kernel final : public op_kernel {
 public:
  attr_unary_kernel(const kernel_construction& c, double cost)
      : op_kernel(c), op_(make_op(c)), cost_(cost) {}
  void compute(kernel_context& ctx) override { dispatch_unary(ctx, op_, cost_); }

 private:
  Op op_;
  double cost_;
};

double real_attr(const kernel_construction& c, const char* name) {
  return c.attr<double>(name);
}
exp_linear_op make_elu(const kernel_construction& c) {
  return {.alpha = real_attr(c, "alpha")};
}
exp_linear_op make_selu(const kernel_construction& c) {
  return {.alpha = real_attr(c, "alpha"), .gamma = real_attr(c, "gamma")};
}
exp_linear_op make_celu(const kernel_construction& c) {
  const double alpha = real_attr(c, "alpha");
  return {.alpha = alpha, .beta = alpha};
}
leaky_relu_op make_leaky_relu(const kernel_construction& c) {
  return {{real_attr(c, "alpha")}};
}
hard_sigmoid_op make_hard_sigmoid(const kernel_construction& c) {
  return {{real_attr(c, "alpha"), real_attr(c, "beta")}};
}
thresholded_relu_op make_thresholded_relu(const kernel_construction& c) {
  return {{real_attr(c, "alpha")}};
}

template <class Op, Op (*make_op)(const kernel_construction&)>
kernel_def attr_unary_def(const char* op, std::vector<dtype> types, double cost) {
  return make_kernel_def_with<attr_unary_kernel<Op, make_op>>(op, type_constraint(std::move(types)),
                                                              cost);
}

// isnan, isinf, isfinite: a float x in, a bool out.
class predicate_kernel final : public op_kernel {
 public:
  predicate_kernel(const kernel_construction& c, int which) : op_kernel(c), which_(which) {
    if (which_ == 1) {
      isinf_.positive = c.attr<bool>("detect_positive");
      isinf_.negative = c.attr<bool>("detect_negative");
    }
  }
  void compute(kernel_context& ctx) override {
    const dtype t = ctx.input(0).type();
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (is_float<T>) {
        if (which_ == 0) {
          run_unary<T, bool>(ctx, isnan_op{}, cheap);
        } else if (which_ == 1) {
          run_unary<T, bool>(ctx, isinf_, cheap);
        } else {
          run_unary<T, bool>(ctx, isfinite_op{}, cheap);
        }
      } else {
        ctx.fail("{} does not take {}", ctx.node().op(), to_string(t));
      }
    });
  }

 private:
  int which_;  // 0 isnan, 1 isinf, 2 isfinite
  isinf_op isinf_{};
};

template <class Op>
kernel_def unary_def(const char* op, std::vector<dtype> types, double cost) {
  // logical_not has no type attribute to constrain.
  auto constraints = types.empty() ? std::vector<std::pair<std::string, std::vector<dtype>>>{}
                                   : type_constraint(std::move(types));
  return make_kernel_def_with<unary_kernel<Op>>(op, std::move(constraints), cost);
}

}  // namespace

void register_unary_kernels(kernel_registry& r) {
  const std::vector<dtype> fl{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
  const std::vector<dtype> sig{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                               dtype::i32, dtype::i64, dtype::i8};
  const std::vector<dtype> num{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                               dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  r.add(unary_def<neg_op>("neg", sig, cheap));
  r.add(unary_def<abs_op>("abs", sig, cheap));
  r.add(unary_def<exp_op>("exp", fl, transcendental));
  r.add(unary_def<log_op>("log", fl, libm));
  r.add(unary_def<sqrt_op>("sqrt", fl, transcendental));
  r.add(unary_def<rsqrt_op>("rsqrt", fl, transcendental));
  r.add(unary_def<tanh_op>("tanh", fl, transcendental));
  r.add(unary_def<sigmoid_op>("sigmoid", fl, transcendental));
  r.add(unary_def<relu_op>("relu", num, cheap));
  r.add(make_kernel_def<gelu_kernel>("gelu", device_type::cpu, type_constraint(fl)));
  r.add(unary_def<erf_op>("erf", fl, libm));
  r.add(unary_def<square_op>("square", sig, cheap));
  r.add(unary_def<reciprocal_op>("reciprocal", fl, cheap));
  r.add(unary_def<logical_not_op>("logical_not", {}, cheap));

  r.add(unary_def<sin_op>("sin", fl, libm));
  r.add(unary_def<cos_op>("cos", fl, libm));
  r.add(unary_def<tan_op>("tan", fl, libm));
  r.add(unary_def<asin_op>("asin", fl, libm));
  r.add(unary_def<acos_op>("acos", fl, libm));
  r.add(unary_def<atan_op>("atan", fl, libm));
  r.add(unary_def<sinh_op>("sinh", fl, libm));
  r.add(unary_def<cosh_op>("cosh", fl, libm));
  r.add(unary_def<asinh_op>("asinh", fl, libm));
  r.add(unary_def<acosh_op>("acosh", fl, libm));
  r.add(unary_def<atanh_op>("atanh", fl, libm));
  r.add(unary_def<log1p_op>("log1p", fl, libm));
  r.add(unary_def<expm1_op>("expm1", fl, libm));
  r.add(unary_def<floor_op>("floor", fl, cheap));
  r.add(unary_def<ceil_op>("ceil", fl, cheap));
  r.add(unary_def<round_op>("round", fl, cheap));
  r.add(unary_def<sign_op>("sign", sig, cheap));
  r.add(unary_def<softplus_op>("softplus", fl, libm));
  r.add(unary_def<softsign_op>("softsign", fl, cheap));
  r.add(unary_def<silu_op>("silu", fl, transcendental));
  r.add(unary_def<mish_op>("mish", fl, libm));
  r.add(unary_def<hard_swish_op>("hard_swish", fl, cheap));
  r.add(attr_unary_def<exp_linear_op, make_elu>("elu", fl, libm));
  r.add(attr_unary_def<exp_linear_op, make_selu>("selu", fl, libm));
  r.add(attr_unary_def<exp_linear_op, make_celu>("celu", fl, libm));
  r.add(attr_unary_def<leaky_relu_op, make_leaky_relu>("leaky_relu", fl, cheap));
  r.add(attr_unary_def<hard_sigmoid_op, make_hard_sigmoid>("hard_sigmoid", fl, cheap));
  r.add(attr_unary_def<thresholded_relu_op, make_thresholded_relu>("thresholded_relu", fl, cheap));
  r.add(make_kernel_def_with<predicate_kernel>("isnan", type_constraint(fl), 0));
  r.add(make_kernel_def_with<predicate_kernel>("isinf", type_constraint(fl), 1));
  r.add(make_kernel_def_with<predicate_kernel>("isfinite", type_constraint(fl), 2));
}

}  // namespace loom::cpu
