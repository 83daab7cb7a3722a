// optimizer_fusion: per-variable apply_adam / apply_adamw / apply_sgd of one step become one
// fused_adam / fused_adamw / fused_sgd. Several steps fused and unfused leave bitwise equal
// variables (and both follow a float64 reference); every grouping and refusal rule, with
// its logged reason.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "loom/graph/ops.hpp"
#include "passes/pattern_test_support.hpp"

namespace loom {
namespace {

using namespace testing;
using kind = passes::pass_record::kind;
constexpr const char* pass = "optimizer_fusion";

struct param {
  std::string name;
  shape s;
};

const std::vector<param> three_params{{"w0", {3, 4}}, {"w1", {5}}, {"w2", {2, 2, 2}}};

// The starting values of parameter k (the same in every graph of a test).
std::vector<double> initial(std::size_t k, const shape& s) {
  std::mt19937 rng(static_cast<unsigned>(100 + k));
  return rounded(dtype::f32, uniform(rng, s.num_elements(), -1.0, 1.0));
}

// Variables for `params`, and a gradient placeholder g_<name> for each.
std::vector<std::pair<output, output>> add_params(graph_builder& b,
                                                  const std::vector<param>& params) {
  std::vector<std::pair<output, output>> out;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const auto& p = params[k];
    out.emplace_back(ops::variable(b, p.name, make_tensor(dtype::f32, p.s, initial(k, p.s))),
                     ops::placeholder(b, "g_" + p.name, dtype::f32, p.s));
  }
  return out;
}

// Gradients of step `k` for `params` (the same in every call).
std::vector<std::vector<double>> grads_of(int k, const std::vector<param>& params) {
  std::mt19937 rng(static_cast<unsigned>(1000 + k));
  std::vector<std::vector<double>> out;
  for (const auto& p : params) out.push_back(rounded(dtype::f32, uniform(rng, p.s.num_elements())));
  return out;
}

struct run_record {
  std::vector<std::vector<std::uint32_t>> bits;  // each variable's final f32 bits
  std::vector<std::vector<double>> values;
  std::vector<passes::pass_record> log;
  std::vector<planned_node> planned;
};

using tweak_fn = std::function<void(int, std::vector<std::vector<double>>&)>;

// `steps` steps of the graph: feeds every g_<name> (and "step" = k + 1 when it exists), runs
// `targets`, then reads the variables.
run_record run_steps(const graph& g, const std::vector<param>& params,
                     const std::vector<std::string>& targets, const session_options& o, int steps,
                     const tweak_fn& tweak = {}) {
  session s(g, o);
  const bool has_step = g.find("step") != nullptr;
  std::vector<std::string> feed_names;
  for (const auto& p : params) feed_names.push_back("g_" + p.name);
  if (has_step) feed_names.push_back("step");
  for (int k = 0; k < steps; ++k) {
    auto gv = grads_of(k, params);
    if (tweak) tweak(k, gv);
    std::vector<feed> feeds;
    for (std::size_t i = 0; i < params.size(); ++i) {
      feeds.emplace_back("g_" + params[i].name, make_tensor(dtype::f32, params[i].s, gv[i]));
    }
    if (has_step)
      feeds.emplace_back("step", make_tensor(dtype::i64, {}, {static_cast<double>(k + 1)}));
    (void)s.run(feeds, {}, targets);
  }
  run_record r;
  r.log = s.explain_passes(feed_names, {}, targets);
  r.planned = describe(s.planned_graph(feed_names, {}, targets));
  for (const auto& p : params) {
    const tensor v = s.run({}, {p.name})[0];
    std::vector<std::uint32_t> bits(static_cast<std::size_t>(v.num_elements()));
    std::memcpy(bits.data(), v.raw_data(), bits.size() * sizeof(float));
    r.bits.push_back(std::move(bits));
    r.values.push_back(values(v));
  }
  return r;
}

// torch.optim.Adam / AdamW in float64 (from PyTorch's documented update rule).
void adam_reference(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                    const std::vector<double>& g, int t, double lr, double b1, double b2,
                    double eps, double wd, bool adamw) {
  const double bc1 = 1.0 - std::pow(b1, t);
  const double bc2 = 1.0 - std::pow(b2, t);
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gi = g[i];
    if (adamw) {
      p[i] *= 1.0 - lr * wd;
    } else {
      gi += wd * p[i];
    }
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
  }
}

TEST(OptimizerFusion, AdamStepsFusedAndUnfusedAreBitwiseEqual) {
  for (const bool adamw : {false, true}) {
    SCOPED_TRACE(adamw ? "adamw" : "adam");
    graph g;
    graph_builder b(g);
    auto pg = add_params(b, three_params);
    auto lr = ops::scalar(b, 0.01);
    auto step = ops::placeholder(b, "step", dtype::i64, {});
    ops::adam_options ao;
    ao.weight_decay = 0.05;
    std::vector<std::string> updates;
    for (auto& [w, gr] : pg) {
      updates.push_back(adamw ? ops::apply_adamw(w, gr, lr, step, ao)
                              : ops::apply_adam(w, gr, lr, step, ao));
    }
    const int steps = 6;
    const auto fused = run_steps(g, three_params, updates, {}, steps);
    const auto plain = run_steps(g, three_params, updates, without({pass}), steps);
    const std::string op = adamw ? "fused_adamw" : "fused_adam";
    EXPECT_EQ(count_op(fused.planned, op), 1u) << log_text(fused.log);
    EXPECT_EQ(count_op(fused.planned, adamw ? "apply_adamw" : "apply_adam"), 0u);
    EXPECT_EQ(count_op(plain.planned, op), 0u);
    EXPECT_EQ(
        records(fused.log, pass, kind::rewrite, {op, "3 parameters", "'w0', 'w1', 'w2'"}).size(),
        1u)
        << log_text(fused.log);
    EXPECT_EQ(fused.bits, plain.bits) << "fused and per-tensor updates agree bitwise";
    for (std::size_t k = 0; k < three_params.size(); ++k) {
      auto p = initial(k, three_params[k].s);
      std::vector<double> m(p.size(), 0.0);
      std::vector<double> v(p.size(), 0.0);
      for (int t = 0; t < steps; ++t) {
        adam_reference(p, m, v, grads_of(t, three_params)[k], t + 1, static_cast<double>(0.01f),
                       0.9, 0.999, 1e-8, 0.05, adamw);
      }
      expect_near_all(fused.values[k], p, 1e-5, 1e-6, three_params[k].name);
    }
  }
}

TEST(OptimizerFusion, SgdWithMomentumFusedAndUnfusedAreBitwiseEqual) {
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, three_params);
  auto lr = ops::scalar(b, 0.1);
  ops::sgd_options so;
  so.momentum = 0.9;
  so.nesterov = true;
  so.weight_decay = 0.01;
  std::vector<std::string> updates;
  for (auto& [w, gr] : pg) updates.push_back(ops::apply_sgd(w, gr, lr, so));
  const int steps = 5;
  const auto fused = run_steps(g, three_params, updates, {}, steps);
  const auto plain = run_steps(g, three_params, updates, without({pass}), steps);
  EXPECT_EQ(count_op(fused.planned, "fused_sgd"), 1u) << log_text(fused.log);
  EXPECT_EQ(count_op(fused.planned, "apply_sgd"), 0u);
  EXPECT_EQ(fused.bits, plain.bits);
  for (std::size_t k = 0; k < three_params.size(); ++k) {
    auto p = initial(k, three_params[k].s);
    std::vector<double> buf(p.size(), 0.0);
    const double lrf = static_cast<double>(0.1f);
    for (int t = 0; t < steps; ++t) {
      const auto gr = grads_of(t, three_params)[k];
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double gi = gr[i] + 0.01 * p[i];
        buf[i] = t == 0 ? gi : 0.9 * buf[i] + gi;
        p[i] -= lrf * (gi + 0.9 * buf[i]);
      }
    }
    expect_near_all(fused.values[k], p, 1e-5, 1e-6, three_params[k].name);
  }
}

// No step is skipped: an inf gradient poisons its own variable, as per-tensor Adam does,
// and the others update as usual (check_finite is off in the fused node).
TEST(OptimizerFusion, AnInfiniteGradientIsNotSkipped) {
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, three_params);
  auto lr = ops::scalar(b, 0.01);
  auto step = ops::placeholder(b, "step", dtype::i64, {});
  std::vector<std::string> updates;
  for (auto& [w, gr] : pg) updates.push_back(ops::apply_adam(w, gr, lr, step));
  const tweak_fn inf_at_step_2 = [](int k, std::vector<std::vector<double>>& gv) {
    if (k == 2) gv[1][3] = INFINITY;
  };
  const auto fused = run_steps(g, three_params, updates, {}, 4, inf_at_step_2);
  const auto plain = run_steps(g, three_params, updates, without({pass}), 4, inf_at_step_2);
  EXPECT_EQ(count_op(fused.planned, "fused_adam"), 1u);
  EXPECT_EQ(fused.bits, plain.bits);
  EXPECT_TRUE(std::isnan(fused.values[1][3])) << "the step was taken";
  EXPECT_FALSE(std::isnan(fused.values[0][0]));
  EXPECT_NE(fused.values[0], initial(0, three_params[0].s)) << "the others were updated";
}

TEST(OptimizerFusion, GroupsSplitByHyperparametersLrAndStepAreLogged) {
  const std::vector<param> params{{"a0", {4}}, {"a1", {4}}, {"b0", {3}}, {"b1", {3}},
                                  {"c0", {2}}, {"d0", {2}}, {"e0", {5}}};
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, params);
  auto lr = ops::scalar(b, 0.01);
  auto lr2 = ops::scalar(b, 0.02);
  auto step = ops::placeholder(b, "step", dtype::i64, {});
  ops::adam_options beta8;
  beta8.beta1 = 0.8;
  std::vector<std::string> updates;
  updates.push_back(
      ops::apply_adam(pg[0].first, pg[0].second, lr, step, {}, {.name = "a0_update"}));
  updates.push_back(
      ops::apply_adam(pg[1].first, pg[1].second, lr, step, {}, {.name = "a1_update"}));
  updates.push_back(
      ops::apply_adam(pg[2].first, pg[2].second, lr2, step, {}, {.name = "b0_update"}));
  updates.push_back(
      ops::apply_adam(pg[3].first, pg[3].second, lr2, step, {}, {.name = "b1_update"}));
  updates.push_back(
      ops::apply_adam(pg[4].first, pg[4].second, lr, step, beta8, {.name = "c0_update"}));
  updates.push_back(ops::apply_sgd(pg[5].first, pg[5].second, lr, {}, {.name = "d0_update"}));
  updates.push_back(
      ops::apply_adamw(pg[6].first, pg[6].second, lr, step, {}, {.name = "e0_update"}));
  const auto fused = run_steps(g, params, updates, {}, 3);
  const auto plain = run_steps(g, params, updates, without({pass}), 3);
  EXPECT_EQ(fused.bits, plain.bits);
  EXPECT_EQ(count_op(fused.planned, "fused_adam"), 2u) << log_text(fused.log);
  EXPECT_EQ(count_op(fused.planned, "apply_adam"), 1u) << "c0 (beta1 0.8) is a group of one";
  EXPECT_EQ(count_op(fused.planned, "apply_sgd"), 1u) << "a group of one stays";
  EXPECT_EQ(count_op(fused.planned, "apply_adamw"), 1u);
  EXPECT_EQ(rewrites(fused.log, pass), 2u);
  EXPECT_TRUE(refused_with(fused.log, pass, {"its lr is", "'a0_update' reads"}))
      << log_text(fused.log);
  EXPECT_TRUE(refused_with(fused.log, pass, {"its beta1 is 0.8", "'a0_update' has 0.9"}))
      << log_text(fused.log);
}

TEST(OptimizerFusion, DifferentStepInputsAreNotFused) {
  const std::vector<param> params{{"w0", {4}}, {"w1", {4}}};
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, params);
  auto lr = ops::scalar(b, 0.01);
  auto step = ops::placeholder(b, "step", dtype::i64, {});
  auto other_step = ops::identity(step, {.name = "other_step"});
  (void)ops::apply_adam(pg[0].first, pg[0].second, lr, step, {}, {.name = "u0"});
  (void)ops::apply_adam(pg[1].first, pg[1].second, lr, other_step, {}, {.name = "u1"});
  const auto fused = run_steps(g, params, {"u0", "u1"}, {}, 2);
  // remove_identities turns other_step into step itself first: they fuse.
  EXPECT_EQ(count_op(fused.planned, "fused_adam"), 1u) << log_text(fused.log);
  session_options o = without({"remove_identities"});
  const auto kept = run_steps(g, params, {"u0", "u1"}, o, 2);
  EXPECT_EQ(count_op(kept.planned, "fused_adam"), 0u) << log_text(kept.log);
  EXPECT_TRUE(refused_with(kept.log, pass, {"its step is 'other_step'", "'u0' reads 'step'"}))
      << log_text(kept.log);
  EXPECT_EQ(fused.bits, kept.bits);
}

TEST(OptimizerFusion, VariablesOnDifferentDevicesAreNotFused) {
  const std::vector<param> params{{"w0", {4}}, {"w1", {4}}, {"w2", {4}}};
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, {params[0], params[1]});
  {
    auto scope = b.with_device("cpu:1");
    pg.emplace_back(ops::variable(b, "w2", make_tensor(dtype::f32, {4}, initial(2, {4}))),
                    ops::placeholder(b, "g_w2", dtype::f32, {4}));
  }
  auto lr = ops::scalar(b, 0.01);
  std::vector<std::string> updates;
  for (auto& [w, gr] : pg) updates.push_back(ops::apply_sgd(w, gr, lr));
  session_options o;
  o.devices.virtual_cpu_devices = 2;
  session_options off = o;
  off.passes.disabled = {pass};
  const auto fused = run_steps(g, params, updates, o, 3);
  const auto plain = run_steps(g, params, updates, off, 3);
  EXPECT_EQ(fused.bits, plain.bits);
  EXPECT_EQ(count_op(fused.planned, "fused_sgd"), 1u) << log_text(fused.log);
  EXPECT_EQ(count_op(fused.planned, "apply_sgd"), 1u);
  EXPECT_TRUE(refused_with(fused.log, pass, {"its variable 'w2' asks for device 'cpu:1'"}))
      << log_text(fused.log);
}

TEST(OptimizerFusion, AnUpdateWaitingForAnotherOfItsGroupIsRefused) {
  const std::vector<param> params{{"w0", {4}}, {"w1", {4}}, {"w2", {4}}};
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, params);
  auto lr = ops::scalar(b, 0.1);
  const auto u0 = ops::apply_sgd(pg[0].first, pg[0].second, lr, {}, {.name = "u0"});
  // u1's gradient is computed after u0 ran: u1 cannot be in u0's fused node. (The edge
  // goes from an earlier node to a later one: the graph editor copies nodes in id order.)
  auto late_grad = ops::identity(pg[1].second, {.name = "late_grad"});
  g.add_control_input(late_grad.ep().node, g.get(u0).id);
  const auto u1 = ops::apply_sgd(pg[1].first, late_grad, lr, {}, {.name = "u1"});
  const auto u2 = ops::apply_sgd(pg[2].first, pg[2].second, lr, {}, {.name = "u2"});
  const auto fused = run_steps(g, params, {u0, u1, u2}, {}, 3);
  const auto plain = run_steps(g, params, {u0, u1, u2}, without({pass}), 3);
  EXPECT_EQ(fused.bits, plain.bits);
  EXPECT_EQ(count_op(fused.planned, "fused_sgd"), 1u) << log_text(fused.log);
  EXPECT_EQ(count_op(fused.planned, "apply_sgd"), 1u);
  EXPECT_TRUE(refused_with(
      fused.log, pass, {"not fused with 'u0'", "fusing would make the fused node wait for itself"}))
      << log_text(fused.log);
}

TEST(OptimizerFusion, ASecondUpdateOfOneVariableStaysApart) {
  const std::vector<param> params{{"w0", {4}}, {"w1", {3}}};
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, params);
  auto extra = ops::placeholder(b, "extra", dtype::f32, {4});
  auto lr = ops::scalar(b, 0.5);
  const auto u0 = ops::apply_sgd(pg[0].first, pg[0].second, lr, {}, {.name = "u0"});
  const auto u1 = ops::apply_sgd(pg[1].first, pg[1].second, lr, {}, {.name = "u1"});
  const auto u0b = ops::apply_sgd(pg[0].first, extra, lr, {}, {.name = "u0b"});
  session s(g);
  const std::vector<double> ev{1.0, 2.0, 3.0, 4.0};
  const auto gv = grads_of(0, params);
  (void)s.run({{"g_w0", make_tensor(dtype::f32, {4}, gv[0])},
               {"g_w1", make_tensor(dtype::f32, {3}, gv[1])},
               {"extra", make_tensor(dtype::f32, {4}, ev)}},
              {}, {u0, u1, u0b});
  const auto log = s.explain_passes({"g_w0", "g_w1", "extra"}, {}, {u0, u1, u0b});
  EXPECT_TRUE(refused_with(log, pass, {"not fused with 'u0'", "updates variable 'w0' already"}))
      << log_text(log);
  const auto planned = describe(s.planned_graph({"g_w0", "g_w1", "extra"}, {}, {u0, u1, u0b}));
  EXPECT_EQ(count_op(planned, "fused_sgd"), 1u);
  EXPECT_EQ(count_op(planned, "apply_sgd"), 1u);
  // Both updates of w0 happened (in some order): w0 - 0.5 g - 0.5 extra.
  const auto w0 = values(s.run({}, {"w0"})[0]);
  const auto p0 = initial(0, {4});
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(w0[i], p0[i] - 0.5 * gv[0][i] - 0.5 * ev[i], 1e-5);
  const auto w1 = values(s.run({}, {"w1"})[0]);
  const auto p1 = initial(1, {3});
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(w1[i], p1[i] - 0.5 * gv[1][i], 1e-6);
}

TEST(OptimizerFusion, TargetsAndControlReadersMoveToTheFusedNode) {
  graph g;
  graph_builder b(g);
  auto pg = add_params(b, three_params);
  auto lr = ops::scalar(b, 0.1);
  std::vector<std::string> updates;
  for (auto& [w, gr] : pg) updates.push_back(ops::apply_sgd(w, gr, lr));
  const std::string train = ops::no_op(b, {}, {.name = "train"});
  for (const auto& u : updates) g.add_control_input(g.get(train).id, g.get(u).id);
  const auto fused = run_steps(g, three_params, {train}, {}, 3);
  const auto plain = run_steps(g, three_params, {train}, without({pass}), 3);
  EXPECT_EQ(fused.bits, plain.bits);
  EXPECT_EQ(count_op(fused.planned, "fused_sgd"), 1u) << log_text(fused.log);
  const auto train_node = node_named(fused.planned, "train");
  ASSERT_FALSE(train_node.waits_for.empty());
  for (const auto& op : train_node.waits_for) EXPECT_EQ(op, "fused_sgd");
  for (std::size_t k = 0; k < 3; ++k) {
    auto p = initial(k, three_params[k].s);
    for (int s = 0; s < 3; ++s) {
      const auto gr = grads_of(s, three_params)[k];
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<double>(0.1f) * gr[i];
    }
    expect_near_all(fused.values[k], p, 1e-5, 1e-6);
  }
}

TEST(OptimizerFusion, NoFusedKernelOnTheRequestedDeviceTypeIsRefused) {
  const std::vector<param> params{{"w0", {4}}, {"w1", {4}}};
  graph g;
  graph_builder b(g);
  std::vector<std::string> updates;
  {
    auto scope = b.with_device("vulkan:0");  // a device type with no kernels at all
    auto pg = add_params(b, params);
    auto lr = ops::scalar(b, 0.1);
    for (auto& [w, gr] : pg) updates.push_back(ops::apply_sgd(w, gr, lr));
  }
  session_options o;
  o.allow_soft_placement = true;
  const auto fused = run_steps(g, params, updates, o, 2);
  EXPECT_TRUE(refused_with(fused.log, pass, {"no fused_sgd kernel on vulkan"}))
      << log_text(fused.log);
  EXPECT_EQ(count_op(fused.planned, "apply_sgd"), 2u);
  session_options off = o;
  off.passes.disabled = {pass};
  EXPECT_EQ(fused.bits, run_steps(g, params, updates, off, 2).bits);
}

}  // namespace
}  // namespace loom
