// The CPU kernel of resize (ONNX Resize, nearest and linear; op in
// src/graph/ops/nn_resize_ops.cpp, rules and coordinate arithmetic in
// loom/graph/ops/nn_rules.hpp). Both modes are separable: the kernel resizes one dimension
// at a time, in double, over x seen as [outer, in, inner] around that dimension, skipping
// the dimensions whose transformation maps every index onto itself (ONNX transforms every
// dimension: tf_half_pixel_for_nearest with ceil rounding moves even an unscaled one); the
// output is rounded into its type at the end.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernel/common/apply_rule.hpp"
#include "nn_kernels.hpp"

namespace loom::cpu {
namespace {

using nn_rules::resize_mode;

// Where output index o along one dimension reads: index a with weight 1 - w and b with w.
struct taps {
  std::int64_t a;
  std::int64_t b;
  double w;
};

std::vector<taps> taps_of(const nn_rules::resize_params& p, std::size_t d, std::int64_t in,
                          std::int64_t out) {
  const double scale = nn_rules::resize_scale(p, d, in, out);
  std::vector<taps> t(static_cast<std::size_t>(out));
  for (std::int64_t o = 0; o < out; ++o) {
    const double x = nn_rules::resize_source(p.coord, o, in, scale);
    if (p.mode == resize_mode::nearest) {
      const std::int64_t i = nn_rules::resize_nearest_index(p.rounding, x, in);
      t[static_cast<std::size_t>(o)] = {i, i, 0.0};
      continue;
    }
    const double f = std::floor(x);
    const auto clamp = [in](double i) {
      return static_cast<std::int64_t>(std::clamp(i, 0.0, static_cast<double>(in - 1)));
    };
    t[static_cast<std::size_t>(o)] = {clamp(f), clamp(f + 1.0), x - f};
  }
  return t;
}

// Whether taps `t` copy a dimension of `in` elements unchanged.
bool is_identity(const std::vector<taps>& t, std::int64_t in) {
  if (static_cast<std::int64_t>(t.size()) != in) return false;
  for (std::size_t o = 0; o < t.size(); ++o) {
    if (t[o].a != static_cast<std::int64_t>(o) || t[o].w != 0.0) return false;
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
            c.attr<std::vector<double>>("scales"))) {}

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
                             const double* sa = cur.data() + (q * in + tp.a) * inner;
                             const double* sb = cur.data() + (q * in + tp.b) * inner;
                             double* dst = next.data() + r * inner;
                             if (tp.w == 0.0) {
                               std::copy_n(sa, inner, dst);
                             } else {
                               for (std::int64_t i = 0; i < inner; ++i) {
                                 dst[i] = (1.0 - tp.w) * sa[i] + tp.w * sb[i];
                               }
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
