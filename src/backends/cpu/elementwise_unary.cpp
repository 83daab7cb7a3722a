// CPU kernels of the unary element-wise ops: neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid,
// relu, gelu, erf, square, reciprocal, logical_not.
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
}

}  // namespace loom::cpu
