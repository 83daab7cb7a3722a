// to_channel_blocks and from_channel_blocks on CPU: NCHW <-> NCHW16c (Note [channel blocks]
// in include/loom/graph/ops/nn_rules.hpp), copies of whole elements, any float dtype.
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using nn_rules::channel_block;

template <class F>
void by_size(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 2:
      return f(std::integral_constant<std::size_t, 2>{});
    case 4:
      return f(std::integral_constant<std::size_t, 4>{});
    default:
      return f(std::integral_constant<std::size_t, 8>{});
  }
}

// Where a plain tensor's channels and pixels are, in elements: NCHW [n, c, h, w] (a pixel's
// channels a plane apart) or NHWC [n, h, w, c] (adjacent).
struct plain_layout {
  std::int64_t n, c, pixels;
  std::int64_t pixel_stride, channel_stride;
};

plain_layout layout_of(const shape& s, bool nhwc) {
  const std::int64_t c = nhwc ? s[3] : s[1];
  const std::int64_t pixels = nhwc ? s[1] * s[2] : s[2] * s[3];
  return {s[0], c, pixels, nhwc ? c : 1, nhwc ? 1 : pixels};
}

// Calls f(plain, block, lanes) with the element offsets of each (image, block)'s first
// channel in the plain tensor and in the blocked one, and how many of its 16 lanes are
// channels. On oneDNN's OpenMP team: the conversions sit between convolutions, whose threads
// are awake (Note [work after a primitive]).
template <class F>
void each_block(kernel_context& ctx, const plain_layout& p, F&& f) {
  const std::int64_t blocks = nn_rules::channel_blocks(p.c);
  onednn::parallel_for(ctx.num_threads(), p.n * blocks, static_cast<double>(p.pixels * channel_block),
                       [&](std::int64_t lo, std::int64_t hi) {
                         for (std::int64_t t = lo; t < hi; ++t) {
                           const std::int64_t n = t / blocks;
                           const std::int64_t b = t % blocks;
                           f(n * p.c * p.pixels + b * channel_block * p.channel_stride,
                             t * p.pixels * channel_block, std::min(channel_block, p.c - b * channel_block));
                         }
                       });
}

// Copies rows x cols 4-byte elements from `in` (row r at in + r * in_row) to `out` transposed
// (element (r, c) to out + c * out_row + r): 4x4 tiles through SSE registers (the baseline of
// x86-64), the edges one by one. The NCHW side of a conversion: a block's pixels by its
// lanes, one way or the other.
void transpose_4byte(const float* in, std::int64_t in_row, float* out, std::int64_t out_row, std::int64_t rows,
                     std::int64_t cols) {
  std::int64_t r = 0;
#if defined(__SSE2__)
  for (; r + 4 <= rows; r += 4) {
    std::int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      __m128 a = _mm_loadu_ps(in + r * in_row + c);
      __m128 b = _mm_loadu_ps(in + (r + 1) * in_row + c);
      __m128 d = _mm_loadu_ps(in + (r + 2) * in_row + c);
      __m128 e = _mm_loadu_ps(in + (r + 3) * in_row + c);
      _MM_TRANSPOSE4_PS(a, b, d, e);
      _mm_storeu_ps(out + c * out_row + r, a);
      _mm_storeu_ps(out + (c + 1) * out_row + r, b);
      _mm_storeu_ps(out + (c + 2) * out_row + r, d);
      _mm_storeu_ps(out + (c + 3) * out_row + r, e);
    }
    for (; c < cols; ++c) {
      for (std::int64_t k = r; k < r + 4; ++k) out[c * out_row + k] = in[k * in_row + c];
    }
  }
#endif
  for (; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) out[c * out_row + r] = in[r * in_row + c];
  }
}

}  // namespace

void to_channel_blocks(kernel_context& ctx, const tensor& plain, const tensor& blocked, bool nhwc) {
  const plain_layout p = layout_of(plain.shape(), nhwc);
  const auto* src = static_cast<const std::byte*>(plain.raw_data());
  auto* dst = static_cast<std::byte*>(blocked.raw_data());
  by_size(size_of(plain.type()), [&](auto size) {
    constexpr std::int64_t B = decltype(size)::value;
    each_block(ctx, p, [&](std::int64_t from, std::int64_t to, std::int64_t lanes) {
      if (B == 4 && p.pixel_stride == 1) {  // NCHW float32: the lanes' planes, transposed
        for (std::int64_t q = 0; lanes < channel_block && q < p.pixels; ++q) {  // the last block's tail
          std::memset(dst + (to + q * channel_block + lanes) * B, 0, static_cast<std::size_t>((channel_block - lanes) * B));
        }
        transpose_4byte(reinterpret_cast<const float*>(src) + from, p.channel_stride,
                        reinterpret_cast<float*>(dst) + to, channel_block, lanes, p.pixels);
        return;
      }
      for (std::int64_t q = 0; q < p.pixels; ++q) {
        std::byte* out = dst + (to + q * channel_block) * B;
        const std::byte* in = src + (from + q * p.pixel_stride) * B;
        for (std::int64_t l = 0; l < lanes; ++l) std::memcpy(out + l * B, in + l * p.channel_stride * B, B);
        std::memset(out + lanes * B, 0, static_cast<std::size_t>((channel_block - lanes) * B));
      }
    });
  });
}

void from_channel_blocks(kernel_context& ctx, const tensor& blocked, const tensor& plain, bool nhwc) {
  const plain_layout p = layout_of(plain.shape(), nhwc);
  const auto* src = static_cast<const std::byte*>(blocked.raw_data());
  auto* dst = static_cast<std::byte*>(plain.raw_data());
  by_size(size_of(plain.type()), [&](auto size) {
    constexpr std::int64_t B = decltype(size)::value;
    each_block(ctx, p, [&](std::int64_t to, std::int64_t from, std::int64_t lanes) {
      if (B == 4 && p.pixel_stride == 1) {  // NCHW float32: the block's pixels, transposed
        transpose_4byte(reinterpret_cast<const float*>(src) + from, channel_block, reinterpret_cast<float*>(dst) + to,
                        p.channel_stride, p.pixels, lanes);
        return;
      }
      for (std::int64_t q = 0; q < p.pixels; ++q) {
        const std::byte* in = src + (from + q * channel_block) * B;
        std::byte* out = dst + (to + q * p.pixel_stride) * B;
        for (std::int64_t l = 0; l < lanes; ++l) std::memcpy(out + l * p.channel_stride * B, in + l * B, B);
      }
    });
  });
}

namespace {

// data_format of the plain side: "NCHW" or "NHWC".
bool plain_is_nhwc(const kernel_construction& c) { return c.attr<std::string>("data_format") == "NHWC"; }

class to_channel_blocks_kernel final : public op_kernel {
 public:
  explicit to_channel_blocks_kernel(const kernel_construction& c) : op_kernel(c), nhwc_(plain_is_nhwc(c)) {}
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }  // OpenMP's
  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    if (x.rank() != 4) ctx.fail("to_channel_blocks needs an {} input of rank 4, got {}", nhwc_ ? "NHWC" : "NCHW", x.describe());
    const shape& s = x.shape();
    tensor& out = ctx.allocate_output(0, nn_rules::blocked_shape(nhwc_ ? shape{s[0], s[3], s[1], s[2]} : s));
    if (out.num_elements() == 0) return;
    to_channel_blocks(ctx, ctx.input_contiguous(0), out, nhwc_);
  }

 private:
  bool nhwc_;
};

class from_channel_blocks_kernel final : public op_kernel {
 public:
  explicit from_channel_blocks_kernel(const kernel_construction& c)
      : op_kernel(c), channels_(c.attr<std::int64_t>("channels")), nhwc_(plain_is_nhwc(c)) {}
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }  // OpenMP's
  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    if (x.rank() != 5 || x.dim(4) != channel_block || x.dim(1) != nn_rules::channel_blocks(channels_)) {
      ctx.fail("from_channel_blocks of {} channels needs an NCHW16c input [n, {}, h, w, {}], got {}", channels_,
               nn_rules::channel_blocks(channels_), channel_block, x.describe());
    }
    tensor& out = ctx.allocate_output(0, nhwc_ ? shape{x.dim(0), x.dim(2), x.dim(3), channels_}
                                               : shape{x.dim(0), channels_, x.dim(2), x.dim(3)});
    if (out.num_elements() == 0) return;
    from_channel_blocks(ctx, ctx.input_contiguous(0), out, nhwc_);
  }

 private:
  std::int64_t channels_;
  bool nhwc_;
};

}  // namespace

void register_nn_channel_block_kernels(kernel_registry& r) {
  const auto types = type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16});
  r.add(make_kernel_def<to_channel_blocks_kernel>("to_channel_blocks", device_type::cpu, types));
  r.add(make_kernel_def<from_channel_blocks_kernel>("from_channel_blocks", device_type::cpu, types));
}

}  // namespace loom::cpu
