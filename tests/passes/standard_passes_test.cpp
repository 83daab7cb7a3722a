// The standard clean-up passes and element-wise fusion, through sessions: each rewrite
// keeps results (checked against the same graph run with the passes off, and against
// references computed here), leaves the planned graph it claims, and logs why it did or
// did not rewrite.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/passes/pass_manager.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using memory::host_tensor;

session_options with_passes(bool on, std::vector<std::string> disabled = {}) {
  session_options o;
  o.devices.cpu_threads = 2;
  o.passes.enabled = on;
  o.passes.disabled = std::move(disabled);
  return o;
}

std::size_t count_op(const graph& g, std::string_view op) {
  std::size_t n = 0;
  for (const node& nd : g.nodes()) n += nd.op() == op;
  return n;
}

bool logged(const std::vector<passes::pass_record>& log, std::string_view pass, bool rewrite,
            std::string_view text) {
  for (const auto& r : log) {
    if (r.pass != pass || (r.what == passes::pass_record::kind::rewrite) != rewrite) continue;
    if (passes::to_string(r).find(text) != std::string::npos) return true;
  }
  return false;
}

std::string dump(const std::vector<passes::pass_record>& log) {
  std::string s;
  for (const auto& r : log) s += passes::to_string(r) + "\n";
  return s;
}

std::vector<float> values_of(const tensor& t) {
  return {t.span<float>().begin(), t.span<float>().end()};
}

tensor random_tensor(const shape& s, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(s.num_elements()));
  for (auto& x : v) x = d(rng);
  return host_tensor(s, v);
}

void expect_close(const tensor& a, const tensor& b, float rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const auto va = values_of(a);
  const auto vb = values_of(b);
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(vb[i])) {
      EXPECT_TRUE(std::isnan(va[i])) << what << " at " << i;
      continue;
    }
    EXPECT_NEAR(va[i], vb[i], rtol * (1.0f + std::fabs(vb[i]))) << what << " at " << i;
  }
}

TEST(RemoveIdentities, DropsIdentitiesAndExactNoOpsOnly) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {4});
  auto t = ops::identity(x);
  t = t * 1.0;
  t = t - 0.0;
  t = t / 1.0;
  t = ops::reshape(t, {4});
  (void)ops::tanh(t, {.name = "y"});
  (void)ops::add(x, ops::scalar(b, 0.0), {.name = "plus_zero"});  // -0 + 0 is +0: kept
  session on(g, with_passes(true, {"elementwise_fusion"}));
  session off(g, with_passes(false));
  const auto feed = host_tensor({4}, {-0.0f, 1.0f, -2.5f, 3.0f});
  const auto a = on.run({{"x", feed}}, {"y", "plus_zero"});
  const auto r = off.run({{"x", feed}}, {"y", "plus_zero"});
  EXPECT_EQ(values_of(a[0]), values_of(r[0]));
  EXPECT_FALSE(std::signbit(a[1].span<float>()[0]));
  const graph& pg = on.planned_graph({"x"}, {"y", "plus_zero"});
  EXPECT_EQ(count_op(pg, "identity"), 0u);
  EXPECT_EQ(count_op(pg, "reshape"), 0u);
  EXPECT_EQ(count_op(pg, "mul") + count_op(pg, "sub") + count_op(pg, "div"), 0u);
  EXPECT_EQ(count_op(pg, "add"), 1u);
  EXPECT_EQ(pg.at(pg.get("y").inputs[0].node).op(), "_arg");
}

TEST(RemoveIdentities, KeepsCopiesTheGraphAskedFor) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  (void)ops::identity(ops::exp(x), {.name = "c", .device = "cpu:1"});
  session_options o = with_passes(true);
  o.devices.virtual_cpu_devices = 2;
  session s(g, o);
  const auto out = s.run({{"x", host_tensor({2}, {1, 2})}}, {"c"});
  EXPECT_EQ(out[0].device(), (device_id{device_type::cpu, 1}));
  const auto log = s.explain_passes({"x"}, {"c"});
  EXPECT_TRUE(logged(log, "remove_identities", false, "a copy the graph asked for")) << dump(log);
}

TEST(ConstantFolding, FoldsConstantSubgraphsOnce) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  auto two = ops::scalar(b, 2.0);
  auto k = ops::exp(two) * 3.0 + ops::constant(b, host_tensor({3}, {1, 2, 3}));
  (void)ops::mul(x, k, {.name = "y"});
  session s(g, with_passes(true));
  const auto out = s.run({{"x", host_tensor({3}, {1, -1, 0.5f})}}, {"y"});
  const double e2 = std::exp(2.0) * 3.0;
  EXPECT_NEAR(out[0].span<float>()[0], (e2 + 1) * 1, 1e-4);
  EXPECT_NEAR(out[0].span<float>()[1], (e2 + 2) * -1, 1e-4);
  EXPECT_NEAR(out[0].span<float>()[2], (e2 + 3) * 0.5, 1e-4);
  const graph& pg = s.planned_graph({"x"}, {"y"});
  EXPECT_EQ(count_op(pg, "exp"), 0u);
  EXPECT_EQ(count_op(pg, "add"), 0u);
  EXPECT_EQ(pg.at(pg.get("y").inputs[1].node).op(), "const");
  EXPECT_TRUE(logged(s.explain_passes({"x"}, {"y"}), "constant_folding", true, "const"));
}

TEST(ConstantFolding, RefusesLargeResultsAndFailingKernelsWithTheReason) {
  graph g;
  graph_builder b(g);
  auto big = ops::zeros(b, dtype::f32, {512, 1024}) + 1.0;  // 2 MiB
  auto x = ops::placeholder(b, "x", dtype::f32, {512, 1024});
  (void)ops::add(x, big, {.name = "y"});
  auto params = ops::constant(b, host_tensor({3}, {1, 2, 3}));
  auto bad = ops::gather(params, ops::constant(b, memory::host_tensor<std::int32_t>(
                                                      {1}, std::vector<std::int32_t>{7})));
  (void)ops::identity(bad, {.name = "bad"});
  session s(g, with_passes(true));
  const auto log = s.explain_passes({"x"}, {"y"});
  EXPECT_TRUE(logged(log, "constant_folding", false, "above max_folded_bytes")) << dump(log);
  std::vector<float> ones(512 * 1024, 2.0f);
  const auto out = s.run({{"x", host_tensor({512, 1024}, ones)}}, {"y"});
  EXPECT_EQ(out[0].span<float>()[12345], 3.0f);
  // A kernel that fails while folding: the region is left alone, and the run reports the
  // error against the node, as it would without the passes.
  const auto bad_log = s.explain_passes({}, {"bad"});
  EXPECT_TRUE(logged(bad_log, "constant_folding", false, "evaluating them failed"))
      << dump(bad_log);
  EXPECT_THROW((void)s.run({}, {"bad"}), node_error);
  // The session stays usable.
  EXPECT_EQ(s.run({{"x", host_tensor({512, 1024}, ones)}}, {"y"})[0].span<float>()[0], 3.0f);
}

TEST(CommonSubexpressions, ComputesEqualNodesOnce) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  auto a1 = ops::exp(x, {.name = "a1"}) * 2.0;
  auto a2 = ops::exp(x, {.name = "a2"}) * 2.0;
  (void)ops::sub(a1, a2, {.name = "zero"});
  session s(g, with_passes(true, {"elementwise_fusion"}));
  const auto out = s.run({{"x", host_tensor({3}, {0.1f, 5, -3})}}, {"zero", "a2"});
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{0, 0, 0}));
  EXPECT_NEAR(out[1].span<float>()[1], std::exp(5.0), 1e-3);
  const graph& pg = s.planned_graph({"x"}, {"zero", "a2"});
  EXPECT_EQ(count_op(pg, "exp"), 1u);
  EXPECT_EQ(count_op(pg, "mul"), 1u);
  EXPECT_EQ(count_op(pg, "const"), 1u);
  EXPECT_TRUE(logged(s.explain_passes({"x"}, {"zero", "a2"}), "common_subexpressions", true, "a2"));
}

TEST(CommonSubexpressions, NeverMergesUpdates) {
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "v", host_tensor({1}, {0}));
  auto one = ops::constant(b, host_tensor({1}, {1}));
  const auto u1 = ops::assign_add(v, one, {.name = "u1"}).producer().name;
  const auto u2 = ops::assign_add(v, one, {.name = "u2"}).producer().name;
  g.add_control_input(g.get(u2).id, g.get(u1).id);
  session s(g, with_passes(true));
  (void)s.run({}, {}, {u1, u2});
  EXPECT_EQ(s.run({}, {"v"})[0].span<float>()[0], 2.0f);
}

TEST(ElementwiseFusion, FusesAChainWithBroadcastOperandsIntoOneNode) {
  std::mt19937 rng(7);
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {33, 70});
  auto w = ops::placeholder(b, "w", dtype::f32, {33, 70});
  auto bias = ops::placeholder(b, "bias", dtype::f32, {70});
  auto s = ops::placeholder(b, "s", dtype::f32, {33, 1});
  (void)ops::mul(ops::relu(x * w + bias), s, {.name = "y"});
  const std::vector<feed> feeds{{"x", random_tensor({33, 70}, rng)},
                                {"w", random_tensor({33, 70}, rng)},
                                {"bias", random_tensor({70}, rng)},
                                {"s", random_tensor({33, 1}, rng)}};
  session on(g, with_passes(true));
  session off(g, with_passes(false));
  const auto a = on.run(feeds, {"y"});
  const auto r = off.run(feeds, {"y"});
  expect_close(a[0], r[0], 1e-6f, "y");
  // Independent reference.
  const auto xv = values_of(feeds[0].second), wv = values_of(feeds[1].second),
             bv = values_of(feeds[2].second), sv = values_of(feeds[3].second);
  for (std::size_t i = 0; i < 33; ++i) {
    for (std::size_t j = 0; j < 70; ++j) {
      const double v = std::max(0.0, double(xv[i * 70 + j]) * wv[i * 70 + j] + bv[j]) * sv[i];
      ASSERT_NEAR(a[0].span<float>()[i * 70 + j], v, 1e-5);
    }
  }
  const graph& pg = on.planned_graph({"x", "w", "bias", "s"}, {"y"});
  EXPECT_EQ(count_op(pg, "fused_elementwise"), 1u);
  EXPECT_EQ(count_op(pg, "relu") + count_op(pg, "mul") + count_op(pg, "add"), 0u);
  const auto log = on.explain_passes({"x", "w", "bias", "s"}, {"y"});
  EXPECT_TRUE(logged(log, "elementwise_fusion", true, "4 ops")) << dump(log);
}

TEST(ElementwiseFusion, FetchedIntermediatesBecomeExtraResults) {
  std::mt19937 rng(8);
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {257});
  auto t = ops::exp(x * 0.5, {.name = "t"});
  (void)ops::tanh(t - 1.0, {.name = "y"});
  const std::vector<feed> feeds{{"x", random_tensor({257}, rng)}};
  session on(g, with_passes(true));
  session off(g, with_passes(false));
  const auto a = on.run(feeds, {"y", "t"});
  const auto r = off.run(feeds, {"y", "t"});
  expect_close(a[0], r[0], 1e-6f, "y");
  expect_close(a[1], r[1], 1e-6f, "t");
  const graph& pg = on.planned_graph({"x"}, {"y", "t"});
  ASSERT_EQ(count_op(pg, "fused_elementwise"), 1u);
  for (const node& nd : pg.nodes()) {
    if (nd.op() == "fused_elementwise") {
      EXPECT_EQ(nd.attr<std::int64_t>("M"), 2);
    }
  }
}

TEST(ElementwiseFusion, SaysWhyItStopsAGroup) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {4, 8});
  auto c = ops::placeholder(b, "c", dtype::f32, {8});
  auto e = ops::exp(c, {.name = "small"});                // [8], also fetched
  auto a = ops::sigmoid(x, {.name = "a"});                // read by a reduction
  auto m = ops::reduce_max(a, {1}, true, {.name = "m"});  // [4, 1], feeds the group back
  auto y = ops::tanh((a - m) * e, {.name = "y"});
  auto far = ops::neg(y, {.name = "far", .device = "cpu:1"});  // another device
  (void)ops::square(far, {.name = "z"});
  session_options o = with_passes(true);
  o.devices.virtual_cpu_devices = 2;
  session s(g, o);
  o.passes.enabled = false;
  session off(g, o);
  std::mt19937 rng(3);
  const std::vector<feed> feeds{{"x", random_tensor({4, 8}, rng)}, {"c", random_tensor({8}, rng)}};
  const std::vector<std::string> fetches{"z", "small", "y"};
  const auto got = s.run(feeds, fetches);
  const auto want = off.run(feeds, fetches);
  for (std::size_t i = 0; i < fetches.size(); ++i) expect_close(got[i], want[i], 1e-6f, fetches[i]);
  const auto log = s.explain_passes({"x", "c"}, fetches);
  EXPECT_TRUE(logged(log, "elementwise_fusion", false, "must have the group's shape")) << dump(log);
  EXPECT_TRUE(logged(log, "elementwise_fusion", false, "would make a cycle")) << dump(log);
  EXPECT_TRUE(logged(log, "elementwise_fusion", false, "asks for device")) << dump(log);
}

TEST(ElementwiseFusion, GradientsOfAFusedTrainingGraphMatchUnfused) {
  std::mt19937 rng(11);
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {16, 12});
  auto w = ops::variable(b, "w", random_tensor({16, 12}, rng));
  auto bias = ops::variable(b, "bias", random_tensor({12}, rng));
  auto y = ops::tanh(x * w + bias);
  auto h = ops::relu(y - 0.25) * y;
  auto loss = ops::reduce_sum(h * h, {}, false, {.name = "loss"});
  auto grads = gradients(loss, {w, bias});
  const std::vector<std::string> fetches{"loss", grads[0].name(), grads[1].name()};
  const std::vector<feed> feeds{{"x", random_tensor({16, 12}, rng)}};
  session on(g, with_passes(true));
  session off(g, with_passes(false));
  const auto a = on.run(feeds, fetches);
  const auto r = off.run(feeds, fetches);
  for (std::size_t i = 0; i < fetches.size(); ++i) expect_close(a[i], r[i], 2e-5f, fetches[i]);
  const graph& pg = on.planned_graph({"x"}, fetches);
  // The forward chain and the backward chain that reads it fuse into one multi-output node.
  EXPECT_GE(count_op(pg, "fused_elementwise"), 1u);
  EXPECT_EQ(count_op(pg, "tanh") + count_op(pg, "relu") + count_op(pg, "relu_grad"), 0u);
}

TEST(ElementwiseFusion, AConstantThatRaisesTheRankStaysAnInput) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, 5});
  auto one = ops::constant(b, host_tensor({1, 1, 1}, {0.5f}));
  (void)ops::exp(ops::relu(x + one), {.name = "y"});
  session on(g, with_passes(true));
  std::mt19937 rng(5);
  const auto xv = random_tensor({2, 5}, rng);
  const auto out = on.run({{"x", xv}}, {"y"});
  ASSERT_EQ(out[0].shape(), (shape{1, 2, 5}));
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(out[0].span<float>()[i], std::exp(std::max(0.0f, xv.span<float>()[i] + 0.5f)), 1e-5);
  }
  EXPECT_EQ(count_op(on.planned_graph({"x"}, {"y"}), "fused_elementwise"), 1u);
}

TEST(Passes, ControlEdgesFromLaterNodesAreKept) {
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "v", host_tensor({1}, {1}));
  auto read = ops::identity(v, {.name = "read"});
  auto bump = ops::assign_add(v, ops::constant(b, host_tensor({1}, {10})), {.name = "bump"});
  // The read (an earlier node) waits for the update (a later one).
  g.add_control_input(read.producer().id, bump.producer().id);
  // The plan is built (the edge does not follow id order) and the update runs.
  for (bool on : {true, false}) {
    session s(g, with_passes(on));
    (void)s.run({}, {"read"});
    EXPECT_EQ(s.run({}, {"v"})[0].span<float>()[0], 11.0f) << on;
  }
}

// Random element-wise DAGs over broadcast inputs, with random fetches: fused and unfused
// agree.
TEST(ElementwiseFusion, RandomGraphsKeepTheirResults) {
  const char* unary[] = {"neg", "abs", "exp", "tanh", "sigmoid", "relu", "square", "erf"};
  const char* binary[] = {"add", "sub", "mul", "maximum", "minimum"};
  for (int seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    graph g;
    graph_builder b(g);
    const std::vector<shape> shapes{{6, 5}, {5}, {6, 1}, {}};
    std::vector<output> values;
    std::vector<feed> feeds;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::string name = "in" + std::to_string(i);
      values.push_back(ops::placeholder(b, name, dtype::f32, shapes[i]));
      feeds.emplace_back(name, random_tensor(shapes[i], rng, -1.0f, 1.0f));
    }
    std::vector<std::string> fetchable;
    const int steps = 3 + static_cast<int>(rng() % 20);
    for (int k = 0; k < steps; ++k) {
      auto pick = [&] { return values[rng() % values.size()]; };
      output v;
      if (rng() % 3 == 0) {
        v = b.add1(unary[rng() % std::size(unary)], {pick()});
      } else {
        v = b.add1(binary[rng() % std::size(binary)], {pick(), pick()});
      }
      if (rng() % 4 == 0) v = v * 0.5;
      values.push_back(v);
      fetchable.push_back(v.name());
    }
    std::vector<std::string> fetches{fetchable.back()};
    for (const auto& f : fetchable) {
      if (rng() % 5 == 0 && f != fetches[0]) fetches.push_back(f);
    }
    session on(g, with_passes(true));
    session off(g, with_passes(false));
    const auto a = on.run(feeds, fetches);
    const auto r = off.run(feeds, fetches);
    for (std::size_t i = 0; i < fetches.size(); ++i) {
      expect_close(a[i], r[i], 1e-5f, "seed " + std::to_string(seed) + " " + fetches[i]);
    }
  }
}

TEST(Passes, FeedingAnIntermediateAndVariablesWork) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  auto a = ops::exp(x, {.name = "a"});
  auto y = ops::tanh(a * 2.0, {.name = "y"});
  auto v = ops::variable(b, "v", host_tensor({3}, {1, 1, 1}));
  auto upd = ops::assign_add(v, y * 1.0, {.name = "upd"});
  session s(g, with_passes(true));
  // Feed the intermediate a: x is not needed.
  const auto out = s.run({{"a", host_tensor({3}, {0, 0.5f, 1})}}, {"y"}, {"upd"});
  EXPECT_NEAR(out[0].span<float>()[1], std::tanh(1.0), 1e-6);
  const auto vv = s.run({}, {"v"});
  EXPECT_NEAR(vv[0].span<float>()[2], 1 + std::tanh(2.0), 1e-6);
  EXPECT_EQ(s.planned_graph({"a"}, {"y"}, {"upd"}).find("x"), nullptr);
  (void)upd;
}

TEST(Passes, OptionsSwitchPassesOffAndUnknownNamesFail) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  (void)ops::tanh(ops::exp(x) * 2.0, {.name = "y"});
  try {
    session bad(g, with_passes(true, {"no_such_pass"}));
    FAIL() << "expected invalid_argument";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_pass"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("elementwise_fusion"), std::string::npos);
  }
  session off(g, with_passes(false));
  const graph& pg = off.planned_graph({"x"}, {"y"});
  EXPECT_EQ(count_op(pg, "exp") + count_op(pg, "mul") + count_op(pg, "tanh"), 3u);
  EXPECT_TRUE(off.explain_passes({"x"}, {"y"}).empty());
  const auto names = passes::pass_manager::standard_pass_names();
  EXPECT_EQ(names.front(), "remove_identities");
  EXPECT_EQ(names.back(), "prune_dead");
}

}  // namespace
}  // namespace loom
