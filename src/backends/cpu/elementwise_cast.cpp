// CPU kernels of cast (any dtype to any dtype) and where (condition ? x : y, broadcasting).
#include "cpu_kernels.hpp"
#include "elementwise_kernels.hpp"
#include "elementwise_loop.hpp"
#include "elementwise_math.hpp"

namespace loom::cpu {
namespace {

using namespace ew;

// One element From -> To, in compute types (float16 and bfloat16 arrive and leave as float,
// so they round to nearest even through float). Float to integer truncates toward zero and
// saturates (NaN -> 0); integer to integer wraps; to bool is x != 0.
template <class From, class To>
struct cast_op {
  using in_t = compute_t<From>;
  using out_t = compute_t<To>;
  out_t operator()(in_t x) const noexcept {
    if constexpr (std::is_same_v<To, bool>) {
      return x != in_t{0};
    } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<in_t>) {
      return saturate_cast<To>(x);
    } else {
      return static_cast<out_t>(x);
    }
  }
};

class cast_kernel final : public op_kernel {
 public:
  explicit cast_kernel(const kernel_construction& c) : op_kernel(c), to_(c.attr<dtype>("to")) {}

  void compute(kernel_context& ctx) override {
    const dtype from = ctx.input(0).type();
    if (from == to_) {
      // Nothing to convert: the same tensor (a view is immutable to the kernels after it).
      ctx.set_output(0, ctx.input(0));
      return;
    }
    visit_dtype(from, [&](auto from_tag) {
      using From = decltype(from_tag);
      visit_dtype(to_, [&](auto to_tag) {
        using To = decltype(to_tag);
        const double cost = is_half_like<From> || is_half_like<To> ? 2.0 : 0.7;
        run_unary<From, To>(ctx, cast_op<From, To>{}, cost);
      });
    });
  }

 private:
  dtype to_;
};

// out[i] = c[i] ? x[i] : y[i] along one run.
template <class T>
void where_run(T* out, const bool* c, std::int64_t cs, const T* x, std::int64_t xs, const T* y,
               std::int64_t ys, std::int64_t n) {
  if (cs == 1 && xs == 1 && ys == 1) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = c[i] ? x[i] : y[i];
  } else if (cs == 0) {
    // One condition for the whole run: a copy from one side.
    const T* src = *c ? x : y;
    const std::int64_t ss = *c ? xs : ys;
    for (std::int64_t i = 0; i < n; ++i) out[i] = src[i * ss];
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = c[i * cs] ? x[i * xs] : y[i * ys];
  }
}

class where_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;

  void compute(kernel_context& ctx) override {
    const tensor& c = ctx.input(0);
    const tensor& x = ctx.input(1);
    const tensor& y = ctx.input(2);
    const shape s = broadcast_shape_of(ctx, {&c.shape(), &x.shape(), &y.shape()});
    tensor& z = forward_or_allocate(ctx, s, {1, 2});
    const std::int64_t count = s.num_elements();
    if (count == 0) return;
    // Dense operands of the output's size or single elements need no plan (the common
    // case: a mask against a tensor and a scalar).
    const std::int64_t cs = flat_stride(c, count);
    const std::int64_t xs = flat_stride(x, count);
    const std::int64_t ys = flat_stride(y, count);
    if (cs >= 0 && xs >= 0 && ys >= 0) {
      visit_dtype(x.type(), [&](auto tag) {
        using T = decltype(tag);
        T* out = z.template data<T>();
        const bool* cp = c.template data<bool>();
        const T* xp = x.template data<T>();
        const T* yp = y.template data<T>();
        ctx.parallel_for(count, 0.7, [&](std::int64_t begin, std::int64_t end) {
          where_run(out + begin, cp + begin * cs, cs, xp + begin * xs, xs, yp + begin * ys, ys,
                    end - begin);
        });
      });
      return;
    }
    const auto p = make_plan<4>(s, {&c, &x, &y});
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      T* out = z.template data<T>();
      const bool* cp = c.template data<bool>();
      const T* xp = x.template data<T>();
      const T* yp = y.template data<T>();
      ctx.parallel_for(p.count, 0.7, [&](std::int64_t begin, std::int64_t end) {
        for_each_run(p, begin, end, [&](const std::array<std::int64_t, 4>& off, std::int64_t n) {
          where_run(out + off[0], cp + off[1], p.inner[1], xp + off[2], p.inner[2], yp + off[3],
                    p.inner[3], n);
        });
      });
    });
  }
};

}  // namespace

void register_cast_kernels(kernel_registry& r) {
  r.add(make_kernel_def<cast_kernel>("cast", device_type::cpu, type_constraint(all_types())));
  r.add(make_kernel_def<where_kernel>("where", device_type::cpu, type_constraint(all_types())));
}

}  // namespace loom::cpu
