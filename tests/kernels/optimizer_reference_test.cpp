// The per-tensor optimizers (apply_sgd, apply_adam, apply_adamw) against hand-computed
// steps and float64 implementations of PyTorch's published rules, run through sessions so
// the real executor and variable store are used.
//
// Bounds. The f32 kernels follow the same operation order as the reference; each f32 op
// rounds once. Per step (the reference started from loom's own f32 state): the parameter
// is one rounding of p - u away (<= 0.5 ulp; AdamW's decay rounds once more) plus the
// update's relative error (a handful of f32 roundings, ~4e-7 |u|); the tests allow
// 0.5 ulp per rounding + 1e-5 |u|. Over a trajectory of
// T steps those per-step errors add up, and nothing amplifies them (the update does not
// depend on p except through the tiny weight-decay term), so the tests allow T/2 ulp of
// the largest |p| seen plus 1e-5 of the total displacement (plus, for AdamW, the rounding
// of its f32 decay factor, which is systematic); the observed maximum is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "optimizer_test_util.hpp"

namespace loom {
namespace {

using namespace testing;
using namespace testing::optim;

// w (f32 [n], initial values), g (placeholder of grad_type), lr (f32 constant), step (i64
// placeholder); one update node made by `add`.
template <class Add>
std::pair<graph, std::string> one_param_graph(const std::vector<double>& w0, float lr,
                                              dtype grad_type, Add&& add) {
  graph g;
  graph_builder b(g);
  const auto n = static_cast<std::int64_t>(w0.size());
  auto w = ops::variable(b, "w", f32_tensor({n}, w0));
  auto grad = ops::placeholder(b, "g", grad_type, {n});
  auto rate = ops::scalar(b, lr);
  auto step = ops::placeholder(b, "step", dtype::i64, {});
  std::string name = add(w, grad, rate, step);
  return {std::move(g), std::move(name)};
}

std::vector<double> random_values(std::size_t n, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> out(n);
  for (auto& x : out) x = static_cast<double>(static_cast<float>(d(rng)));
  return out;
}

TEST(OptimizerReference, AdamFirstStepByHand) {
  // Step 1: m = 0.1 g, v = 0.001 g², bias corrections 0.1 and 0.001, so
  // p1 = p0 - lr * g / (|g| + eps). The f32 update carries about seven roundings (m, v,
  // sqrt, two divisions, eps, step size): 4 ulp relative where p0 = 0 leaves only it.
  auto [g, name] = one_param_graph(
      {1.0, -2.0, 0.5, 0.0}, 0.1f, dtype::f32,
      [](output w, output gr, output lr, output step) { return ops::apply_adam(w, gr, lr, step); });
  session s(std::move(g));
  s.run({{"g", f32_tensor({4}, {0.5, -1.0, 0.0, 2.0})}, {"step", i64_scalar(1)}}, {}, {name});
  const double lr = static_cast<double>(0.1f);
  expect_close(var_value(s, "w"), {4},
               {1.0 - lr * 0.5 / (0.5 + 1e-8), -2.0 + lr * 1.0 / (1.0 + 1e-8), 0.5,
                0.0 - lr * 2.0 / (2.0 + 1e-8)},
               4.8e-7, 0.0);
  expect_close(var_value(s, "w/adam_m"), {4}, {0.05, -0.1, 0.0, 0.2}, 1.2e-7, 0.0);
  expect_close(var_value(s, "w/adam_v"), {4}, {0.00025, 0.001, 0.0, 0.004}, 2.4e-7, 0.0);
  EXPECT_EQ(s.variables().find("w/master"), nullptr);  // f32 parameters have no master
}

TEST(OptimizerReference, SgdStepsByHand) {
  struct variant {
    ops::sgd_options o;
    double after1, after2;
  };
  // p0 = 1, g1 = 1, g2 = 0.5, lr = 0.1.
  const variant cases[] = {
      {{}, 0.9, 0.85},                                    // plain
      {{.momentum = 0.9}, 0.9, 0.9 - 0.1 * (0.9 + 0.5)},  // buf 1, 1.4
      {{.momentum = 0.9, .nesterov = true}, 1 - 0.19, 0.81 - 0.1 * (0.5 + 0.9 * 1.4)},
      {{.momentum = 0.9, .dampening = 0.5}, 0.9, 0.9 - 0.1 * (0.9 + 0.25)},  // no damping at 1
      {{.weight_decay = 0.1}, 1 - 0.1 * 1.1, 0.89 - 0.1 * (0.5 + 0.089)},
  };
  for (const auto& c : cases) {
    auto [g, name] = one_param_graph(
        {1.0}, 0.1f, dtype::f32,
        [&](output w, output gr, output lr, output) { return ops::apply_sgd(w, gr, lr, c.o); });
    session s(std::move(g));
    s.run({{"g", f32_tensor({1}, {1.0})}}, {}, {name});
    expect_close(var_value(s, "w"), {1}, {c.after1}, 3e-7, 0.0);
    s.run({{"g", f32_tensor({1}, {0.5})}}, {}, {name});
    expect_close(var_value(s, "w"), {1}, {c.after2}, 6e-7, 0.0);
    EXPECT_EQ(s.variables().find("w/momentum") != nullptr, c.o.momentum != 0.0);
  }
}

struct adam_variant {
  const char* label;
  bool adamw;
  ops::adam_options o;
};

std::vector<adam_variant> adam_variants() {
  return {{"adam", false, {}},
          {"adam_l2", false, {.weight_decay = 0.1}},
          {"adam_betas", false, {.beta1 = 0.3, .beta2 = 0.99, .eps = 1e-6}},  // lerp's 2nd form
          {"adamw", true, {}},
          {"adamw_strong", true, {.weight_decay = 0.5}}};
}

// AdamW's factor 1 - lr*wd is rounded to f32 once per call (as PyTorch rounds the Python
// float it multiplies by): a relative error of up to 2^-25 on p per step, systematic.
double decay_error(const adam_ref_params& h) {
  if (!h.adamw) return 0.0;
  const double decay = 1.0 - h.lr * h.weight_decay;
  return std::abs(decay - static_cast<double>(static_cast<float>(decay)));
}

adam_ref_params ref_params_of(const adam_variant& v, float lr) {
  adam_ref_params h;
  h.lr = lr;
  h.beta1 = v.o.beta1;
  h.beta2 = v.o.beta2;
  h.eps = v.o.eps;
  h.weight_decay = v.o.weight_decay.value_or(v.adamw ? 0.01 : 0.0);
  h.adamw = v.adamw;
  return h;
}

// Each step checked against float64 from loom's own f32 state before it: half an ulp per
// rounding of p, plus the update's own error.
TEST(OptimizerReference, AdamEachStepIsOneRoundingFromFloat64) {
  constexpr std::size_t n = 2000;
  constexpr float lr = 1e-2f;
  for (const auto& variant : adam_variants()) {
    SCOPED_TRACE(variant.label);
    std::mt19937 rng(7);
    auto [g, name] = one_param_graph(random_values(n, rng, -2, 2), lr, dtype::f32,
                                     [&](output w, output gr, output rate, output step) {
                                       return variant.adamw
                                                  ? ops::apply_adamw(w, gr, rate, step, variant.o)
                                                  : ops::apply_adam(w, gr, rate, step, variant.o);
                                     });
    session s(std::move(g));
    const adam_ref_params h = ref_params_of(variant, lr);
    for (std::int64_t t = 1; t <= 20; ++t) {
      // Gradients of mixed scales, some zero, to exercise eps and small v.
      auto grad = random_values(n, rng, -1, 1);
      for (std::size_t i = 0; i < n; i += 7) grad[i] *= 1e-4;
      for (std::size_t i = 3; i < n; i += 53) grad[i] = 0.0;
      adam_ref_state before;
      if (t == 1) {
        s.run({}, {"w"});  // materialise the variable
        before = {values(var_value(s, "w")), std::vector<double>(n, 0.0),
                  std::vector<double>(n, 0.0)};
      } else {
        before = {values(var_value(s, "w")), values(var_value(s, "w/adam_m")),
                  values(var_value(s, "w/adam_v"))};
      }
      adam_ref_state ref = before;
      adam_ref_step(ref, grad, t, h);
      s.run({{"g", f32_tensor({static_cast<std::int64_t>(n)}, grad)}, {"step", i64_scalar(t)}}, {},
            {name});
      const auto p = values(var_value(s, "w"));
      const auto m = values(var_value(s, "w/adam_m"));
      const auto v = values(var_value(s, "w/adam_v"));
      const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
      const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
      for (std::size_t i = 0; i < n; ++i) {
        // The gradient with Adam's L2 term, g + wd*p, may cancel, and so may m's update:
        // their errors are relative to the magnitudes that went in, not to the result.
        const double g_scale = std::abs(grad[i]) + h.weight_decay * std::abs(before.p[i]);
        const double g_eff = h.adamw ? grad[i] : grad[i] + h.weight_decay * before.p[i];
        const double m_err = 0x1p-22 * (std::abs(before.m[i]) + g_scale);
        // p - u rounds once (half an ulp), after AdamW's p*(1 - lr*wd) rounded once more;
        // u = step_size*m/denom carries m's error plus a few roundings of its own.
        const double u = std::abs(ref.p[i] - before.p[i]);
        const double denom = std::sqrt(ref.v[i]) / std::sqrt(bc2) + h.eps;
        const double rounding = 0.5 * ulp_f32(std::max(std::abs(ref.p[i]), std::abs(p[i]))) +
                                (h.adamw ? 0.5 * ulp_f32(before.p[i]) : 0.0) +
                                decay_error(h) * std::abs(before.p[i]);
        ASSERT_LE(std::abs(p[i] - ref.p[i]), rounding + h.lr / bc1 * m_err / denom + 1e-5 * u)
            << "step " << t << " element " << i;
        ASSERT_LE(std::abs(m[i] - ref.m[i]), m_err) << "step " << t << " element " << i;
        ASSERT_LE(std::abs(v[i] - ref.v[i]),
                  0x1p-21 * ref.v[i] + 2.0 * (1.0 - h.beta2) * std::abs(g_eff) * 0x1p-22 * g_scale)
            << "step " << t << " element " << i;
      }
    }
  }
}

// 100 steps of loom's f32 against 100 steps of float64: T/2 ulp (see the top of the file).
TEST(OptimizerReference, AdamTrajectoryOf100StepsMatchesFloat64) {
  constexpr std::size_t n = 1000;
  constexpr std::int64_t steps = 100;
  constexpr float lr = 1e-2f;
  for (const auto& variant : adam_variants()) {
    SCOPED_TRACE(variant.label);
    std::mt19937 rng(11);
    const auto w0 = random_values(n, rng, -1, 1);
    auto [g, name] =
        one_param_graph(w0, lr, dtype::f32, [&](output w, output gr, output rate, output step) {
          return variant.adamw ? ops::apply_adamw(w, gr, rate, step, variant.o)
                               : ops::apply_adam(w, gr, rate, step, variant.o);
        });
    session s(std::move(g));
    adam_ref_state ref{w0, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    std::vector<double> max_abs(n, 0.0);
    for (std::int64_t t = 1; t <= steps; ++t) {
      const auto grad = random_values(n, rng, -1, 1);
      adam_ref_step(ref, grad, t, ref_params_of(variant, lr));
      for (std::size_t i = 0; i < n; ++i) max_abs[i] = std::max(max_abs[i], std::abs(ref.p[i]));
      s.run({{"g", f32_tensor({static_cast<std::int64_t>(n)}, grad)}, {"step", i64_scalar(t)}}, {},
            {name});
    }
    const auto p = values(var_value(s, "w"));
    double worst_ulps = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double err = std::abs(p[i] - ref.p[i]);
      const double bound =
          static_cast<double>(steps) *
              (0.5 * ulp_f32(max_abs[i]) + decay_error(ref_params_of(variant, lr)) * max_abs[i]) +
          1e-5 * std::abs(ref.p[i] - w0[i]);
      ASSERT_LE(err, bound) << "element " << i;
      worst_ulps = std::max(worst_ulps, err / ulp_f32(max_abs[i]));
    }
    std::printf("[ %s ] worst error after %lld steps: %.1f ulp\n", variant.label,
                static_cast<long long>(steps), worst_ulps);
  }
}

TEST(OptimizerReference, SgdTrajectoryOf100StepsMatchesFloat64) {
  constexpr std::size_t n = 1000;
  constexpr std::int64_t steps = 100;
  constexpr float lr = 1e-2f;
  struct variant {
    const char* label;
    ops::sgd_options o;
  };
  const variant variants[] = {
      {"plain", {}},
      {"momentum", {.momentum = 0.9}},
      {"nesterov_wd", {.momentum = 0.9, .weight_decay = 0.01, .nesterov = true}},
      {"dampening", {.momentum = 0.5, .dampening = 0.3, .weight_decay = 0.1}},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.label);
    std::mt19937 rng(5);
    const auto w0 = random_values(n, rng, -1, 1);
    auto [g, name] = one_param_graph(
        w0, lr, dtype::f32,
        [&](output w, output gr, output rate, output) { return ops::apply_sgd(w, gr, rate, v.o); });
    session s(std::move(g));
    const sgd_ref_params h{lr, v.o.momentum, v.o.dampening, v.o.weight_decay, v.o.nesterov};
    std::vector<double> p = w0, buf(n, 0.0), max_abs(n, 0.0), disp(n, 0.0);
    for (std::int64_t t = 1; t <= steps; ++t) {
      const auto grad = random_values(n, rng, -1, 1);
      sgd_ref_step(p, buf, t == 1, grad, h);
      for (std::size_t i = 0; i < n; ++i) max_abs[i] = std::max(max_abs[i], std::abs(p[i]));
      s.run({{"g", f32_tensor({static_cast<std::int64_t>(n)}, grad)}}, {}, {name});
    }
    const auto got = values(var_value(s, "w"));
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double err = std::abs(got[i] - p[i]);
      // Momentum carries an error of the buffer into later steps, at most 1/(1 - momentum)
      // times (x10 for 0.9); the buffer's own roundings are far below p's ulp at lr 1e-2.
      const double amplify = v.o.momentum > 0 ? 1.0 / (1.0 - v.o.momentum) : 1.0;
      const double bound = 0.5 * static_cast<double>(steps) * ulp_f32(max_abs[i]) +
                           1e-6 * amplify * static_cast<double>(steps) * lr;
      ASSERT_LE(err, bound) << "element " << i;
      worst = std::max(worst, err / ulp_f32(max_abs[i]));
    }
    std::printf("[ %s ] worst error after %lld steps: %.1f ulp\n", v.label,
                static_cast<long long>(steps), worst);
  }
}

}  // namespace
}  // namespace loom
