// Channel blocks (Note [channel blocks] in nn_rules.hpp): to_channel_blocks and
// from_channel_blocks against the layout's definition computed here element by element, and
// a conv2d on NCHW16c tensors against the NCHW conv2d, bit for bit; bad input is a typed
// error naming what is wrong.
#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <cstring>

#include "kernels/kernel_test_support.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/nn_rules.hpp"

namespace loom::testing {
namespace {

double at(const tensor& t, std::int64_t i) {
  switch (t.type()) {
    case dtype::f32: return t.data<float>()[i];
    case dtype::f64: return t.data<double>()[i];
    case dtype::bf16: return static_cast<float>(t.data<bfloat16>()[i]);
    default: return static_cast<float>(t.data<half>()[i]);
  }
}

TEST(ChannelBlocks, ToAndFromFollowTheLayoutsDefinition) {
  // Pixels and channels in whole 4x4 tiles and not (float32 moves in 4x4 tiles).
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16}) {
    for (const std::int64_t c : {1, 16, 20, 33}) {
      for (const std::array<std::int64_t, 2> hw : {std::array<std::int64_t, 2>{3, 5}, {4, 4}, {7, 7}}) {
        SCOPED_TRACE(std::string(to_string(t)) + " channels " + std::to_string(c) + " pixels " +
                     std::to_string(hw[0] * hw[1]));
        const shape s{2, c, hw[0], hw[1]};
        const std::int64_t pixels = hw[0] * hw[1];
        const tensor x = random(t, s, 3);
        const tensor b = run_op1("to_channel_blocks", {x});
        const std::int64_t blocks = (c + 15) / 16;
        ASSERT_EQ(b.shape(), (shape{2, blocks, hw[0], hw[1], 16}));
        for (std::int64_t n = 0; n < 2; ++n) {
          for (std::int64_t k = 0; k < blocks; ++k) {
            for (std::int64_t p = 0; p < pixels; ++p) {
              for (std::int64_t l = 0; l < 16; ++l) {
                const std::int64_t ch = k * 16 + l;
                const double want = ch < c ? at(x, (n * c + ch) * pixels + p) : 0.0;
                ASSERT_EQ(at(b, (((n * blocks + k) * pixels) + p) * 16 + l), want) << n << " " << ch << " " << p;
              }
            }
          }
        }
        const tensor back = run_op1("from_channel_blocks", {b}, {{"channels", c}});
        ASSERT_EQ(back.shape(), s);
        EXPECT_EQ(std::memcmp(back.raw_data(), x.raw_data(), x.nbytes()), 0);
      }
    }
  }
}

// conv2d in NCHW16c = the NCHW conv2d's output in blocks, bit for bit: the same primitive
// (nn_rules::conv_channel_blocks decides for both).
TEST(ChannelBlocks, AConvolutionInBlocksGivesTheNchwAnswerInBlocks) {
  for (const std::int64_t groups : {1, 24}) {
    SCOPED_TRACE("groups " + std::to_string(groups));
    const tensor x = random(dtype::f32, {2, 24, 8, 6}, 5);
    const std::int64_t o = groups == 1 ? 40 : 24;
    const tensor w = random(dtype::f32, {o, 24 / groups, 3, 3}, 6);
    const tensor plain = run_op1("conv2d", {x, w},
                                 {{"padding", std::vector<std::int64_t>{1, 1, 1, 1}}, {"groups", groups}});
    const tensor in_blocks = run_op1(
        "conv2d", {run_op1("to_channel_blocks", {x}), w},
        {{"padding", std::vector<std::int64_t>{1, 1, 1, 1}}, {"groups", groups}, {"data_format", std::string("NCHW16c")}});
    const tensor want = run_op1("to_channel_blocks", {plain});
    ASSERT_EQ(in_blocks.shape(), (shape{2, (o + 15) / 16, 8, 6, 16}));
    EXPECT_EQ(std::memcmp(in_blocks.raw_data(), want.raw_data(), want.nbytes()), 0);
  }
}

// The NHWC forms: to_channel_blocks of an NHWC tensor is to_channel_blocks of its NCHW
// transpose, and from_channel_blocks to NHWC the transpose of the NCHW one.
TEST(ChannelBlocks, NhwcConversionsAreTheNchwOnesTransposed) {
  for (const std::int64_t c : {3, 16, 40}) {
    SCOPED_TRACE("channels " + std::to_string(c));
    const tensor nchw = random(dtype::f32, {2, c, 5, 3}, 9);
    const tensor nhwc = run_op1("transpose", {nchw}, {{"perm", std::vector<std::int64_t>{0, 2, 3, 1}}});
    const tensor a = run_op1("to_channel_blocks", {nchw});
    const tensor b = run_op1("to_channel_blocks", {nhwc}, {{"data_format", std::string("NHWC")}});
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
    const tensor back = run_op1("from_channel_blocks", {a}, {{"channels", c}, {"data_format", std::string("NHWC")}});
    ASSERT_EQ(back.shape(), nhwc.shape());
    EXPECT_EQ(std::memcmp(back.raw_data(), nhwc.raw_data(), nhwc.nbytes()), 0);
  }
}

// A batch the convolution runs in several chunks (Note [convolutions in chunks]): fused_conv2d
// = its epilogue's steps applied to conv2d's output in float, bit for bit, in NCHW and in
// channel blocks alike.
TEST(ChannelBlocks, AFusedConvolutionInChunksIsItsStepsBitForBit) {
  const std::int64_t n = 11;  // 512 KiB an image: chunks of 8 and 3
  const tensor x = random(dtype::f32, {n, 16, 64, 64}, 21);
  const tensor w = random(dtype::f32, {20, 16, 1, 1}, 22);
  const tensor bias = random(dtype::f32, {20}, 23);
  const attr_map epilogue{{"has_bias", true}, {"has_residual", false}, {"activation", std::string("sigmoid")}};
  const tensor plain = run_op1("conv2d", {x, w});
  tensor want = run_op1("conv2d", {x, w});
  const std::int64_t plane = 64 * 64;
  for (std::int64_t i = 0; i < want.num_elements(); ++i) {
    const float v = want.data<float>()[i] + bias.data<float>()[(i / plane) % 20];
    want.data<float>()[i] = 1.0F / (1.0F + std::exp(-v));
  }
  const tensor fused = run_op1("fused_conv2d", {x, w, bias}, epilogue);
  const tensor sigmoid = run_op1("sigmoid", {run_op1("bias_add", {plain, bias}, {{"data_format", std::string("NCHW")}})});
  ASSERT_EQ(fused.shape(), sigmoid.shape());
  EXPECT_EQ(std::memcmp(fused.raw_data(), sigmoid.raw_data(), fused.nbytes()), 0);
  attr_map blocked = epilogue;
  blocked.emplace("data_format", std::string("NCHW16c"));
  const tensor in_blocks = run_op1("fused_conv2d", {run_op1("to_channel_blocks", {x}), w, bias}, blocked);
  const tensor want_blocks = run_op1("to_channel_blocks", {sigmoid});
  ASSERT_EQ(in_blocks.shape(), want_blocks.shape());
  EXPECT_EQ(std::memcmp(in_blocks.raw_data(), want_blocks.raw_data(), want_blocks.nbytes()), 0);
  // And close to the float reference (the sigmoid kernel's own formula may differ in the last bit).
  for (std::int64_t i = 0; i < want.num_elements(); i += 997) {
    ASSERT_NEAR(fused.data<float>()[i], want.data<float>()[i], 1e-6);
  }
}

// A first layer (fewer than 16 input channels): NCHW in, channel blocks out, the NCHW
// conv2d's answer in blocks, bit for bit.
TEST(ChannelBlocks, AFirstLayerTakesNchwAndGivesBlocks) {
  const tensor x = random(dtype::f32, {3, 3, 17, 15}, 31);
  const tensor w = random(dtype::f32, {24, 3, 3, 3}, 32);
  const attr_map window{{"strides", std::vector<std::int64_t>{2, 2}}, {"padding", std::vector<std::int64_t>{1, 1, 1, 1}}};
  attr_map blocked = window;
  blocked.emplace("data_format", std::string("NCHW16c"));
  const tensor in_blocks = run_op1("conv2d", {x, w}, blocked);
  const tensor want = run_op1("to_channel_blocks", {run_op1("conv2d", {x, w}, window)});
  ASSERT_EQ(in_blocks.shape(), (shape{3, 2, 9, 8, 16}));
  EXPECT_EQ(std::memcmp(in_blocks.raw_data(), want.raw_data(), want.nbytes()), 0);
}

// max_pool2d and avg_pool2d in NCHW16c = the NCHW pool's output in blocks, bit for bit, NaN
// and infinities included, where nn_rules::cpu_pools_in_channel_blocks says so (oneDNN pools
// both layouts with one implementation); a part-filled last block stays zero.
TEST(ChannelBlocks, APoolInBlocksGivesTheNchwAnswerInBlocks) {
  using ints = std::vector<std::int64_t>;
  struct pool_case {
    const char* op;
    attr_map attrs;
  };
  const std::vector<pool_case> cases{
      {"max_pool2d", {{"kernel", ints{3, 3}}, {"strides", ints{2, 2}}, {"padding", ints{1, 1, 1, 1}}}},
      {"max_pool2d", {{"kernel", ints{3, 2}}, {"strides", ints{1, 2}}, {"ceil_mode", true}}},
      {"avg_pool2d", {{"kernel", ints{3, 3}}, {"strides", ints{1, 1}}, {"padding", ints{1, 1, 1, 1}}}},
      {"avg_pool2d",
       {{"kernel", ints{3, 3}}, {"strides", ints{2, 2}}, {"padding", ints{1, 1, 1, 1}}, {"count_include_pad", true}}},
  };
  for (const std::int64_t c : {16, 20, 40}) {
    tensor x = random(dtype::f32, {2, c, 9, 7}, 7);
    float* v = x.data<float>();
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[40] = std::numeric_limits<float>::infinity();
    for (std::int64_t y = 1; y < 4; ++y) {  // a 3x3 patch of -inf in channel 1: whole windows
      for (std::int64_t xx = 1; xx < 4; ++xx) v[9 * 7 + y * 7 + xx] = -std::numeric_limits<float>::infinity();
    }
    for (const auto& pc : cases) {
      SCOPED_TRACE(std::string(pc.op) + " channels " + std::to_string(c));
      const tensor plain = run_op1(pc.op, {x}, pc.attrs);
      attr_map blocked_attrs = pc.attrs;
      blocked_attrs["data_format"] = std::string("NCHW16c");
      const tensor in_blocks = run_op1(pc.op, {run_op1("to_channel_blocks", {x})}, blocked_attrs);
      const tensor want = run_op1("to_channel_blocks", {plain});
      ASSERT_EQ(in_blocks.shape(), want.shape());
      nn_rules::pool_window win = nn_rules::pool_window_of(
          pc.attrs.at("kernel").as<ints>(), pc.attrs.at("strides").as<ints>(),
          pc.attrs.contains("padding") ? pc.attrs.at("padding").as<ints>() : ints{0, 0, 0, 0},
          pc.attrs.contains("ceil_mode"), ints{1, 1});
      const bool max = std::string_view(pc.op) == "max_pool2d";
      if (nn_rules::cpu_pools_in_channel_blocks(nn_rules::pool2d_geometry(x.shape(), win), dtype::f32, max,
                                                pc.attrs.contains("count_include_pad"))) {
        EXPECT_EQ(std::memcmp(in_blocks.raw_data(), want.raw_data(), want.nbytes()), 0);
      } else {
        // Another implementation: the same values where no NaN or -inf window decides them.
        const tensor back = run_op1("from_channel_blocks", {in_blocks}, {{"channels", c}});
        for (std::int64_t i = 0; i < plain.num_elements(); ++i) {
          const float a = plain.data<float>()[i], b = back.data<float>()[i];
          if (std::isfinite(a) && std::isfinite(b)) {
            EXPECT_NEAR(a, b, 1e-6f * (1 + std::fabs(a))) << i;
          }
        }
      }
    }
  }
  // bfloat16 max pooling in blocks: the same maxima.
  const tensor xb = random(dtype::bf16, {1, 24, 8, 8}, 9);
  const attr_map window{{"kernel", ints{3, 3}}, {"strides", ints{2, 2}}, {"padding", ints{1, 1, 1, 1}}};
  attr_map blocked = window;
  blocked["data_format"] = std::string("NCHW16c");
  const tensor want = run_op1("to_channel_blocks", {run_op1("max_pool2d", {xb}, window)});
  const tensor got = run_op1("max_pool2d", {run_op1("to_channel_blocks", {xb})}, blocked);
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
}

TEST(ChannelBlocks, BadInputIsATypedErrorNamingIt) {
  const tensor b = run_op1("to_channel_blocks", {random(dtype::f32, {1, 20, 2, 2}, 1)});
  try {
    (void)run_op1("from_channel_blocks", {b}, {{"channels", std::int64_t{40}}});
    FAIL() << "40 channels from 2 blocks";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("40 channels take 3 blocks"), std::string::npos) << e.what();
  }
  // A filter of 40 input channels for 2 blocks.
  EXPECT_THROW((void)run_op1("conv2d", {b, random(dtype::f32, {8, 40, 1, 1}, 2)},
                             {{"data_format", std::string("NCHW16c")}}),
               error);
  // float64 has no blocked convolution (oneDNN computes channel blocks).
  const tensor b64 = run_op1("to_channel_blocks", {random(dtype::f64, {1, 20, 2, 2}, 1)});
  try {
    (void)run_op1("conv2d", {b64, random(dtype::f64, {8, 20, 1, 1}, 2)}, {{"data_format", std::string("NCHW16c")}});
    FAIL() << "a float64 convolution in channel blocks";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("float32 or bfloat16, not float64"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)run_op1("conv2d", {random(dtype::f32, {1, 20, 2, 2}, 1), random(dtype::f32, {8, 20, 1, 1}, 2)},
                             {{"data_format", std::string("NCHW16")}}),
               error);
  // Pools in blocks: an NCHW input, float64, dilations, an unknown layout.
  const attr_map pool{{"kernel", std::vector<std::int64_t>{2, 2}}, {"data_format", std::string("NCHW16c")}};
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string m = message([&] { (void)run_op1("max_pool2d", {random(dtype::f32, {1, 20, 4, 4}, 1)}, pool); });
  EXPECT_NE(m.find("needs an input [n, blocks, h, w, 16], got [1, 20, 4, 4]"), std::string::npos) << m;
  m = message([&] { (void)run_op1("avg_pool2d", {b64}, pool); });
  EXPECT_NE(m.find("float32 or bfloat16, not float64"), std::string::npos) << m;
  attr_map dilated = pool;
  dilated["dilations"] = std::vector<std::int64_t>{2, 2};
  const tensor b5 = run_op1("to_channel_blocks", {random(dtype::f32, {1, 20, 5, 5}, 1)});
  m = message([&] { (void)run_op1("max_pool2d", {b5}, dilated); });
  EXPECT_NE(m.find("dilations of 1 only"), std::string::npos) << m;
  attr_map nhwc = pool;
  nhwc["data_format"] = std::string("NHWC");
  m = message([&] { (void)run_op1("max_pool2d", {b}, nhwc); });
  EXPECT_NE(m.find("must be \"NCHW\" or \"NCHW16c\""), std::string::npos) << m;
}

// A pool in channel blocks is an inference layout: asking for its gradient is an error naming
// the node.
TEST(ChannelBlocks, APoolInBlocksHasNoGradient) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1, 2, 4, 4, 16});
  auto y = b.add1("max_pool2d", {x},
                  {{"kernel", std::vector<std::int64_t>{2, 2}}, {"data_format", std::string("NCHW16c")}},
                  {.name = "pool"});
  try {
    (void)gradients(ops::reduce_sum(y), {x});
    FAIL() << "a gradient through a pool in blocks";
  } catch (const error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'pool'"), std::string::npos) << m;
    EXPECT_NE(m.find("channel blocks (data_format NCHW16c, an inference layout) has no gradient"), std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace loom::testing
