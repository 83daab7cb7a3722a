// layer_norm_fusion: layer normalisation written in primitives becomes one layer_norm node.
// Every form the pass matches, over random shapes and axes, against a float64 reference
// and the unfused graph; every refusal rule with its logged reason; and a small MLP whose
// forward graph is rewritten before gradients() trains as the unfused one does.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <numeric>
#include <optional>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/passes/pass_manager.hpp"
#include "passes/pattern_test_support.hpp"

namespace loom {
namespace {

using namespace testing;
using kind = passes::pass_record::kind;
constexpr const char* pass = "layer_norm_fusion";

// How the primitives are written.
struct ln_form {
  bool square = true;      // square(d), or d * d
  bool rsqrt = true;       // d * rsqrt(var + eps), or d / sqrt(var + eps)
  bool eps_first = false;  // eps + var
  bool swapped = false;    // rsqrt(.) * d, gamma * y, beta + y
  bool twice = false;      // x - mean written twice (CSE merges them)
};

output ln_primitives(output x, const std::vector<std::int64_t>& axes, double eps, const ln_form& f,
                     std::optional<output> gamma, std::optional<output> beta) {
  graph_builder& b = x.builder();
  const output mean = ops::reduce_mean(x, axes, true);
  const output d = x - mean;
  const output d2 = f.twice ? x - mean : d;
  const output sq = f.square ? ops::square(d) : d * d;
  const output var = ops::reduce_mean(sq, axes, true);
  const output e = ops::scalar(b, eps, x.dtype_of());
  const output ve = f.eps_first ? e + var : var + e;
  output y = f.rsqrt ? (f.swapped ? ops::rsqrt(ve) * d2 : d2 * ops::rsqrt(ve)) : d2 / ops::sqrt(ve);
  if (gamma) y = f.swapped ? *gamma * y : y * *gamma;
  if (beta) y = f.swapped ? *beta + y : y + *beta;
  return y;
}

// Layer normalisation in float64 over dims [axis, rank) of x (shape s); empty gamma/beta
// mean 1 and 0.
std::vector<double> ln_reference(const std::vector<double>& x, const shape& s, std::size_t axis,
                                 const std::vector<double>& gamma, const std::vector<double>& beta,
                                 double eps) {
  std::int64_t inner = 1;
  for (std::size_t k = axis; k < s.rank(); ++k) inner *= s[k];
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<double> y(x.size());
  for (std::int64_t r = 0; inner > 0 && r < n / inner; ++r) {
    double mean = 0.0;
    for (std::int64_t i = 0; i < inner; ++i) mean += x[static_cast<std::size_t>(r * inner + i)];
    mean /= static_cast<double>(inner);
    double var = 0.0;
    for (std::int64_t i = 0; i < inner; ++i) {
      const double d = x[static_cast<std::size_t>(r * inner + i)] - mean;
      var += d * d;
    }
    var /= static_cast<double>(inner);
    for (std::int64_t i = 0; i < inner; ++i) {
      const auto k = static_cast<std::size_t>(r * inner + i);
      const auto j = static_cast<std::size_t>(i);
      y[k] = (x[k] - mean) / std::sqrt(var + eps) * (gamma.empty() ? 1.0 : gamma[j]) +
             (beta.empty() ? 0.0 : beta[j]);
    }
  }
  return y;
}

shape tail_of(const shape& s, std::size_t axis) {
  shape t;
  for (std::size_t k = axis; k < s.rank(); ++k) t.push_back(s[k]);
  return t;
}

TEST(LayerNormFusion, FusesTheRsqrtFormWithGammaAndBeta) {
  std::mt19937 rng(1);
  const shape s{4, 6};
  const auto xv = rounded(dtype::f32, uniform(rng, 24));
  const auto gv = rounded(dtype::f32, uniform(rng, 6, 0.5, 1.5));
  const auto bv = rounded(dtype::f32, uniform(rng, 6));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto gamma = ops::variable(b, "gamma", make_tensor(dtype::f32, {6}, gv));
  auto beta = ops::variable(b, "beta", make_tensor(dtype::f32, {6}, bv));
  auto y = ln_primitives(x, {-1}, 1e-5, {}, gamma, beta);
  ops::identity(y, {.name = "y"});
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y"});
  const auto want = ln_reference(xv, s, 1, gv, bv, 1e-5);
  expect_near_all(values(c.on[0]), want, 2e-4, 2e-5, "fused");
  expect_near_all(values(c.off[0]), want, 2e-4, 2e-5, "unfused");
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 1u);
  EXPECT_EQ(count_op(c.planned, "reduce_mean"), 0u);
  EXPECT_EQ(count_op(c.planned, "rsqrt"), 0u);
  EXPECT_EQ(count_op(c.planned, "fused_elementwise"), 0u) << "nothing is left to fuse";
  const auto done =
      records(c.log, pass, kind::rewrite, {"layer_norm", "axis 1", "'gamma'", "'beta'"});
  ASSERT_EQ(done.size(), 1u) << log_text(c.log);
  EXPECT_EQ(done[0].nodes.size(), 9u) << "mean, d, square, var, +eps, rsqrt, y0, *gamma, +beta";
}

// Every form, over random shapes, axes spelled every way, f32 and f64.
TEST(LayerNormFusion, RandomShapesAxesAndFormsMatchTheReference) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 24; ++trial) {
    const dtype t = trial % 3 == 2 ? dtype::f64 : dtype::f32;
    const std::size_t rank = 1 + static_cast<std::size_t>(rng() % 4);
    shape s;
    for (std::size_t k = 0; k < rank; ++k) s.push_back(1 + static_cast<std::int64_t>(rng() % 5));
    const std::size_t axis = static_cast<std::size_t>(rng() % rank);
    std::vector<std::int64_t> axes;
    for (std::size_t k = axis; k < rank; ++k) {
      axes.push_back(rng() % 2 ? static_cast<std::int64_t>(k)
                               : static_cast<std::int64_t>(k) - static_cast<std::int64_t>(rank));
    }
    std::shuffle(axes.begin(), axes.end(), rng);
    if (axis == 0 && rng() % 2) axes.clear();  // every dim
    ln_form f{.square = rng() % 2 == 0,
              .rsqrt = rng() % 2 == 0,
              .eps_first = rng() % 2 == 0,
              .swapped = rng() % 2 == 0,
              .twice = rng() % 2 == 0};
    const bool has_gamma = rng() % 3 != 0;
    const bool has_beta = rng() % 3 != 0;
    const double eps = trial % 2 ? 1e-5 : 1e-3;
    const shape ps = tail_of(s, axis);
    const auto xv = rounded(t, uniform(rng, s.num_elements()));
    const auto gv =
        has_gamma ? rounded(t, uniform(rng, ps.num_elements(), 0.5, 1.5)) : std::vector<double>{};
    const auto bv = has_beta ? rounded(t, uniform(rng, ps.num_elements())) : std::vector<double>{};
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, s);
    std::optional<output> gamma;
    std::optional<output> beta;
    if (has_gamma) gamma = ops::placeholder(b, "gamma", t, ps);
    if (has_beta) beta = ops::placeholder(b, "beta", t, ps);
    ops::identity(ln_primitives(x, axes, eps, f, gamma, beta), {.name = "y"});
    std::vector<feed> feeds{{"x", make_tensor(t, s, xv)}};
    if (has_gamma) feeds.emplace_back("gamma", make_tensor(t, ps, gv));
    if (has_beta) feeds.emplace_back("beta", make_tensor(t, ps, bv));
    SCOPED_TRACE(
        fmt::format("trial {}: {} {} axis {} gamma {} beta {} square {} rsqrt {} "
                    "eps_first {} swapped {} twice {}",
                    trial, to_string(t), to_string(s), axis, has_gamma, has_beta, f.square, f.rsqrt,
                    f.eps_first, f.swapped, f.twice));
    const auto c = run_both(g, pass, feeds, {"y"});
    const double eps_t = t == dtype::f32 ? static_cast<double>(static_cast<float>(eps)) : eps;
    const auto want = ln_reference(xv, s, axis, gv, bv, eps_t);
    // A row of one element normalises to 0 whatever its value: both forms agree.
    expect_near_all(values(c.on[0]), want, rtol_of(t), atol_of(t) * 10, "fused");
    expect_near_all(values(c.off[0]), want, rtol_of(t), atol_of(t) * 10, "unfused");
    EXPECT_EQ(count_op(c.planned, "layer_norm"), 1u) << log_text(c.log);
    EXPECT_EQ(count_op(c.planned, "reduce_mean"), 0u) << log_text(c.log);
    EXPECT_EQ(rewrites(c.log, pass), 1u) << log_text(c.log);
    EXPECT_EQ(count_op(c.planned, "ones"), has_gamma ? 0u : 1u);
    EXPECT_EQ(count_op(c.planned, "zeros"), has_beta ? 0u : 1u);
  }
}

TEST(LayerNormFusion, AGammaWithLeadingOnesIsReshaped) {
  std::mt19937 rng(3);
  const shape s{3, 5};
  const auto xv = rounded(dtype::f32, uniform(rng, 15));
  const auto gv = rounded(dtype::f32, uniform(rng, 5));
  const auto bv = rounded(dtype::f32, uniform(rng, 5));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto gamma = ops::placeholder(b, "gamma", dtype::f32, {1, 5});
  auto beta = ops::placeholder(b, "beta", dtype::f32, {1, 1, 5});  // rank 3: broadcasts x up
  ops::identity(ln_primitives(x, {1}, 1e-5, {}, gamma, beta), {.name = "y"});
  const auto c = run_both(g, pass,
                          {{"x", make_tensor(dtype::f32, s, xv)},
                           {"gamma", make_tensor(dtype::f32, {1, 5}, gv)},
                           {"beta", make_tensor(dtype::f32, {1, 1, 5}, bv)}},
                          {"y"});
  // gamma [1, 5] holds x.shape[1:]'s elements: reshaped and fused. beta [1, 1, 5] makes the
  // result [1, 3, 5], which layer_norm's output is not: the shift stays outside.
  EXPECT_EQ(values(c.on[0]).size(), 15u);
  EXPECT_EQ(c.on[0].shape(), (shape{1, 3, 5}));
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, gv, bv, 1e-5), 2e-4, 2e-5);
  expect_near_all(values(c.off[0]), values(c.on[0]), 2e-4, 2e-5);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 1u);
  EXPECT_EQ(count_op(c.planned, "zeros"), 1u);
  EXPECT_EQ(count_op(c.planned, "ones"), 0u);
  EXPECT_TRUE(refused_with(c.log, pass, {"beta", "is not x's shape"})) << log_text(c.log);
}

TEST(LayerNormFusion, ABroadcastingGammaStaysOutsideWithTheReason) {
  std::mt19937 rng(4);
  const shape s{2, 3, 4};
  const auto xv = rounded(dtype::f32, uniform(rng, 24));
  const auto gv = rounded(dtype::f32, uniform(rng, 4));  // [4]: broadcast over [3, 4]
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto gamma = ops::placeholder(b, "gamma", dtype::f32, {4});
  ops::identity(ln_primitives(x, {1, 2}, 1e-5, {}, gamma, std::nullopt), {.name = "y"});
  const auto c = run_both(
      g, pass, {{"x", make_tensor(dtype::f32, s, xv)}, {"gamma", make_tensor(dtype::f32, {4}, gv)}},
      {"y"});
  std::vector<double> g12;  // gamma broadcast to [3, 4]
  for (int i = 0; i < 3; ++i) g12.insert(g12.end(), gv.begin(), gv.end());
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, g12, {}, 1e-5), 2e-4, 2e-5);
  expect_near_all(values(c.off[0]), values(c.on[0]), 2e-4, 2e-5);
  EXPECT_TRUE(
      refused_with(c.log, pass, {"gamma", "float32[4]", "x.shape[1:] = [3, 4]", "broadcasts"}))
      << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 1u) << "the normalisation itself still fuses";
}

TEST(LayerNormFusion, NonTrailingAxesAreNotALayerNorm) {
  std::mt19937 rng(5);
  const shape s{4, 3};
  const auto xv = rounded(dtype::f32, uniform(rng, 12));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  ops::identity(ln_primitives(x, {0}, 1e-5, {}, std::nullopt, std::nullopt), {.name = "y"});
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y"});
  // Reference: normalise each column.
  std::vector<double> want(12);
  for (int j = 0; j < 3; ++j) {
    std::vector<double> col;
    for (int i = 0; i < 4; ++i) col.push_back(xv[static_cast<std::size_t>(i * 3 + j)]);
    const auto n = ln_reference(col, {4}, 0, {}, {}, 1e-5);
    for (int i = 0; i < 4; ++i)
      want[static_cast<std::size_t>(i * 3 + j)] = n[static_cast<std::size_t>(i)];
  }
  expect_near_all(values(c.on[0]), want, 2e-4, 2e-5);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 0u);
  EXPECT_EQ(rewrites(c.log, pass), 0u);
}

// The usual refusal: gradients() built the backward graph first, and it reads d and rstd.
TEST(LayerNormFusion, InteriorValuesReadByGradientsAreRefused) {
  std::mt19937 rng(6);
  const shape s{3, 4};
  const auto xv = rounded(dtype::f32, uniform(rng, 12));
  const auto gv = rounded(dtype::f32, uniform(rng, 4, 0.5, 1.5));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto gamma = ops::variable(b, "gamma", make_tensor(dtype::f32, {4}, gv));
  auto y = ln_primitives(x, {-1}, 1e-5, {}, gamma, std::nullopt);
  auto loss = ops::reduce_sum(y * y, {}, false, {.name = "loss"});
  // d loss / d gamma reads only y0 (the fused node's result); d loss / d x reads d and rstd.
  const auto grads = gradients(loss, {gamma, x});
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}},
                          {"loss", grads[0].name(), grads[1].name()});
  EXPECT_TRUE(refused_with(
      c.log, pass, {"is also read by", "gradients() ran before the passes", "ops::layer_norm"}))
      << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 0u);
  const auto yr = ln_reference(xv, s, 1, gv, {}, 1e-5);
  double want = 0.0;
  for (double v : yr) want += v * v;
  EXPECT_NEAR(values(c.on[0])[0], want, 1e-4 * want);
  expect_near_all(values(c.on[1]), values(c.off[1]), 1e-5, 1e-6, "gradient of gamma");
  expect_near_all(values(c.on[2]), values(c.off[2]), 1e-5, 1e-6, "gradient of x");
}

TEST(LayerNormFusion, AFetchedInteriorValueIsRefused) {
  std::mt19937 rng(8);
  const shape s{2, 5};
  const auto xv = rounded(dtype::f32, uniform(rng, 10));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto mean = ops::reduce_mean(x, {1}, true, {.name = "mean"});
  auto d = x - mean;
  auto var = ops::reduce_mean(ops::square(d), {1}, true);
  ops::identity(d * ops::rsqrt(var + 1e-5), {.name = "y"});
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y", "mean"});
  EXPECT_TRUE(refused_with(c.log, pass, {"'mean' is also read by a fetch"})) << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 0u);
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, {}, {}, 1e-5), 2e-4, 2e-5);
}

TEST(LayerNormFusion, NodesAskingForAnotherDeviceAreRefused) {
  std::mt19937 rng(9);
  const shape s{2, 5};
  const auto xv = rounded(dtype::f32, uniform(rng, 10));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto mean = ops::reduce_mean(x, {1}, true);
  auto d = x - mean;
  auto var = ops::reduce_mean(ops::square(d, {.name = "sq", .device = "cpu:1"}), {1}, true);
  ops::identity(d * ops::rsqrt(var + 1e-5), {.name = "y"});
  session_options o;
  o.devices.virtual_cpu_devices = 2;
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y"}, {}, o);
  EXPECT_TRUE(refused_with(c.log, pass, {"'sq' asks for device 'cpu:1'"})) << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 0u);
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, {}, {}, 1e-5), 2e-4, 2e-5);
}

TEST(LayerNormFusion, NoKernelOnTheRequestedDeviceTypeIsRefused) {
  std::mt19937 rng(10);
  const shape s{2, 5};
  const auto xv = rounded(dtype::f32, uniform(rng, 10));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  output y;
  {
    // A device type loom has no kernels for (CUDA has a layer_norm kernel).
    auto scope = b.with_device("vulkan:0");
    y = ln_primitives(x, {1}, 1e-5, {}, std::nullopt, std::nullopt);
  }
  ops::identity(y, {.name = "y"});
  session_options o;
  o.allow_soft_placement = true;  // no Vulkan device: the nodes run on the CPU
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y"}, {}, o);
  EXPECT_TRUE(refused_with(c.log, pass, {"no layer_norm kernel for T = float32 on vulkan"}))
      << log_text(c.log);
  EXPECT_EQ(count_op(c.planned, "layer_norm"), 0u);
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, {}, {}, 1e-5), 2e-4, 2e-5);
}

TEST(LayerNormFusion, AControlInputInsideIsRefused) {
  std::mt19937 rng(11);
  const shape s{2, 5};
  const auto xv = rounded(dtype::f32, uniform(rng, 10));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto other = ops::identity(x, {.name = "other"});
  auto mean = ops::reduce_mean(x, {1}, true);
  auto d = ops::sub(x, mean, {.name = "d"});
  auto var = ops::reduce_mean(ops::square(d), {1}, true);
  ops::identity(d * ops::rsqrt(var + 1e-5), {.name = "y"});
  g.add_control_input(d.ep().node, other.ep().node);
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y"});
  EXPECT_TRUE(refused_with(c.log, pass, {"'d' waits for 'other'"})) << log_text(c.log);
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, {}, {}, 1e-5), 2e-4, 2e-5);
}

TEST(LayerNormFusion, AnEpsilonThatBroadcastsTheVarianceIsRefused) {
  std::mt19937 rng(12);
  const shape s{2, 5};
  const auto xv = rounded(dtype::f32, uniform(rng, 10));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto mean = ops::reduce_mean(x, {1}, true);
  auto d = x - mean;
  auto var = ops::reduce_mean(ops::square(d), {1}, true);
  auto eps = ops::constant(b, make_tensor(dtype::f32, {1, 1, 1}, {1e-5}));
  ops::identity(d * ops::rsqrt(var + eps), {.name = "y"});
  // elementwise_fusion is off: it makes the [1, 1, 1] epsilon a literal and its fused node
  // then loses the rank that epsilon adds (reported to the lead).
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {"y"}, {},
                          without({"elementwise_fusion"}));
  EXPECT_TRUE(refused_with(c.log, pass, {"epsilon's constant broadcasts the variance"}))
      << log_text(c.log);
  EXPECT_EQ(c.on[0].shape(), (shape{1, 2, 5}));
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, {}, {}, 1e-5), 2e-4, 2e-5);
}

TEST(LayerNormFusion, TheResultKeepsItsFetchAndItsControlReaders) {
  std::mt19937 rng(13);
  const shape s{3, 4};
  const auto xv = rounded(dtype::f32, uniform(rng, 12));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, s);
  auto y = ln_primitives(x, {1}, 1e-5, {}, std::nullopt, std::nullopt);
  auto after = ops::identity(x * 2.0, {.name = "after"});
  g.add_control_input(after.ep().node, y.ep().node);
  const auto c = run_both(g, pass, {{"x", make_tensor(dtype::f32, s, xv)}}, {y.name(), "after"});
  EXPECT_EQ(rewrites(c.log, pass), 1u) << log_text(c.log);
  expect_near_all(values(c.on[0]), ln_reference(xv, s, 1, {}, {}, 1e-5), 2e-4, 2e-5);
  EXPECT_EQ(node_named(c.planned, "after").waits_for, std::vector<std::string>{"layer_norm"});
}

// Training: the forward graph (LayerNorm and cross-entropy in primitives) is rewritten by
// the passes first, gradients() then differentiates layer_norm and softmax_cross_entropy;
// the loss curve matches the unfused graph's.
struct mlp {
  graph g;
  std::string loss;
  std::vector<std::string> updates;
};

constexpr std::int64_t batch = 8, in_dim = 5, hidden = 6, classes = 3;

void build_forward(graph& g, std::mt19937 rng) {
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {batch, in_dim});
  auto labels = ops::placeholder(b, "labels", dtype::i32, {batch});
  auto w1 = ops::variable(
      b, "w1", make_tensor(dtype::f32, {in_dim, hidden}, uniform(rng, in_dim * hidden, -0.5, 0.5)));
  auto b1 =
      ops::variable(b, "b1", make_tensor(dtype::f32, {hidden}, uniform(rng, hidden, -0.1, 0.1)));
  auto gamma =
      ops::variable(b, "gamma", make_tensor(dtype::f32, {hidden}, uniform(rng, hidden, 0.8, 1.2)));
  auto beta =
      ops::variable(b, "beta", make_tensor(dtype::f32, {hidden}, uniform(rng, hidden, -0.1, 0.1)));
  auto w2 = ops::variable(
      b, "w2",
      make_tensor(dtype::f32, {hidden, classes}, uniform(rng, hidden * classes, -0.5, 0.5)));
  auto h = ops::matmul(x, w1) + b1;
  auto n = ops::relu(ln_primitives(h, {-1}, 1e-5, {}, gamma, beta));
  auto logits = ops::matmul(n, w2);
  auto ls = ops::log_softmax(logits);
  auto oh = ops::one_hot(labels, classes);
  ops::reduce_mean(-ops::reduce_sum(oh * ls, {-1}), {}, false, {.name = "loss"});
}

void add_training(graph& g, endpoint loss_ep, mlp& m) {
  graph_builder b(g);
  const output loss(&b, loss_ep);
  std::vector<output> vars;
  for (const char* name : {"w1", "b1", "gamma", "beta", "w2"})
    vars.emplace_back(&b, endpoint{g.get(name).id, 0});
  const auto grads = gradients(loss, vars);
  auto lr = ops::scalar(b, 0.2);
  for (std::size_t k = 0; k < vars.size(); ++k)
    m.updates.push_back(ops::apply_sgd(vars[k], grads[k], lr));
  m.loss = loss.name();
}

std::vector<double> train(mlp& m, const session_options& o, int steps) {
  std::mt19937 rng(99);
  const auto xv = uniform(rng, batch * in_dim);
  std::vector<double> lv;
  for (std::int64_t i = 0; i < batch; ++i) lv.push_back(static_cast<double>(rng() % classes));
  session s(m.g, o);
  std::vector<double> curve;
  for (int i = 0; i < steps; ++i) {
    const auto out = s.run({{"x", make_tensor(dtype::f32, {batch, in_dim}, xv)},
                            {"labels", make_tensor(dtype::i32, {batch}, lv)}},
                           {m.loss}, m.updates);
    curve.push_back(values(out[0])[0]);
  }
  return curve;
}

TEST(LayerNormFusion, AnMlpRewrittenBeforeGradientsTrainsAsTheUnfusedOne) {
  mlp fused;
  {
    graph forward;
    build_forward(forward, std::mt19937(42));
    passes::pass_options po;
    po.disabled = {"epilogue_fusion", "elementwise_fusion"};  // keep ops that have gradients
    const passes::pass_manager pm(po);
    auto res = pm.run(forward, {{}, {forward.parse_endpoint("loss")}, {}});
    EXPECT_EQ(count_op(res.rewritten.g, "layer_norm"), 1u) << log_text(res.log);
    EXPECT_EQ(count_op(res.rewritten.g, "softmax_cross_entropy"), 1u) << log_text(res.log);
    EXPECT_EQ(count_op(res.rewritten.g, "reduce_mean"), 1u) << "only the loss's mean is left";
    fused.g = std::move(res.rewritten.g);
    add_training(fused.g, res.rewritten.fetches[0], fused);
  }
  mlp plain;
  build_forward(plain.g, std::mt19937(42));
  add_training(plain.g, plain.g.parse_endpoint("loss"), plain);
  session_options none;
  none.passes.enabled = false;
  const auto a = train(fused, none, 30);
  const auto b = train(plain, none, 30);
  expect_near_all(a, b, 1e-3, 1e-5, "loss curve");
  EXPECT_LT(a.back(), 0.6 * a.front()) << "the MLP learns";
}

}  // namespace
}  // namespace loom
