// The nn family's CPU kernels: the table, and bias_add (a loop of its own; the others are
// in nn_matmul.cpp, nn_conv.cpp and nn_pool.cpp).
#include "nn_kernels.hpp"

#include "cpu_kernels.hpp"
#include "kernel/common/apply_rule.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// out[r, c] = x[r, c] + bias[c] over rows of `channels`.
template <class T>
void add_rows(const T* x, const T* bias, T* out, std::int64_t rows, std::int64_t channels) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * channels;
    T* o = out + r * channels;
    for (std::int64_t c = 0; c < channels; ++c) {
      if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
        o[c] = T(static_cast<float>(xr[c]) + static_cast<float>(bias[c]));
      } else {
        o[c] = static_cast<T>(xr[c] + bias[c]);
      }
    }
  }
}

// out[p, s] = x[p, s] + bias[p % channels] over planes of `inner` elements.
template <class T>
void add_planes(const T* x, const T* bias, T* out, std::int64_t begin, std::int64_t end,
                std::int64_t channels, std::int64_t inner) {
  for (std::int64_t p = begin; p < end; ++p) {
    const T* xp = x + p * inner;
    T* o = out + p * inner;
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      const float b = static_cast<float>(bias[p % channels]);
      for (std::int64_t s = 0; s < inner; ++s) o[s] = T(static_cast<float>(xp[s]) + b);
    } else {
      const T b = bias[p % channels];
      for (std::int64_t s = 0; s < inner; ++s) o[s] = static_cast<T>(xp[s] + b);
    }
  }
}

class bias_add_kernel final : public op_kernel {
 public:
  explicit bias_add_kernel(const kernel_construction& c)
      : op_kernel(c),
        nchw_(nn_rules::is_nchw(c.attr<std::string>("data_format"))),
        type_(c.attr<dtype>("T")) {}

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const auto g = common::apply_rule(
        ctx, [&] { return nn_rules::bias_add_geometry_of(ctx.input(0), ctx.input(1), nchw_); });
    // Output first, so that a contiguous input held by this node alone is written in place.
    tensor& out = ctx.forward_input_or_allocate_output(0, 0, s);
    if (out.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    const tensor bias = ctx.input_contiguous(1);
    visit_dtype(type_, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        ctx.fail("bias_add has no kernel for bool");
      } else {
        const T* xp = x.data<T>();
        const T* bp = bias.data<T>();
        T* op = out.data<T>();
        const std::int64_t channels = g.channels;
        if (!nchw_) {
          ctx.parallel_for(
              g.outer, static_cast<double>(channels) * 0.5, [&](std::int64_t lo, std::int64_t hi) {
                add_rows(xp + lo * channels, bp, op + lo * channels, hi - lo, channels);
              });
        } else {
          const std::int64_t inner = g.inner;
          ctx.parallel_for(g.outer * channels, static_cast<double>(inner) * 0.5,
                           [&](std::int64_t lo, std::int64_t hi) {
                             add_planes(xp, bp, op, lo, hi, channels, inner);
                           });
        }
      }
    });
  }

 private:
  bool nchw_;
  dtype type_;
};

}  // namespace

void register_nn_kernels(kernel_registry& r) {
  register_nn_matmul_kernels(r);
  register_nn_conv_kernels(r);
  register_nn_channel_block_kernels(r);
  register_nn_pool_kernels(r);
  register_nn_conv_backward_kernels(r);
  register_nn_pool_backward_kernels(r);
  register_nn_fused_kernels(r);
  register_nn_resize_kernels(r);
  r.add(make_kernel_def<bias_add_kernel>(
      "bias_add", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                       dtype::i8, dtype::u8})));
}

}  // namespace loom::cpu
