// CPU kernels of the binary element-wise ops, all with NumPy broadcasting: add, sub, mul,
// div, pow, maximum, minimum; the comparisons equal, not_equal, less, less_equal, greater,
// greater_equal (bool results); logical_and, logical_or.
//
// As in elementwise_unary.cpp, each op is a functor on one pair of elements in the compute
// type; binary_kernel<Op> dispatches on the dtype once per call (Note [element-wise
// iteration]).
#include <cmath>

#include "cpu_kernels.hpp"
#include "elementwise_kernels.hpp"
#include "elementwise_loop.hpp"
#include "elementwise_math.hpp"

namespace loom::cpu {
namespace {

using namespace ew;

template <class T>
inline constexpr bool is_float = std::is_floating_point_v<T> || is_half_like<T>;
template <class T>
inline constexpr bool is_number = !std::is_same_v<T, bool>;

constexpr double cheap = 0.5;

struct add_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return wrap_add(a, b);
    } else {
      return a + b;
    }
  }
};

struct sub_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return wrap_sub(a, b);
    } else {
      return a - b;
    }
  }
};

struct mul_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      return wrap_mul(a, b);
    } else {
      return a * b;
    }
  }
};

// Integer division truncates toward zero, as C's does. A zero divisor is caught before the
// loop (div_kernel); the guards here only keep the loop free of undefined behaviour:
// INT_MIN / -1 wraps to INT_MIN.
struct div_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) return C{0};
      if constexpr (std::is_signed_v<C>) {
        if (b == C{-1}) return wrap_neg(a);
      }
      return static_cast<C>(a / b);
    } else {
      return a / b;
    }
  }
};

struct pow_op {
  template <class T>
  static constexpr bool supports = is_float<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    return std::pow(a, b);
  }
};

// NumPy's maximum / minimum: NaN on either side gives NaN.
struct maximum_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_floating_point_v<C>) {
      return ((a > b) | (a != a)) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

struct minimum_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C a, C b) const noexcept {
    if constexpr (std::is_floating_point_v<C>) {
      return ((a < b) | (a != a)) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

#define LOOM_COMPARISON(name, expr, types)     \
  struct name {                                \
    template <class T>                         \
    static constexpr bool supports = types;    \
    static constexpr bool bool_out = true;     \
    template <class C>                         \
    bool operator()(C a, C b) const noexcept { \
      return expr;                             \
    }                                          \
  };
LOOM_COMPARISON(equal_op, a == b, true)
LOOM_COMPARISON(not_equal_op, a != b, true)
LOOM_COMPARISON(less_op, a < b, is_number<T>)
LOOM_COMPARISON(less_equal_op, a <= b, is_number<T>)
LOOM_COMPARISON(greater_op, a > b, is_number<T>)
LOOM_COMPARISON(greater_equal_op, a >= b, is_number<T>)
LOOM_COMPARISON(logical_and_op, (a & b) != 0, (std::is_same_v<T, bool>))
LOOM_COMPARISON(logical_or_op, (a | b) != 0, (std::is_same_v<T, bool>))
#undef LOOM_COMPARISON

// relu's gradient from its output: dy where y > 0, else 0 (one pass, where the composed
// form would be greater + where).
struct relu_grad_op {
  template <class T>
  static constexpr bool supports = is_number<T>;
  static constexpr bool bool_out = false;
  template <class C>
  C operator()(C dy, C y) const noexcept {
    return y > C{0} ? dy : C{0};
  }
};

template <class Op>
class binary_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;

  void compute(kernel_context& ctx) override {
    const dtype t = ctx.input(0).type();
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Op::template supports<T>) {
        using R = std::conditional_t<Op::bool_out, bool, T>;
        if constexpr (std::is_same_v<Op, div_op> && std::is_integral_v<T>) {
          check_divisor<T>(ctx);
        }
        run_binary<T, R>(ctx, Op{}, is_half_like<T> ? cheap + 2.0 : cost<T>());
      } else {
        ctx.fail("{} does not take {}", ctx.node().op(), to_string(t));
      }
    });
  }

 private:
  template <class T>
  static constexpr double cost() {
    if constexpr (std::is_same_v<Op, pow_op>) return 20.0;
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
}

}  // namespace loom::cpu
