// fused_conv2d with bias_in_sum: a convolution whose bias is a term of its own sum, the form
// an imported ONNX Conv with B takes. Checked against a float64 convolution plus the bias;
// and the passes keep its bits when they fuse the clip after it (ReLU6), for inputs that let
// the primitive apply the clip and for NaN, infinities and values large enough to overflow
// that do not (Note [bias and clip in the primitive] in src/backends/cpu/nn_conv.cpp).
// oneDNN's verbose log says which runs put the clip into the primitive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/passes/pass.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

struct layer {
  const char* name;
  shape xs;
  shape ws;
  std::int64_t groups;
  std::vector<std::int64_t> strides;
  std::vector<std::int64_t> padding;
};

// mobilenet_v2's kinds of layer: the first (3 channels, stride 2), an expansion (1x1, six
// times the channels), a depthwise one, a projection; and a 3x3 layer of 32 channels.
const layer layers[] = {
    {"first", {2, 3, 16, 16}, {32, 3, 3, 3}, 1, {2, 2}, {1, 1, 1, 1}},
    {"expansion", {2, 16, 12, 12}, {96, 16, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}},
    {"depthwise", {2, 96, 12, 12}, {96, 1, 3, 3}, 96, {1, 1}, {1, 1, 1, 1}},
    {"projection", {2, 96, 6, 6}, {24, 96, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}},
    {"3x3", {1, 32, 10, 10}, {32, 32, 3, 3}, 1, {1, 1}, {1, 1, 1, 1}},
};

ops::conv2d_options options_of(const layer& l, const std::string& format = "NCHW") {
  return {.strides = l.strides, .padding = l.padding, .dilations = {1, 1}, .groups = l.groups, .data_format = format};
}

// x -> fused_conv2d(x, w, b, bias_in_sum) "core" -> [maximum(., 0) -> minimum(., 6)] "y".
graph clip_graph(const layer& l, dtype t, const tensor& w, const tensor& b, bool clip) {
  graph g;
  graph_builder gb(g);
  auto x = ops::placeholder(gb, "x", t, l.xs);
  const ops::epilogue e{.bias = ops::constant(gb, b, {.name = "b", .device = {}}), .bias_in_sum = true};
  auto core = ops::fused_conv2d(x, ops::constant(gb, w, {.name = "w", .device = {}}), e, options_of(l),
                                {.name = clip ? "core" : "y", .device = {}});
  if (clip) {
    (void)ops::minimum(ops::maximum(core, ops::scalar(gb, 0.0, t)), ops::scalar(gb, 6.0, t),
                       {.name = "y", .device = {}});
  }
  return g;
}

// The layer with its clip, run with the passes (the clip fused) and without (as written).
struct clip_sessions {
  clip_sessions(const layer& l, const tensor& w, const tensor& b)
      : unfused(clip_graph(l, dtype::f32, w, b, true), bare()), fused(clip_graph(l, dtype::f32, w, b, true)) {}
  static session_options bare() {
    session_options o;
    o.passes.enabled = false;
    return o;
  }
  session unfused;
  session fused;
};

void expect_same_bits(const tensor& a, const tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

TEST(ConvBiasInSum, MatchesAFloat64ConvolutionPlusTheBias) {
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16}) {
    for (const layer& l : layers) {
      for (const std::string format : {"NCHW", "NHWC"}) {
        SCOPED_TRACE(std::string(l.name) + " " + to_string(t) + " " + format);
        const tensor w = random(t, l.ws, 3, -0.5, 0.5);
        const tensor b = random(t, shape{l.ws[0]}, 4);
        const tensor x = random(t, l.xs, 5);
        graph g;
        {
          graph_builder gb(g);
          auto xin = ops::placeholder(gb, "x", t, l.xs);
          if (format == "NHWC") xin = ops::transpose(xin, {0, 2, 3, 1});
          const ops::epilogue e{.bias = ops::constant(gb, b), .bias_in_sum = true};
          auto y = ops::fused_conv2d(xin, ops::constant(gb, w), e, options_of(l, format));
          if (format == "NHWC") y = ops::transpose(y, {0, 3, 1, 2});
          (void)ops::identity(y, {.name = "y", .device = {}});
        }
        session s(std::move(g));
        const auto got = values(s.run({{"x", x}}, {"y"}).at(0));
        const conv2d_reference want = conv2d_float64(x, w, l.strides, l.padding, {1, 1}, l.groups);
        const auto bias = values(b);
        const std::int64_t plane = want.s[2] * want.s[3];
        ASSERT_EQ(got.size(), want.value.size());
        // conv2d's own tolerances (tests/kernels/nn_conv_test.cpp) on the sum's scale.
        const double rel = t == dtype::f64 ? 1e-12 : t == dtype::f32 ? 1e-5 : 2e-2;
        int reported = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          const double bi = bias[static_cast<std::size_t>(static_cast<std::int64_t>(i) / plane % want.s[1])];
          const double expected = want.value[i] + bi;
          if (!(std::fabs(got[i] - expected) <= rel * (want.magnitude[i] + std::fabs(bi))) && reported++ < 5) {
            ADD_FAILURE() << "element " << i << ": " << got[i] << ", float64 " << expected;
          }
        }
      }
    }
  }
}

// oneDNN's verbose log of what f() runs.
template <class F>
std::string verbose_log_of(F&& f) {
  dnnl::set_verbose(1);
  ::testing::internal::CaptureStdout();
  f();
  std::fflush(stdout);
  std::string log = ::testing::internal::GetCapturedStdout();
  dnnl::set_verbose(0);
  return log;
}

// How many convolution primitives `log` says ran with the post-op `post_op` ("eltwise_clip",
// "binary_add"; one per chunk of images), of those whose line has `problem` (oneDNN's
// description of the convolution, "g96mb2_ic96oc96...").
int post_op_runs(const std::string& log, const std::string& post_op, const std::string& problem = "") {
  std::istringstream lines(log);
  int count = 0;
  for (std::string line; std::getline(lines, line);) {
    count += static_cast<int>(line.find("exec,cpu,convolution") != std::string::npos &&
                              line.find(post_op) != std::string::npos && line.find(problem) != std::string::npos);
  }
  return count;
}

// Runs `s` on x (fetching y) and counts as post_op_runs does.
int post_ops_run(session& s, const tensor& x, std::vector<tensor>& out, const std::string& post_op,
                 const std::string& problem = "") {
  return post_op_runs(verbose_log_of([&] { out = s.run({{"x", x}}, {"y"}); }), post_op, problem);
}

int clip_post_ops_run(session& s, const tensor& x, std::vector<tensor>& out, const std::string& problem = "") {
  return post_ops_run(s, x, out, "eltwise_clip", problem);
}

bool ran_with_clip_post_op(session& s, const tensor& x, std::vector<tensor>& out) {
  return clip_post_ops_run(s, x, out) > 0;
}

TEST(ConvBiasInSum, TheFusedClipKeepsTheBitsNaNAndInfinitiesIncluded) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr double inf = std::numeric_limits<double>::infinity();
  for (const layer& l : layers) {
    SCOPED_TRACE(l.name);
    const tensor w = random(dtype::f32, l.ws, 3, -0.5, 0.5);
    const tensor b = random(dtype::f32, shape{l.ws[0]}, 4);
    clip_sessions s(l, w, b);
    // The clip can go into the primitive where oneDNN computes in channel blocks (the
    // passes' layout there) and reading the input to prove it finite costs at most half of
    // what the epilogue would: the first layer's and the expansion's.
    const shape ys = nn_rules::conv2d_geometry(l.xs, l.ws, nn_rules::conv_window_of(l.groups, l.strides, {1, 1}, l.padding))
                         .output_shape();
    const bool may = nn_rules::cpu_computes_in_channel_blocks() && l.xs.num_elements() <= ys.num_elements() / 2;
    struct input {
      const char* what;
      double value;  // put at element 5; 0: none
      bool clip_in_primitive;
    };
    for (const input& in : {input{"finite", 0.0, may}, input{"NaN", nan, false}, input{"inf", inf, false},
                            input{"-inf", -inf, false}, input{"1e35, finite but may overflow", 1e35, false}}) {
      SCOPED_TRACE(in.what);
      tensor x = random(dtype::f32, l.xs, 5, -3.0, 3.0);
      if (in.value != 0.0) x.data<float>()[5] = static_cast<float>(in.value);
      std::vector<tensor> got;
      EXPECT_EQ(ran_with_clip_post_op(s.fused, x, got), in.clip_in_primitive);
      const tensor want = s.unfused.run({{"x", x}}, {"y"}).at(0);
      expect_same_bits(got.at(0), want);
      const auto v = values(want);
      const bool any_nan = std::any_of(v.begin(), v.end(), [](double d) { return std::isnan(d); });
      // NaN at element 5 reaches the outputs whose window covers it; so does inf times a
      // filter tap of the other sign plus one of the same (the 1x1 layers: all 96 or 24
      // channels of that pixel, some of opposite signs), and 1e35 stays finite or clips.
      if (std::isnan(in.value)) {
        EXPECT_TRUE(any_nan);
      }
      if (in.value == 0.0 || in.value == 1e35) {
        EXPECT_FALSE(any_nan);
      }
      for (const double d : v) {
        if (!std::isnan(d)) {
          EXPECT_TRUE(d >= 0.0 && d <= 6.0) << d;
        }
      }
    }
  }
}

// A batch in several chunks (Note [convolutions in chunks]): each chunk's clip goes into
// the primitive or not on its own input; a NaN in one image keeps its chunk's clip loom's,
// and the whole output is the unfused graph's, bit for bit.
TEST(ConvBiasInSum, EachChunkDecidesWhereItsClipRuns) {
  const layer l{"expansion at 56x56", {7, 16, 56, 56}, {96, 16, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}};
  const tensor w = random(dtype::f32, l.ws, 3, -0.5, 0.5);
  const tensor b = random(dtype::f32, shape{l.ws[0]}, 4);
  clip_sessions s(l, w, b);
  tensor x = random(dtype::f32, l.xs, 5, -3.0, 3.0);
  const std::int64_t image = l.xs.num_elements() / l.xs[0];
  x.data<float>()[4 * image + 100] = std::numeric_limits<float>::quiet_NaN();  // image 4
  std::vector<tensor> got;
  EXPECT_EQ(ran_with_clip_post_op(s.fused, x, got), nn_rules::cpu_computes_in_channel_blocks());
  const tensor want = s.unfused.run({{"x", x}}, {"y"}).at(0);
  expect_same_bits(got.at(0), want);
  const auto v = values(want);
  const std::int64_t out_image = static_cast<std::int64_t>(v.size()) / l.xs[0];
  for (std::int64_t i = 0; i < l.xs[0]; ++i) {
    const bool nan = std::any_of(v.begin() + i * out_image, v.begin() + (i + 1) * out_image,
                                 [](double d) { return std::isnan(d); });
    EXPECT_EQ(nan, i == 4) << "image " << i;
  }
}

// An inverted residual block's expansion and depthwise layer, each with its ReLU6. Where the
// expansion's clip ran in the primitive on every chunk its output is known to lie in
// [0, 6] (Note [known bounds] in loom/core/tensor.hpp), so the depthwise layer's clip goes
// into its primitive too without reading its input; where any chunk of the expansion kept
// loom's clip (a NaN, an infinity, a huge value), the depthwise layer keeps its own. The
// bits are the unfused graph's either way.
TEST(ConvBiasInSum, ADepthwiseLayerAfterAClippedExpansionClipsInItsPrimitive) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr double inf = std::numeric_limits<double>::infinity();
  const layer& expansion = layers[1];
  const layer& depthwise = layers[2];
  const tensor w1 = random(dtype::f32, expansion.ws, 3, -0.5, 0.5);
  const tensor b1 = random(dtype::f32, shape{expansion.ws[0]}, 4);
  const tensor w2 = random(dtype::f32, depthwise.ws, 7, -0.5, 0.5);
  const tensor b2 = random(dtype::f32, shape{depthwise.ws[0]}, 8);
  const auto make_graph = [&](const shape& xs) {
    graph g;
    graph_builder gb(g);
    const auto relu6 = [&](output v, const char* name) {
      return ops::minimum(ops::maximum(v, ops::scalar(gb, 0.0, dtype::f32)), ops::scalar(gb, 6.0, dtype::f32),
                          {.name = name, .device = {}});
    };
    auto x = ops::placeholder(gb, "x", dtype::f32, xs);
    const ops::epilogue e1{.bias = ops::constant(gb, b1), .bias_in_sum = true};
    auto e = relu6(ops::fused_conv2d(x, ops::constant(gb, w1), e1, options_of(expansion)), "e");
    const ops::epilogue e2{.bias = ops::constant(gb, b2), .bias_in_sum = true};
    (void)relu6(ops::fused_conv2d(e, ops::constant(gb, w2), e2, options_of(depthwise)), "y");
    return g;
  };
  const int both = nn_rules::cpu_computes_in_channel_blocks() ? 2 : 0;
  session_options bare;
  bare.passes.enabled = false;
  {
    session unfused(make_graph(expansion.xs), bare);
    session fused(make_graph(expansion.xs));
    struct input {
      const char* what;
      double value;  // put at element 5; 0: none
      int clips_in_primitives;
    };
    for (const input& in : {input{"finite", 0.0, both}, input{"NaN", nan, 0}, input{"inf", inf, 0},
                            input{"-inf", -inf, 0}, input{"1e35", 1e35, 0}}) {
      SCOPED_TRACE(in.what);
      tensor x = random(dtype::f32, expansion.xs, 5, -3.0, 3.0);
      if (in.value != 0.0) x.data<float>()[5] = static_cast<float>(in.value);
      std::vector<tensor> got;
      EXPECT_EQ(clip_post_ops_run(fused, x, got), in.clips_in_primitives);
      const tensor want = unfused.run({{"x", x}}, {"y"}).at(0);
      expect_same_bits(got.at(0), want);
      if (std::isnan(in.value)) {
        const auto v = values(want);
        EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](double d) { return std::isnan(d); }));
      }
    }
  }
  // Seven images in chunks, a NaN in image 4: that chunk's expansion keeps loom's clip, so
  // nothing is known of the expansion's output and the depthwise layer keeps its own.
  const shape xs{7, 16, 56, 56};
  session unfused(make_graph(xs), bare);
  session fused(make_graph(xs));
  tensor x = random(dtype::f32, xs, 5, -3.0, 3.0);
  float& in_image_4 = x.data<float>()[4 * (xs.num_elements() / 7) + 100];
  for (const bool with_nan : {true, false}) {
    SCOPED_TRACE(with_nan ? "a NaN in image 4" : "finite");
    in_image_4 = with_nan ? std::numeric_limits<float>::quiet_NaN() : 1.0F;
    std::vector<tensor> got;
    const int expansion_clips = clip_post_ops_run(fused, x, got, "_ic16oc96_");
    const int depthwise_clips = clip_post_ops_run(fused, x, got, "g96mb");
    expect_same_bits(got.at(0), unfused.run({{"x", x}}, {"y"}).at(0));
    if (both != 0) {
      EXPECT_GE(expansion_clips, with_nan ? 1 : 2);  // the chunks without the NaN
      EXPECT_EQ(depthwise_clips > 0, !with_nan);
    } else {
      EXPECT_EQ(expansion_clips + depthwise_clips, 0);
    }
  }
}

// Note [known bounds] (src/kernel/known_bounds.hpp): what a convolution proved of its output
// is not trusted for a tensor the caller feeds, even one that convolution wrote (fetched,
// changed, fed back where that output goes). A graph in channel blocks as written (no passes):
// x -> to_channel_blocks -> expansion with its clip "e" -> depthwise with its clip -> "y".
TEST(ConvBiasInSum, AFedTensorIsNotTrustedForWhatItsConvolutionProved) {
  if (!nn_rules::cpu_computes_in_channel_blocks()) GTEST_SKIP() << "no channel blocks on this CPU";
  const layer& expansion = layers[1];
  const layer& depthwise = layers[2];
  graph g;
  {
    graph_builder gb(g);
    ops::conv2d_options in_blocks = options_of(expansion, "NCHW16c");
    const ops::epilogue e1{.bias = ops::constant(gb, random(dtype::f32, shape{expansion.ws[0]}, 4)),
                           .activation = "clip", .clip_min = 0.0, .clip_max = 6.0, .bias_in_sum = true};
    auto x = gb.add1("to_channel_blocks", {ops::placeholder(gb, "x", dtype::f32, expansion.xs)});
    auto e = ops::fused_conv2d(x, ops::constant(gb, random(dtype::f32, expansion.ws, 3, -0.5, 0.5)), e1, in_blocks,
                               {.name = "e", .device = {}});
    const ops::epilogue e2{.bias = ops::constant(gb, random(dtype::f32, shape{depthwise.ws[0]}, 8)),
                           .activation = "clip", .clip_min = 0.0, .clip_max = 6.0, .bias_in_sum = true};
    (void)ops::fused_conv2d(e, ops::constant(gb, random(dtype::f32, depthwise.ws, 7, -0.5, 0.5)), e2,
                            options_of(depthwise, "NCHW16c"), {.name = "y", .device = {}});
  }
  session_options bare;
  bare.passes.enabled = false;
  session s(std::move(g), bare);
  const tensor x = random(dtype::f32, expansion.xs, 5, -3.0, 3.0);
  std::vector<tensor> out;
  // Both clips run inside: the expansion proved its output within [0, 6].
  EXPECT_EQ(post_op_runs(verbose_log_of([&] { out = s.run({{"x", x}}, {"y", "e"}); }), "eltwise_clip"), 2);
  tensor e = out.at(1);  // shares the buffer the expansion wrote
  e.data<float>()[16 * 7] = std::numeric_limits<float>::quiet_NaN();  // channel 0 of pixel 7
  const tensor y = s.run({{"e", e}}, {"y"}).at(0);
  const auto v = values(y);
  // The NaN reaches channel 0 of the pixels whose window covers pixel 7 (the clip keeps it).
  EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](double d) { return std::isnan(d); }));
}

// An inverted residual block's projection: its residual, when nothing follows it, is added
// by the primitive (Note [the residual in the primitive] in src/backends/cpu/nn_conv.cpp)
// with the unfused graph's bits: NaN from the input, NaN made in the sums (inf - inf), -0 in
// the residual, a residual made in the graph or fed; and a larger batch, whose chunks keep
// loom's pass.
TEST(ConvBiasInSum, TheResidualIsAddedByThePrimitiveWithTheSameBits) {
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr float inf = std::numeric_limits<float>::infinity();
  const layer& expansion = layers[1];                                                 // 16 -> 96
  const layer projection{"projection", {}, {16, 96, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}};  // 96 -> 16
  const tensor w1 = random(dtype::f32, expansion.ws, 3, -0.5, 0.5);
  const tensor b1 = random(dtype::f32, shape{expansion.ws[0]}, 4);
  const tensor w2 = random(dtype::f32, projection.ws, 7, -0.5, 0.5);
  const tensor b2 = random(dtype::f32, shape{projection.ws[0]}, 8);
  // y = projection(relu6(expansion(r))) + r, r = -x made in the graph (or x, fed).
  const auto make_graph = [&](const shape& xs, bool fed_r) {
    graph g;
    graph_builder gb(g);
    auto x = ops::placeholder(gb, "x", dtype::f32, xs);
    auto r = fed_r ? x : ops::neg(x);
    const ops::epilogue e1{.bias = ops::constant(gb, b1), .bias_in_sum = true};
    auto e = ops::minimum(ops::maximum(ops::fused_conv2d(r, ops::constant(gb, w1), e1, options_of(expansion)),
                                       ops::scalar(gb, 0.0, dtype::f32)),
                          ops::scalar(gb, 6.0, dtype::f32));
    const ops::epilogue e2{.bias = ops::constant(gb, b2), .bias_in_sum = true};
    (void)ops::add(ops::fused_conv2d(e, ops::constant(gb, w2), e2, options_of(projection)), r,
                   {.name = "y", .device = {}});
    return g;
  };
  session_options bare;
  bare.passes.enabled = false;
  for (const shape& xs : {expansion.xs, shape{7, 16, 56, 56}}) {
    for (const bool fed_r : {false, true}) {
      SCOPED_TRACE(to_string(xs) + (fed_r ? " fed residual" : " residual made in the graph"));
      session unfused(make_graph(xs, fed_r), bare);
      session fused(make_graph(xs, fed_r));
      for (const std::string what : {"finite", "NaN", "inf", "-0"}) {
        SCOPED_TRACE(what);
        tensor x = random(dtype::f32, xs, 5, -3.0, 3.0);
        float* v = x.data<float>();
        const std::int64_t last = xs.num_elements() - 1;
        if (what == "NaN") v[5] = v[last] = nan;
        // Two channels of pixel 5 infinite: sums of inf times taps of both signs, NaN.
        if (what == "inf") v[5] = v[5 + xs[2] * xs[3]] = v[last] = inf;
        if (what == "-0") v[5] = v[last] = fed_r ? -0.0F : 0.0F;  // r = -0
        std::vector<tensor> got;
        const int added = post_ops_run(fused, x, got, "binary_add");
        const tensor want = unfused.run({{"x", x}}, {"y"}).at(0);
        expect_same_bits(got.at(0), want);
        // Up to 1 MiB of output a chunk (seven 56x56 images are 1.4 MiB: loom's pass).
        EXPECT_EQ(added > 0, nn_rules::cpu_computes_in_channel_blocks() && xs[0] == 2);
        if (what != "finite" && what != "-0") {
          const auto values_of = values(want);
          EXPECT_TRUE(std::any_of(values_of.begin(), values_of.end(), [](double d) { return std::isnan(d); }));
        }
      }
    }
  }
}

TEST(ConvBiasInSum, AResidualAndAnActivationJoinItsNodeWithTheSameBits) {
  const layer& l = layers[3];  // the projection: 96 -> 24 channels, a residual of its output
  const tensor w = random(dtype::f32, l.ws, 3, -0.5, 0.5);
  const tensor b = random(dtype::f32, shape{l.ws[0]}, 4);
  const shape ys{l.xs[0], l.ws[0], l.xs[2], l.xs[3]};
  const auto make_graph = [&] {
    graph g;
    graph_builder gb(g);
    auto x = ops::placeholder(gb, "x", dtype::f32, l.xs);
    auto r = ops::placeholder(gb, "r", dtype::f32, ys);
    const ops::epilogue e{.bias = ops::constant(gb, b), .bias_in_sum = true};
    auto core = ops::fused_conv2d(x, ops::constant(gb, w), e, options_of(l));
    (void)ops::relu(ops::add(core, r), {.name = "y", .device = {}});
    return g;
  };
  session_options bare;
  bare.passes.enabled = false;
  session unfused(make_graph(), bare);
  session fused(make_graph(), session_options{});
  tensor x = random(dtype::f32, l.xs, 5);
  tensor r = random(dtype::f32, ys, 6);
  r.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  r.data<float>()[9] = -0.0F;
  const auto a = unfused.run({{"x", x}, {"r", r}}, {"y"}).at(0);
  const auto c = fused.run({{"x", x}, {"r", r}}, {"y"}).at(0);
  expect_same_bits(a, c);
  EXPECT_TRUE(std::isnan(values(c)[7]));
  // One fused node: the conv, its bias in the sum, the residual and the relu.
  std::string log;
  for (const auto& record : fused.explain_passes({"x", "r"}, {"y"})) log += passes::to_string(record) + "\n";
  EXPECT_NE(log.find("(in the sum), residual 'r', relu"), std::string::npos) << log;
}

// The gradients of a bias in the sum are a bias_add's: those of conv2d + bias_add, to
// float32's rounding (the forward sums differ in rounding only).
TEST(ConvBiasInSum, ItsGradientsAreThoseOfConvolutionPlusBias) {
  const layer& l = layers[4];  // 3x3, 32 channels
  const tensor w = random(dtype::f32, l.ws, 3, -0.5, 0.5);
  const tensor b = random(dtype::f32, shape{l.ws[0]}, 4);
  const tensor x = random(dtype::f32, l.xs, 5);
  const auto graph_of = [&](bool in_sum) {
    graph g;
    graph_builder gb(g);
    auto xin = ops::placeholder(gb, "x", dtype::f32, l.xs);
    auto win = ops::placeholder(gb, "w", dtype::f32, l.ws);
    auto bin = ops::placeholder(gb, "b", dtype::f32, shape{l.ws[0]});
    const output y = in_sum ? ops::fused_conv2d(xin, win, ops::epilogue{.bias = bin, .bias_in_sum = true}, options_of(l))
                            : ops::bias_add(ops::conv2d(xin, win, options_of(l)), bin, "NCHW");
    const auto d = gradients(ops::reduce_sum(y * y), {xin, win, bin});
    (void)ops::identity(d[0], {.name = "dx", .device = {}});
    (void)ops::identity(d[1], {.name = "dw", .device = {}});
    (void)ops::identity(d[2], {.name = "db", .device = {}});
    return g;
  };
  session in_sum(graph_of(true));
  session after(graph_of(false));
  const auto a = in_sum.run({{"x", x}, {"w", w}, {"b", b}}, {"dx", "dw", "db"});
  const auto c = after.run({{"x", x}, {"w", w}, {"b", b}}, {"dx", "dw", "db"});
  for (std::size_t k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    const auto u = values(a.at(k));
    const auto v = values(c.at(k));
    ASSERT_EQ(u.size(), v.size());
    double scale = 0.0;
    for (const double e : v) scale = std::max(scale, std::fabs(e));
    for (std::size_t i = 0; i < u.size(); ++i) EXPECT_NEAR(u[i], v[i], 1e-5 * scale) << i;
  }
}

TEST(ConvBiasInSum, AnOutputWhoseWindowsAllLieInThePaddingIsTheBias) {
  // An input of width 0 padded by 1 on each side: a 1x1 filter sees only padding.
  const shape xs{1, 4, 3, 0};
  const tensor w = random(dtype::f32, {8, 4, 1, 1}, 3);
  const tensor b = random(dtype::f32, shape{8}, 4);
  for (const std::string format : {"NCHW", "NHWC"}) {
    SCOPED_TRACE(format);
    graph g;
    {
      graph_builder gb(g);
      auto x = ops::placeholder(gb, "x", dtype::f32, xs);
      if (format == "NHWC") x = ops::transpose(x, {0, 2, 3, 1});
      const ops::epilogue e{.bias = ops::constant(gb, b), .bias_in_sum = true};
      auto y = ops::fused_conv2d(x, ops::constant(gb, w), e,
                                 {.strides = {1, 1}, .padding = {0, 0, 1, 1}, .dilations = {1, 1}, .groups = 1,
                                  .data_format = format});
      if (format == "NHWC") y = ops::transpose(y, {0, 3, 1, 2});
      (void)ops::identity(y, {.name = "y", .device = {}});
    }
    session s(std::move(g));
    const tensor y = s.run({{"x", make(dtype::f32, xs, {})}}, {"y"}).at(0);
    ASSERT_EQ(y.shape(), (shape{1, 8, 3, 2}));
    const auto v = values(y);
    const auto bias = values(b);
    for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], bias[i / 6]) << i;
  }
}

TEST(ConvBiasInSum, NeedsABiasAndIsAConvolutions) {
  graph g;
  graph_builder gb(g);
  auto x = ops::placeholder(gb, "x", dtype::f32, {1, 4, 5, 5});
  auto w = ops::constant(gb, random(dtype::f32, {8, 4, 1, 1}, 3));
  EXPECT_THROW((void)ops::fused_conv2d(x, w, ops::epilogue{.bias_in_sum = true}), invalid_argument);
  auto a = ops::placeholder(gb, "a", dtype::f32, {2, 3});
  auto m = ops::placeholder(gb, "m", dtype::f32, {3, 4});
  auto bias = ops::placeholder(gb, "bias", dtype::f32, {4});
  EXPECT_THROW((void)ops::fused_matmul(a, m, ops::epilogue{.bias = bias, .bias_in_sum = true}), invalid_argument);
}

}  // namespace
}  // namespace loom::testing
