// to_channel_blocks and from_channel_blocks on CPU: NCHW <-> NCHW16c (Note [channel blocks]
// in include/loom/graph/ops/nn_rules.hpp), copies of whole elements, any float dtype.
#include <cstring>

#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using nn_rules::channel_block;

// Copies of whole elements, Bytes each; `count` of them, or channel_block with zeros after.
template <std::size_t Bytes>
void copy_lanes(const std::byte* from, std::byte* to, std::int64_t count) {
  std::memcpy(to, from, static_cast<std::size_t>(count) * Bytes);
}

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

// The geometry of a conversion: the plain tensor [n, c, h, w] (NCHW) or [n, h, w, c] (NHWC).
struct blocks_geometry {
  std::int64_t n, c, plane, blocks;
  bool nhwc;
};

blocks_geometry geometry_of(const shape& plain, bool nhwc) {
  const std::int64_t c = nhwc ? plain[3] : plain[1];
  return {plain[0], c, plain[1] * plain[2] * plain[3] / c, nn_rules::channel_blocks(c), nhwc};
}

// Calls f(plain offset, plain stride between lanes, blocked offset, pixels, lanes) for each
// task of a conversion, in elements: NCHW, a task is an (image, block): its lanes are planes
// `plane` apart; NHWC, a task is an (image, pixel range): its lanes are adjacent. On
// oneDNN's OpenMP team: the conversions sit between convolutions, whose threads are awake
// (Note [work after a primitive]).
template <class F>
void each_task(kernel_context& ctx, const blocks_geometry& g, F&& f) {
  if (!g.nhwc) {
    onednn::parallel_for(ctx.num_threads(), g.n * g.blocks, static_cast<double>(g.plane * channel_block),
                     [&](std::int64_t lo, std::int64_t hi) {
                       for (std::int64_t t = lo; t < hi; ++t) {
                         const std::int64_t n = t / g.blocks;
                         const std::int64_t b = t % g.blocks;
                         f((n * g.c + b * channel_block) * g.plane, g.plane, t * g.plane * channel_block, std::int64_t{0},
                           g.plane, std::min(channel_block, g.c - b * channel_block));
                       }
                     });
    return;
  }
  onednn::parallel_for(ctx.num_threads(), g.n * g.plane, static_cast<double>(g.blocks * channel_block),
                       [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t t = lo; t < hi; ++t) {
      const std::int64_t n = t / g.plane;
      const std::int64_t p = t % g.plane;
      f(t * g.c, std::int64_t{1}, (n * g.blocks * g.plane + p) * channel_block, g.plane * channel_block, 1, g.c);
    }
  });
}

}  // namespace

// NCHW: for each pixel of a block, its lanes from `lanes` planes, zeros after. NHWC: for each
// pixel, its c channels cut into the blocks (each `block_stride` apart), zeros after.
void to_channel_blocks(kernel_context& ctx, const tensor& plain, const tensor& blocked, bool nhwc) {
  const blocks_geometry g = geometry_of(plain.shape(), nhwc);
  const auto* src = static_cast<const std::byte*>(plain.raw_data());
  auto* dst = static_cast<std::byte*>(blocked.raw_data());
  by_size(size_of(plain.type()), [&](auto size) {
    constexpr std::size_t B = decltype(size)::value;
    each_task(ctx, g, [&](std::int64_t from, std::int64_t lane_stride, std::int64_t to, std::int64_t block_stride,
                          std::int64_t pixels, std::int64_t lanes) {
      if (!nhwc) {
        for (std::int64_t p = 0; p < pixels; ++p) {
          std::byte* out = dst + (to + p * channel_block) * B;
          for (std::int64_t l = 0; l < lanes; ++l) std::memcpy(out + l * B, src + (from + l * lane_stride + p) * B, B);
          std::memset(out + lanes * B, 0, static_cast<std::size_t>(channel_block - lanes) * B);
        }
        return;
      }
      for (std::int64_t b = 0; b * channel_block < lanes; ++b) {
        const std::int64_t k = std::min(channel_block, lanes - b * channel_block);
        std::byte* out = dst + (to + b * block_stride) * B;
        copy_lanes<B>(src + (from + b * channel_block) * B, out, k);
        std::memset(out + k * B, 0, static_cast<std::size_t>(channel_block - k) * B);
      }
    });
  });
}

void from_channel_blocks(kernel_context& ctx, const tensor& blocked, const tensor& plain, bool nhwc) {
  const blocks_geometry g = geometry_of(plain.shape(), nhwc);
  const auto* src = static_cast<const std::byte*>(blocked.raw_data());
  auto* dst = static_cast<std::byte*>(plain.raw_data());
  by_size(size_of(plain.type()), [&](auto size) {
    constexpr std::size_t B = decltype(size)::value;
    each_task(ctx, g, [&](std::int64_t to, std::int64_t lane_stride, std::int64_t from, std::int64_t block_stride,
                          std::int64_t pixels, std::int64_t lanes) {
      if (!nhwc) {
        for (std::int64_t l = 0; l < lanes; ++l) {
          for (std::int64_t p = 0; p < pixels; ++p) {
            std::memcpy(dst + (to + l * lane_stride + p) * B, src + (from + p * channel_block + l) * B, B);
          }
        }
        return;
      }
      for (std::int64_t b = 0; b * channel_block < lanes; ++b) {
        copy_lanes<B>(src + (from + b * block_stride) * B, dst + (to + b * channel_block) * B,
                      std::min(channel_block, lanes - b * channel_block));
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
