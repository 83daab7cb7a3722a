// epilogue_fusion: matmul / conv2d followed by a bias, a residual and an activation becomes
// one fused_matmul / fused_conv2d node. Random shapes, transposes, bias spellings,
// residuals and activations against float64 references and the unfused graph; every
// refusal rule with its logged reason.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numbers>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "passes/pattern_test_support.hpp"

namespace loom {
namespace {

using namespace testing;
using kind = passes::pass_record::kind;
constexpr const char* pass = "epilogue_fusion";

const char* const activations[] = {"none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};

double activate(const std::string& a, double x) {
  if (a == "relu") return x > 0 ? x : 0.0;
  if (a == "gelu") return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
  if (a == "gelu_tanh") {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }
  if (a == "tanh") return std::tanh(x);
  if (a == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  if (a == "clip") return std::min(std::max(x, -0.5), 0.5);
  return x;
}

output apply_activation(const std::string& a, output x) {
  if (a == "relu") return ops::relu(x, {.name = "act"});
  if (a == "gelu") return ops::gelu(x, "none", {.name = "act"});
  if (a == "gelu_tanh") return ops::gelu(x, "tanh", {.name = "act"});
  if (a == "tanh") return ops::tanh(x, {.name = "act"});
  if (a == "sigmoid") return ops::sigmoid(x, {.name = "act"});
  if (a == "clip") {  // as ONNX's Clip lowers: maximum(x, lo), minimum(., hi)
    const output lo = ops::scalar(x.builder(), -0.5, x.dtype_of());
    const output hi = ops::scalar(x.builder(), 0.5, x.dtype_of());
    return ops::minimum(ops::maximum(x, lo, {.name = "act"}), hi, {.name = "act_hi"});
  }
  return x;
}

// How the bias is written.
enum class bias_kind { none, bias_add, bias_add_nchw, add_flat, add_ones };

// a @ b in float64 for stored a ([batch,] M, K, or K, M when ta) and b (K, N, or N, K when
// tb), b shared over the batch.
std::vector<double> matmul_reference(const std::vector<double>& a, const std::vector<double>& b,
                                     std::int64_t batch, std::int64_t m, std::int64_t k,
                                     std::int64_t n, bool ta, bool tb) {
  std::vector<double> out(static_cast<std::size_t>(batch * m * n), 0.0);
  for (std::int64_t z = 0; z < batch; ++z) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double av = a[static_cast<std::size_t>(z * m * k + (ta ? p * m + i : i * k + p))];
          const double bv = b[static_cast<std::size_t>(tb ? j * k + p : p * n + j)];
          s += av * bv;
        }
        out[static_cast<std::size_t>((z * m + i) * n + j)] = s;
      }
    }
  }
  return out;
}

struct conv_case {
  std::int64_t n, c, h, w, o, kh, kw, stride, pad, groups;
  [[nodiscard]] std::int64_t oh() const { return (h + 2 * pad - kh) / stride + 1; }
  [[nodiscard]] std::int64_t ow() const { return (w + 2 * pad - kw) / stride + 1; }
};

std::vector<double> conv_reference(const std::vector<double>& x, const std::vector<double>& w,
                                   const conv_case& cc) {
  const std::int64_t cg = cc.c / cc.groups;
  const std::int64_t og = cc.o / cc.groups;
  std::vector<double> out(static_cast<std::size_t>(cc.n * cc.o * cc.oh() * cc.ow()), 0.0);
  for (std::int64_t n = 0; n < cc.n; ++n) {
    for (std::int64_t o = 0; o < cc.o; ++o) {
      const std::int64_t gi = o / og;
      for (std::int64_t y = 0; y < cc.oh(); ++y) {
        for (std::int64_t xo = 0; xo < cc.ow(); ++xo) {
          double s = 0.0;
          for (std::int64_t ci = 0; ci < cg; ++ci) {
            for (std::int64_t ky = 0; ky < cc.kh; ++ky) {
              for (std::int64_t kx = 0; kx < cc.kw; ++kx) {
                const std::int64_t iy = y * cc.stride - cc.pad + ky;
                const std::int64_t ix = xo * cc.stride - cc.pad + kx;
                if (iy < 0 || iy >= cc.h || ix < 0 || ix >= cc.w) continue;
                const std::int64_t c = gi * cg + ci;
                s += x[static_cast<std::size_t>(((n * cc.c + c) * cc.h + iy) * cc.w + ix)] *
                     w[static_cast<std::size_t>(((o * cg + ci) * cc.kh + ky) * cc.kw + kx)];
              }
            }
          }
          out[static_cast<std::size_t>(((n * cc.o + o) * cc.oh() + y) * cc.ow() + xo)] = s;
        }
      }
    }
  }
  return out;
}

TEST(EpilogueFusion, MatmulEpiloguesOverRandomShapes) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 30; ++trial) {
    const dtype t = trial % 4 == 3 ? dtype::f64 : dtype::f32;
    const bool batched = trial % 5 == 4;
    const std::int64_t batch = batched ? 2 : 1;
    const std::int64_t m = 1 + static_cast<std::int64_t>(rng() % 6);
    const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % 6);
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 6);
    const bool ta = rng() % 2 == 0;
    const bool tb = rng() % 2 == 0;
    auto bk = static_cast<bias_kind>(rng() % 5);
    if (batched && bk == bias_kind::bias_add_nchw) bk = bias_kind::bias_add;
    const bool residual = rng() % 2 == 0;
    std::string act = activations[rng() % 6];
    if (bk == bias_kind::none && !residual && act == "none") act = "relu";
    SCOPED_TRACE(fmt::format(
        "trial {}: {} batch {} m {} k {} n {} ta {} tb {} bias {} residual {} {}", trial,
        to_string(t), batch, m, k, n, ta, tb, static_cast<int>(bk), residual, act));
    shape as = ta ? shape{k, m} : shape{m, k};
    if (batched) as = ta ? shape{batch, k, m} : shape{batch, m, k};
    const shape bs = tb ? shape{n, k} : shape{k, n};
    const shape os = batched ? shape{batch, m, n} : shape{m, n};
    const auto av = rounded(t, uniform(rng, as.num_elements()));
    const auto bv = rounded(t, uniform(rng, bs.num_elements()));
    const auto biasv = rounded(t, uniform(rng, n));
    const auto rv = rounded(t, uniform(rng, os.num_elements()));
    graph g;
    graph_builder b(g);
    auto a = ops::placeholder(b, "a", t, as);
    auto w = ops::placeholder(b, "b", t, bs);
    output y = ops::matmul(a, w, ta, tb, {.name = "mm"});
    std::vector<feed> feeds{{"a", make_tensor(t, as, av)}, {"b", make_tensor(t, bs, bv)}};
    shape bias_shape{n};
    if (bk == bias_kind::add_ones) bias_shape = batched ? shape{1, 1, n} : shape{1, n};
    if (bk != bias_kind::none) {
      auto bias = ops::placeholder(b, "bias", t, bias_shape);
      feeds.emplace_back("bias", make_tensor(t, bias_shape, biasv));
      if (bk == bias_kind::bias_add) y = ops::bias_add(y, bias);
      if (bk == bias_kind::bias_add_nchw) y = ops::bias_add(y, bias, "NCHW");
      if (bk == bias_kind::add_flat || bk == bias_kind::add_ones)
        y = rng() % 2 ? y + bias : bias + y;
    }
    if (residual) {
      auto r = ops::placeholder(b, "r", t, os);
      feeds.emplace_back("r", make_tensor(t, os, rv));
      y = rng() % 2 ? y + r : r + y;
    }
    y = apply_activation(act, y);
    ops::identity(y, {.name = "y"});
    const auto c = run_both(g, pass, feeds, {"y"});
    auto want = matmul_reference(av, bv, batch, m, k, n, ta, tb);
    for (std::size_t i = 0; i < want.size(); ++i) {
      double v = want[i];
      if (bk != bias_kind::none) v += biasv[i % static_cast<std::size_t>(n)];
      if (residual) v += rv[i];
      want[i] = activate(act, v);
    }
    const double tol = t == dtype::f64 ? 1e-9 : 1e-4;
    expect_near_all(values(c.on[0]), want, tol, tol, "fused");
    expect_near_all(values(c.off[0]), want, tol, tol, "unfused");
    EXPECT_EQ(count_op(c.planned, "fused_matmul"), 1u) << log_text(c.log);
    EXPECT_EQ(count_op(c.planned, "matmul"), 0u);
    EXPECT_EQ(count_op(c.planned, "fused_elementwise"), 0u) << "the epilogue went to the matmul";
    const auto done = records(c.log, pass, kind::rewrite, {"fused_matmul"});
    ASSERT_EQ(done.size(), 1u) << log_text(c.log);
    if (act != "none") {
      EXPECT_NE(done[0].result.find(act), std::string::npos) << done[0].result;
    }
    // A lone residual of shape [1, N] is also a channel bias, and is taken as one.
    const bool residual_as_bias = bk == bias_kind::none && residual && !batched && m == 1;
    EXPECT_EQ(done[0].result.find("bias") != std::string::npos,
              bk != bias_kind::none || residual_as_bias)
        << done[0].result;
    EXPECT_EQ(done[0].result.find("residual") != std::string::npos, residual && !residual_as_bias)
        << done[0].result;
  }
}

TEST(EpilogueFusion, Conv2dEpiloguesOverRandomShapes) {
  std::mt19937 rng(32);
  for (int trial = 0; trial < 20; ++trial) {
    const dtype t = trial % 4 == 3 ? dtype::f64 : dtype::f32;
    conv_case cc{};
    cc.groups = trial % 5 == 4 ? 2 : 1;
    cc.n = 1 + static_cast<std::int64_t>(rng() % 2);
    cc.c = cc.groups * (1 + static_cast<std::int64_t>(rng() % 2));
    cc.o = cc.groups * (1 + static_cast<std::int64_t>(rng() % 3));
    cc.h = 3 + static_cast<std::int64_t>(rng() % 4);
    cc.w = 3 + static_cast<std::int64_t>(rng() % 4);
    cc.kh = 1 + static_cast<std::int64_t>(rng() % 3);
    cc.kw = 1 + static_cast<std::int64_t>(rng() % 3);
    cc.stride = 1 + static_cast<std::int64_t>(rng() % 2);
    cc.pad = static_cast<std::int64_t>(rng() % 2);
    const int bias_form = static_cast<int>(rng() % 4);  // none, bias_add NCHW, [O,1,1], [1,O,1,1]
    const bool residual = rng() % 2 == 0;
    std::string act = activations[rng() % 6];
    if (bias_form == 0 && !residual && act == "none") act = "sigmoid";
    SCOPED_TRACE(
        fmt::format("trial {}: {} n {} c {} {}x{} o {} k {}x{} stride {} pad {} groups {} "
                    "bias {} residual {} {}",
                    trial, to_string(t), cc.n, cc.c, cc.h, cc.w, cc.o, cc.kh, cc.kw, cc.stride,
                    cc.pad, cc.groups, bias_form, residual, act));
    const shape xs{cc.n, cc.c, cc.h, cc.w};
    const shape ws{cc.o, cc.c / cc.groups, cc.kh, cc.kw};
    const shape os{cc.n, cc.o, cc.oh(), cc.ow()};
    const auto xv = rounded(t, uniform(rng, xs.num_elements()));
    const auto wv = rounded(t, uniform(rng, ws.num_elements()));
    const auto biasv = rounded(t, uniform(rng, cc.o));
    const auto rv = rounded(t, uniform(rng, os.num_elements()));
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, xs);
    auto w = ops::placeholder(b, "w", t, ws);
    ops::conv2d_options co;
    co.strides = {cc.stride, cc.stride};
    co.padding = {cc.pad, cc.pad};
    co.groups = cc.groups;
    output y = ops::conv2d(x, w, co, {.name = "conv"});
    std::vector<feed> feeds{{"x", make_tensor(t, xs, xv)}, {"w", make_tensor(t, ws, wv)}};
    if (bias_form != 0) {
      const shape bs = bias_form == 1   ? shape{cc.o}
                       : bias_form == 2 ? shape{cc.o, 1, 1}
                                        : shape{1, cc.o, 1, 1};
      auto bias = ops::placeholder(b, "bias", t, bs);
      feeds.emplace_back("bias", make_tensor(t, bs, biasv));
      y = bias_form == 1 ? ops::bias_add(y, bias, "NCHW") : (rng() % 2 ? y + bias : bias + y);
    }
    if (residual) {
      auto r = ops::placeholder(b, "r", t, os);
      feeds.emplace_back("r", make_tensor(t, os, rv));
      y = y + r;
    }
    y = apply_activation(act, y);
    ops::identity(y, {.name = "y"});
    const auto c = run_both(g, pass, feeds, {"y"});
    auto want = conv_reference(xv, wv, cc);
    const std::int64_t plane = cc.oh() * cc.ow();
    for (std::size_t i = 0; i < want.size(); ++i) {
      double v = want[i];
      if (bias_form != 0)
        v += biasv[static_cast<std::size_t>((static_cast<std::int64_t>(i) / plane) % cc.o)];
      if (residual) v += rv[i];
      want[i] = activate(act, v);
    }
    const double tol = t == dtype::f64 ? 1e-9 : 1e-4;
    expect_near_all(values(c.on[0]), want, tol, tol, "fused");
    expect_near_all(values(c.off[0]), want, tol, tol, "unfused");
    EXPECT_EQ(count_op(c.planned, "fused_conv2d"), 1u) << log_text(c.log);
    EXPECT_EQ(count_op(c.planned, "conv2d"), 0u);
    EXPECT_EQ(count_op(c.planned, "reshape"), bias_form >= 2 ? 1u : 0u)
        << "a [O,1,1] bias is reshaped";
    EXPECT_EQ(rewrites(c.log, pass), 1u) << log_text(c.log);
  }
}

TEST(EpilogueFusion, ConvBiasesThatAreNotAlongTheChannelsAreRefused) {
  std::mt19937 rng(34);
  const conv_case cc{1, 2, 4, 3, 3, 2, 2, 1, 0, 1};  // output [1, 3, 3, 2]
  const shape xs{1, 2, 4, 3};
  const shape ws{3, 2, 2, 2};
  const auto xv = rounded(dtype::f32, uniform(rng, xs.num_elements()));
  const auto wv = rounded(dtype::f32, uniform(rng, ws.num_elements()));
  const auto bv = rounded(dtype::f32, uniform(rng, 3));
  for (const bool bias_add : {false, true}) {
    SCOPED_TRACE(bias_add ? "bias_add NHWC" : "add of a [3]");
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, xs);
    auto w = ops::placeholder(b, "w", dtype::f32, ws);
    auto conv = ops::conv2d(x, w, {}, {.name = "conv"});
    // The output is [1, 3, 3, 2]: a [3, 1] bias has O's size but runs along H, and
    // bias_add "NHWC" runs along W.
    auto bias = ops::placeholder(b, "bias", dtype::f32, bias_add ? shape{2} : shape{3, 1});
    auto y = bias_add ? ops::bias_add(conv, bias) : conv + bias;
    ops::identity(y, {.name = "y"});
    const std::vector<double> bias_values = bias_add ? std::vector<double>{bv[0], bv[1]} : bv;
    const auto c = run_both(
        g, pass,
        {{"x", make_tensor(dtype::f32, xs, xv)},
         {"w", make_tensor(dtype::f32, ws, wv)},
         {"bias", make_tensor(dtype::f32, bias_add ? shape{2} : shape{3, 1}, bias_values)}},
        {"y"});
    if (bias_add) {
      EXPECT_TRUE(refused_with(c.log, pass,
                               {"data_format \"NHWC\"", "another dim than the output's channels"}))
          << log_text(c.log);
    } else {
      EXPECT_TRUE(
          refused_with(c.log, pass, {"neither a channel bias nor a residual", "float32[3, 1]"}))
          << log_text(c.log);
    }
    EXPECT_EQ(count_op(c.planned, "fused_conv2d"), 0u);
    auto want = conv_reference(xv, wv, cc);
    for (std::size_t i = 0; i < want.size(); ++i) {
      // bias_add NHWC: along W (2); [3, 1]: along H (3).
      want[i] += bias_add ? bias_values[i % 2] : bias_values[(i / 2) % 3];
    }
    expect_near_all(values(c.on[0]), want, 1e-5, 1e-5);
  }
}

TEST(EpilogueFusion, AnActivationOnAnotherDeviceStaysOutside) {
  std::mt19937 rng(35);
  const auto av = rounded(dtype::f32, uniform(rng, 6));
  const auto bv = rounded(dtype::f32, uniform(rng, 6));
  const auto biasv = rounded(dtype::f32, uniform(rng, 2));
  graph g;
  graph_builder b(g);
  auto a = ops::placeholder(b, "a", dtype::f32, {2, 3});
  auto w = ops::placeholder(b, "b", dtype::f32, {3, 2});
  auto bias = ops::placeholder(b, "bias", dtype::f32, {2});
  auto h = ops::bias_add(ops::matmul(a, w), bias);
  ops::identity(ops::tanh(h, {.name = "act", .device = "cpu:1"}), {.name = "y"});
  session_options o;
  o.devices.virtual_cpu_devices = 2;
  const auto c = run_both(g, pass,
                          {{"a", make_tensor(dtype::f32, {2, 3}, av)},
                           {"b", make_tensor(dtype::f32, {3, 2}, bv)},
                           {"bias", make_tensor(dtype::f32, {2}, biasv)}},
                          {"y"}, {}, o);
  EXPECT_TRUE(refused_with(c.log, pass, {"it asks for device 'cpu:1'"})) << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "fused_matmul"), 1u) << "the bias still fuses";
  EXPECT_EQ(count_op(c.planned, "tanh"), 1u);
  auto want = matmul_reference(av, bv, 1, 2, 3, 2, false, false);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = std::tanh(want[i] + biasv[i % 2]);
  expect_near_all(values(c.on[0]), want, 1e-5, 1e-5);
}

TEST(EpilogueFusion, AControlInputOnAStepIsRefused) {
  std::mt19937 rng(36);
  const auto av = rounded(dtype::f32, uniform(rng, 6));
  const auto bv = rounded(dtype::f32, uniform(rng, 6));
  graph g;
  graph_builder b(g);
  auto a = ops::placeholder(b, "a", dtype::f32, {2, 3});
  auto w = ops::placeholder(b, "b", dtype::f32, {3, 2});
  auto other = ops::identity(a, {.name = "other"});
  auto act = ops::relu(ops::matmul(a, w), {.name = "act"});
  ops::identity(act, {.name = "y"});
  g.add_control_input(act.ep().node, other.ep().node);
  const auto c = run_both(
      g, pass,
      {{"a", make_tensor(dtype::f32, {2, 3}, av)}, {"b", make_tensor(dtype::f32, {3, 2}, bv)}},
      {"y"});
  EXPECT_TRUE(refused_with(c.log, pass, {"it waits for 'other' (a control input)"}))
      << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "fused_matmul"), 0u);
  auto want = matmul_reference(av, bv, 1, 2, 3, 2, false, false);
  for (auto& v : want) v = std::max(v, 0.0);
  expect_near_all(values(c.on[0]), want, 1e-5, 1e-5);
}

TEST(EpilogueFusion, AResidualOfAnUnknownShapeIsRefused) {
  std::mt19937 rng(37);
  const auto av = rounded(dtype::f32, uniform(rng, 6));
  const auto bv = rounded(dtype::f32, uniform(rng, 6));
  const auto rv = rounded(dtype::f32, uniform(rng, 4));
  graph g;
  graph_builder b(g);
  auto a = ops::placeholder(b, "a", dtype::f32, {-1, 3});
  auto w = ops::placeholder(b, "b", dtype::f32, {3, 2});
  auto r = ops::placeholder(b, "r", dtype::f32, {-1, 2});
  ops::identity(ops::matmul(a, w) + r, {.name = "y"});
  const auto c = run_both(g, pass,
                          {{"a", make_tensor(dtype::f32, {2, 3}, av)},
                           {"b", make_tensor(dtype::f32, {3, 2}, bv)},
                           {"r", make_tensor(dtype::f32, {2, 2}, rv)}},
                          {"y"});
  EXPECT_TRUE(refused_with(c.log, pass, {"[?, 2] is not fully known"})) << log_text(c.log);
  auto want = matmul_reference(av, bv, 1, 2, 3, 2, false, false);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += rv[i];
  expect_near_all(values(c.on[0]), want, 1e-5, 1e-5);
}

// After gradients(): tanh's gradient reads tanh's output, which the fused node provides, so
// the epilogue still fuses; gelu's reads its input, the bias_add's value, so it is refused,
// and so are clip's maximum and minimum, whose gradients read theirs.
TEST(EpilogueFusion, GradientsBuiltFirstFuseWhereTheyReadOnlyTheResult) {
  std::mt19937 rng(38);
  const auto av = rounded(dtype::f32, uniform(rng, 12));
  const auto wv = rounded(dtype::f32, uniform(rng, 6));
  const auto biasv = rounded(dtype::f32, uniform(rng, 2));
  for (const char* act : {"tanh", "gelu", "clip"}) {
    SCOPED_TRACE(act);
    graph g;
    graph_builder b(g);
    auto a = ops::placeholder(b, "a", dtype::f32, {4, 3});
    auto w = ops::variable(b, "w", make_tensor(dtype::f32, {3, 2}, wv));
    auto bias = ops::variable(b, "bias", make_tensor(dtype::f32, {2}, biasv));
    auto y = apply_activation(act, ops::bias_add(ops::matmul(a, w), bias));
    auto loss = ops::reduce_sum(y, {}, false, {.name = "loss"});
    const auto grads = gradients(loss, {w, bias});
    const auto c = run_both(g, pass, {{"a", make_tensor(dtype::f32, {4, 3}, av)}},
                            {"loss", grads[0].name(), grads[1].name()});
    if (std::string(act) == "tanh") {
      EXPECT_EQ(count_op(c.planned, "fused_matmul"), 1u) << log_text(c.log);
    } else {
      EXPECT_TRUE(
          refused_with(c.log, pass, {"is also read by", "gradients() ran before the passes"}))
          << log_text(c.log);
      if (std::string(act) == "gelu") {
        EXPECT_EQ(count_op(c.planned, "gelu"), 1u);
      }
      EXPECT_EQ(count_op(c.planned, "fused_matmul"), 1u) << "the bias still fuses";
      EXPECT_EQ(records(c.log, pass, kind::rewrite, {act}).size(), 0u) << log_text(c.log);
    }
    auto h = matmul_reference(av, wv, 1, 4, 3, 2, false, false);
    double want = 0.0;
    for (std::size_t i = 0; i < h.size(); ++i) want += activate(act, h[i] + biasv[i % 2]);
    EXPECT_NEAR(values(c.on[0])[0], want, 1e-4);
    for (std::size_t k = 1; k < 3; ++k)
      expect_near_all(values(c.on[k]), values(c.off[k]), 1e-5, 1e-6);
  }
}

// ---- activation clip: maximum / minimum with scalar const bounds ---------------------------

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// Every byte of every fetch the same with the pass and without it.
void expect_same_bits(const compared& c) {
  ASSERT_EQ(c.on.size(), c.off.size());
  for (std::size_t k = 0; k < c.on.size(); ++k) {
    ASSERT_EQ(c.on[k].nbytes(), c.off[k].nbytes()) << "fetch " << k;
    ASSERT_TRUE(c.on[k].is_contiguous() && c.off[k].is_contiguous());
    EXPECT_EQ(std::memcmp(c.on[k].raw_data(), c.off[k].raw_data(), c.on[k].nbytes()), 0)
        << "fetch " << k << " differs from the unfused graph's";
  }
}

// A bound as ONNX's Clip lowering gives it: a const of rank 0, or of `ones` dims of 1.
output bound_const(graph_builder& b, double v, dtype t, std::size_t ones = 0) {
  if (ones == 0) return ops::scalar(b, v, t);
  return ops::constant(b, make_tensor(t, shape(std::vector<std::int64_t>(ones, 1)), {v}));
}

// Residual values that put NaN, infinities, signed zeros and the bounds' values into the
// activation's input (where the core and the bias are zero) and values between and past
// them.
const std::vector<double> specials{nan, inf,  -inf, -0.0, 0.0,  6.0, -6.0, 0.25,
                                   3.0, -3.0, 7.0,  1e3,  -1e3, 0.5, 6.0,  0.0};

// How the clip is written after the core (and its bias and residual): both nodes, a lone
// maximum, a lone minimum; bounds of rank 0 or all dims 1.
struct clip_form {
  bool max = true;
  bool min = true;
  std::size_t ones = 0;  // the bounds' rank (dims of 1); 0: scalars
  double lo = 0.0;
  double hi = 6.0;
};

output apply_clip(graph_builder& b, output y, dtype t, const clip_form& f) {
  if (f.max) y = ops::maximum(y, bound_const(b, f.lo, t, f.ones), {.name = "clip_lo"});
  if (f.min) y = ops::minimum(y, bound_const(b, f.hi, t, f.ones), {.name = "clip_hi"});
  return y;
}

std::string clip_text(const clip_form& f) {
  return fmt::format("clip [{}, {}]", f.max ? f.lo : -inf, f.min ? f.hi : inf);
}

const clip_form clip_forms[] = {
    {},                                                // ReLU6: maximum(., 0), minimum(., 6)
    {.max = true, .min = false},                       // relu-like: maximum(., 0)
    {.max = false, .min = true},                       // minimum(., 6)
    {.ones = 2},                                       // [1, 1] bounds
    {.lo = -0.0, .hi = 0.25},                          // a -0 bound
    {.max = true, .min = true, .lo = nan},             // a NaN bound
    {.max = true, .min = true, .lo = 6.0, .hi = 0.0},  // lo > hi
};

TEST(EpilogueFusion, MatmulClipChainsFuseBitForBit) {
  std::mt19937 rng(41);
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16}) {
    for (const clip_form& f : clip_forms) {
      for (int extra = 0; extra < 3; ++extra) {  // none; bias_add and residual; add-bias
        SCOPED_TRACE(fmt::format("{} {} extra {}", to_string(t), clip_text(f), extra));
        // Rows 0 and 1 of a are zeros: there the activation's input is bias + residual,
        // and bias columns 0-3 are zeros: the residual's specials themselves.
        std::vector<double> av = uniform(rng, 12);
        std::fill(av.begin(), av.begin() + 6, 0.0);
        std::vector<double> biasv = uniform(rng, 8);
        std::fill(biasv.begin(), biasv.begin() + 4, 0.0);
        std::vector<double> rv = specials;
        rv.insert(rv.end(), specials.rbegin(), specials.rend());
        graph g;
        graph_builder b(g);
        auto a = ops::placeholder(b, "a", t, {4, 3});
        auto w = ops::placeholder(b, "b", t, {3, 8});
        std::vector<feed> feeds{{"a", make_tensor(t, {4, 3}, av)},
                                {"b", make_tensor(t, {3, 8}, uniform(rng, 24))}};
        output y = ops::matmul(a, w, false, false, {.name = "mm"});
        if (extra == 0) {
          // The specials come through a: a K = 1 product with b's ones.
          a = ops::placeholder(b, "a1", t, {8, 1});
          auto ones = ops::placeholder(b, "ones", t, {1, 4});
          feeds = {{"a1", make_tensor(t, {8, 1},
                                      std::vector<double>(specials.begin(), specials.begin() + 8))},
                   {"ones", make_tensor(t, {1, 4}, {1.0, -1.0, 1.0, 0.5})}};
          y = ops::matmul(a, ones, false, false, {.name = "mm1"});
        } else {
          auto bias = ops::placeholder(b, "bias", t, extra == 1 ? shape{8} : shape{1, 8});
          feeds.emplace_back("bias", make_tensor(t, extra == 1 ? shape{8} : shape{1, 8}, biasv));
          y = extra == 1 ? ops::bias_add(y, bias) : y + bias;
          if (extra == 1) {
            auto r = ops::placeholder(b, "r", t, {4, 8});
            feeds.emplace_back("r", make_tensor(t, {4, 8}, rv));
            y = y + r;
          }
        }
        y = apply_clip(b, y, t, f);
        ops::identity(y, {.name = "y"});
        const auto c = run_both(g, pass, feeds, {"y"});
        EXPECT_EQ(count_op(c.planned, "fused_matmul"), 1u) << log_text(c.log);
        EXPECT_EQ(count_op(c.planned, "maximum"), 0u) << log_text(c.log);
        EXPECT_EQ(count_op(c.planned, "minimum"), 0u) << log_text(c.log);
        EXPECT_EQ(count_op(c.planned, "fused_elementwise"), 0u) << log_text(c.log);
        EXPECT_EQ(records(c.log, pass, kind::rewrite, {"fused_matmul", clip_text(f)}).size(), 1u)
            << log_text(c.log);
        expect_same_bits(c);
      }
    }
  }
}

TEST(EpilogueFusion, Conv2dClipChainsFuseBitForBit) {
  std::mt19937 rng(42);
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16}) {
    for (const clip_form& f : clip_forms) {
      for (const bool residual : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} residual {}", to_string(t), clip_text(f), residual));
        clip_form cf = f;
        if (cf.ones != 0) cf.ones = 4;  // [1, 1, 1, 1] against the rank-4 output
        // Image 0 is zeros: there the input is bias + residual, and bias 0 is zero.
        std::vector<double> xv = uniform(rng, 2 * 2 * 4 * 4);
        std::fill(xv.begin(), xv.begin() + 32, 0.0);
        std::vector<double> biasv = uniform(rng, 2);
        biasv[0] = 0.0;
        std::vector<double> rv;
        for (int k = 0; k < 4; ++k) rv.insert(rv.end(), specials.begin(), specials.end());
        graph g;
        graph_builder b(g);
        auto x = ops::placeholder(b, "x", t, {2, 2, 4, 4});
        auto w = ops::placeholder(b, "w", t, {2, 2, 3, 3});
        auto bias = ops::placeholder(b, "bias", t, {2, 1, 1});
        std::vector<feed> feeds{{"x", make_tensor(t, {2, 2, 4, 4}, xv)},
                                {"w", make_tensor(t, {2, 2, 3, 3}, uniform(rng, 36))},
                                {"bias", make_tensor(t, {2, 1, 1}, biasv)}};
        ops::conv2d_options co;
        co.padding = {1, 1};
        output y = ops::conv2d(x, w, co, {.name = "conv"}) + bias;
        if (residual) {
          auto r = ops::placeholder(b, "r", t, {2, 2, 4, 4});
          feeds.emplace_back("r", make_tensor(t, {2, 2, 4, 4}, rv));
          y = y + r;
        }
        y = apply_clip(b, y, t, cf);
        ops::identity(y, {.name = "y"});
        const auto c = run_both(g, pass, feeds, {"y"});
        EXPECT_EQ(count_op(c.planned, "fused_conv2d"), 1u) << log_text(c.log);
        EXPECT_EQ(count_op(c.planned, "maximum") + count_op(c.planned, "minimum"), 0u)
            << log_text(c.log);
        EXPECT_EQ(records(c.log, pass, kind::rewrite, {"fused_conv2d", clip_text(cf)}).size(), 1u)
            << log_text(c.log);
        expect_same_bits(c);
      }
    }
  }
}

// What is no clip stays outside, logged with the reason: the value as the second operand
// (maximum(0, v) gives v for v = -0 where maximum(v, 0) gives +0), a bound that is not a
// scalar (a [N] const, or all dims 1 but of a higher rank than the output, which would
// broadcast it), a bound that is not a const. The bias before it still fuses.
TEST(EpilogueFusion, WhatIsNoClipIsRefused) {
  std::mt19937 rng(44);
  const auto av = rounded(dtype::f32, uniform(rng, 6));
  const auto bv = rounded(dtype::f32, uniform(rng, 9));
  const auto biasv = rounded(dtype::f32, uniform(rng, 3));
  enum class bad { swapped, vector_bound, higher_rank, placeholder_bound, swapped_min };
  for (const bad k : {bad::swapped, bad::vector_bound, bad::higher_rank, bad::placeholder_bound,
                      bad::swapped_min}) {
    SCOPED_TRACE(static_cast<int>(k));
    graph g;
    graph_builder b(g);
    auto a = ops::placeholder(b, "a", dtype::f32, {2, 3});
    auto w = ops::placeholder(b, "b", dtype::f32, {3, 3});
    auto bias = ops::placeholder(b, "bias", dtype::f32, {3});
    std::vector<feed> feeds{{"a", make_tensor(dtype::f32, {2, 3}, av)},
                            {"b", make_tensor(dtype::f32, {3, 3}, bv)},
                            {"bias", make_tensor(dtype::f32, {3}, biasv)}};
    auto h = ops::bias_add(ops::matmul(a, w, false, false, {.name = "mm"}), bias);
    auto zero = ops::scalar(b, 0.0, dtype::f32);
    output y;
    std::string why;
    switch (k) {
      case bad::swapped:
        y = ops::maximum(zero, h, {.name = "lo"});
        why = "the value is its second operand";
        break;
      case bad::swapped_min:
        y = ops::minimum(ops::scalar(b, 6.0, dtype::f32), h, {.name = "lo"});
        why = "only minimum(value, bound) is a clip";
        break;
      case bad::vector_bound:
        y = ops::maximum(h, ops::constant(b, make_tensor(dtype::f32, {3}, {0.0, 0.0, 0.0})),
                         {.name = "lo"});
        why = "float32[3]) is not a scalar";
        break;
      case bad::higher_rank:
        y = ops::maximum(h, ops::constant(b, make_tensor(dtype::f32, {1, 1, 1}, {0.0})),
                         {.name = "lo"});
        why = "float32[1, 1, 1]) is not a scalar";
        break;
      case bad::placeholder_bound: {
        auto p = ops::placeholder(b, "p", dtype::f32, shape{});
        feeds.emplace_back("p", make_tensor(dtype::f32, shape{}, {0.0}));
        y = ops::maximum(h, p, {.name = "lo"});
        why = "its bound 'p' is no const";
        break;
      }
    }
    ops::identity(ops::minimum(y, ops::scalar(b, 6.0, dtype::f32)), {.name = "y"});
    const auto c = run_both(g, pass, feeds, {"y"});
    const auto refusals =
        records(c.log, pass, kind::refused, {"not fused into the epilogue of 'mm'", why});
    ASSERT_EQ(refusals.size(), 1u) << log_text(c.log);
    EXPECT_EQ(refusals[0].nodes, std::vector<std::string>{"lo"});
    EXPECT_EQ(count_op(c.planned, "fused_matmul"), 1u) << "the bias still fuses";
    EXPECT_EQ(records(c.log, pass, kind::rewrite, {"clip"}).size(), 0u) << log_text(c.log);
    expect_same_bits(c);
  }
}

// A value also fetched ends the match before the step that reads it: a fetched core keeps
// its whole epilogue outside; a clip's maximum also fetched fuses alone (clip [0, inf]) and
// its minimum stays outside.
TEST(EpilogueFusion, AFetchedValueEndsTheMatch) {
  std::mt19937 rng(33);
  const auto av = rounded(dtype::f32, uniform(rng, 6));
  const auto bv = rounded(dtype::f32, uniform(rng, 6));
  for (const bool clip : {false, true}) {
    SCOPED_TRACE(clip ? "clip" : "relu");
    graph g;
    graph_builder b(g);
    auto a = ops::placeholder(b, "a", dtype::f32, {2, 3});
    auto w = ops::placeholder(b, "b", dtype::f32, {3, 2});
    auto mid = ops::matmul(a, w, false, false, {.name = "mm"});  // also fetched
    if (clip) {
      mid = ops::maximum(mid, ops::scalar(b, 0.0, dtype::f32), {.name = "lo"});
      ops::identity(ops::minimum(mid, ops::scalar(b, 1.0, dtype::f32), {.name = "hi"}),
                    {.name = "y"});
    } else {
      ops::identity(ops::relu(mid), {.name = "y"});
    }
    const auto c = run_both(
        g, pass,
        {{"a", make_tensor(dtype::f32, {2, 3}, av)}, {"b", make_tensor(dtype::f32, {3, 2}, bv)}},
        {"y", mid.name()});
    const auto refusals =
        records(c.log, pass, kind::refused,
                {"not fused into the epilogue of 'mm'",
                 clip ? "'lo' is also read by a fetch" : "'mm' is also read by a fetch"});
    ASSERT_EQ(refusals.size(), 1u) << log_text(c.log);
    EXPECT_EQ(refusals[0].nodes, std::vector<std::string>{clip ? "hi" : "relu"});
    EXPECT_EQ(count_op(c.planned, "fused_matmul"), clip ? 1u : 0u);
    EXPECT_EQ(records(c.log, pass, kind::rewrite, {"fused_matmul", "clip [0, inf]"}).size(),
              clip ? 1u : 0u)
        << log_text(c.log);
    expect_same_bits(c);
    auto want = matmul_reference(av, bv, 1, 2, 3, 2, false, false);
    for (auto& v : want) v = clip ? std::max(v, 0.0) : v;
    expect_near_all(values(c.on[1]), want, 1e-5, 1e-5);
    for (auto& v : want) v = clip ? std::min(v, 1.0) : std::max(v, 0.0);
    expect_near_all(values(c.on[0]), want, 1e-5, 1e-5);
  }
}

}  // namespace
}  // namespace loom
