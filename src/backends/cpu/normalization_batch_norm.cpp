// The CPU kernel of batch_norm (op in src/graph/ops/normalization_ops.cpp, shape rule
// normalization_rules::batch_norm_geometry_of): x seen as [outer, channels, inner], one pass
// y = x · a[c] + b[c] with a = scale / sqrt(var + epsilon) and b = bias - mean · a computed
// once per channel in double and used in the compute type (float for f32/f16/bf16).
#include <cmath>
#include <vector>

#include "kernel/common/normalization_helpers.hpp"
#include "reduction_common.hpp"

namespace loom::cpu {

void register_batch_norm_kernels(kernel_registry& registry);

namespace {

using namespace reduction;

class batch_norm_kernel final : public op_kernel {
 public:
  explicit batch_norm_kernel(const kernel_construction& c)
      : op_kernel(c), eps_(c.attr<double>("epsilon")) {}

  void compute(kernel_context& ctx) override {
    const normalization_rules::batch_norm_geometry g = common::batch_norm_geometry(ctx);
    const common::batch_norm_tensors io(ctx);
    const tensor& x = io.x;
    tensor& y = io.y;
    if (x.num_elements() == 0) return;
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (float_type_v<T>) {
        using C = compute_t<T>;
        std::vector<C> a(static_cast<std::size_t>(g.channels));
        std::vector<C> b(a.size());
        for (std::int64_t c = 0; c < g.channels; ++c) {
          const double ac = static_cast<double>(load(io.scale.data<T>()[c])) /
                            std::sqrt(static_cast<double>(load(io.var.data<T>()[c])) + eps_);
          a[static_cast<std::size_t>(c)] = static_cast<C>(ac);
          b[static_cast<std::size_t>(c)] = static_cast<C>(
              static_cast<double>(load(io.bias.data<T>()[c])) -
              static_cast<double>(load(io.mean.data<T>()[c])) * ac);
        }
        const T* xp = x.data<T>();
        T* yp = y.data<T>();
        const std::int64_t inner = g.inner;
        ctx.parallel_for(g.outer * g.channels, static_cast<double>(inner),
                         [&](std::int64_t lo, std::int64_t hi) {
                           for (std::int64_t p = lo; p < hi; ++p) {
                             const auto c = static_cast<std::size_t>(p % g.channels);
                             const C ac = a[c];
                             const C bc = b[c];
                             const T* src = xp + p * inner;
                             T* dst = yp + p * inner;
                             for (std::int64_t i = 0; i < inner; ++i) {
                               dst[i] = store<T>(load(src[i]) * ac + bc);
                             }
                           }
                         });
      } else {
        ctx.fail("batch_norm has no kernel for {}", to_string(x.type()));
      }
    });
  }

 private:
  double eps_;
};

}  // namespace

void register_batch_norm_kernels(kernel_registry& r) {
  r.add(make_kernel_def<batch_norm_kernel>("batch_norm", device_type::cpu));
}

}  // namespace loom::cpu
