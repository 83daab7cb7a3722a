// to_channel_blocks and from_channel_blocks on CPU: NCHW <-> NCHW16c (Note [channel blocks]
// in include/loom/graph/ops/nn_rules.hpp), copies of whole elements, any float dtype.
#include <cstring>

#include "nn_kernels.hpp"

namespace loom::cpu {
namespace {

using nn_rules::channel_block;

// One image and one block: the 16 lanes of each of `plane` pixels from (or to) the block's
// channel planes of the NCHW image. `lanes` of the 16 are channels; the rest are zero.
template <std::size_t Bytes>
void block_to(const std::byte* nchw, std::byte* blocked, std::int64_t plane, std::int64_t lanes) {
  for (std::int64_t p = 0; p < plane; ++p) {
    std::byte* dst = blocked + p * channel_block * Bytes;
    for (std::int64_t l = 0; l < lanes; ++l) std::memcpy(dst + l * Bytes, nchw + (l * plane + p) * Bytes, Bytes);
    if (lanes < channel_block) std::memset(dst + lanes * Bytes, 0, (channel_block - lanes) * Bytes);
  }
}

template <std::size_t Bytes>
void block_from(const std::byte* blocked, std::byte* nchw, std::int64_t plane, std::int64_t lanes) {
  for (std::int64_t l = 0; l < lanes; ++l) {
    std::byte* dst = nchw + l * plane * Bytes;
    for (std::int64_t p = 0; p < plane; ++p) std::memcpy(dst + p * Bytes, blocked + (p * channel_block + l) * Bytes, Bytes);
  }
}

// Calls f(image, block, lanes, nchw offset, blocked offset) for every (image, block); offsets
// in elements.
template <class F>
void each_block(const shape& nchw, F&& f) {
  const std::int64_t c = nchw[1];
  const std::int64_t plane = nchw[2] * nchw[3];
  const std::int64_t blocks = nn_rules::channel_blocks(c);
  for (std::int64_t n = 0; n < nchw[0]; ++n) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t lanes = std::min(channel_block, c - b * channel_block);
      f(lanes, (n * c + b * channel_block) * plane, (n * blocks + b) * plane * channel_block, plane);
    }
  }
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

class to_channel_blocks_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    if (x.rank() != 4) ctx.fail("to_channel_blocks needs an NCHW input of rank 4, got {}", x.describe());
    tensor& out = ctx.allocate_output(0, nn_rules::blocked_shape(x.shape()));
    if (out.num_elements() == 0) return;
    to_channel_blocks(ctx.input_contiguous(0), out);
  }
};

class from_channel_blocks_kernel final : public op_kernel {
 public:
  explicit from_channel_blocks_kernel(const kernel_construction& c)
      : op_kernel(c), channels_(c.attr<std::int64_t>("channels")) {}
  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    if (x.rank() != 5 || x.dim(4) != channel_block || x.dim(1) != nn_rules::channel_blocks(channels_)) {
      ctx.fail("from_channel_blocks of {} channels needs an NCHW16c input [n, {}, h, w, {}], got {}", channels_,
               nn_rules::channel_blocks(channels_), channel_block, x.describe());
    }
    tensor& out = ctx.allocate_output(0, shape{x.dim(0), channels_, x.dim(2), x.dim(3)});
    if (out.num_elements() == 0) return;
    from_channel_blocks(ctx.input_contiguous(0), out);
  }

 private:
  std::int64_t channels_;
};

}  // namespace

void to_channel_blocks(const tensor& nchw, const tensor& blocked) {
  const std::size_t bytes = size_of(nchw.type());
  const auto* src = static_cast<const std::byte*>(nchw.raw_data());
  auto* dst = static_cast<std::byte*>(blocked.raw_data());
  by_size(bytes, [&](auto size) {
    constexpr std::size_t B = decltype(size)::value;
    each_block(nchw.shape(), [&](std::int64_t lanes, std::int64_t from, std::int64_t to, std::int64_t plane) {
      block_to<B>(src + from * B, dst + to * B, plane, lanes);
    });
  });
}

void from_channel_blocks(const tensor& blocked, const tensor& nchw) {
  const std::size_t bytes = size_of(nchw.type());
  const auto* src = static_cast<const std::byte*>(blocked.raw_data());
  auto* dst = static_cast<std::byte*>(nchw.raw_data());
  by_size(bytes, [&](auto size) {
    constexpr std::size_t B = decltype(size)::value;
    each_block(nchw.shape(), [&](std::int64_t lanes, std::int64_t to, std::int64_t from, std::int64_t plane) {
      block_from<B>(src + from * B, dst + to * B, plane, lanes);
    });
  });
}

void register_nn_channel_block_kernels(kernel_registry& r) {
  const auto types = type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16});
  r.add(make_kernel_def<to_channel_blocks_kernel>("to_channel_blocks", device_type::cpu, types));
  r.add(make_kernel_def<from_channel_blocks_kernel>("from_channel_blocks", device_type::cpu, types));
}

}  // namespace loom::cpu
