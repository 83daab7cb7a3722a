// CPU kernels of the binary element-wise ops, all with NumPy broadcasting: add, sub, mul,
// div, pow, maximum, minimum; the comparisons equal, not_equal, less, less_equal, greater,
// greater_equal (bool results); logical_and, logical_or; mod (attribute fmod).
//
// As in elementwise_unary.cpp, each op is a functor of elementwise_ops.hpp on one pair of
// elements in the compute type; binary_kernel<Op> dispatches on the dtype once per call
// (Note [element-wise iteration]).
#include "cpu_kernels.hpp"
#include "elementwise_kernels.hpp"
#include "elementwise_loop.hpp"
#include "elementwise_ops.hpp"

namespace loom::cpu {
namespace {

using namespace ew;

constexpr double cheap = 0.5;

template <class Op>
class binary_kernel final : public op_kernel {
 public:
  explicit binary_kernel(const kernel_construction& c) : op_kernel(c) {
    if constexpr (std::is_same_v<Op, mod_op>) op_.fmod = c.attr<bool>("fmod");
  }

  void compute(kernel_context& ctx) override {
    const dtype t = ctx.input(0).type();
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template supports<T>) {
        using R = std::conditional_t<Op::bool_out, bool, T>;
        if constexpr (divides && std::is_integral_v<T>) check_divisor<T>(ctx);
        run_binary<T, R>(ctx, op_, is_half_like<T> ? cheap + 2.0 : cost<T>());
      } else {
        ctx.fail("{} does not take {}", ctx.node().op(), to_string(t));
      }
    });
  }

 private:
  template <class T>
  static constexpr double cost() {
    if constexpr (std::is_same_v<Op, pow_op>) return 20.0;
    if constexpr (std::is_same_v<Op, mod_op>) return 4.0;
    if constexpr (std::is_same_v<Op, div_op> && std::is_integral_v<T>) return 3.0;
    return cheap;
  }

  // A zero divisor fails the node, unless the output is empty (then nothing is divided).
  template <class T>
  static void check_divisor(kernel_context& ctx) {
    const tensor& x = ctx.input(0);
    const tensor& y = ctx.input(1);
    const shape s = broadcast_shape_of(ctx, {&x.shape(), &y.shape()});
    if (s.num_elements() == 0) return;
    if (!all_of<T>(y, [](T v) { return v != T{0}; })) {
      ctx.fail("integer division by zero (divisor {})", y.describe());
    }
  }

  // div and mod: an integer divisor of 0 fails the node.
  static constexpr bool divides = std::is_same_v<Op, div_op> || std::is_same_v<Op, mod_op>;

  Op op_{};
};

template <class Op>
kernel_def binary_def(const char* op, std::vector<dtype> types) {
  auto constraints = types.empty() ? std::vector<std::pair<std::string, std::vector<dtype>>>{}
                                   : type_constraint(std::move(types));
  return make_kernel_def<binary_kernel<Op>>(op, device_type::cpu, std::move(constraints));
}

}  // namespace

void register_binary_kernels(kernel_registry& r) {
  const std::vector<dtype> fl{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
  const std::vector<dtype> num{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                               dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  std::vector<dtype> all = num;
  all.push_back(dtype::boolean);
  r.add(binary_def<add_op>("add", num));
  r.add(binary_def<sub_op>("sub", num));
  r.add(binary_def<mul_op>("mul", num));
  r.add(binary_def<div_op>("div", num));
  r.add(binary_def<pow_op>("pow", fl));
  r.add(binary_def<maximum_op>("maximum", num));
  r.add(binary_def<minimum_op>("minimum", num));
  r.add(binary_def<equal_op>("equal", all));
  r.add(binary_def<not_equal_op>("not_equal", all));
  r.add(binary_def<less_op>("less", num));
  r.add(binary_def<less_equal_op>("less_equal", num));
  r.add(binary_def<greater_op>("greater", num));
  r.add(binary_def<greater_equal_op>("greater_equal", num));
  r.add(binary_def<logical_and_op>("logical_and", {}));
  r.add(binary_def<logical_or_op>("logical_or", {}));
  r.add(binary_def<relu_grad_op>("relu_grad", num));
  r.add(binary_def<mod_op>("mod", num));
}

}  // namespace loom::cpu
