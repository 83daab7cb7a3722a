// The CPU kernel of resize (ONNX Resize, nearest, linear and cubic, tf_crop_and_resize's
// extrapolation too; op in
// src/graph/ops/nn_resize_ops.cpp, rules and coordinate arithmetic in
// loom/graph/ops/nn_rules.hpp). Both modes are separable: the kernel resizes one dimension
// at a time, in double, over x seen as [outer, in, inner] around that dimension, skipping
// the dimensions whose transformation maps every index onto itself (ONNX transforms every
// dimension: tf_half_pixel_for_nearest with ceil rounding moves even an unscaled one); the
// output is rounded into its type at the end.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "kernel/common/apply_rule.hpp"
#include "nn_kernels.hpp"

namespace loom::cpu {
namespace {

using nn_rules::resize_mode;

// Where output index o along one dimension reads: up to 4 input indices and their weights
// (none: the output is extrapolation_value, tf_crop_and_resize outside x).
struct taps {
  std::array<std::int64_t, 4> i{};
  std::array<double, 4> w{};
  int n = 0;
};

// ONNX's cubic convolution weights of the 4 taps around a coordinate whose distance from the
// second tap is t (in (0, 1]).
std::array<double, 4> cubic_weights(double t, double a) {
  const auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };  // 1 < d < 2
  const auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };       // d <= 1
  return {far(t + 1), near(t), near(1 - t), far(2 - t)};
}

std::vector<taps> taps_of(const nn_rules::resize_params& p, std::size_t d, std::int64_t in,
                          std::int64_t out) {
  const double scale = nn_rules::resize_scale(p, d, in, out);
  std::vector<taps> t(static_cast<std::size_t>(out));
  const auto clamp = [in](std::int64_t i) { return std::clamp<std::int64_t>(i, 0, in - 1); };
  const bool crop = p.coord == nn_rules::resize_coord::tf_crop_and_resize;
  const std::size_t rank = p.roi.size() / 2;
  for (std::int64_t o = 0; o < out; ++o) {
    const double x = crop ? nn_rules::resize_crop_source(o, in, out, p.roi[d], p.roi[rank + d])
                          : nn_rules::resize_source(p.coord, o, in, scale);
    taps& tp = t[static_cast<std::size_t>(o)];
    if (crop && (x < 0.0 || x > static_cast<double>(in - 1))) continue;  // n = 0
    if (p.mode == resize_mode::nearest) {
      tp.i[0] = nn_rules::resize_nearest_index(p.rounding, x, in);
      tp.w[0] = 1.0;
      tp.n = 1;
      continue;
    }
    // The tap left of x and the fraction past it; an integral x counts as the right end of
    // the interval before it (fraction 1), as ONNX's reference picks neighbours.
    double f = std::floor(x);
    double frac = x - f;
    std::array<double, 4> w{};
    std::int64_t first = 0;
    if (p.mode == resize_mode::linear) {
      if (frac == 0.0 && p.exclude_outside) {
        f -= 1;
        frac = 1.0;
      }
      w = {1.0 - frac, frac, 0.0, 0.0};
      tp.n = 2;
      first = static_cast<std::int64_t>(f);
    } else {
      if (frac == 0.0) {
        f -= 1;
        frac = 1.0;
      }
      w = cubic_weights(frac, p.cubic_coeff_a);
      tp.n = 4;
      first = static_cast<std::int64_t>(f) - 1;
    }
    double sum = 0;
    for (int k = 0; k < tp.n; ++k) {
      const std::int64_t idx = first + k;
      if (p.exclude_outside && (idx < 0 || idx >= in)) w[static_cast<std::size_t>(k)] = 0.0;
      sum += w[static_cast<std::size_t>(k)];
      tp.i[static_cast<std::size_t>(k)] = clamp(idx);
    }
    for (int k = 0; k < tp.n; ++k) {
      tp.w[static_cast<std::size_t>(k)] = p.exclude_outside ? w[static_cast<std::size_t>(k)] / sum : w[static_cast<std::size_t>(k)];
    }
  }
  return t;
}

// Whether taps `t` copy a dimension of `in` elements unchanged.
bool is_identity(const std::vector<taps>& t, std::int64_t in) {
  if (static_cast<std::int64_t>(t.size()) != in) return false;
  for (std::size_t o = 0; o < t.size(); ++o) {
    const taps& tp = t[o];
    if (tp.n == 0) return false;
    for (int k = 0; k < tp.n; ++k) {
      const bool on = tp.i[static_cast<std::size_t>(k)] == static_cast<std::int64_t>(o);
      if (tp.w[static_cast<std::size_t>(k)] != (on ? 1.0 : 0.0) && !(on && tp.n > 1 && tp.w[static_cast<std::size_t>(k)] == 1.0)) {
        return false;
      }
    }
  }
  return true;
}

class resize_kernel final : public op_kernel {
 public:
  explicit resize_kernel(const kernel_construction& c)
      : op_kernel(c),
        params_(nn_rules::resize_params_of(
            c.attr<std::string>("mode"), c.attr<std::string>("coordinate_transformation_mode"),
            c.attr<std::string>("nearest_mode"), c.attr<std::vector<std::int64_t>>("sizes"),
            c.attr<std::vector<double>>("scales"))) {
    params_.cubic_coeff_a = c.attr<double>("cubic_coeff_a");
    params_.exclude_outside = c.attr<bool>("exclude_outside");
    params_.roi = c.attr<std::vector<double>>("roi");
    params_.extrapolation_value = c.attr<double>("extrapolation_value");
  }

  void compute(kernel_context& ctx) override {
    const shape xs = ctx.input(0).shape();
    const shape ys = common::apply_rule(ctx, [&] { return nn_rules::resize_output(xs, params_); });
    tensor& y = ctx.allocate_output(0, ys);
    if (y.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    nn_detail::visit_float_type(ctx, x.type(), "resize", [&](auto tag) {
      using T = decltype(tag);
      const T* xp = x.data<T>();
      std::vector<double> cur(static_cast<std::size_t>(x.num_elements()));
      for (std::size_t i = 0; i < cur.size(); ++i) cur[i] = nn_detail::widen(xp[i]);
      shape cs = xs;
      for (std::size_t d = 0; d < xs.rank(); ++d) {
        const std::int64_t in = cs[d];
        const std::int64_t out = ys[d];
        const std::vector<taps> t = taps_of(params_, d, in, out);
        if (is_identity(t, in)) continue;
        std::int64_t outer = 1;
        std::int64_t inner = 1;
        for (std::size_t k = 0; k < d; ++k) outer *= cs[k];
        for (std::size_t k = d + 1; k < cs.rank(); ++k) inner *= cs[k];
        std::vector<double> next(static_cast<std::size_t>(outer * out * inner));
        ctx.parallel_for(outer * out, static_cast<double>(inner) + 1.0,
                         [&](std::int64_t lo, std::int64_t hi) {
                           for (std::int64_t r = lo; r < hi; ++r) {
                             const std::int64_t q = r / out;
                             const taps& tp = t[static_cast<std::size_t>(r % out)];
                             double* dst = next.data() + r * inner;
                             if (tp.n == 0) {
                               std::fill_n(dst, inner, params_.extrapolation_value);
                               continue;
                             }
                             const double* s0 = cur.data() + (q * in + tp.i[0]) * inner;
                             if (tp.n == 1 || (tp.n == 2 && tp.w[1] == 0.0)) {
                               std::copy_n(s0, inner, dst);
                               continue;
                             }
                             for (std::int64_t i = 0; i < inner; ++i) dst[i] = tp.w[0] * s0[i];
                             for (int k = 1; k < tp.n; ++k) {
                               const double* sk = cur.data() + (q * in + tp.i[static_cast<std::size_t>(k)]) * inner;
                               const double wk = tp.w[static_cast<std::size_t>(k)];
                               for (std::int64_t i = 0; i < inner; ++i) dst[i] += wk * sk[i];
                             }
                           }
                         });
        cur = std::move(next);
        cs[d] = out;
      }
      T* yp = y.data<T>();
      for (std::size_t i = 0; i < cur.size(); ++i) {
        yp[i] = nn_detail::narrow<T>(static_cast<nn_detail::acc_t<T>>(cur[i]));
      }
    });
  }

 private:
  nn_rules::resize_params params_;
};

}  // namespace

void register_nn_resize_kernels(kernel_registry& r) {
  r.add(make_kernel_def<resize_kernel>("resize", device_type::cpu));
}

}  // namespace loom::cpu
