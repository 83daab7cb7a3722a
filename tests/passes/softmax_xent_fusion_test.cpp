// softmax_xent_fusion: -sum(one_hot(labels) * log_softmax(logits)) becomes one
// softmax_cross_entropy node. Each written form, over random shapes, label and float
// dtypes, against a float64 reference and the unfused graph; every refusal rule with its
// logged reason; and the one behaviour the rewrite changes (labels out of range).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "passes/pattern_test_support.hpp"

namespace loom {
namespace {

using namespace testing;
using kind = passes::pass_record::kind;
constexpr const char* pass = "softmax_xent_fusion";

// How the loss is written.
enum class form { neg_of_sum, sum_of_neg, neg_inside };

struct xent_form {
  form f = form::neg_of_sum;
  bool ls_first = false;       // mul(ls, oh)
  std::int64_t ls_axis = -1;   // -1 or 1
  std::int64_t sum_axis = -1;  // -1 or 1
  std::int64_t oh_axis = -1;   // -1 or 1
};

output xent_primitives(output logits, output labels, std::int64_t classes, const xent_form& x,
                       double on = 1.0, double off = 0.0) {
  const output ls = ops::log_softmax(logits, x.ls_axis, {.name = "ls"});
  const output oh =
      ops::one_hot(labels, classes, logits.dtype_of(), on, off, x.oh_axis, {.name = "oh"});
  auto times = [&](output v) { return x.ls_first ? v * oh : oh * v; };
  switch (x.f) {
    case form::neg_of_sum:
      return -ops::reduce_sum(times(ls), {x.sum_axis});
    case form::sum_of_neg:
      return ops::reduce_sum(-times(ls), {x.sum_axis});
    case form::neg_inside:
      return ops::reduce_sum(times(-ls), {x.sum_axis});
  }
  return ls;
}

// -log softmax(logits)[n, labels[n]] in float64 (a row of zeros for a label out of range).
std::vector<double> xent_reference(const std::vector<double>& logits, std::int64_t n,
                                   std::int64_t c, const std::vector<double>& labels) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY;
    for (std::int64_t j = 0; j < c; ++j)
      mx = std::max(mx, logits[static_cast<std::size_t>(i * c + j)]);
    double sum = 0.0;
    for (std::int64_t j = 0; j < c; ++j)
      sum += std::exp(logits[static_cast<std::size_t>(i * c + j)] - mx);
    const auto l = static_cast<std::int64_t>(labels[static_cast<std::size_t>(i)]);
    out[static_cast<std::size_t>(i)] =
        l < 0 || l >= c ? 0.0 : -(logits[static_cast<std::size_t>(i * c + l)] - mx - std::log(sum));
  }
  return out;
}

std::vector<double> random_labels(std::mt19937& rng, std::int64_t n, std::int64_t c) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < n; ++i)
    v.push_back(static_cast<double>(static_cast<std::int64_t>(rng() % static_cast<unsigned>(c))));
  return v;
}

TEST(SoftmaxXentFusion, EveryFormOverRandomShapesAndDtypes) {
  std::mt19937 rng(21);
  const form forms[] = {form::neg_of_sum, form::sum_of_neg, form::neg_inside};
  for (int trial = 0; trial < 24; ++trial) {
    const dtype t = trial % 4 == 3 ? dtype::f64 : dtype::f32;
    const dtype lt = trial % 2 ? dtype::i64 : dtype::i32;
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 7);
    const std::int64_t c = 1 + static_cast<std::int64_t>(rng() % 9);
    xent_form x{.f = forms[trial % 3],
                .ls_first = rng() % 2 == 0,
                .ls_axis = rng() % 2 ? 1 : -1,
                .sum_axis = rng() % 2 ? 1 : -1,
                .oh_axis = rng() % 2 ? 1 : -1};
    SCOPED_TRACE(fmt::format("trial {}: {} [{}, {}] labels {} form {} ls_first {} axes {} {} {}",
                             trial, to_string(t), n, c, to_string(lt), static_cast<int>(x.f),
                             x.ls_first, x.ls_axis, x.sum_axis, x.oh_axis));
    const auto lv = rounded(t, uniform(rng, n * c, -4.0, 4.0));
    const auto labels = random_labels(rng, n, c);
    graph g;
    graph_builder b(g);
    auto logits = ops::placeholder(b, "logits", t, {n, c});
    auto lab = ops::placeholder(b, "labels", lt, {n});
    ops::identity(xent_primitives(logits, lab, c, x), {.name = "loss"});
    const auto cmp = run_both(
        g, pass, {{"logits", make_tensor(t, {n, c}, lv)}, {"labels", make_tensor(lt, {n}, labels)}},
        {"loss"});
    const auto want = xent_reference(lv, n, c, labels);
    expect_near_all(values(cmp.on[0]), want, rtol_of(t), atol_of(t), "fused");
    expect_near_all(values(cmp.off[0]), want, rtol_of(t), atol_of(t), "unfused");
    EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 1u) << log_text(cmp.log);
    EXPECT_EQ(count_op(cmp.planned, "log_softmax"), 0u);
    EXPECT_EQ(count_op(cmp.planned, "one_hot"), 0u);
    EXPECT_EQ(count_op(cmp.planned, "reduce_sum"), 0u);
    const auto done =
        records(cmp.log, pass, kind::rewrite, {"softmax_cross_entropy", "'logits'", "'labels'"});
    ASSERT_EQ(done.size(), 1u) << log_text(cmp.log);
    EXPECT_EQ(done[0].nodes.size(), 5u) << "log_softmax, neg, mul, reduce_sum and one_hot";
  }
}

TEST(SoftmaxXentFusion, ASharedOneHotStaysForItsOtherReader) {
  std::mt19937 rng(22);
  const auto lv = rounded(dtype::f32, uniform(rng, 12));
  const auto labels = random_labels(rng, 3, 4);
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {3, 4});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {3});
  ops::identity(xent_primitives(logits, lab, 4, {}), {.name = "loss"});
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {3, 4}, lv)},
                             {"labels", make_tensor(dtype::i32, {3}, labels)}},
                            {"loss", "oh"});
  EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 1u) << log_text(cmp.log);
  EXPECT_EQ(count_op(cmp.planned, "one_hot"), 1u);
  expect_near_all(values(cmp.on[0]), xent_reference(lv, 3, 4, labels), 2e-4, 2e-5);
  std::vector<double> oh(12, 0.0);
  for (std::size_t i = 0; i < 3; ++i) oh[i * 4 + static_cast<std::size_t>(labels[i])] = 1.0;
  EXPECT_EQ(values(cmp.on[1]), oh);
}

TEST(SoftmaxXentFusion, LabelSmoothingIsRefused) {
  std::mt19937 rng(23);
  const auto lv = rounded(dtype::f32, uniform(rng, 8));
  const auto labels = random_labels(rng, 2, 4);
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {2, 4});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {2});
  ops::identity(xent_primitives(logits, lab, 4, {}, 0.9, 0.025), {.name = "loss"});
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {2, 4}, lv)},
                             {"labels", make_tensor(dtype::i32, {2}, labels)}},
                            {"loss"});
  EXPECT_TRUE(refused_with(cmp.log, pass, {"one_hot 'oh' has on_value 0.9 and off_value 0.025"}))
      << log_text(cmp.log);
  EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 0u);
  // -sum(q * log_softmax), q = 0.9 at the label, 0.025 elsewhere.
  for (std::size_t i = 0; i < 2; ++i) {
    double mx = -INFINITY;
    for (std::size_t j = 0; j < 4; ++j) mx = std::max(mx, lv[i * 4 + j]);
    double s = 0.0;
    for (std::size_t j = 0; j < 4; ++j) s += std::exp(lv[i * 4 + j] - mx);
    double want = 0.0;
    for (std::size_t j = 0; j < 4; ++j) {
      const double q = static_cast<double>(j) == labels[i] ? 0.9 : 0.025;
      want -= q * (lv[i * 4 + j] - mx - std::log(s));
    }
    EXPECT_NEAR(values(cmp.on[0])[i], want, 1e-5);
  }
}

TEST(SoftmaxXentFusion, AOneHotAlongAnotherAxisIsRefused) {
  std::mt19937 rng(24);
  const auto lv = rounded(dtype::f32, uniform(rng, 9));
  const auto labels = random_labels(rng, 3, 3);
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {3, 3});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {3});
  // axis 0: oh[j, n] = (labels[n] == j), the transposed indicator (N = C makes it fit).
  ops::identity(xent_primitives(logits, lab, 3, {.oh_axis = 0}), {.name = "loss"});
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {3, 3}, lv)},
                             {"labels", make_tensor(dtype::i32, {3}, labels)}},
                            {"loss"});
  EXPECT_TRUE(refused_with(cmp.log, pass, {"one_hot 'oh'", "(axis 0)"})) << log_text(cmp.log);
  EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 0u);
  // loss_i = -sum_j [labels[j] == i] * ls[i, j].
  for (std::size_t i = 0; i < 3; ++i) {
    double mx = -INFINITY;
    for (std::size_t j = 0; j < 3; ++j) mx = std::max(mx, lv[i * 3 + j]);
    double s = 0.0;
    for (std::size_t j = 0; j < 3; ++j) s += std::exp(lv[i * 3 + j] - mx);
    double want = 0.0;
    for (std::size_t j = 0; j < 3; ++j) {
      if (labels[j] == static_cast<double>(i)) want -= lv[i * 3 + j] - mx - std::log(s);
    }
    EXPECT_NEAR(values(cmp.on[0])[i], want, 1e-5);
  }
}

TEST(SoftmaxXentFusion, OneLabelForEveryRowIsRefused) {
  std::mt19937 rng(28);
  const auto lv = rounded(dtype::f32, uniform(rng, 12));
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {3, 4});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {1});  // broadcast over the rows
  ops::identity(xent_primitives(logits, lab, 4, {}), {.name = "loss"});
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {3, 4}, lv)},
                             {"labels", make_tensor(dtype::i32, {1}, {2})}},
                            {"loss"});
  EXPECT_TRUE(refused_with(cmp.log, pass, {"one_hot 'oh' gives float32[1, 4]", "[3, 4]"}))
      << log_text(cmp.log);
  EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 0u);
  expect_near_all(values(cmp.on[0]), xent_reference(lv, 3, 4, {2, 2, 2}), 2e-4, 2e-5);
}

TEST(SoftmaxXentFusion, InteriorValuesReadByGradientsAreRefused) {
  std::mt19937 rng(25);
  const auto lv = rounded(dtype::f32, uniform(rng, 12));
  const auto labels = random_labels(rng, 3, 4);
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {3, 4});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {3});
  auto loss = ops::reduce_mean(xent_primitives(logits, lab, 4, {}), {}, false, {.name = "loss"});
  const auto grads = gradients(loss, {logits});
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {3, 4}, lv)},
                             {"labels", make_tensor(dtype::i32, {3}, labels)}},
                            {"loss", grads[0].name()});
  EXPECT_TRUE(refused_with(
      cmp.log, pass,
      {"'ls' is also read by", "gradients() ran before the passes", "ops::softmax_cross_entropy"}))
      << log_text(cmp.log);
  EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 0u);
  const auto per_row = xent_reference(lv, 3, 4, labels);
  EXPECT_NEAR(values(cmp.on[0])[0], (per_row[0] + per_row[1] + per_row[2]) / 3.0, 1e-5);
  // d mean / d logits = (softmax - one_hot) / N.
  const auto dl = values(cmp.on[1]);
  for (std::size_t i = 0; i < 3; ++i) {
    double mx = -INFINITY;
    for (std::size_t j = 0; j < 4; ++j) mx = std::max(mx, lv[i * 4 + j]);
    double s = 0.0;
    for (std::size_t j = 0; j < 4; ++j) s += std::exp(lv[i * 4 + j] - mx);
    for (std::size_t j = 0; j < 4; ++j) {
      const double p = std::exp(lv[i * 4 + j] - mx) / s;
      const double want = (p - (static_cast<double>(j) == labels[i] ? 1.0 : 0.0)) / 3.0;
      EXPECT_NEAR(dl[i * 4 + j], want, 1e-6);
    }
  }
}

TEST(SoftmaxXentFusion, AFetchedProductIsRefused) {
  std::mt19937 rng(26);
  const auto lv = rounded(dtype::f32, uniform(rng, 8));
  const auto labels = random_labels(rng, 2, 4);
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {2, 4});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {2});
  auto ls = ops::log_softmax(logits);
  auto oh = ops::one_hot(lab, 4);
  auto m = ops::mul(oh, ls, {.name = "picked"});
  ops::identity(-ops::reduce_sum(m, {1}), {.name = "loss"});
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {2, 4}, lv)},
                             {"labels", make_tensor(dtype::i32, {2}, labels)}},
                            {"loss", "picked"});
  EXPECT_TRUE(refused_with(cmp.log, pass, {"'picked' is also read by a fetch"}))
      << log_text(cmp.log);
  expect_near_all(values(cmp.on[0]), xent_reference(lv, 2, 4, labels), 2e-4, 2e-5);
}

TEST(SoftmaxXentFusion, NodesAskingForAnotherDeviceAreRefused) {
  std::mt19937 rng(27);
  const auto lv = rounded(dtype::f32, uniform(rng, 8));
  const auto labels = random_labels(rng, 2, 4);
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {2, 4});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {2});
  auto ls = ops::log_softmax(logits, -1, {.name = "ls", .device = "cpu:1"});
  auto oh = ops::one_hot(lab, 4);
  ops::identity(-ops::reduce_sum(oh * ls, {1}), {.name = "loss"});
  session_options o;
  o.devices.virtual_cpu_devices = 2;
  const auto cmp = run_both(g, pass,
                            {{"logits", make_tensor(dtype::f32, {2, 4}, lv)},
                             {"labels", make_tensor(dtype::i32, {2}, labels)}},
                            {"loss"}, {}, o);
  EXPECT_TRUE(refused_with(cmp.log, pass, {"asks for device ''", "'ls' for 'cpu:1'"}))
      << log_text(cmp.log);
  EXPECT_EQ(count_op(cmp.planned, "softmax_cross_entropy"), 0u);
  expect_near_all(values(cmp.on[0]), xent_reference(lv, 2, 4, labels), 2e-4, 2e-5);
}

// The one behaviour the rewrite changes (documented in the pass): a label outside [0, C)
// gave a loss of 0 through one_hot; softmax_cross_entropy rejects it, naming the label.
TEST(SoftmaxXentFusion, ALabelOutOfRangeFailsTheFusedRun) {
  graph g;
  graph_builder b(g);
  auto logits = ops::placeholder(b, "logits", dtype::f32, {2, 3});
  auto lab = ops::placeholder(b, "labels", dtype::i32, {2});
  ops::identity(xent_primitives(logits, lab, 3, {}), {.name = "loss"});
  const std::vector<feed> feeds{{"logits", make_tensor(dtype::f32, {2, 3}, {1, 2, 3, 4, 5, 6})},
                                {"labels", make_tensor(dtype::i32, {2}, {1, 3})}};
  session off(g, without({pass}));
  const auto out = values(off.run(feeds, {"loss"})[0]);
  EXPECT_NEAR(out[0], xent_reference({1, 2, 3}, 1, 3, {1})[0], 1e-5);
  EXPECT_EQ(out[1], 0.0);
  session on(g);
  const std::string msg = error_of([&] { (void)on.run(feeds, {"loss"}); });
  EXPECT_NE(msg.find("softmax_cross_entropy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("label 3 in row 1 is outside [0, 3)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace loom
