// fused_matmul and fused_conv2d on CPU: y = act(core + bias + residual), the core by the
// plain op's kernel, the epilogue in one pass over its output. (On CUDA, fused_matmul is
// one kernel with matmul: src/backends/cuda/nn_matmul.cpp.) The checks of the epilogue's
// arguments are the op rules' (include/loom/graph/ops/nn_rules.hpp).
//
// Note [fused epilogue]
// A fused node gives bit for bit what the unfused graph gives, NaN, infinities and signed
// zeros included (docs/passes.md, "Passes never change an answer"). So:
// - the core is the plain op's own CPU kernel (matmul's or conv2d's, from the kernel
//   registry, made from the fused node itself, whose attributes include the plain op's):
//   the computation the unfused matmul / conv2d node runs, summing in the same order;
// - one loop over the core's output then adds the bias, adds the residual and applies the
//   activation, each step with the functor of the unfused op's kernel (elementwise_ops.hpp)
//   and each result rounded to T as that kernel rounds it (float16 / bfloat16: after every
//   step). The unfused graph reads and writes the output once per step (bias_add, add,
//   the activation); the fused node once in all.
// oneDNN can apply the same epilogue inside the primitive (bias argument, `sum` and
// `eltwise` post-ops), saving that one pass, but not with the same answers, so loom uses it
// only where it gives them (a convolution's own bias, fused_conv2d's bias_in_sum, a clip
// where no sum can be NaN: Note [bias and clip in the primitive] in nn_conv.cpp, and a
// float32 residual with nothing after it: Note [the residual in the primitive] there):
// - its eltwise relu is max(x, 0) on vmaxps, which gives 0 for NaN (and +0 for -0), where
//   relu keeps NaN (as NumPy and PyTorch do); its clip is min/max instructions too, not the
//   NaN and tie rules of the maximum and minimum nodes (Note [NaN rules]); its logistic,
//   tanh and gelu clamp the input with min/max first, which turns NaN into a number too;
// - bias and sum are added in float and rounded once for bfloat16, where the unfused graph
//   rounds after every op: other roundings, and values past bfloat16's largest finite are
//   inf in one and finite in the other (then inf - inf is NaN in one only);
// - a primitive with post-ops may be another implementation than the plain one, summing
//   the core in another order: other roundings, and with values near the largest finite,
//   an overflow (inf, later NaN) in one order and not in the other;
// - its sum post-op (the residual, already in the output buffer) is not always added last:
//   the 1x1 kernel, 96 -> 16 channels at 12x12, gave other roundings than the plain
//   primitive plus the residual (it adds the output's contents to the first part of a
//   reduction it splits), so a residual with nothing after it goes in as a binary add post-op
//   instead (Note [the residual in the primitive] in nn_conv.cpp).
#include <cmath>
#include <memory>
#include <string_view>

#include "cpu_isa.hpp"
#include "elementwise_ops.hpp"
#include "kernel/common/apply_rule.hpp"
#include "loom/core/half.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

using nn_rules::activation;

// No activation: the value as it is.
struct no_activation {
  template <class C>
  C operator()(C x) const noexcept {
    return x;
  }
};

// Activation "clip" for elements of T (Note [clip activation] in nn_rules.hpp): the
// unfused maximum(x, lo) then minimum(., hi), x first, in T's compute type. Their results
// are one of their operands, values of T already, so rounding each to T as the unfused
// kernels do changes nothing.
template <class T>
struct clip_op {
  using C = ew::compute_t<T>;
  C lo;
  C hi;
  C operator()(C x) const noexcept { return ew::minimum_op{}(ew::maximum_op{}(x, lo), hi); }
};

// clip_op for bounds that are not NaN, in a form that vectorises (one compare and a select
// per bound, where the rules' NaN test makes the compiler branch, per element, on data):
// maximum(x, lo) = x unless x > lo fails for a number x, i.e. x <= lo gives lo; NaN x
// compares false and stays; a tie gives lo, the rules' b. Likewise minimum(m, hi).
template <class T>
struct clip_number_bounds_op {
  using C = ew::compute_t<T>;
  C lo;
  C hi;
  C operator()(C x) const noexcept {
    const C m = x <= lo ? lo : x;
    return m >= hi ? hi : m;
  }
};

// A clip bound as a scalar constant of T holds it, in T's compute type.
template <class T>
ew::compute_t<T> clip_bound(double v) noexcept {
  return ew::load(ew::store<T>(static_cast<ew::compute_t<T>>(v)));
}

// Calls f with the functor of activation a for elements of T: the unary kernels' own, or
// for clip the binary ones' with the bounds lo and hi (Note [fused epilogue]).
template <class T, class F>
void visit_activation(activation a, double lo, double hi, F&& f) {
  switch (a) {
    case activation::clip:
      if (std::isnan(lo) || std::isnan(hi)) return f(clip_op<T>{clip_bound<T>(lo), clip_bound<T>(hi)});
      return f(clip_number_bounds_op<T>{clip_bound<T>(lo), clip_bound<T>(hi)});
    case activation::none:
      return f(no_activation{});
    case activation::relu:
      return f(ew::relu_op{});
    case activation::gelu:
      return f(ew::gelu_erf_op{});
    case activation::gelu_tanh:
      return f(ew::gelu_tanh_op{});
    case activation::tanh:
      return f(ew::tanh_op{});
    case activation::sigmoid:
      return f(ew::sigmoid_op{});
  }
}

// One run of `count` contiguous output elements: o = act(o + bias + residual), each step the
// unfused op's (the add of bias_add and of add, then the activation), every value rounded
// to T as those kernels store it (ew::round_to: nothing for float and double). The
// bias is one value for the run (`bias_scalar`) or an array along it (`bias_row`).
template <bool Bias, bool BiasRow, bool Residual, class T, class Act>
[[gnu::always_inline]] inline void epilogue_run(T* o, const T* bias_row, ew::compute_t<T> bias_scalar,
                                                const T* r, std::int64_t count, Act act) {
  using C = ew::compute_t<T>;
  for (std::int64_t s = 0; s < count; ++s) {
    C v = ew::load(o[s]);
    if constexpr (Bias) {
      const C b = BiasRow ? ew::load(bias_row[s]) : bias_scalar;
      v = ew::round_to<T>(v + b);
    }
    if constexpr (Residual) v = ew::round_to<T>(v + ew::load(r[s]));
    o[s] = ew::store<T>(act(v));
  }
}

// epilogue_units for a bias (or none) and a residual (or none) known at compile time.
template <bool Bias, bool Residual, class T, class Act>
[[gnu::always_inline]] inline void epilogue_units_as(T* out, const T* bias, const T* residual,
                                                     std::int64_t lo, std::int64_t hi,
                                                     std::int64_t channels, std::int64_t inner,
                                                     Act act) {
  using C = ew::compute_t<T>;
  if (inner == 1) {
    for (std::int64_t q = lo; q < hi; ++q) {
      epilogue_run<Bias, true, Residual>(out + q * channels, bias, C{},
                                         Residual ? residual + q * channels : nullptr, channels,
                                         act);
    }
    return;
  }
  for (std::int64_t p = lo; p < hi; ++p) {
    const C b = Bias ? ew::load(bias[p % channels]) : C{};
    epilogue_run<Bias, false, Residual>(out + p * inner, static_cast<const T*>(nullptr), b,
                                        Residual ? residual + p * inner : nullptr, inner, act);
  }
}

// out = act(out + bias + residual) over the units [lo, hi) of an output whose channel
// dimension has `channels` elements and `inner` elements after it: a unit is a row of
// `channels` when inner is 1 (a matmul's product, an NHWC convolution's output: the bias
// along each row), else a plane of `inner` elements (an NCHW convolution's output: one bias
// value per plane). bias and residual may be null.
template <class T, class Act>
[[gnu::always_inline]] inline void epilogue_units(T* out, const T* bias, const T* residual,
                                                  std::int64_t lo, std::int64_t hi,
                                                  std::int64_t channels, std::int64_t inner,
                                                  Act act) {
  if (bias != nullptr) {
    residual != nullptr
        ? epilogue_units_as<true, true>(out, bias, residual, lo, hi, channels, inner, act)
        : epilogue_units_as<true, false>(out, bias, residual, lo, hi, channels, inner, act);
  } else {
    residual != nullptr
        ? epilogue_units_as<false, true>(out, bias, residual, lo, hi, channels, inner, act)
        : epilogue_units_as<false, false>(out, bias, residual, lo, hi, channels, inner, act);
  }
}

// out = act(out + bias + residual) over `pixels` rows of one channel block (Note [channel
// blocks]) of which the first `lanes` are channels: 16 lanes a row, the block's bias values
// in registers, each row one vector step (the trip count is a constant); the lanes past the
// channels are set back to zero, whatever the activation made of them (a sigmoid makes 0.5).
// bias (the block's first channel's) and residual may be null.
template <bool Bias, bool Residual, class T, class Act>
[[gnu::always_inline]] inline void epilogue_block_as(T* out, const T* bias, const T* residual,
                                                     std::int64_t lanes, std::int64_t pixels, Act act) {
  using C = ew::compute_t<T>;
  constexpr int block = static_cast<int>(nn_rules::channel_block);
  C b[block];
  for (int l = 0; l < block; ++l) b[l] = Bias && l < lanes ? ew::load(bias[l]) : C{};
  for (std::int64_t p = 0; p < pixels; ++p) {
    T* o = out + p * block;
    for (int l = 0; l < block; ++l) {
      C v = ew::load(o[l]);
      if constexpr (Bias) v = ew::round_to<T>(v + b[l]);
      if constexpr (Residual) v = ew::round_to<T>(v + ew::load(residual[p * block + l]));
      o[l] = ew::store<T>(act(v));
    }
  }
  if (lanes == block) return;
  for (std::int64_t p = 0; p < pixels; ++p) std::fill(out + p * block + lanes, out + (p + 1) * block, T(0.0F));
}

template <class T, class Act>
[[gnu::always_inline]] inline void epilogue_block(T* out, const T* bias, const T* residual, std::int64_t lanes,
                                                  std::int64_t pixels, Act act) {
  if (bias != nullptr) {
    residual != nullptr ? epilogue_block_as<true, true>(out, bias, residual, lanes, pixels, act)
                        : epilogue_block_as<true, false>(out, bias, residual, lanes, pixels, act);
  } else {
    residual != nullptr ? epilogue_block_as<false, true>(out, bias, residual, lanes, pixels, act)
                        : epilogue_block_as<false, false>(out, bias, residual, lanes, pixels, act);
  }
}

// Note [epilogue instruction sets]
// The epilogue is compiled for each instruction set, as the fused element-wise kernel is
// (Note [fused instruction sets]; cpu_isa.hpp): the same bits in every variant, 4, 8 or 16
// floats a step. Its loops are always_inline functions, not lambdas, so that each variant
// inlines them (GCC compiles a lambda once, for the baseline, whoever calls it). In the
// baseline alone the epilogue took 13% of mobilenet_v2's run at batch 32 (SSE2 compares
// and selects for the clip, four floats a step).
#define LOOM_EPILOGUE_VARIANT(isa, target_attr)                                                 \
  template <class T, class Act>                                                                 \
  target_attr void epilogue_units_##isa(T* out, const T* bias, const T* residual,              \
                                        std::int64_t lo, std::int64_t hi, std::int64_t channels, \
                                        std::int64_t inner, Act act) {                          \
    epilogue_units<T>(out, bias, residual, lo, hi, channels, inner, act);                       \
  }
#define LOOM_EPILOGUE_BLOCK_VARIANT(isa, target_attr)                                           \
  template <class T, class Act>                                                                 \
  target_attr void epilogue_block_##isa(T* out, const T* bias, const T* residual, std::int64_t lanes, \
                                        std::int64_t pixels, Act act) {                         \
    epilogue_block<T>(out, bias, residual, lanes, pixels, act);                                 \
  }
LOOM_EPILOGUE_VARIANT(baseline, LOOM_ISA_BASELINE)
LOOM_EPILOGUE_BLOCK_VARIANT(baseline, LOOM_ISA_BASELINE)
#if LOOM_ISA_HAS_AVX2
LOOM_EPILOGUE_VARIANT(avx2, LOOM_ISA_AVX2)
LOOM_EPILOGUE_BLOCK_VARIANT(avx2, LOOM_ISA_AVX2)
#endif
#if LOOM_ISA_HAS_AVX512
LOOM_EPILOGUE_VARIANT(avx512, LOOM_ISA_AVX512)
LOOM_EPILOGUE_BLOCK_VARIANT(avx512, LOOM_ISA_AVX512)
#endif
#undef LOOM_EPILOGUE_VARIANT
#undef LOOM_EPILOGUE_BLOCK_VARIANT

// epilogue_units in the widest variant allowed.
template <class T, class Act>
void epilogue_units_widest(T* out, const T* bias, const T* residual, std::int64_t lo,
                           std::int64_t hi, std::int64_t channels, std::int64_t inner, Act act) {
  switch (widest_cpu_isa()) {
    case isa_cap::avx512:
#if LOOM_ISA_HAS_AVX512
      return epilogue_units_avx512<T>(out, bias, residual, lo, hi, channels, inner, act);
#endif
    case isa_cap::avx2:
#if LOOM_ISA_HAS_AVX2
      return epilogue_units_avx2<T>(out, bias, residual, lo, hi, channels, inner, act);
#endif
    case isa_cap::baseline:
      break;
  }
  epilogue_units_baseline<T>(out, bias, residual, lo, hi, channels, inner, act);
}

// epilogue_block in the widest variant allowed.
template <class T, class Act>
void epilogue_block_widest(T* out, const T* bias, const T* residual, std::int64_t lanes, std::int64_t pixels,
                           Act act) {
  switch (widest_cpu_isa()) {
    case isa_cap::avx512:
#if LOOM_ISA_HAS_AVX512
      return epilogue_block_avx512<T>(out, bias, residual, lanes, pixels, act);
#endif
    case isa_cap::avx2:
#if LOOM_ISA_HAS_AVX2
      return epilogue_block_avx2<T>(out, bias, residual, lanes, pixels, act);
#endif
    case isa_cap::baseline:
      break;
  }
  epilogue_block_baseline<T>(out, bias, residual, lanes, pixels, act);
}

// The highest-priority CPU kernel of the plain op `op` for the fused node.
std::unique_ptr<op_kernel> plain_kernel(const kernel_construction& c, std::string_view op) {
  for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
    if (k->device == device_type::cpu && k->matches(c.node())) return k->create(c);
  }
  c.fail(fmt::format("no CPU kernel of {} for T = {}", op, to_string(c.attr<dtype>("T"))));
}

// What fused_matmul and fused_conv2d share: the plain op's kernel, then the epilogue
// (Note [fused epilogue]).
class fused_kernel : public op_kernel {
 protected:
  // `channel_axis`: the output dimension the bias runs along (-1: the last); `blocked`: an
  // NCHW16c output (Note [channel blocks]), its bias along dimensions 1 and 4.
  fused_kernel(const kernel_construction& c, std::string_view plain_op, int channel_axis, bool blocked = false)
      : op_kernel(c),
        blocked_(blocked),
        type_(c.attr<dtype>("T")),
        has_bias_(c.attr<bool>("has_bias")),
        has_residual_(c.attr<bool>("has_residual")),
        act_(common::apply_rule(
            c, [&] { return nn_rules::activation_of(c.attr<std::string>("activation")); })),
        clip_min_(c.attr<double>("clip_min")),
        clip_max_(c.attr<double>("clip_max")),
        bias_in_sum_(plain_op == "conv2d" && c.attr<bool>("bias_in_sum")),
        channel_axis_(channel_axis),
        plain_(plain_kernel(c, plain_op)) {
    common::apply_rule(c, [&] {
      nn_rules::check_epilogue_inputs(c.node().inputs.size(), has_bias_, has_residual_);
      nn_rules::check_clip_bounds(act_, clip_min_, clip_max_);
      nn_rules::check_bias_in_sum(bias_in_sum_, has_bias_);
    });
    if (bias_in_sum_ && dynamic_cast<chunked_kernel*>(plain_.get()) == nullptr) {
      c.fail("the CPU kernel of conv2d cannot take the bias into its sum (bias_in_sum)");
    }
  }

 public:
  // The plain kernel (oneDNN) runs on its own threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override {
    return plain_->uses_all_threads();
  }

  void compute(kernel_context& ctx) override {
    const bool epilogue = has_bias_ || has_residual_ || act_ != activation::none;
    // A convolution runs in batch chunks, each chunk's epilogue right after it, while its
    // output is in cache (Note [convolutions in chunks] in nn_conv.cpp); its own bias (in the
    // sum) and, where that gives the same bits, the clip, inside the primitive (Note [bias and
    // clip in the primitive] there).
    if (auto* chunked = dynamic_cast<chunked_kernel*>(plain_.get()); chunked != nullptr && epilogue) {
      chunked_kernel::in_core core;
      if (bias_in_sum_) core.bias_input = 2;
      core.clip = act_ == activation::clip && !has_residual_ && !epilogue_bias();
      if (has_residual_ && act_ == activation::none && !epilogue_bias()) core.residual_input = residual_input();
      core.lo = clip_min_;
      core.hi = clip_max_;
      core.check = [&](const tensor& out) { check_args(ctx, out.shape()); };
      const bool rest = epilogue_bias() || has_residual_ || act_ != activation::none;
      chunked->compute_in_chunks(
          ctx,
          rest ? chunked_kernel::chunk_done([&](std::int64_t lo, std::int64_t hi, std::int64_t n) {
            apply_epilogue(ctx, ctx.output(0), lo, hi, n);
          })
               : chunked_kernel::chunk_done(),
          &core);
      return;
    }
    plain_->compute(ctx);
    const tensor out = ctx.output(0);
    check_args(ctx, out.shape());
    if (epilogue) apply_epilogue(ctx, out, 0, 1, 1);
  }

 private:
  // The epilogue over parts [lo, hi) of `out` cut into `parts` equal parts along dimension 0.
  void apply_epilogue(kernel_context& ctx, const tensor& out, std::int64_t lo, std::int64_t hi,
                      std::int64_t parts) {
    if (out.num_elements() == 0) return;
    if (blocked_) return blocked_epilogue(ctx, out, lo, hi, parts);
    const shape& s = out.shape();
    const std::size_t axis = channel(s);
    std::int64_t inner = 1;
    for (std::size_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
    const std::int64_t channels = s[axis];
    const std::int64_t unit = inner == 1 ? channels : inner;  // a row, or a plane
    const double per_element = act_ == activation::none ? 1.0 : 4.0;
    const tensor bias = epilogue_bias() ? ctx.input_contiguous(2) : tensor();
    const tensor residual = has_residual_ ? ctx.input_contiguous(residual_input()) : tensor();
    const std::int64_t per_part = out.num_elements() / unit / parts;
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      visit_activation<T>(act_, clip_min_, clip_max_, [&](auto act) {
        const auto units = [&](std::int64_t a, std::int64_t b) {
          epilogue_units_widest<T>(out.data<T>(), epilogue_bias() ? bias.data<T>() : nullptr,
                                   has_residual_ ? residual.data<T>() : nullptr, lo * per_part + a,
                                   lo * per_part + b, channels, inner, act);
        };
        const std::int64_t n = (hi - lo) * per_part;
        const double cost = per_element * static_cast<double>(unit);
        // After oneDNN, on oneDNN's threads (Note [work after a primitive]).
        if (plain_->uses_all_threads()) {
          onednn::parallel_for(ctx.num_threads(), n, cost, units);
        } else {
          ctx.parallel_for(n, cost, units);
        }
      });
    };
    visit_float_type(ctx, type_, node().op(), run);
  }

 private:
  // The epilogue over parts [lo, hi) of an NCHW16c output [n, blocks, h, w, 16]: per (image,
  // block), the block's pixels (epilogue_block).
  void blocked_epilogue(kernel_context& ctx, const tensor& out, std::int64_t lo, std::int64_t hi,
                        std::int64_t parts) {
    const shape& s = out.shape();
    const std::int64_t channels = ctx.input(1).dim(0);  // the filter's output channels
    const std::int64_t blocks = s[1];
    const std::int64_t pixels = s[2] * s[3];
    const std::int64_t block = nn_rules::channel_block;
    const tensor bias = epilogue_bias() ? ctx.input_contiguous(2) : tensor();
    const tensor residual = has_residual_ ? ctx.input_contiguous(residual_input()) : tensor();
    const double per_element = act_ == activation::none ? 1.0 : 4.0;
    const std::int64_t per_part = s[0] * blocks / parts;
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      visit_activation<T>(act_, clip_min_, clip_max_, [&](auto act) {
        const auto slabs = [&](std::int64_t a, std::int64_t b) {
          for (std::int64_t k = lo * per_part + a; k < lo * per_part + b; ++k) {
            const std::int64_t first = (k % blocks) * block;  // the block's first channel
            const std::int64_t at = k * pixels * block;
            epilogue_block_widest<T>(out.data<T>() + at, epilogue_bias() ? bias.data<T>() + first : nullptr,
                                     has_residual_ ? residual.data<T>() + at : nullptr,
                                     std::min(block, channels - first), pixels, act);
          }
        };
        const double cost = per_element * static_cast<double>(pixels * block);
        if (plain_->uses_all_threads()) {
          onednn::parallel_for(ctx.num_threads(), (hi - lo) * per_part, cost, slabs);
        } else {
          ctx.parallel_for((hi - lo) * per_part, cost, slabs);
        }
      });
    };
    visit_float_type(ctx, type_, node().op(), run);
  }

  [[nodiscard]] std::size_t residual_input() const noexcept { return has_bias_ ? 3 : 2; }
  // Whether the epilogue adds the bias (not the convolution, in its sum: bias_in_sum).
  [[nodiscard]] bool epilogue_bias() const noexcept { return has_bias_ && !bias_in_sum_; }

  [[nodiscard]] std::size_t channel(const shape& out) const noexcept {
    return channel_axis_ < 0 ? out.rank() - 1 : static_cast<std::size_t>(channel_axis_);
  }

  // Fails unless the bias is [out[channel]] and the residual has shape `out`.
  void check_args(kernel_context& ctx, const shape& out) const {
    common::apply_rule(ctx, [&] {
      nn_rules::check_epilogue_args(out, channel(out), has_bias_ ? &ctx.input(2) : nullptr,
                                    has_residual_ ? &ctx.input(residual_input()) : nullptr, blocked_);
    });
  }

  bool blocked_;
  dtype type_;
  bool has_bias_;
  bool has_residual_;
  activation act_;
  double clip_min_;  // activation clip's bounds
  double clip_max_;
  bool bias_in_sum_;  // fused_conv2d's bias is the convolution's own, in its sum
  int channel_axis_;
  std::unique_ptr<op_kernel> plain_;
};

class fused_matmul_kernel final : public fused_kernel {
 public:
  explicit fused_matmul_kernel(const kernel_construction& c) : fused_kernel(c, "matmul", -1) {}
};

class fused_conv2d_kernel final : public fused_kernel {
 public:
  // The bias runs along dimension 1 of an NCHW output, the last of an NHWC one, and along
  // dimensions 1 and 4 of an NCHW16c one.
  explicit fused_conv2d_kernel(const kernel_construction& c)
      : fused_conv2d_kernel(c, c.attr<std::string>("data_format")) {}

 private:
  fused_conv2d_kernel(const kernel_construction& c, const std::string& format)
      : fused_kernel(c, "conv2d", nn_rules::is_nchw(format) || nn_rules::is_channel_blocked(format) ? 1 : -1,
                     nn_rules::is_channel_blocked(format)) {}
};

}  // namespace

void register_nn_fused_kernels(kernel_registry& r) {
  r.add(onednn::with_emulated_reason(make_kernel_def<fused_matmul_kernel>(
      "fused_matmul", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn")));
  r.add(onednn::with_emulated_reason(make_kernel_def<fused_conv2d_kernel>(
      "fused_conv2d", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn")));
}

}  // namespace loom::cpu
