// CPU kernels of the generators: fill, zeros, ones, range, dynamic_range, random_uniform,
// random_normal, random_uniform_per_run, random_normal_per_run.
//
// Note [reproducible random numbers]
// random_uniform and random_normal draw from Philox4x32-10 (elementwise_philox.hpp) keyed by
// the node's seed, and the value of element i depends on nothing but the seed and i: for
// float32, float16 and bfloat16 it comes from word i % 4 of block i / 4 (a normal from the
// Box-Muller pair of words 0,1 or 2,3 of that block); for float64 from words 2(i % 2) and
// 2(i % 2) + 1 of block i / 2 (a normal from the pair of 64-bit halves of the block). So a
// run gives the same values every time, on any number of threads, and a larger tensor with
// the same seed starts with the values of a smaller one. Box-Muller is computed in double;
// uniform values that round up to maxval in the output dtype step down to the largest value
// below it, so the results stay in [minval, maxval).
// random_uniform_per_run and random_normal_per_run (stateful) draw anew on every run: run k
// of the kernel (from 0, one count per run of its plan) reads the blocks of Philox stream k
// (the counter's upper half), so run 0 gives what the plain op gives, and a session's
// sequence of runs is reproducible from the seed. What dropout's mask needs in training.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>

#include "cpu_kernels.hpp"
#include "kernel/common/apply_rule.hpp"
#include "loom/graph/ops/math_rules.hpp"
#include "elementwise_kernels.hpp"
#include "elementwise_loop.hpp"
#include "elementwise_math.hpp"
#include "elementwise_philox.hpp"

namespace loom::cpu {
namespace {

using namespace ew;

// ---- fill, zeros, ones ------------------------------------------------------------------------

class fill_kernel final : public op_kernel {
 public:
  // `value`: zeros' and ones' value; fill's comes from its attribute.
  fill_kernel(const kernel_construction& c, std::optional<double> value)
      : op_kernel(c),
        type_(c.attr<dtype>("dtype")),
        shape_(generator_shape(c)),
        value_(value ? *value : c.attr<double>("value")) {}

  void compute(kernel_context& ctx) override {
    tensor& out = ctx.allocate_output(0, type_, shape_);
    visit_dtype(type_, [&](auto tag) {
      using T = decltype(tag);
      const T v = from_double<T>(value_);
      T* p = out.template data<T>();
      ctx.parallel_for(out.num_elements(), 0.1, [&](std::int64_t begin, std::int64_t end) {
        std::fill(p + begin, p + end, v);
      });
    });
  }

 private:
  dtype type_;
  shape shape_;
  double value_;
};

// ---- range
// ---------------------------------------------------------------------------------------

class range_kernel final : public op_kernel {
 public:
  explicit range_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("dtype")),
        shape_(generator_shape(c)),
        start_(c.attr<double>("start")),
        delta_(c.attr<double>("delta")) {}

  void compute(kernel_context& ctx) override {
    tensor& out = ctx.allocate_output(0, type_, shape_);
    visit_dtype(type_, [&](auto tag) {
      using T = decltype(tag);
      T* p = out.template data<T>();
      ctx.parallel_for(out.num_elements(), 0.5, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) {
          p[i] = from_double<T>(start_ + static_cast<double>(i) * delta_);
        }
      });
    });
  }

 private:
  dtype type_;
  shape shape_;
  double start_;
  double delta_;
};

// dynamic_range: range's elements, the bounds read from the inputs on each run.
class dynamic_range_kernel final : public op_kernel {
 public:
  explicit dynamic_range_kernel(const kernel_construction& c)
      : op_kernel(c), type_(c.attr<dtype>("T")) {}

  void compute(kernel_context& ctx) override {
    double bound[3];
    static constexpr const char* names[] = {"start", "limit", "delta"};
    for (std::size_t i = 0; i < 3; ++i) {
      const tensor& t = ctx.input(i);
      if (t.num_elements() != 1) {
        ctx.fail("{} must be one number, got {}", names[i], t.describe());
      }
      const tensor d = ctx.input_contiguous(i);
      visit_dtype(type_, [&](auto tag) {
        using T = decltype(tag);
        bound[i] = static_cast<double>(load(d.template data<T>()[0]));
      });
    }
    const std::int64_t n = common::apply_rule(
        ctx, [&] { return math_rules::range_length(bound[0], bound[1], bound[2]); });
    tensor& out = ctx.allocate_output(0, type_, shape{n});
    visit_dtype(type_, [&](auto tag) {
      using T = decltype(tag);
      T* p = out.template data<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        p[i] = from_double<T>(bound[0] + static_cast<double>(i) * bound[2]);
      }
    });
  }

 private:
  dtype type_;
};

// ---- random ----------------------------------------------------------------------------------

// The largest T below v (v finite).
template <class T>
T next_below(T v) {
  if constexpr (is_half_like<T>) {
    // Sign-magnitude bits: toward -inf is one step down in magnitude for positives, one step
    // up for negatives; below +-0 is the smallest negative subnormal.
    const float f = static_cast<float>(v);
    std::uint16_t bits = v.bits;
    if (f > 0.0f) {
      --bits;
    } else if (f == 0.0f) {
      bits = 0x8001;
    } else {
      ++bits;
    }
    return T::from_bits(bits);
  } else {
    return std::nextafter(v, -std::numeric_limits<T>::infinity());
  }
}

// Elements per Philox block: four for 32-bit resolution (float32 and the 16-bit types), two
// for float64 (Note [reproducible random numbers]).
template <class T>
inline constexpr int lanes = std::is_same_v<T, double> ? 2 : 4;

// The block's `lanes<T>` uniform values in [0, 1), as double.
template <class T>
std::array<double, 4> uniforms(const philox_block& w) {
  if constexpr (lanes<T> == 2) {
    return {uniform_double(w[0], w[1]), uniform_double(w[2], w[3]), 0.0, 0.0};
  } else {
    return {uniform_float(w[0]), uniform_float(w[1]), uniform_float(w[2]), uniform_float(w[3])};
  }
}

// The block's `lanes<T>` standard normal values (Box-Muller on pairs of uniforms; the first
// of each pair is taken in (0, 1] so its logarithm is finite).
template <class T>
std::array<double, 4> normals(const philox_block& w) {
  constexpr double two_pi = 2.0 * std::numbers::pi;
  auto pair = [&](double u1, double u2, double* z) {
    const double r = std::sqrt(-2.0 * std::log(u1));
    z[0] = r * std::cos(two_pi * u2);
    z[1] = r * std::sin(two_pi * u2);
  };
  std::array<double, 4> z{};
  if constexpr (lanes<T> == 2) {
    pair(1.0 - uniform_double(w[0], w[1]), uniform_double(w[2], w[3]), z.data());
  } else {
    constexpr double scale = 0x1.0p-32;
    pair((static_cast<double>(w[0]) + 1.0) * scale, static_cast<double>(w[1]) * scale, z.data());
    pair((static_cast<double>(w[2]) + 1.0) * scale, static_cast<double>(w[3]) * scale,
         z.data() + 2);
  }
  return z;
}

template <bool Normal, bool PerRun = false>
class random_kernel final : public op_kernel {
 public:
  explicit random_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("dtype")),
        shape_(generator_shape(c)),
        seed_(static_cast<std::uint64_t>(c.attr<std::int64_t>("seed"))),
        a_(c.attr<double>(Normal ? "mean" : "minval")),
        b_(c.attr<double>(Normal ? "stddev" : "maxval")) {}

  void compute(kernel_context& ctx) override {
    tensor& out = ctx.allocate_output(0, type_, shape_);
    const std::uint64_t stream = PerRun ? runs_.fetch_add(1, std::memory_order_relaxed) : 0;
    visit_dtype(type_, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T> || is_half_like<T>) {
        generate<T>(ctx, out.template data<T>(), out.num_elements(), stream);
      } else {
        ctx.fail("{} does not make {}", ctx.node().op(), to_string(type_));
      }
    });
  }

 private:
  template <class T>
  void generate(kernel_context& ctx, T* out, std::int64_t n, std::uint64_t stream) const {
    constexpr int l = lanes<T>;
    const std::int64_t blocks = (n + l - 1) / l;
    const T hi = store<T>(static_cast<compute_t<T>>(b_));
    const T below_hi = std::max(next_below(hi), store<T>(static_cast<compute_t<T>>(a_)),
                                [](T x, T y) { return load(x) < load(y); });
    ctx.parallel_for(blocks, Normal ? 40.0 : 10.0, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t blk = begin; blk < end; ++blk) {
        const philox_block w = philox_at(seed_, static_cast<std::uint64_t>(blk), stream);
        const auto v = Normal ? normals<T>(w) : uniforms<T>(w);
        const std::int64_t first = blk * l;
        const int count = static_cast<int>(std::min<std::int64_t>(l, n - first));
        for (int j = 0; j < count; ++j) {
          if constexpr (Normal) {
            out[first + j] = store<T>(static_cast<compute_t<T>>(a_ + b_ * v[j]));
          } else {
            T x = store<T>(static_cast<compute_t<T>>(a_ + (b_ - a_) * v[j]));
            if (b_ > a_ && !(load(x) < load(hi))) x = below_hi;
            out[first + j] = x;
          }
        }
      }
    });
  }

  dtype type_;
  shape shape_;
  std::uint64_t seed_;
  double a_;  // mean or minval
  double b_;  // stddev or maxval
  std::atomic<std::uint64_t> runs_{0};  // PerRun: the runs so far
};

}  // namespace

void register_generator_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types(), "dtype");
  r.add(make_kernel_def_with<fill_kernel>("fill", any, std::optional<double>()));
  r.add(make_kernel_def_with<fill_kernel>("zeros", any, std::optional<double>(0.0)));
  r.add(make_kernel_def_with<fill_kernel>("ones", any, std::optional<double>(1.0)));
  r.add(make_kernel_def<range_kernel>("range", device_type::cpu,
                                      type_constraint(numeric_types(), "dtype")));
  r.add(make_kernel_def<dynamic_range_kernel>("dynamic_range", device_type::cpu,
                                              type_constraint(numeric_types())));
  r.add(make_kernel_def<random_kernel<false>>("random_uniform", device_type::cpu,
                                              type_constraint(float_types(), "dtype")));
  r.add(make_kernel_def<random_kernel<true>>("random_normal", device_type::cpu,
                                             type_constraint(float_types(), "dtype")));
  r.add(make_kernel_def<random_kernel<false, true>>("random_uniform_per_run", device_type::cpu,
                                                    type_constraint(float_types(), "dtype")));
  r.add(make_kernel_def<random_kernel<true, true>>("random_normal_per_run", device_type::cpu,
                                                   type_constraint(float_types(), "dtype")));
}

}  // namespace loom::cpu
