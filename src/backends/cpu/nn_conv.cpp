// conv2d on CPU: oneDNN's convolution_forward for float32 and bfloat16 (NCHW, NHWC or
// NCHW16c activations, OIHW filters; oneDNN picks the layouts it computes in, Note [blocked
// layouts], except where loom's rule says channel blocks, Note [channel blocks]; Winograd's
// algorithm for the 3x3 layers of inference graphs, Note [Winograd convolutions]), a
// reference loop for float64 and for whatever oneDNN cannot do on the machine (on the NCHW
// view of NHWC tensors, through a transposed copy).
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <span>

#include "cpu_isa.hpp"
#include "kernel/common/apply_rule.hpp"
#include "kernel/known_bounds.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// out[n, o] = bias[o] + sum over the group's channels c and the window of
// x[n, g*cg + c] * w[o, c] (the bias, when given, starting the sum). One task per output
// plane; each accumulates in Acc and rounds once.
template <class T>
void reference_conv(kernel_context& ctx, const T* x, const T* w, const T* bias, T* out, const conv_geometry& g) {
  using Acc = acc_t<T>;
  const std::int64_t planes = g.n * g.o;
  const std::int64_t plane = g.oh * g.ow;
  const std::int64_t per_group = g.o / g.groups;
  const double cost = static_cast<double>(g.cg * g.kh * g.kw * plane);
  ctx.parallel_for(planes, cost, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<Acc> acc(static_cast<std::size_t>(plane));
    for (std::int64_t p = lo; p < hi; ++p) {
      const std::int64_t n = p / g.o;
      const std::int64_t o = p % g.o;
      const std::int64_t group = o / per_group;
      std::fill(acc.begin(), acc.end(), bias != nullptr ? widen<T>(bias[o]) : Acc{0});
      for (std::int64_t c = 0; c < g.cg; ++c) {
        const T* in = x + (n * g.c + group * g.cg + c) * g.h * g.w;
        const T* filt = w + (o * g.cg + c) * g.kh * g.kw;
        for (std::int64_t i = 0; i < g.kh; ++i) {
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const Acc wv = widen<T>(filt[i * g.kw + j]);
            const std::int64_t shift = j * g.dilation[1] - g.pad[2];  // iw = ow * sw + shift
            const auto [ow_lo, ow_hi] = ox_range(g, shift);
            for (std::int64_t oy = 0; oy < g.oh; ++oy) {
              const std::int64_t iy = oy * g.stride[0] - g.pad[0] + i * g.dilation[0];
              if (iy < 0 || iy >= g.h) continue;
              const T* row = in + iy * g.w + shift;
              Acc* arow = acc.data() + oy * g.ow;
              const std::int64_t sw = g.stride[1];
              for (std::int64_t ox = ow_lo; ox < ow_hi; ++ox) {
                arow[ox] += wv * widen<T>(row[ox * sw]);
              }
            }
          }
        }
      }
      T* dst = out + p * plane;
      for (std::int64_t k = 0; k < plane; ++k) dst[k] = narrow<T>(acc[static_cast<std::size_t>(k)]);
    }
  });
}

// Shape [n, h, w, c] from [n, c, h, w] (to_nhwc) or back.
shape relayout_shape(const shape& s, bool to_nhwc) {
  return to_nhwc ? shape{s[0], s[2], s[3], s[1]} : shape{s[0], s[3], s[1], s[2]};
}

// Writes the dense tensor t of shape [n, c, h, w] (to_nhwc) or [n, h, w, c] to `dst` in the
// other layout: one strided view of t, copied dense.
void relayout(const tensor& t, bool to_nhwc, void* dst) {
  const shape strides = relayout_shape(contiguous_strides(t.shape()), to_nhwc);
  copy_to_dense(tensor::strided(t.buf(), t.type(), relayout_shape(t.shape(), to_nhwc), strides,
                                t.offset()),
                dst);
}

// Note [convolutions in chunks]
// A fused_conv2d's epilogue (bias, residual, activation: Note [fused epilogue]) is one more
// pass over the convolution's output. At batch 32 a mobilenet_v2 layer's output is tens of
// MB, out of cache by the time the primitive ends, so that pass ran at memory speed. So
// conv2d runs its primitive on chunks of whole images, each chunk's output about 4 MiB (at
// least one image; it stays in the 32 MiB L3 here: 1 MiB chunks, for the 2 MiB L2, measured
// no better), and fused_conv2d applies the epilogue to each chunk right after it, while it
// is in cache (chunked_kernel): mobilenet_v2 at batch 32 and 1 thread, fused_conv2d 262 to
// 267 ms in 3 runs unchunked, 249 to 250 ms in chunks. The chunk size is a function of
// the geometry alone, and the plain conv2d runs the same chunks, so the primitive, and with
// it every sum, is the one the unfused graph runs.
std::int64_t images_per_chunk(const conv_geometry& g, dtype t) {
  constexpr std::int64_t chunk_bytes = std::int64_t{4} << 20;
  const std::int64_t image = std::max<std::int64_t>(1, g.o * g.oh * g.ow * static_cast<std::int64_t>(size_of(t)));
  return std::clamp<std::int64_t>(chunk_bytes / image, 1, std::max<std::int64_t>(g.n, 1));
}

// Note [bias and clip in the primitive]
// An imported Conv's bias is the convolution's own (fused_conv2d's bias_in_sum: a term of
// its sum, as ONNX Runtime and PyTorch compute it): oneDNN's bias argument, which adds it
// within the sum (the 1x1 kernel starts the sum from it), and the reference loop, which
// starts from it. The epilogue pass (Note [fused epilogue] in nn_fused.cpp) then has no
// bias to add, and a fused node whose epilogue is only a clip (mobilenet's ReLU6) may leave
// the clip to the primitive too, as an eltwise post-op, where that gives the unfused
// graph's bits. oneDNN's clip is max and min instructions, which give the bound for NaN
// where the clip node keeps NaN; so the post-op runs on a chunk of images (Note
// [convolutions in chunks]) only where none of its sums can be NaN, which run_onednn proves
// just before the primitive runs on it: every input finite, and twice the filter's largest
// sum of magnitudes (kept for the constant filter) times the chunk's largest input, plus the
// largest bias, below 2^100, far from float's overflow even after Winograd's transforms.
// Other chunks (a NaN, an infinity, a huge value) run the plain primitive and loom's clip
// pass: the same bits either way. The proof reads the input, so it is made only where the
// input is at most half the output (the expansions of an inverted residual block, first
// layers: a sixfold expansion reads a twelfth of the bytes the pass would move); reading the
// depthwise layers' inputs as well (as large as their outputs) made mobilenet_v2 slower,
// 249-259 against 220-237 ms at batch 32 on 1 thread in interleaved runs. But a depthwise
// layer's input is the expansion's output: where the expansion's clip ran in the primitive
// on every chunk, every value of it is finite and within the clip's bounds, and the kernel
// records that (Note [known bounds] in src/kernel/known_bounds.hpp); a convolution reading a
// convolution's output with a known bound makes the proof from the bound, reading nothing,
// whatever the sizes. That took mobilenet_v2's 17 depthwise clip passes away: a prototype
// that assumed the bound ran batch 1 on 2 threads in 3.49-3.58 ms against 3.68-3.84 in
// alternating runs; the kernel as written, on a busier machine, 3.75-4.25 (median 4.16)
// against 3.99-4.67 (4.24) in ten alternating pairs, and batch 32 on 1 thread 256-266 ms
// against 267-302 in three. A tie gives the
// bound in both (vmaxps(x, lo) returns lo for x == lo, as maximum(x, lo) does), and the
// post-op primitive must be the implementation the plain one is, writing loom's buffer
// itself (post_op_plan_for), so its sums are the plain primitive's. Measured on mobilenet_v2's
// layers (oneDNN 2.6, 1 thread, median of 40): 4 images of 16 -> 96 channels at 112x112,
// 1x1: the convolution 1.12 ms, with its bias 1.22, with bias and clip 1.25, where loom's
// epilogue pass after it took 0.81 ms (oneDNN's 1x1 kernel writes its output past the
// cache, so the pass reads it from memory); the epilogue's bias as a binary post-op instead
// (the bits of a bias_add after the sum) took 2.49 ms, slower than the pass. So an imported
// mobilenet_v2 at batch 32 went from 257-267 to 230-238 ms on 1 thread in A/B runs of the
// same build on a busy machine.
//
// Note [the residual in the primitive]
// A fused_conv2d whose epilogue is a residual alone (its bias in the sum, no activation: an
// inverted residual block's projection) may have the primitive add the residual, a binary
// add post-op reading it in the output's layout: oneDNN adds it to each finished float32 sum,
// round(sum + r), which is what the epilogue pass computes, NaN and -0 included (checked bit
// for bit on mobilenet_v2's projection shapes with oneDNN 2.6, and by
// ConvBiasInSum.TheResidualIsAddedByThePrimitiveWithTheSameBits; the post-op primitive must
// be the plain one's implementation writing loom's buffer, as for the clip). oneDNN's sum
// post-op, which would add the output buffer's contents, is not: it starts a split
// reduction from them (other roundings, Note [fused epilogue] in nn_fused.cpp). float32 only
// (a 16-bit output rounds the sum, then the addition). Measured with oneDNN 2.6 on
// mobilenet_v2's projections (1 image, median of 40): the post-op cost 0 to 6% of the
// convolution on the 28x28 and smaller layers, 2 to 5% on the 56x56 one (144 -> 24) on 2
// threads and 22 to 37% on 1, about what loom's pass costs there (43 of 229 us in the
// model); at batch 1 on 2 threads, interleaved runs of the model took 3.38-3.65 ms (median
// 3.41) against 3.45-3.62 (3.50) without, on 1 thread 6.11-6.44 against 6.06-6.49. On the 4 MiB
// chunks of a large batch it was mixed (10 images of 144 -> 24 channels at 56x56 on one thread:
// 2.73 against 1.88 ms plus the pass; 40 of 192 -> 32 at 28x28: 2.79 against 2.70 plus the
// pass), and in three interleaved pairs each on 1 and 2 threads batch 32 took up to 3.2%
// longer in five and 3.5% less in one, so only chunks of up to 1 MiB of output.
//
// Note [Winograd convolutions]
// A 3x3 convolution of stride 1 can compute each tile of outputs from a tile of inputs with
// fewer products than the direct sum (Winograd's minimal filtering: F(2x2, 3x3) takes 16
// products for 4 outputs instead of 36; F(4x4, 3x3) 36 for 16 instead of 144), at the price
// of transforming the input, the filter and the output. oneDNN has both on AVX-512 for float32
// in channel blocks, jit_fp32_wino_2x3 and jit_wino_4x3, and picks one by the images, the
// channels and the threads (here 2x3 for one image; for 2 to 8 images of 64 or 128 channels
// 4x3 on one thread, 2x3 on two), so the last bits of such a layer can differ between thread
// counts. Timed
// here against the direct kernel that computed them before (oneDNN 2.6, the primitive alone,
// channel blocks, median of 15, 1 and 2 threads), the layers of a resnet took 1.1 to 2.5x less
// time: 64 channels at 56x56, one image, 1080 against 612 us; 128 at 28x28, ten images, 10.9
// against 4.7 ms; 512 at 7x7, one image, 1266 against 1109 us. It lost on 16 channels (0.7 to
// 0.97x) and on the smallest layers at 2 threads (64 channels at 8x8 or 4x4, one image: 0.65
// to 0.73x, work too small to split). So a convolution runs Winograd's algorithm when
// winograd_pays: float32, one group, 3x3, stride 1, no dilation, input and output channels
// multiples of 16 and at least 32, at least 2^22 products (a chunk's, Note [convolutions in
// chunks]), and channel blocks (the rule of Note [channel blocks] says `both`, so the
// conv_layout pass keeps the same primitive), and oneDNN has it on this machine.
//
// The price is rounding: the transforms add and scale, so the sums are not the direct
// kernel's. Against a float64 convolution of ReLU'd normal inputs and He-scaled filters (64
// and 256 channels), the error's norm relative to the output's was 1.6e-7 direct, 2.3e-7 to
// 4.3e-7 for F(2x2, 3x3) and 6.4e-7 to 1.2e-6 for F(4x4, 3x3); the largest error 2.3e-6 of
// the largest output. That is far inside float32 inference's usual tolerance (TF32 and
// bfloat16 convolutions, the GPUs' default, round at 1e-3), but it is not the direct
// kernel's bits: so only for a constant filter (an inference graph, an imported model),
// whose filter transform is done once (Note [constant reorders]). A variable's (training)
// would be transformed on every step, and its gradients are the direct convolution's.
bool winograd_pays(const conv_geometry& g, dtype t, bool constant_filter) {
  constexpr double least_products = 1 << 22;
  constexpr std::int64_t least_channels = 32;
  return constant_filter && t == dtype::f32 && g.groups == 1 && g.kh == 3 && g.kw == 3 &&
         g.stride == std::array<std::int64_t, 2>{1, 1} && g.dilation == std::array<std::int64_t, 2>{1, 1} &&
         g.c % nn_rules::channel_block == 0 && g.o % nn_rules::channel_block == 0 &&
         g.c >= least_channels && g.o >= least_channels &&
         static_cast<double>(g.n) * static_cast<double>(g.oh * g.ow) * static_cast<double>(g.o * g.c) * 9 >=
             least_products &&
         nn_rules::conv_channel_blocks(g, t) == nn_rules::conv_blocks::both;
}

// The largest of the bit patterns of p[0, n) without their sign bits, which order as the
// floats' magnitudes do, infinity and NaN past every number; in the baseline and, for the
// machines that have it, in AVX-512 (16 lanes a step).
[[gnu::always_inline]] inline std::uint32_t largest_magnitude_bits(const float* p, std::int64_t n) {
  std::uint32_t m = 0;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<std::uint32_t>(p[i]) & 0x7fffffffU);
  return m;
}
LOOM_ISA_BASELINE std::uint32_t largest_magnitude_bits_baseline(const float* p, std::int64_t n) {
  return largest_magnitude_bits(p, n);
}
#if LOOM_ISA_HAS_AVX512
LOOM_ISA_AVX512 std::uint32_t largest_magnitude_bits_avx512(const float* p, std::int64_t n) {
  return largest_magnitude_bits(p, n);
}
#endif

// The largest magnitude of p[0, n), inf when one is NaN or infinite (on oneDNN's threads:
// Note [work after a primitive]).
double largest_magnitude(kernel_context& ctx, const float* p, std::int64_t n) {
  std::atomic<std::uint32_t> largest{0};
  onednn::parallel_for(ctx.num_threads(), n, 0.05, [&](std::int64_t lo, std::int64_t hi) {
#if LOOM_ISA_HAS_AVX512
    const std::uint32_t m = widest_cpu_isa() == isa_cap::avx512 ? largest_magnitude_bits_avx512(p + lo, hi - lo)
                                                                 : largest_magnitude_bits_baseline(p + lo, hi - lo);
#else
    const std::uint32_t m = largest_magnitude_bits_baseline(p + lo, hi - lo);
#endif
    std::uint32_t seen = largest.load();
    while (m > seen && !largest.compare_exchange_weak(seen, m)) {
    }
  });
  const std::uint32_t m = largest.load();
  return m >= 0x7f800000U ? HUGE_VAL : static_cast<double>(std::bit_cast<float>(m));
}

class conv2d_kernel final : public op_kernel, public chunked_kernel {
 public:
  // oneDNN runs on its own (OpenMP) threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }
  explicit conv2d_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("T")),
        window_(conv_window_of(c)),
        format_(c.attr<std::string>("data_format")),
        nchw_(nn_rules::is_nchw(format_)),
        blocked_(nn_rules::is_channel_blocked(format_)),
        constant_filter_(onednn::input_is_constant(c, 1)),
        input_from_conv_(onednn::input_op(c, 0) == "conv2d" || onednn::input_op(c, 0) == "fused_conv2d") {
    if (blocked_ && !onednn::data_type_of(type_)) {
      c.fail(fmt::format("a convolution in channel blocks (NCHW16c) computes through oneDNN, which "
                         "takes float32 or bfloat16, not {}",
                         to_string(type_)));
    }
  }

  void compute(kernel_context& ctx) override { compute_in_chunks(ctx, nullptr, nullptr); }

  void compute_in_chunks(kernel_context& ctx, const chunk_done& after, const in_core* core) override {
    const tensor& xin = ctx.input(0);
    const tensor& win = ctx.input(1);
    if (win.rank() != 4) ctx.fail("conv2d needs an OIHW filter of rank 4, got {}", win.describe());
    // Note [channel blocks]: under NCHW16c the input is in blocks (rank 5) or NCHW (rank 4).
    const bool blocked_in = blocked_ && xin.rank() != 4;
    const shape view = common::apply_rule(
        ctx, [&] { return nn_rules::conv_input_view(xin.shape(), win.shape(), window_.groups, format_); });
    const conv_geometry g = nn_rules::conv2d_geometry(view, win.shape(), window_);
    if (!g.fits()) {
      ctx.fail("filter {} does not fit input {} in {} groups", win.describe(), xin.describe(),
               g.groups);
    }
    if (g.oh < 0 || g.ow < 0) {
      ctx.fail("the filter {} is larger than the padded input {}", win.describe(), xin.describe());
    }
    tensor& out = ctx.allocate_output(0, nn_rules::conv_output_in(g.output_shape(), format_));
    known_bounds::record(out.buf().get(), HUGE_VALF);  // nothing known yet (Note [known bounds])
    if (core != nullptr && core->check) core->check(out);
    const tensor bias = core != nullptr && core->bias_input ? ctx.input_contiguous(*core->bias_input) : tensor();
    if (out.num_elements() == 0) return;
    if (g.cg == 0 || g.h == 0 || g.w == 0) {  // every window lies in the padding: the bias alone
      fill_with_bias(ctx, out, bias, g);
      if (after) after(0, g.n, g.n);
      return;
    }
    const tensor x = ctx.input_contiguous(0);
    const tensor w = ctx.input_contiguous(1);
    if (const auto dt = onednn::data_type_of(type_)) {
      const float known = core != nullptr && core->clip ? known_input_bound(x) : HUGE_VALF;
      const in_core* clip = core != nullptr && core->clip && clip_may_run_inside(ctx, x, w, out, *core, known) ? core : nullptr;
      // The residual added by the primitive: float32 (a 16-bit one rounds the sum twice),
      // dense (its shape is the output's: core->check), else the epilogue's pass adds it.
      const tensor residual = core != nullptr && core->residual_input && type_ == dtype::f32 &&
                                      ctx.input(*core->residual_input).is_contiguous()
                                  ? ctx.input(*core->residual_input)
                                  : tensor();
      if (run_onednn(ctx, x, w, bias, out, g, *dt, blocked_in, after, clip, known, residual)) return;
    }
    run_reference(ctx, x, w, bias, out, g, view, blocked_in);
    if (after) after(0, g.n, g.n);
  }

 private:
  // The output where every window lies in the padding: the bias (zeros without one), in the
  // output's layout.
  void fill_with_bias(kernel_context& ctx, tensor& out, const tensor& bias, const conv_geometry& g) const {
    std::memset(out.raw_data(), 0, out.nbytes());
    if (!bias.defined()) return;
    visit_float_type(ctx, type_, "conv2d", [&](auto tag) {
      using T = decltype(tag);
      const T* b = bias.data<T>();
      T* o = out.data<T>();
      const std::int64_t pixels = g.oh * g.ow;
      const std::int64_t block = blocked_ ? nn_rules::channel_block : 1;
      const std::int64_t blocks = (g.o + block - 1) / block;
      for (std::int64_t n = 0; n < g.n; ++n) {
        for (std::int64_t p = 0; p < pixels; ++p) {
          for (std::int64_t c = 0; c < g.o; ++c) {
            const std::int64_t at = blocked_ ? ((n * blocks + c / block) * pixels + p) * block + c % block
                                    : nchw_  ? (n * g.o + c) * pixels + p
                                             : (n * pixels + p) * g.o + c;
            o[at] = b[c];
          }
        }
      }
    });
  }

  void run_reference(kernel_context& ctx, const tensor& x, const tensor& w, const tensor& bias, tensor& out,
                     const conv_geometry& g,
                     const shape& view, bool blocked_in) {
    if (blocked_) {
      // The reference loop on the NCHW tensors, between copies out of and into the blocks.
      tensor xr = x;
      if (blocked_in) {
        xr = ctx.allocate_temp(type_, view);
        from_channel_blocks(ctx, x, xr);
      }
      tensor yr = ctx.allocate_temp(type_, g.output_shape());
      visit_float_type(ctx, type_, "conv2d", [&](auto tag) {
        using T = decltype(tag);
        reference_conv<T>(ctx, xr.data<T>(), w.data<T>(), bias.defined() ? bias.data<T>() : nullptr, yr.data<T>(), g);
      });
      to_channel_blocks(ctx, yr, out);
      return;
    }
    // The reference loop computes NCHW: an NHWC input is transposed to it, and the result
    // back.
    tensor xr = x;
    tensor yr = out;
    if (!nchw_) {
      xr = ctx.allocate_temp(type_, relayout_shape(x.shape(), false));
      relayout(x, false, xr.raw_data());
      yr = ctx.allocate_temp(type_, g.output_shape());
    }
    visit_float_type(ctx, type_, "conv2d", [&](auto tag) {
      using T = decltype(tag);
      reference_conv<T>(ctx, xr.data<T>(), w.data<T>(), bias.defined() ? bias.data<T>() : nullptr, yr.data<T>(), g);
    });
    if (!nchw_) relayout(yr, true, out.raw_data());
  }

  // Runs the primitive on chunks of images (Note [convolutions in chunks]), with the bias in
  // the sum when given, calling `after` for each chunk, except those whose clip `clip` (when
  // given; Note [bias and clip in the primitive]; `known` the input's known bound) or
  // residual `residual` (when defined; Note [the residual in the primitive]) the primitive
  // applied; false, having run nothing, when oneDNN has no implementation.
  bool run_onednn(kernel_context& ctx, const tensor& x, const tensor& w, const tensor& bias, tensor& out,
                  const conv_geometry& whole, dnnl::memory::data_type dt, bool blocked_in,
                  const chunk_done& after, const in_core* clip, float known, const tensor& residual) {
    const std::int64_t chunk = images_per_chunk(whole, type_);
    // The plans of both chunk sizes first (they differ in the batch only); those with the
    // clip or the residual where oneDNN's is the plain primitive's implementation.
    std::shared_ptr<const onednn::plan> plans[2];
    std::shared_ptr<const onednn::plan> clipped[2];
    std::shared_ptr<const onednn::plan> added[2];
    bool adds = residual.defined() &&
                static_cast<std::int64_t>(out.nbytes()) / whole.n * std::min(chunk, whole.n) <= residual_pays_up_to;
    for (int k = 0; k < 2; ++k) {
      conv_geometry g = whole;
      g.n = k == 0 ? std::min(chunk, whole.n) : whole.n % chunk;
      if (g.n == 0) continue;
      plans[k] = plan_for(ctx, g, dt, blocked_in, bias.defined());
      if (!plans[k]->primitive) return false;
      if (clip != nullptr) clipped[k] = post_op_plan_for(ctx, g, dt, blocked_in, bias.defined(), clip, *plans[k]);
      if (clipped[k] && !clipped[k]->primitive) clip = nullptr;
      if (adds) added[k] = post_op_plan_for(ctx, g, dt, blocked_in, bias.defined(), nullptr, *plans[k]);
      adds = adds && added[k]->primitive;
    }
    // No sum can reach an infinity, and so a NaN, where twice the filter's largest sum of
    // magnitudes (room for rounding and Winograd's transforms) times the largest input, plus
    // the largest bias, is below 2^100 (false for inf and NaN).
    const double filter = clip != nullptr ? 2.0 * filter_magnitude(w) : HUGE_VAL;
    const double largest_bias =
        clip != nullptr && bias.defined() ? largest_magnitude(ctx, bias.data<float>(), bias.num_elements()) : 0.0;
    const auto x_image = static_cast<std::int64_t>(x.nbytes()) / whole.n;
    const auto out_image = static_cast<std::int64_t>(out.nbytes()) / whole.n;
    bool every_chunk_inside = clip != nullptr;
    for (std::int64_t lo = 0; lo < whole.n; lo += chunk) {
      const std::int64_t n = std::min(chunk, whole.n - lo);
      const auto* in = static_cast<const std::byte*>(x.raw_data()) + lo * x_image;
      // The clip in the primitive where this chunk's sums cannot be NaN: the input's known
      // bound `known`, or its input read just before the primitive reads it again, from the cache.
      const bool inside =
          clip != nullptr &&
          filter * (std::isfinite(known) ? static_cast<double>(known)
                                         : largest_magnitude(ctx, reinterpret_cast<const float*>(in),
                                                             n * x_image / static_cast<std::int64_t>(sizeof(float)))) +
                  largest_bias <
              std::ldexp(1.0, 100);
      every_chunk_inside = every_chunk_inside && inside;
      const onednn::plan& plan = *(adds ? added : inside ? clipped : plans)[n == std::min(chunk, whole.n) ? 0 : 1];
      // The arguments in the plan's order: input, filter, output, [bias], [residual].
      std::array<const void*, 5> data{in, w.raw_data(), static_cast<std::byte*>(out.raw_data()) + lo * out_image};
      std::size_t args = 3;
      if (bias.defined()) data.at(args++) = bias.raw_data();
      if (adds) data.at(args++) = static_cast<const std::byte*>(residual.raw_data()) + lo * out_image;
      // The filter is argument 1 (Note [constant reorders]).
      onednn::execute(ctx, plan, std::span<const void* const>(data.data(), args), constants_,
                      constant_filter_ ? 0b010U : 0U);
      if (after && !inside && !adds) after(lo, lo + n, whole.n);
    }
    // Every sum finite and clipped: the output lies within the clip's bounds (Note [known
    // bounds]), which spares the next convolution its proof's reading.
    if (every_chunk_inside) {
      known_bounds::record(out.buf().get(), static_cast<float>(std::max(std::fabs(clip->lo), std::fabs(clip->hi))));
    }
    return true;
  }

  // The largest chunk of output (bytes) whose residual the primitive adds: beyond, at the 4
  // MiB chunks of a large batch, the epilogue's pass measured as fast or faster (Note [the
  // residual in the primitive]).
  static constexpr std::int64_t residual_pays_up_to = std::int64_t{1} << 20;

  // Whether the primitive may apply `clip` at all (Note [bias and clip in the primitive]):
  // float32 in channel blocks, a constant filter (its own buffer), numeric bounds in order,
  // and an input whose bound is known (`known`) or at most half the output (the proof reads it).
  bool clip_may_run_inside(kernel_context& ctx, const tensor& x, const tensor& w, const tensor& out,
                           const in_core& clip, float known) const {
    return type_ == dtype::f32 && blocked_ && constant_filter_ && w.raw_data() == ctx.input(1).raw_data() &&
           clip.lo <= clip.hi && (std::isfinite(known) || x.num_elements() <= out.num_elements() / 2);
  }

  // The input's known bound (Note [known bounds] in src/kernel/known_bounds.hpp), trusted
  // only straight from a convolution node (the kind that records one); +inf otherwise.
  [[nodiscard]] float known_input_bound(const tensor& x) const {
    return input_from_conv_ ? known_bounds::of(x.buf().get()) : HUGE_VALF;
  }

  // The largest sum over an output channel of its filter's magnitudes (inf when the filter
  // is not finite); computed once for the constant filter's buffer (`w` is that buffer, not
  // a copy: a const node's tensor is dense).
  double filter_magnitude(const tensor& w) {
    const std::lock_guard lock(filter_mutex_);
    if (filter_handle_ != nullptr && filter_handle_ == w.raw_data()) return filter_magnitude_;
    const float* p = w.data<float>();
    const std::int64_t outputs = w.dim(0);
    const std::int64_t per = outputs > 0 ? w.num_elements() / outputs : 0;  // [o, c / groups, kh, kw]
    double largest = 0.0;
    for (std::int64_t o = 0; o < outputs && std::isfinite(largest); ++o) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < per; ++i) sum += std::fabs(static_cast<double>(p[o * per + i]));
      largest = std::isfinite(sum) ? std::max(largest, sum) : HUGE_VAL;
    }
    filter_handle_ = w.raw_data();
    filter_magnitude_ = largest;
    return largest;
  }

  // The plan of the primitive for `g`, with the bias in the sum when `bias`.
  std::shared_ptr<const onednn::plan> plan_for(kernel_context& ctx, const conv_geometry& g,
                                               dnnl::memory::data_type dt, bool blocked_in, bool bias) {
    const int threads = ctx.num_threads();
    return cache_.get(plan_key(threads, g, bias), [&] { return build_plan(threads, g, dt, blocked_in, bias, nullptr, false); });
  }

  // The same with a post-op, the clip `clip` or (null) the addition of a residual of the
  // output's layout: no primitive unless it is `plain`'s implementation, writing loom's
  // buffer itself (Notes [bias and clip in the primitive], [the residual in the primitive]).
  std::shared_ptr<const onednn::plan> post_op_plan_for(kernel_context& ctx, const conv_geometry& g,
                                                       dnnl::memory::data_type dt, bool blocked_in, bool bias,
                                                       const in_core* clip, const onednn::plan& plain) {
    const int threads = ctx.num_threads();
    onednn::primitive_cache::key key = plan_key(threads, g, bias);
    key.push_back(std::int64_t{clip != nullptr});
    if (clip != nullptr) {
      key.push_back(std::bit_cast<std::int64_t>(clip->lo));
      key.push_back(std::bit_cast<std::int64_t>(clip->hi));
    }
    return post_op_cache_.get(key, [&] {
      onednn::plan p = build_plan(threads, g, dt, blocked_in, bias, clip, clip == nullptr);
      if (p.implementation != plain.implementation || p.reorders.at(2)) {
        throw dnnl::error(dnnl_unimplemented, "not the plain convolution's implementation");
      }
      return p;
    });
  }

  [[nodiscard]] onednn::primitive_cache::key plan_key(int threads, const conv_geometry& g, bool bias) const {
    return {static_cast<std::int64_t>(type_), threads, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, std::int64_t{bias}};
  }

  onednn::plan build_plan(int threads, const conv_geometry& g, dnnl::memory::data_type dt, bool blocked_in,
                          bool bias, const in_core* clip, bool residual) const {
    using tag = dnnl::memory::format_tag;
    onednn::use_threads(threads);
    // oneDNN's dims are NCHW whatever the layout.
    const tag layout = blocked_ ? tag::nChw16c : nchw_ ? tag::nchw : tag::nhwc;
    const tag in_layout = blocked_ && !blocked_in ? tag::nchw : layout;
    const dnnl::memory::desc src_md({g.n, g.c, g.h, g.w}, dt, in_layout);
    const dnnl::memory::desc wei_md =
        g.groups == 1
            ? dnnl::memory::desc({g.o, g.cg, g.kh, g.kw}, dt, tag::oihw)
            : dnnl::memory::desc({g.groups, g.o / g.groups, g.cg, g.kh, g.kw}, dt, tag::goihw);
    const dnnl::memory::desc dst_md({g.n, g.o, g.oh, g.ow}, dt, layout);
    // oneDNN picks the layouts it computes fastest in (Note [blocked layouts]), unless
    // loom's rule says channel blocks (Note [channel blocks]): the same primitive whatever
    // the tensors' layout, so the same bits.
    const nn_rules::conv_blocks in_blocks = nn_rules::conv_channel_blocks(g, type_);
    const auto any = [](const dnnl::memory::desc& md) {
      return dnnl::memory::desc(md.dims(), md.data_type(), tag::any);
    };
    const auto fixed = [](const dnnl::memory::desc& md, tag t) {
      return dnnl::memory::desc(md.dims(), md.data_type(), t);
    };
    const dnnl::memory::desc src = in_blocks == nn_rules::conv_blocks::both     ? fixed(src_md, tag::nChw16c)
                                   : in_blocks == nn_rules::conv_blocks::output ? fixed(src_md, tag::nchw)
                                                                                : any(src_md);
    const dnnl::memory::desc dst =
        in_blocks == nn_rules::conv_blocks::none ? any(dst_md) : fixed(dst_md, tag::nChw16c);
    // The bias in the sum (oneDNN's bias argument); the clip as an eltwise post-op, or a
    // residual in the output's layout as a binary one.
    const dnnl::memory::desc bias_md = bias ? dnnl::memory::desc({g.o}, dt, tag::a) : dnnl::memory::desc();
    dnnl::primitive_attr attr = onednn::user_scratchpad_attr();
    constexpr int residual_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
    if (clip != nullptr || residual) {
      dnnl::post_ops ops;
      if (clip != nullptr) {
        ops.append_eltwise(1.0F, dnnl::algorithm::eltwise_clip, static_cast<float>(clip->lo),
                           static_cast<float>(clip->hi));
      }
      if (residual) ops.append_binary(dnnl::algorithm::binary_add, dst_md);
      attr.set_post_ops(ops);
    }
    const auto primitive = [&](dnnl::algorithm algorithm) {
      const dnnl::convolution_forward::desc desc(
          dnnl::prop_kind::forward_inference, algorithm, src, any(wei_md), bias_md, dst,
          {g.stride[0], g.stride[1]}, {g.dilation[0] - 1, g.dilation[1] - 1},
          {g.pad[0], g.pad[2]}, {g.pad[1], g.pad[3]});
      return dnnl::convolution_forward::primitive_desc(desc, attr, onednn::engine());
    };
    // Note [Winograd convolutions]; the direct kernel where oneDNN has none.
    const dnnl::convolution_forward::primitive_desc pd = [&] {
      if (winograd_pays(g, type_, constant_filter_)) {
        try {
          return primitive(dnnl::algorithm::convolution_winograd);
        } catch (const dnnl::error&) {
        }
      }
      return primitive(dnnl::algorithm::convolution_direct);
    }();
    std::vector<onednn::arg_desc> args{{DNNL_ARG_SRC, src_md, pd.src_desc()},
                                       {DNNL_ARG_WEIGHTS, wei_md, pd.weights_desc()},
                                       {DNNL_ARG_DST, dst_md, pd.dst_desc(), true}};
    if (bias) args.push_back({DNNL_ARG_BIAS, bias_md, pd.bias_desc()});
    if (residual) args.push_back({residual_arg, dst_md, pd.query_md(dnnl::query::exec_arg_md, residual_arg)});
    return onednn::make_plan<dnnl::convolution_forward>(pd, std::move(args));
  }

  dtype type_;
  nn_rules::conv_window window_;
  std::string format_;
  bool nchw_;
  bool blocked_;
  bool constant_filter_;
  bool input_from_conv_;  // input 0 is a convolution node's output (Note [known bounds])
  onednn::primitive_cache cache_;
  onednn::primitive_cache post_op_cache_;  // the plans with the clip or the residual as a post-op
  onednn::constant_reorders constants_;
  std::mutex filter_mutex_;  // filter_magnitude's value, for the constant filter
  const void* filter_handle_ = nullptr;
  double filter_magnitude_ = 0.0;
};

}  // namespace
}  // namespace loom::cpu

namespace loom {

bool nn_rules::cpu_computes_in_channel_blocks() noexcept {
  static const bool yes = [] {
    if (cpu::widest_cpu_isa() != cpu::isa_cap::avx512) return false;
    try {
      return dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return yes;
}

}  // namespace loom

namespace loom::cpu {

void register_nn_conv_kernels(kernel_registry& r) {
  r.add(onednn::with_emulated_reason(make_kernel_def<conv2d_kernel>(
      "conv2d", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn")));
}

}  // namespace loom::cpu
