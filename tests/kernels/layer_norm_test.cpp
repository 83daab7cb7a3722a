// layer_norm and layer_norm_grad (src/backends/cpu/normalization_kernels.cpp) against references
// written here (float64 loops; long double for the forward's statistics): every float dtype, rows
// of 1, 3, 1024 and 4097 elements, several normalised dims, empty tensors, large means with small
// spreads, constant rows, NaN; the gradient also against the composite formula built from primitive
// ops, against central differences, across thread counts, and bad input at graph build time and at
// run time. Every check runs with the AVX2 row loops (where the CPU has them) and with the baseline
// ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using namespace reduction;

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// The row loops a check runs with (Note [layer_norm row kernels]): LOOM_MAX_CPU_ISA=baseline
// forces the baseline ISA; without the cap the kernel uses AVX2 where the CPU has it.
class isa_scope {
 public:
  explicit isa_scope(bool baseline) {
    if (baseline) {
      ::setenv("LOOM_MAX_CPU_ISA", "baseline", 1);
    } else {
      ::unsetenv("LOOM_MAX_CPU_ISA");
    }
  }
  ~isa_scope() { ::unsetenv("LOOM_MAX_CPU_ISA"); }
  isa_scope(const isa_scope&) = delete;
  isa_scope& operator=(const isa_scope&) = delete;
};

template <class F>
void for_each_isa(F&& f) {
  for (const bool baseline : {false, true}) {
    SCOPED_TRACE(baseline ? "baseline ISA" : "best ISA");
    const isa_scope scope(baseline);
    f();
  }
}

std::size_t wrap(std::int64_t axis, std::size_t rank) {
  return static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(rank) : axis);
}

struct split {
  shape lead;
  shape normalized;
  std::int64_t rows = 1;
  std::int64_t n = 1;
};

split split_at_axis(const shape& s, std::size_t axis) {
  split r;
  for (std::size_t k = 0; k < s.rank(); ++k) (k < axis ? r.lead : r.normalized).push_back(s[k]);
  r.rows = r.lead.num_elements();
  r.n = r.normalized.num_elements();
  return r;
}

// ---- float64 references -----------------------------------------------------------------

struct forward_ref {
  std::vector<double> y, mean, rstd;
};

// Two passes per row in long double (x87's 64-bit significand on x86-64, so float64 inputs
// with a large mean keep their digits): the mean, then the mean of squared deviations.
forward_ref layer_norm_ref(const std::vector<double>& x, std::int64_t rows, std::int64_t n,
                           const std::vector<double>& g, const std::vector<double>& b, double eps) {
  forward_ref r;
  r.y.assign(x.size(), 0.0);
  for (std::int64_t o = 0; o < rows; ++o) {
    const auto at = [&](std::int64_t i) { return static_cast<std::size_t>(o * n + i); };
    long double mean = 0;
    for (std::int64_t i = 0; i < n; ++i) mean += x[at(i)];
    mean /= static_cast<long double>(n);
    long double var = 0;
    for (std::int64_t i = 0; i < n; ++i) var += (x[at(i)] - mean) * (x[at(i)] - mean);
    var /= static_cast<long double>(n);
    const long double rstd = 1.0L / std::sqrt(var + eps);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      r.y[at(i)] = static_cast<double>((x[at(i)] - mean) * rstd * g[k] + b[k]);
    }
    r.mean.push_back(static_cast<double>(mean));
    r.rstd.push_back(static_cast<double>(rstd));
  }
  return r;
}

struct backward_ref {
  std::vector<double> dx, dgamma, dbeta;
};

// The gradient in float64 from the given statistics (the op's contract: it uses its mean
// and rstd inputs): xhat = (x - mean) rstd, dxhat = dy gamma,
// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dgamma = Σ dy xhat, dbeta = Σ dy.
backward_ref layer_norm_grad_ref(const std::vector<double>& dy, const std::vector<double>& x,
                                 const std::vector<double>& g, const std::vector<double>& mean,
                                 const std::vector<double>& rstd, std::int64_t rows,
                                 std::int64_t n) {
  backward_ref r;
  r.dx.assign(x.size(), 0.0);
  r.dgamma.assign(static_cast<std::size_t>(n), 0.0);
  r.dbeta.assign(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t o = 0; o < rows; ++o) {
    const auto at = [&](std::int64_t i) { return static_cast<std::size_t>(o * n + i); };
    const double m = mean[static_cast<std::size_t>(o)];
    const double rs = rstd[static_cast<std::size_t>(o)];
    double m1 = 0;
    double m2 = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double xh = (x[at(i)] - m) * rs;
      const double d = dy[at(i)] * g[static_cast<std::size_t>(i)];
      m1 += d;
      m2 += d * xh;
      r.dgamma[static_cast<std::size_t>(i)] += dy[at(i)] * xh;
      r.dbeta[static_cast<std::size_t>(i)] += dy[at(i)];
    }
    m1 /= static_cast<double>(n);
    m2 /= static_cast<double>(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const double xh = (x[at(i)] - m) * rs;
      const double d = dy[at(i)] * g[static_cast<std::size_t>(i)];
      r.dx[at(i)] = rs * (d - m1 - xh * m2);
    }
  }
  return r;
}

// Tolerances per dtype: f32 computes in float, f16/bf16 in float and round every output.
double fwd_rtol(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-12;
    case dtype::f32:
      return 2e-5;
    case dtype::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}
double fwd_atol(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-12;
    case dtype::f32:
      return 2e-5;
    case dtype::f16:
      return 4e-3;
    default:
      return 3e-2;
  }
}

// ---- forward ----------------------------------------------------------------------------

void check_forward(const tensor& x, const tensor& g, const tensor& b, std::int64_t axis,
                   double eps) {
  SCOPED_TRACE(::testing::Message() << "layer_norm " << x.describe() << " axis " << axis);
  const auto out = run_op("layer_norm", {x, g, b}, {{"axis", axis}, {"epsilon", eps}});
  ASSERT_EQ(out.size(), 3u);
  const split sp = split_at_axis(x.shape(), wrap(axis, x.rank()));
  const auto want = layer_norm_ref(values(x), sp.rows, sp.n, values(g), values(b), eps);
  const dtype t = x.type();
  expect_close(out[0], x.shape(), want.y, fwd_rtol(t), fwd_atol(t));
  expect_close(out[1], sp.lead, want.mean, fwd_rtol(t), fwd_atol(t));
  expect_close(out[2], sp.lead, want.rstd, fwd_rtol(t), fwd_atol(t));
}

struct ln_case {
  shape s;
  std::int64_t axis;
};

// Rows of 1, 3, 1024 and 4097 elements (4097: several summation blocks and a vector
// tail), several normalised dims, empty leading dims.
const ln_case cases[] = {
    {{5, 1}, -1},        {{4, 3}, -1}, {{6, 1024}, -1}, {{3, 4097}, -1}, {{2, 3, 5}, 1},
    {{2, 3, 33, 31}, 1}, {{7}, 0},     {{0, 16}, -1},   {{2, 0, 8}, 2},  {{3, 1, 1024}, -2},
};

TEST(LayerNormForward, MatchesFloat64EveryDtypeAndShape) {
  for_each_isa([] {
    std::uint64_t seed = 1;
    for (dtype t : float_types) {
      for (const auto& c : cases) {
        const split sp = split_at_axis(c.s, wrap(c.axis, c.s.rank()));
        const tensor x = random(t, c.s, seed++, -3.0, 5.0);
        const tensor g = random(t, sp.normalized, seed++, 0.5, 2.0);
        const tensor b = random(t, sp.normalized, seed++, -1.0, 1.0);
        check_forward(x, g, b, c.axis, 1e-5);
        check_forward(x, g, b, c.axis, 0.25);
      }
    }
  });
}

TEST(LayerNormForward, NonContiguousInputs) {
  for_each_isa([] {
    const tensor x = random(dtype::f32, {6, 40}, 3);
    const tensor g = random(dtype::f32, {40}, 4, 0.5, 2.0);
    const tensor b = random(dtype::f32, {40}, 5);
    check_forward(non_contiguous(x), g, b, -1, 1e-5);
    check_forward(strided_view(x), strided_view(g), b, -1, 1e-5);
  });
}

TEST(LayerNormForward, LargeMeanSmallSpreadKeepsTheVariance) {
  // Mean 1e4, spread 0.05: E[x²] - E[x]² in float would lose every digit of the variance
  // (1e8 against ~1e-3); the centred sums keep it, and y stays accurate too.
  for_each_isa([] {
    for (dtype t : {dtype::f32, dtype::f64}) {
      SCOPED_TRACE(to_string(t));
      const shape s{4, 1024};
      const tensor u = random(dtype::f64, s, 7, -0.05, 0.05);
      std::vector<double> v = values(u);
      for (auto& e : v) e += 1e4;
      const tensor x = make(t, s, v);
      const tensor g = random(t, {1024}, 8, 0.5, 1.5);
      const tensor b = random(t, {1024}, 9);
      const auto out = run_op("layer_norm", {x, g, b});
      const auto want = layer_norm_ref(values(x), 4, 1024, values(g), values(b), 1e-5);
      const double tol = t == dtype::f32 ? 1e-4 : 1e-10;
      expect_close(out[2], {4}, want.rstd, tol, 0.0);
      expect_close(out[0], s, want.y, tol, tol);
      expect_close(out[1], {4}, want.mean, 1e-7, 0.0);
    }
  });
}

TEST(LayerNormForward, ConstantRowsGiveBeta) {
  for_each_isa([] {
    for (dtype t : float_types) {
      SCOPED_TRACE(to_string(t));
      std::vector<double> v(2 * 100);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = i < 100 ? 3.0 : -1.5;
      const tensor b = random(t, {100}, 11);
      const auto out = run_op("layer_norm", {make(t, {2, 100}, v), random(t, {100}, 10), b});
      std::vector<double> want = values(b);
      want.insert(want.end(), want.begin(), want.end());
      expect_close(out[0], {2, 100}, want, 0.0, 0.0);
      expect_close(out[1], {2}, {3.0, -1.5}, 0.0, 0.0);
      const double r = 1.0 / std::sqrt(1e-5);
      expect_close(out[2], {2}, {r, r}, fwd_rtol(t), 0.0);
    }
  });
}

TEST(LayerNormForward, NanPoisonsOnlyItsRow) {
  for_each_isa([] {
    for (dtype t : float_types) {
      SCOPED_TRACE(to_string(t));
      tensor x = random(t, {3, 37}, 12);
      std::vector<double> v = values(x);
      v[37 + 20] = std::nan("");
      x = make(t, {3, 37}, v);
      const tensor g = random(t, {37}, 13, 0.5, 2.0);
      const tensor b = random(t, {37}, 14);
      const auto out = run_op("layer_norm", {x, g, b});
      const auto want = layer_norm_ref(v, 3, 37, values(g), values(b), 1e-5);
      for (std::size_t i = 37; i < 74; ++i) EXPECT_TRUE(std::isnan(want.y[i]));
      expect_close(out[0], {3, 37}, want.y, fwd_rtol(t), fwd_atol(t));
      expect_close(out[1], {3}, want.mean, fwd_rtol(t), fwd_atol(t));
      expect_close(out[2], {3}, want.rstd, fwd_rtol(t), fwd_atol(t));
    }
  });
}

TEST(LayerNormForward, EmptyRowsGiveNanStatistics) {
  const auto out = run_op("layer_norm", {make(dtype::f32, {3, 0}, {}), make(dtype::f32, {0}, {}),
                                         make(dtype::f32, {0}, {})});
  expect_close(out[0], {3, 0}, {});
  expect_close(out[1], {3}, std::vector<double>(3, std::nan("")));
  expect_close(out[2], {3}, std::vector<double>(3, std::nan("")));
}

// ---- backward ---------------------------------------------------------------------------

double bwd_rtol(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-11;
    case dtype::f32:
      return 1e-4;
    case dtype::f16:
      return 5e-3;
    default:
      return 3e-2;
  }
}
double bwd_atol(dtype t, std::int64_t rows) {
  // dgamma and dbeta sum over the rows: their absolute error grows with the row count.
  const double scale = std::sqrt(static_cast<double>(std::max<std::int64_t>(rows, 1)));
  switch (t) {
    case dtype::f64:
      return 1e-11 * scale;
    case dtype::f32:
      return 2e-5 * scale;
    case dtype::f16:
      return 2e-2 * scale;
    default:
      return 1e-1 * scale;
  }
}

// Runs layer_norm then layer_norm_grad (fed the forward's mean and rstd) and checks dx,
// dgamma and dbeta against the float64 reference.
// `scale`: the size of rstd (dx's absolute error grows with it).
void check_backward(const tensor& x, const tensor& g, const tensor& dy, std::int64_t axis,
                    double scale = 1.0) {
  SCOPED_TRACE(::testing::Message() << "layer_norm_grad " << x.describe() << " axis " << axis);
  const split sp = split_at_axis(x.shape(), wrap(axis, x.rank()));
  const tensor b = random(x.type(), sp.normalized, 99);
  const auto fwd = run_op("layer_norm", {x, g, b}, {{"axis", axis}});
  const auto out = run_op("layer_norm_grad", {dy, x, g, fwd[1], fwd[2]}, {{"axis", axis}});
  ASSERT_EQ(out.size(), 3u);
  const auto want = layer_norm_grad_ref(values(dy), values(x), values(g), values(fwd[1]),
                                        values(fwd[2]), sp.rows, sp.n);
  const dtype t = x.type();
  expect_close(out[0], x.shape(), want.dx, bwd_rtol(t), bwd_atol(t, 1) * scale);
  expect_close(out[1], sp.normalized, want.dgamma, bwd_rtol(t), bwd_atol(t, sp.rows));
  expect_close(out[2], sp.normalized, want.dbeta, bwd_rtol(t), bwd_atol(t, sp.rows));
}

TEST(LayerNormBackward, MatchesFloat64EveryDtypeAndShape) {
  for_each_isa([] {
    std::uint64_t seed = 100;
    for (dtype t : float_types) {
      for (const auto& c : cases) {
        const split sp = split_at_axis(c.s, wrap(c.axis, c.s.rank()));
        const tensor x = random(t, c.s, seed++, -3.0, 5.0);
        const tensor g = random(t, sp.normalized, seed++, 0.5, 2.0);
        const tensor dy = random(t, c.s, seed++, -1.0, 1.0);
        check_backward(x, g, dy, c.axis);
      }
    }
  });
}

TEST(LayerNormBackward, ManyRowsAndNonContiguousInputs) {
  // 301 rows: several dgamma/dbeta groups of 8 rows (four rows at a time) and a last one of
  // 5 (four, then one); 3003 rows: groups of 47 rows, which flush their float sums into
  // double after 32 rows and at their end.
  for_each_isa([] {
    for (dtype t : float_types) {
      SCOPED_TRACE(to_string(t));
      for (const shape& s : {shape{301, 70}, shape{3003, 5}}) {
        const tensor x = random(t, s, 21, -2.0, 2.0);
        const tensor g = random(t, {s[1]}, 22, 0.5, 2.0);
        const tensor dy = random(t, s, 23);
        check_backward(x, g, dy, -1);
        check_backward(non_contiguous(x), strided_view(g), non_contiguous(dy), -1);
      }
    }
  });
}

TEST(LayerNormBackward, ConstantAndNanRows) {
  for_each_isa([] {
    // Row 0 constant (xhat 0: dx = rstd (dy g - mean(dy g))), row 1 with a NaN (all NaN),
    // row 2 ordinary; dgamma/dbeta take the NaN in every column.
    std::vector<double> v = values(random(dtype::f32, {3, 16}, 31));
    for (std::size_t i = 0; i < 16; ++i) v[i] = 2.5;
    v[16 + 5] = std::nan("");
    const tensor x = make(dtype::f32, {3, 16}, v);
    const tensor g = random(dtype::f32, {16}, 32, 0.5, 2.0);
    const tensor dy = random(dtype::f32, {3, 16}, 33);
    check_backward(x, g, dy, -1, 1.0 / std::sqrt(1e-5));
  });
}

TEST(LayerNormBackward, EmptyTensors) {
  // No rows: dgamma and dbeta are sums of nothing.
  auto out = run_op("layer_norm_grad", {make(dtype::f32, {0, 3}, {}), make(dtype::f32, {0, 3}, {}),
                                        make(dtype::f32, {3}, {1, 2, 3}), make(dtype::f32, {0}, {}),
                                        make(dtype::f32, {0}, {})});
  expect_close(out[0], {0, 3}, {});
  expect_close(out[1], {3}, {0, 0, 0}, 0.0, 0.0);
  expect_close(out[2], {3}, {0, 0, 0}, 0.0, 0.0);
  out = run_op("layer_norm_grad", {make(dtype::f32, {2, 0}, {}), make(dtype::f32, {2, 0}, {}),
                                   make(dtype::f32, {0}, {}), make(dtype::f32, {2}, {0, 0}),
                                   make(dtype::f32, {2}, {1, 1})});
  expect_close(out[0], {2, 0}, {});
  expect_close(out[1], {0}, {});
  expect_close(out[2], {0}, {});
}

TEST(LayerNormBackward, SameBitsForOneAndTwoThreads) {
  // dgamma/dbeta groups depend on (rows, n) alone, so the sums do not depend on the threads.
  const shape s{1000, 300};
  const tensor x = random(dtype::f32, s, 41);
  const tensor dy = random(dtype::f32, s, 42);
  const tensor gamma = random(dtype::f32, {300}, 43, 0.5, 2.0);
  const tensor beta = random(dtype::f32, {300}, 44);
  std::vector<std::vector<std::vector<float>>> results;  // copied out: the buffers die with
                                                         // their session
  for (const int threads : {1, 2}) {
    graph g;
    graph_builder b(g);
    const auto xp = ops::placeholder(b, "x", dtype::f32, s);
    const auto gp = ops::placeholder(b, "gamma", dtype::f32, {300});
    const auto bp = ops::placeholder(b, "beta", dtype::f32, {300});
    const auto dyp = ops::placeholder(b, "dy", dtype::f32, s);
    const auto ln = ops::layer_norm(xp, gp, bp);
    const auto grads = gradients(ln.y, {xp, gp, bp}, dyp);
    std::vector<std::string> fetches{ln.y.name()};
    for (const auto& d : grads) fetches.push_back(d.name());
    session_options o;
    o.devices.cpu_threads = threads;
    session sess(std::move(g), o);
    const auto out = sess.run({{"x", x}, {"gamma", gamma}, {"beta", beta}, {"dy", dy}}, fetches);
    auto& r = results.emplace_back();
    for (const tensor& t : out) {
      ASSERT_TRUE(t.is_contiguous());
      r.emplace_back(t.data<float>(), t.data<float>() + t.num_elements());
    }
  }
  ASSERT_EQ(results[0].size(), 4u);
  for (std::size_t i = 0; i < results[0].size(); ++i) {
    SCOPED_TRACE(i);
    const auto& a = results[0][i];
    const auto& c = results[1][i];
    ASSERT_EQ(a.size(), c.size());
    EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
  }
}

// The gradient as reduction_grads.cpp built it before layer_norm_grad existed: a dozen
// primitive ops (reshape, sub, mul, reduce_mean, reduce_sum).
TEST(LayerNormBackward, MatchesTheCompositeFormula) {
  for (dtype t : {dtype::f32, dtype::f64}) {
    for (const auto& c : {ln_case{{8, 50}, -1}, ln_case{{3, 4, 5, 6}, 2}}) {
      SCOPED_TRACE(::testing::Message() << to_string(t) << " " << to_string(c.s));
      const std::size_t axis = wrap(c.axis, c.s.rank());
      const split sp = split_at_axis(c.s, axis);
      graph g;
      graph_builder b(g);
      const auto x = ops::placeholder(b, "x", t, c.s);
      const auto gamma = ops::placeholder(b, "gamma", t, sp.normalized);
      const auto beta = ops::placeholder(b, "beta", t, sp.normalized);
      const auto dy = ops::placeholder(b, "dy", t, c.s);
      const auto ln = ops::layer_norm(x, gamma, beta, c.axis);
      const auto fused = gradients(ln.y, {x, gamma, beta}, dy);
      // The composite formula.
      std::vector<std::int64_t> lead;
      std::vector<std::int64_t> norm;
      std::vector<std::int64_t> stat_shape = c.s.to_vector();
      for (std::size_t d = 0; d < c.s.rank(); ++d) {
        if (d < axis) {
          lead.push_back(static_cast<std::int64_t>(d));
        } else {
          norm.push_back(static_cast<std::int64_t>(d));
          stat_shape[d] = 1;
        }
      }
      const auto mean = ops::reshape(ln.mean, stat_shape);
      const auto rstd = ops::reshape(ln.rstd, stat_shape);
      const auto xhat = (x - mean) * rstd;
      const auto dxhat = dy * gamma;
      const auto m1 = ops::reduce_mean(dxhat, norm, true);
      const auto m2 = ops::reduce_mean(dxhat * xhat, norm, true);
      const auto dx = rstd * (dxhat - m1 - xhat * m2);
      const auto dgamma = ops::reduce_sum(dy * xhat, lead);
      const auto dbeta = ops::reduce_sum(dy, lead);
      // The gradients come from one layer_norm_grad node.
      for (const auto& d : fused) EXPECT_EQ(d.producer().op(), "layer_norm_grad");
      const std::vector<std::string> fetches{fused[0].name(), fused[1].name(), fused[2].name(),
                                             dx.name(),       dgamma.name(),   dbeta.name()};
      session sess(std::move(g));
      const auto out = sess.run({{"x", random(t, c.s, 51, -2.0, 3.0)},
                                 {"gamma", random(t, sp.normalized, 52, 0.5, 2.0)},
                                 {"beta", random(t, sp.normalized, 53)},
                                 {"dy", random(t, c.s, 54)}},
                                fetches);
      const double tol = t == dtype::f32 ? 1e-4 : 1e-12;
      expect_close(out[0], c.s, values(out[3]), tol, tol);
      expect_close(out[1], sp.normalized, values(out[4]), tol, tol * 10);
      expect_close(out[2], sp.normalized, values(out[5]), tol, tol * 10);
    }
  }
}

TEST(LayerNormBackward, MatchesCentralDifferences) {
  // L = Σ y w over f64; dL/dv by central differences of the forward kernel for every
  // element of x, gamma and beta, against layer_norm_grad fed dy = w.
  for_each_isa([] {
    const shape s{3, 2, 5};
    const std::int64_t axis = 1;
    const tensor x = random(dtype::f64, s, 61, -2.0, 2.0);
    const tensor g = random(dtype::f64, {2, 5}, 62, 0.5, 2.0);
    const tensor b = random(dtype::f64, {2, 5}, 63);
    const tensor w = random(dtype::f64, s, 64);
    const auto wv = values(w);
    const auto loss = [&](const std::vector<tensor>& in) {
      const auto y = values(run_op("layer_norm", in, {{"axis", axis}, {"epsilon", 1e-3}})[0]);
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * wv[i];
      return l;
    };
    const auto fwd = run_op("layer_norm", {x, g, b}, {{"axis", axis}, {"epsilon", 1e-3}});
    const auto grads = run_op("layer_norm_grad", {w, x, g, fwd[1], fwd[2]}, {{"axis", axis}});
    const std::vector<tensor> inputs{x, g, b};
    for (std::size_t k = 0; k < 3; ++k) {
      SCOPED_TRACE(::testing::Message() << "input " << k);
      const auto base = values(inputs[k]);
      std::vector<double> numeric(base.size());
      constexpr double h = 1e-6;
      for (std::size_t i = 0; i < base.size(); ++i) {
        auto plus = base;
        auto minus = base;
        plus[i] += h;
        minus[i] -= h;
        std::vector<tensor> in_p = inputs;
        std::vector<tensor> in_m = inputs;
        in_p[k] = make(dtype::f64, inputs[k].shape(), plus);
        in_m[k] = make(dtype::f64, inputs[k].shape(), minus);
        numeric[i] = (loss(in_p) - loss(in_m)) / (2 * h);
      }
      expect_close(grads[k], inputs[k].shape(), numeric, 1e-6, 1e-7);
    }
  });
}

TEST(LayerNormBackward, InPlaceThroughASession) {
  // x and dy made by ops inside the graph, read once: layer_norm may write y into x's
  // buffer and layer_norm_grad dx into dy's (Note [buffer forwarding]); the results must
  // not change.
  for_each_isa([] {
    const shape s{64, 96};
    graph g;
    graph_builder b(g);
    const auto a = ops::placeholder(b, "a", dtype::f32, s);
    const auto gamma = ops::placeholder(b, "gamma", dtype::f32, {96});
    const auto beta = ops::placeholder(b, "beta", dtype::f32, {96});
    const auto w = ops::placeholder(b, "w", dtype::f32, s);
    const auto x = a * 2.0;
    const auto ln = ops::layer_norm(x, gamma, beta);
    const auto dy = w * 1.0;
    const auto grads = gradients(ln.y, {x, gamma, beta}, dy);
    // x3 is read by layer_norm alone (x above also by layer_norm_grad): y3 may take its buffer.
    const auto x3 = a * 3.0;
    const auto y3 = ops::layer_norm(x3, gamma, beta).y;
    const std::vector<std::string> fetches{ln.y.name(),     ln.mean.name(),  ln.rstd.name(),
                                           grads[0].name(), grads[1].name(), grads[2].name(),
                                           y3.name()};
    session sess(std::move(g));
    const tensor av = random(dtype::f32, s, 71);
    const tensor gv = random(dtype::f32, {96}, 72, 0.5, 2.0);
    const tensor bv = random(dtype::f32, {96}, 73);
    const tensor wv = random(dtype::f32, s, 74);
    const auto out = sess.run({{"a", av}, {"gamma", gv}, {"beta", bv}, {"w", wv}}, fetches);
    std::vector<double> xv = values(av);
    for (auto& e : xv) e *= 2.0;
    const auto fwd = layer_norm_ref(xv, 64, 96, values(gv), values(bv), 1e-5);
    expect_close(out[0], s, fwd.y, 2e-5, 2e-5);
    for (auto& e : xv) e *= 1.5;
    expect_close(out[6], s, layer_norm_ref(xv, 64, 96, values(gv), values(bv), 1e-5).y, 2e-5, 2e-5);
    for (auto& e : xv) e /= 1.5;
    const auto bwd =
        layer_norm_grad_ref(values(wv), xv, values(gv), values(out[1]), values(out[2]), 64, 96);
    expect_close(out[3], s, bwd.dx, 1e-4, 2e-5);
    expect_close(out[4], {96}, bwd.dgamma, 1e-4, 2e-4);
    expect_close(out[5], {96}, bwd.dbeta, 1e-4, 2e-4);
  });
}

// Rows [r0, r1) of a dense [rows, n] tensor, as a new tensor.
tensor row_slice(const tensor& x, std::int64_t r0, std::int64_t r1) {
  const std::int64_t n = x.dim(1);
  const auto v = values(x);
  return make(x.type(), {r1 - r0, n}, std::vector<double>(v.begin() + r0 * n, v.begin() + r1 * n));
}

// Expects the elements [from, from + count) of a to have the bits of b's first count.
void expect_same_bits(const tensor& a, std::int64_t from, const tensor& b, std::int64_t count) {
  const std::size_t size = size_of(a.type());
  ASSERT_EQ(a.type(), b.type());
  EXPECT_EQ(
      std::memcmp(static_cast<const char*>(a.raw_data()) + static_cast<std::size_t>(from) * size,
                  b.raw_data(), static_cast<std::size_t>(count) * size),
      0)
      << "elements from " << from;
}

TEST(LayerNormStreaming, LargeOutputsGiveTheSameBitsAsSmallOnes) {
  // 8 MiB outputs are written with streaming stores (Note [layer_norm streaming stores]);
  // rows are computed independently, so a slice of the rows computed on its own (plain
  // stores, and other rows first in their range) must give the same bits, and the whole
  // must match the reference.
  for_each_isa([] {
    for (const dtype t : {dtype::f32, dtype::f64}) {
      SCOPED_TRACE(to_string(t));
      const std::int64_t rows = t == dtype::f32 ? 2048 : 1024;
      const std::int64_t n = 1024;
      const tensor x = random(t, {rows, n}, 81, -2.0, 3.0);
      const tensor g = random(t, {n}, 82, 0.5, 2.0);
      const tensor b = random(t, {n}, 83);
      const tensor dy = random(t, {rows, n}, 84);
      const auto fwd = run_op("layer_norm", {x, g, b});
      const auto want = layer_norm_ref(values(x), rows, n, values(g), values(b), 1e-5);
      expect_close(fwd[0], {rows, n}, want.y, fwd_rtol(t), fwd_atol(t));
      const auto bwd = run_op("layer_norm_grad", {dy, x, g, fwd[1], fwd[2]});
      const auto want_b = layer_norm_grad_ref(values(dy), values(x), values(g), values(fwd[1]),
                                              values(fwd[2]), rows, n);
      expect_close(bwd[0], {rows, n}, want_b.dx, bwd_rtol(t), bwd_atol(t, 1));
      expect_close(bwd[1], {n}, want_b.dgamma, bwd_rtol(t), bwd_atol(t, rows));
      for (const std::int64_t r0 : {std::int64_t{0}, rows / 2 - 3, rows - 5}) {
        const std::int64_t r1 = std::min(rows, r0 + 8);
        const tensor xs = row_slice(x, r0, r1);
        const auto fs = run_op("layer_norm", {xs, g, b});
        expect_same_bits(fwd[0], r0 * n, fs[0], (r1 - r0) * n);
        expect_same_bits(fwd[1], r0, fs[1], r1 - r0);
        expect_same_bits(fwd[2], r0, fs[2], r1 - r0);
        const auto stat = [&](const tensor& v) {
          return row_slice(v.reshaped({rows, 1}), r0, r1).reshaped({r1 - r0});
        };
        const auto bs =
            run_op("layer_norm_grad", {row_slice(dy, r0, r1), xs, g, stat(fwd[1]), stat(fwd[2])});
        expect_same_bits(bwd[0], r0 * n, bs[0], (r1 - r0) * n);
      }
    }
  });
}

// ---- inference ---------------------------------------------------------------------------

TEST(LayerNormGradInference, TakesKnownDimsFromEveryInput) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f16, {-1, 3, -1});
  const auto dy = ops::placeholder(b, "dy", dtype::f16, {5, -1, -1});
  const auto gamma = ops::placeholder(b, "gamma", dtype::f16, {3, 8});
  const auto stat = ops::placeholder(b, "stat", dtype::f16, {-1});
  const auto outs =
      b.add("layer_norm_grad", {dy, x, gamma, stat, stat}, {{"axis", std::int64_t{1}}});
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs[0].type(), (tensor_type{dtype::f16, shape{5, 3, -1}}));
  EXPECT_EQ(outs[1].type(), (tensor_type{dtype::f16, shape{3, 8}}));
  EXPECT_EQ(outs[2].type(), (tensor_type{dtype::f16, shape{3, 8}}));
}

// ---- bad input --------------------------------------------------------------------------

TEST(LayerNormGradErrors, AtGraphBuildTime) {
  const tensor x = random(dtype::f32, {2, 3, 4}, 1);
  const tensor g4 = random(dtype::f32, {4}, 2);
  const tensor m2 = random(dtype::f32, {2, 3}, 3);
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {x, x, random(dtype::f32, {3}, 2), m2, m2});
      },
      {"under_test", "layer_norm_grad", "gamma", "[3]", "[4]", "[2, 3, 4]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {x, x, g4, m2, m2}, {{"axis", std::int64_t{1}}});
      },
      {"under_test", "gamma", "[4]", "[3, 4]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {x, x, g4, random(dtype::f32, {2}, 3), m2});
      },
      {"under_test", "mean", "[2]", "[2, 3]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {x, x, g4, m2, random(dtype::f32, {6}, 3)});
      },
      {"under_test", "rstd", "[6]", "[2, 3]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {random(dtype::f32, {2, 3, 5}, 4), x, g4, m2, m2});
      },
      {"under_test", "dy", "[2, 3, 5]", "[2, 3, 4]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {x, x, g4, m2, m2}, {{"axis", std::int64_t{3}}});
      },
      {"under_test", "out of range"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {x, x, random(dtype::f64, {4}, 2), m2, m2});
      },
      {"under_test", "float64"});
  const tensor xi = random(dtype::i32, {2, 4}, 5);
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("layer_norm_grad", {xi, xi, random(dtype::i32, {4}, 6),
                                         random(dtype::i32, {2}, 7), random(dtype::i32, {2}, 8)});
      },
      {"under_test", "int32"});
}

TEST(LayerNormGradErrors, AtRunTime) {
  // Declared with unknown dims, so inference lets them through; the kernel names the shapes.
  const tensor x = random(dtype::f32, {2, 4}, 1);
  const tensor m = random(dtype::f32, {2}, 2);
  const shape any2{-1, -1};
  const shape any1{-1};
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("layer_norm_grad", {x, x, random(dtype::f32, {5}, 3), m, m},
                              {any2, any2, any1, any1, any1});
      },
      {"under_test", "layer_norm_grad", "gamma", "[5]", "[4]"});
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("layer_norm_grad",
                              {random(dtype::f32, {2, 5}, 4), x, random(dtype::f32, {4}, 3), m, m},
                              {any2, any2, any1, any1, any1});
      },
      {"under_test", "dy", "[2, 5]", "[2, 4]"});
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("layer_norm_grad",
                              {x, x, random(dtype::f32, {4}, 3), random(dtype::f32, {3}, 5), m},
                              {any2, any2, any1, any1, any1});
      },
      {"under_test", "mean", "[3]", "[2]"});
  // layer_norm's own run-time check of beta.
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("layer_norm",
                              {x, random(dtype::f32, {4}, 3), random(dtype::f32, {3}, 6)},
                              {any2, any1, any1});
      },
      {"under_test", "layer_norm", "beta", "[3]", "[4]"});
}

TEST(LayerNormGradErrors, GradientsThroughTheStatisticsAreRejected) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {2, 4});
  const auto gamma = ops::placeholder(b, "gamma", dtype::f32, {4});
  const auto beta = ops::placeholder(b, "beta", dtype::f32, {4});
  const auto ln = ops::layer_norm(x, gamma, beta);
  expect_error<invalid_argument>([&] { (void)gradients(ops::reduce_sum(ln.rstd), {x}); },
                                 {"layer_norm", "mean or rstd"});
  // layer_norm_grad itself has no gradient (second order through it is an error).
  const auto grads = gradients(ln.y, {x});
  expect_error<invalid_argument>([&] { (void)gradients(ops::reduce_sum(grads[0]), {x}); },
                                 {"layer_norm_grad"});
}

}  // namespace
}  // namespace loom::testing
