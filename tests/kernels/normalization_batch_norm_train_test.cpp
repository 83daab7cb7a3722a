// Batch normalisation in training (src/backends/cpu/normalization_batch_norm_train.cpp):
// batch_norm_train and its gradient, and the pieces of sync_batch_norm merged by hand in one
// process, against float64 loops written here: every float dtype (and float32 parameters for
// 16-bit x), NCHW and NHWC, ranks 2 to 5, the running statistics over several steps, a large
// mean (where E[x²] - E[x]² fails), a zero-variance channel, thread-count independence, and
// bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

// x seen as [outer, C, inner] for its data_format.
struct geometry {
  std::int64_t outer = 1, channels = 0, inner = 1;
  [[nodiscard]] std::int64_t channel_of(std::size_t i) const {
    return (static_cast<std::int64_t>(i) / inner) % channels;
  }
};
geometry geometry_of(const shape& s, const std::string& format) {
  const std::size_t axis = format == "NHWC" ? s.rank() - 1 : 1;
  geometry g;
  g.channels = s[axis];
  for (std::size_t k = 0; k < axis; ++k) g.outer *= s[k];
  for (std::size_t k = axis + 1; k < s.rank(); ++k) g.inner *= s[k];
  return g;
}

// The float64 reference of one training step.
struct reference {
  std::vector<double> y, mean, var, invstd, dx, dscale, dbias, running_mean, running_var;
};
reference reference_step(const std::vector<double>& x, const std::vector<double>& dy,
                         const std::vector<double>& scale, const std::vector<double>& bias,
                         const std::vector<double>& rm, const std::vector<double>& rv,
                         const geometry& g, double eps, double momentum) {
  const auto ch = static_cast<std::size_t>(g.channels);
  reference r;
  r.mean.assign(ch, 0.0);
  r.var.assign(ch, 0.0);
  std::vector<double> n(ch, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto c = static_cast<std::size_t>(g.channel_of(i));
    r.mean[c] += x[i];
    n[c] += 1;
  }
  for (std::size_t c = 0; c < ch; ++c) r.mean[c] /= n[c];
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto c = static_cast<std::size_t>(g.channel_of(i));
    r.var[c] += (x[i] - r.mean[c]) * (x[i] - r.mean[c]);
  }
  for (std::size_t c = 0; c < ch; ++c) {
    r.var[c] /= n[c];
    r.invstd.push_back(1.0 / std::sqrt(r.var[c] + eps));
    r.running_mean.push_back((1 - momentum) * rm[c] + momentum * r.mean[c]);
    r.running_var.push_back((1 - momentum) * rv[c] + momentum * r.var[c] * n[c] / (n[c] - 1));
  }
  r.dscale.assign(ch, 0.0);
  r.dbias.assign(ch, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto c = static_cast<std::size_t>(g.channel_of(i));
    const double xhat = (x[i] - r.mean[c]) * r.invstd[c];
    r.y.push_back(xhat * scale[c] + bias[c]);
    r.dbias[c] += dy[i];
    r.dscale[c] += dy[i] * xhat;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto c = static_cast<std::size_t>(g.channel_of(i));
    const double xhat = (x[i] - r.mean[c]) * r.invstd[c];
    r.dx.push_back(scale[c] * r.invstd[c] *
                   (dy[i] - r.dbias[c] / n[c] - xhat * r.dscale[c] / n[c]));
  }
  return r;
}

tensor host(const tensor& t) {
  return memory::contiguous_copy(t, memory::host_resource::instance(), device_id{});
}

// One model: y = batch_norm_train(x), loss = Σ y·w (so dy = w), gradients of x, scale, bias.
struct bn_graph {
  graph g;
  std::vector<std::string> fetches;  // y, mean, invstd, dx, dscale, dbias
};
bn_graph build(dtype t, dtype u, const shape& s, const std::string& format, double eps,
               double momentum, const tensor& scale, const tensor& bias, const tensor& rm,
               const tensor& rv, const tensor& w) {
  bn_graph m;
  graph_builder b(m.g);
  const output x = ops::placeholder(b, "x", t, s);
  const output sc = ops::variable(b, "scale", scale);
  const output bi = ops::variable(b, "bias", bias);
  const output mean = ops::variable(b, "running_mean", rm);
  const output var = ops::variable(b, "running_var", rv);
  (void)u;
  const auto outs = ops::batch_norm_train(x, sc, bi, mean, var,
                                          {.epsilon = eps, .momentum = momentum,
                                           .data_format = format},
                                          {.name = "bn"});
  const output loss = ops::reduce_sum(ops::mul(outs.y, ops::constant(b, w)), {});
  const auto grads = gradients(loss, {x, sc, bi});
  m.fetches = {outs.y.name(),   outs.mean.name(),   outs.invstd.name(),
               grads[0].name(), grads[1].name(),    grads[2].name()};
  return m;
}

void expect_values(const tensor& t, const std::vector<double>& want, double rtol, double atol,
                   const char* what) {
  const auto got = values(host(t));
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::abs(want[i])) << what << " at " << i;
  }
}

TEST(BatchNormTrainTest, MatchesFloat64ForEveryDtypeLayoutAndRank) {
  std::uint64_t seed = 100;
  struct param_case {
    dtype t, u;
  };
  for (const param_case pc : {param_case{dtype::f32, dtype::f32}, {dtype::f64, dtype::f64},
                              {dtype::f16, dtype::f16}, {dtype::bf16, dtype::bf16},
                              {dtype::f16, dtype::f32}, {dtype::bf16, dtype::f32}}) {
    for (const std::string format : {"NCHW", "NHWC"}) {
      for (const shape& s : {shape{16, 5}, shape{3, 4, 7}, shape{4, 3, 5, 6}, shape{2, 3, 2, 4, 3},
                             shape{2, 35, 3, 3}, shape{64, 33}, shape{3, 1, 9, 9}}) {
        SCOPED_TRACE(::testing::Message() << to_string(pc.t) << "/" << to_string(pc.u) << " "
                                          << format << " " << to_string(s));
        const geometry g = geometry_of(s, format);
        const shape c{g.channels};
        const tensor x = random(pc.t, s, seed++, -3.0, 5.0);
        const tensor w = random(pc.t, s, seed++, -1.0, 1.0);
        const tensor scale = random(pc.u, c, seed++, 0.5, 2.0);
        const tensor bias = random(pc.u, c, seed++, -1.0, 1.0);
        const tensor rm = random(pc.u, c, seed++, -1.0, 1.0);
        const tensor rv = random(pc.u, c, seed++, 0.5, 2.0);
        const double eps = 1e-3;
        const double momentum = 0.25;
        bn_graph m = build(pc.t, pc.u, s, format, eps, momentum, scale, bias, rm, rv, w);
        const auto fetches = m.fetches;
        session sess(std::move(m.g));
        const auto out = sess.run({{"x", x}}, fetches);
        const reference r = reference_step(values(x), values(w), values(scale), values(bias),
                                           values(rm), values(rv), g, eps, momentum);
        const bool narrow = pc.t == dtype::f16 || pc.t == dtype::bf16;
        const double rtol = narrow ? rtol_for(pc.t) : (pc.t == dtype::f32 ? 2e-5 : 1e-12);
        const double atol = narrow ? 4 * atol_for(pc.t) : rtol;
        expect_values(out[0], r.y, rtol, atol, "y");
        // The statistics are float32 (float64 for float64 x), whatever x's precision.
        EXPECT_EQ(out[1].type(), pc.t == dtype::f64 ? dtype::f64 : dtype::f32);
        expect_values(out[1], r.mean, 1e-5, 1e-5, "mean");
        expect_values(out[2], r.invstd, 1e-5, 1e-5, "invstd");
        expect_values(out[3], r.dx, rtol, 2 * atol, "dx");
        const double prtol = pc.u == dtype::f32 || pc.u == dtype::f64 ? 1e-4 : rtol_for(pc.u);
        expect_values(out[4], r.dscale, prtol, prtol * static_cast<double>(g.outer * g.inner),
                      "dscale");
        expect_values(out[5], r.dbias, prtol, prtol * static_cast<double>(g.outer * g.inner),
                      "dbias");
        // The running statistics, updated in place by the step.
        const auto running = sess.run({}, {"running_mean", "running_var"});
        EXPECT_EQ(running[0].type(), pc.u);
        const double rs = pc.u == dtype::f32 || pc.u == dtype::f64 ? 1e-5 : rtol_for(pc.u);
        expect_values(running[0], r.running_mean, rs, rs, "running_mean");
        expect_values(running[1], r.running_var, rs, rs, "running_var");
      }
    }
  }
}

TEST(BatchNormTrainTest, RunningStatisticsFollowPyTorchsRuleOverSteps) {
  const shape s{8, 3, 4, 4};
  const geometry g = geometry_of(s, "NCHW");
  const tensor scale = make(dtype::f32, {3}, {1, 1, 1});
  const tensor bias = make(dtype::f32, {3}, {0, 0, 0});
  std::vector<double> rm{0, 0, 0};
  std::vector<double> rv{1, 1, 1};
  const tensor w = random(dtype::f32, s, 3);
  bn_graph m = build(dtype::f32, dtype::f32, s, "NCHW", 1e-5, 0.1, scale, bias,
                     make(dtype::f32, {3}, rm), make(dtype::f32, {3}, rv), w);
  session sess(std::move(m.g));
  for (int step = 0; step < 4; ++step) {
    const tensor x = random(dtype::f32, s, 50 + static_cast<std::uint64_t>(step), -2.0 + step, 4.0);
    (void)sess.run({{"x", x}}, {m.fetches[0]});
    const reference r =
        reference_step(values(x), values(w), {1, 1, 1}, {0, 0, 0}, rm, rv, g, 1e-5, 0.1);
    rm = r.running_mean;
    rv = r.running_var;
  }
  const auto running = sess.run({}, {"running_mean", "running_var"});
  expect_values(running[0], rm, 1e-5, 1e-6, "running_mean");
  expect_values(running[1], rv, 1e-5, 1e-6, "running_var");
  // A fetched running statistic keeps its value when the next step updates the variable.
  const tensor before = host(running[0]);
  (void)sess.run({{"x", random(dtype::f32, s, 99)}}, {m.fetches[0]});
  EXPECT_EQ(values(before), values(host(running[0])));
}

// Values around 1e4 with unit spread: E[x²] - E[x]² in float32 loses every digit of the
// variance (x² ~ 1e8, float32 resolves 8 there); the statistics and y stay within float32
// rounding of float64.
TEST(BatchNormTrainTest, LargeMeanKeepsFloat32Accuracy) {
  for (const std::string format : {"NCHW", "NHWC"}) {
    const shape s = format == "NCHW" ? shape{16, 4, 12, 12} : shape{16, 12, 12, 4};
    const geometry g = geometry_of(s, format);
    std::vector<double> xv = values(random(dtype::f64, s, 7, -1.0, 1.0));
    for (std::size_t i = 0; i < xv.size(); ++i) {
      xv[i] = static_cast<double>(static_cast<float>(1e4 + 1e3 * static_cast<double>(g.channel_of(i)) +
                                                     xv[i] * std::sqrt(3.0)));
    }
    const tensor x = make(dtype::f32, s, xv);
    const tensor ones = make(dtype::f32, {4}, {1, 1, 1, 1});
    const tensor zeros = make(dtype::f32, {4}, {0, 0, 0, 0});
    const tensor w = random(dtype::f32, s, 8);
    bn_graph m = build(dtype::f32, dtype::f32, s, format, 1e-5, 1.0, ones, zeros, zeros, ones, w);
    const auto fetches = m.fetches;
    session sess(std::move(m.g));
    const auto out = sess.run({{"x", x}}, fetches);
    const reference r = reference_step(xv, values(w), {1, 1, 1, 1}, {0, 0, 0, 0}, {0, 0, 0, 0},
                                       {1, 1, 1, 1}, g, 1e-5, 1.0);
    // The naive formula in float32, for contrast: its variance is off by far more.
    double worst_naive = 0;
    for (std::int64_t c = 0; c < 4; ++c) {
      float sx = 0;
      float sxx = 0;
      float n = 0;
      for (std::size_t i = 0; i < xv.size(); ++i) {
        if (g.channel_of(i) != c) continue;
        sx += static_cast<float>(xv[i]);
        sxx += static_cast<float>(xv[i]) * static_cast<float>(xv[i]);
        n += 1;
      }
      const double naive = static_cast<double>(sxx / n - (sx / n) * (sx / n));
      worst_naive = std::max(worst_naive, std::abs(naive - r.var[static_cast<std::size_t>(c)]));
    }
    EXPECT_GT(worst_naive, 0.05) << "the naive formula should fail here";
    expect_values(out[1], r.mean, 2e-7, 0, "mean");
    expect_values(out[2], r.invstd, 1e-6, 0, "invstd");
    expect_values(out[0], r.y, 0, 1e-5, "y");
    // The running variance (momentum 1: the batch's, unbiased) to float32 rounding.
    expect_values(sess.run({}, {"running_var"})[0], r.running_var, 1e-6, 0, "running_var");
  }
}

TEST(BatchNormTrainTest, ZeroVarianceChannelAndThreadCounts) {
  // Channel 1 is constant: its variance is 0, invstd 1/sqrt(eps), y the bias (as PyTorch).
  const shape s{6, 2, 5, 5};
  std::vector<double> xv = values(random(dtype::f32, s, 11));
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if ((i / 25) % 2 == 1) xv[i] = 3.5;
  }
  const tensor x = make(dtype::f32, s, xv);
  const tensor scale = make(dtype::f32, {2}, {2, 2});
  const tensor bias = make(dtype::f32, {2}, {0.5, -0.25});
  const tensor w = random(dtype::f32, s, 12);
  std::vector<std::vector<double>> by_threads;
  for (int threads : {1, 2, 3}) {
    bn_graph m = build(dtype::f32, dtype::f32, s, "NCHW", 1e-5, 0.1, scale, bias,
                       make(dtype::f32, {2}, {0, 0}), make(dtype::f32, {2}, {1, 1}), w);
    session_options so;
    so.devices.cpu_threads = threads;
    const auto fetches = m.fetches;
    session sess(std::move(m.g), so);
    const auto out = sess.run({{"x", x}}, fetches);
    const auto y = values(host(out[0]));
    EXPECT_FLOAT_EQ(static_cast<float>(values(host(out[2]))[1]),
                    static_cast<float>(1 / std::sqrt(1e-5)));
    for (std::size_t i = 0; i < y.size(); ++i) {
      if ((i / 25) % 2 == 1) {
        ASSERT_EQ(y[i], -0.25);
      }
    }
    std::vector<double> all;
    for (const auto& t : out) {
      const auto v = values(host(t));
      all.insert(all.end(), v.begin(), v.end());
    }
    by_threads.push_back(all);
  }
  EXPECT_EQ(by_threads[0], by_threads[1]);
  EXPECT_EQ(by_threads[0], by_threads[2]);
}

// sync_batch_norm's pieces in one process: each part of a batch's statistics packed
// (batch_norm_stats), stacked as all_gather would, and merged by sync_batch_norm; the
// backward sums of the parts added as all_reduce would. Unequal parts and an empty one give
// the whole batch's y, dx and running statistics.
TEST(BatchNormTrainTest, MergedPartsEqualTheWholeBatch) {
  for (const std::string format : {"NCHW", "NHWC"}) {
    SCOPED_TRACE(format);
    const std::vector<std::int64_t> parts{5, 0, 2, 9};
    const std::int64_t total = 16;
    const shape whole = format == "NCHW" ? shape{total, 3, 4, 2} : shape{total, 4, 2, 3};
    const geometry gw = geometry_of(whole, format);
    const tensor x = random(dtype::f32, whole, 21, -2.0, 6.0);
    const tensor dy = random(dtype::f32, whole, 22);
    const tensor scale = random(dtype::f32, {3}, 23, 0.5, 2.0);
    const tensor bias = random(dtype::f32, {3}, 24);
    const reference r = reference_step(values(x), values(dy), values(scale), values(bias),
                                       {0, 0, 0}, {1, 1, 1}, gw, 1e-5, 0.1);
    graph g;
    graph_builder b(g);
    const output xin = ops::placeholder(b, "x", dtype::f32, whole);
    const output dyin = ops::placeholder(b, "dy", dtype::f32, whole);
    const output sc = ops::constant(b, scale);
    const output bi = ops::constant(b, bias);
    std::vector<output> xs;
    std::vector<output> dys;
    std::vector<output> stats;
    std::int64_t at = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      std::vector<std::int64_t> begin(whole.rank(), 0);
      std::vector<std::int64_t> size(whole.dims().begin(), whole.dims().end());
      begin[0] = at;
      size[0] = parts[p];
      xs.push_back(ops::slice(xin, begin, size));
      dys.push_back(ops::slice(dyin, begin, size));
      stats.push_back(b.add1("batch_norm_stats", {xs.back()}, {{"data_format", format}}));
      at += parts[p];
    }
    const output gathered = ops::concat(stats, 0);
    std::vector<output> ys;
    std::vector<output> reduced;
    std::vector<std::array<output, 2>> saved;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const output rm = ops::variable(b, fmt::format("rm{}", p), make(dtype::f32, {3}, {0, 0, 0}));
      const output rv = ops::variable(b, fmt::format("rv{}", p), make(dtype::f32, {3}, {1, 1, 1}));
      const auto outs = b.add("sync_batch_norm", {xs[p], sc, bi, rm, rv, gathered},
                              {{"data_format", format}});
      ys.push_back(outs.at(0));
      saved.push_back({outs.at(1), outs.at(2)});
      reduced.push_back(b.add("batch_norm_grad_reduce",
                              {dys[p], xs[p], sc, outs.at(1), outs.at(2)},
                              {{"data_format", format}})
                            .at(0));
    }
    output sums = reduced[0];
    for (std::size_t p = 1; p < parts.size(); ++p) sums = ops::add(sums, reduced[p]);
    std::vector<output> dxs;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      dxs.push_back(b.add1("batch_norm_grad_elemt",
                           {dys[p], xs[p], sc, saved[p][0], saved[p][1], sums},
                           {{"data_format", format}}));
    }
    const std::string y = ops::concat(ys, 0).name();
    const std::string dx = ops::concat(dxs, 0).name();
    const std::string mean = saved[3][0].name();
    session sess(std::move(g));
    const auto out = sess.run({{"x", x}, {"dy", dy}}, {y, dx, mean});
    expect_values(out[0], r.y, 2e-5, 2e-5, "y");
    expect_values(out[1], r.dx, 2e-5, 2e-5, "dx");
    expect_values(out[2], r.mean, 1e-5, 1e-5, "mean");
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const auto running = sess.run({}, {fmt::format("rm{}", p), fmt::format("rv{}", p)});
      expect_values(running[0], r.running_mean, 1e-5, 1e-6, "running_mean");
      expect_values(running[1], r.running_var, 1e-5, 1e-6, "running_var");
    }
  }
}

TEST(BatchNormTrainTest, BadInputIsATypedError) {
  const auto try_build = [](const shape& xs, const shape& cs, dtype u, const std::string& format) {
    graph g;
    graph_builder b(g);
    const output x = ops::placeholder(b, "x", dtype::f32, xs);
    const output v = ops::variable(b, "v", random(u, cs, 1));
    (void)ops::batch_norm_train(x, v, v, v, v, {.data_format = format}, {.name = "bn"});
  };
  expect_invalid_argument([&] { try_build({2, 3, 4}, {4}, dtype::f32, "NCHW"); },
                          {"bn", "scale of shape [4] must be [C] = [3]"});
  expect_invalid_argument([&] { try_build({2, 3, 4}, {3}, dtype::f32, "NHWC"); },
                          {"bn", "[C] = [4]"});
  expect_invalid_argument([&] { try_build({2, 3}, {3}, dtype::f32, "NCWH"); },
                          {"bn", "data_format"});
  expect_invalid_argument([&] { try_build({2, 3}, {3}, dtype::f64, "NCHW"); },
                          {"bn", "float64", "float32"});
  expect_invalid_argument([&] { try_build({3}, {3}, dtype::f32, "NCHW"); }, {"bn", "rank >= 2"});
  // One value per channel has no unbiased variance: an error naming the node, and the
  // session stays usable.
  {
    graph g;
    graph_builder b(g);
    const output x = ops::placeholder(b, "x", dtype::f32, {-1, 3});
    const output v = ops::variable(b, "v", make(dtype::f32, {3}, {1, 1, 1}));
    const output m = ops::variable(b, "m", make(dtype::f32, {3}, {0, 0, 0}));
    const std::string y = ops::batch_norm_train(x, v, m, m, v, {}, {.name = "bn"}).y.name();
    session sess(std::move(g));
    reduction::expect_error<error>(
        [&] { (void)sess.run({{"x", random(dtype::f32, {1, 3}, 2)}}, {y}); },
        {"bn", "more than 1 value per channel", "[1, 3]"});
    EXPECT_EQ(sess.run({{"x", random(dtype::f32, {4, 3}, 3)}}, {y})[0].shape(), (shape{4, 3}));
  }
  // The running statistics must be variables.
  {
    graph g;
    graph_builder b(g);
    const output x = ops::placeholder(b, "x", dtype::f32, {4, 3});
    const output c = ops::constant(b, make(dtype::f32, {3}, {1, 1, 1}));
    const std::string y = ops::batch_norm_train(x, c, c, c, c, {}, {.name = "bn"}).y.name();
    session sess(std::move(g));
    reduction::expect_error<error>(
        [&] { (void)sess.run({{"x", random(dtype::f32, {4, 3}, 2)}}, {y}); },
        {"bn", "input 3 must come from a variable"});
  }
}

}  // namespace
}  // namespace loom::testing
