// The amp pass (automatic mixed precision): which nodes it lowers and how (casts shared,
// round trips dropped, optimizers reading 16-bit gradients), the answers it gives against
// a float64 reference that rounds as bfloat16 does, the policy and its overrides, and what
// it refuses (float64 nodes, kernels that only emulate the low precision) with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "passes/pattern_test_support.hpp"

namespace loom {
namespace {

using namespace testing;
using kind = passes::pass_record::kind;
constexpr const char* pass = "amp";

// AMP in `t`, lowering even where this machine's kernels emulate it (the answers are the
// same; the tests must not depend on the CPU having bfloat16 instructions).
session_options amp_session(dtype t = dtype::bf16) {
  session_options o;
  o.passes.amp.type = t;
  o.passes.amp.policy.allow_emulated = true;
  return o;
}

// The dtype attribute T of the planned node of `op` whose name starts with `prefix`.
std::vector<dtype> planned_types(const graph& g, std::string_view op) {
  std::vector<dtype> out;
  for (const node& n : g.nodes()) {
    if (n.op() == op) out.push_back(n.attr<dtype>("T"));
  }
  return out;
}

double round_bf16(double v) {
  return static_cast<float>(bfloat16(static_cast<float>(v)));
}

// a [m, k] x b [k, n] in float64 over bfloat16-rounded inputs, the result rounded to bfloat16:
// what a bfloat16 product with float32 accumulation gives, up to the accumulation order.
std::vector<double> matmul_bf16(const std::vector<double>& a, const std::vector<double>& b,
                                std::int64_t m, std::int64_t k, std::int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        s += round_bf16(a[static_cast<std::size_t>(i * k + p)]) *
             round_bf16(b[static_cast<std::size_t>(p * n + j)]);
      }
      out[static_cast<std::size_t>(i * n + j)] = round_bf16(s);
    }
  }
  return out;
}

struct two_layers {
  graph g;
  std::vector<double> x, w1, w2;
};

// y = matmul(relu(matmul(x, w1)), w2) with x [16, 32], w1 [32, 24], w2 [24, 8]; `relu`
// false drops the relu (the products then chain directly).
two_layers make_two_layers(bool relu) {
  two_layers t;
  graph_builder b(t.g);
  std::mt19937 rng(7);
  t.x = uniform(rng, 16 * 32);
  t.w1 = uniform(rng, 32 * 24, -0.5, 0.5);
  t.w2 = uniform(rng, 24 * 8, -0.5, 0.5);
  const output x = ops::placeholder(b, "x", dtype::f32, {16, 32});
  const output w1 = ops::variable(b, "w1", make_tensor(dtype::f32, {32, 24}, t.w1));
  const output w2 = ops::variable(b, "w2", make_tensor(dtype::f32, {24, 8}, t.w2));
  output h = ops::matmul(x, w1, false, false, {.name = "mm1"});
  if (relu) h = ops::relu(h, {.name = "act"});
  (void)ops::matmul(h, w2, false, false, {.name = "y"});
  return t;
}

TEST(Amp, ProductsComputeInBfloat16AsAFloat64ReferenceRoundedSoDoes) {
  for (const bool relu : {true, false}) {
    SCOPED_TRACE(relu ? "with relu" : "chained");
    two_layers t = make_two_layers(relu);
    session s(t.g, amp_session());
    const tensor y = detach(s.run({{"x", make_tensor(dtype::f32, {16, 32}, t.x)}}, {"y"})[0]);
    EXPECT_EQ(y.type(), dtype::f32);  // readers see what they saw before
    std::vector<double> h = matmul_bf16(t.x, t.w1, 16, 32, 24);
    if (relu) {
      for (double& v : h) v = std::max(v, 0.0);
    }
    const std::vector<double> want = matmul_bf16(h, t.w2, 16, 24, 8);
    // One bfloat16 rounding step (2^-8 relative) where float32 accumulation and float64
    // accumulation land on either side of a rounding boundary.
    expect_near_all(values(y), want, 8e-3, 1e-2);
    // And it is not the float32 answer: the products really ran in bfloat16.
    session f32(t.g);
    const auto plain = values(f32.run({{"x", make_tensor(dtype::f32, {16, 32}, t.x)}}, {"y"})[0]);
    double most = 0;
    const auto got = values(y);
    for (std::size_t i = 0; i < got.size(); ++i) most = std::max(most, std::abs(got[i] - plain[i]));
    EXPECT_GT(most, 1e-4);

    const graph& planned = s.planned_graph({"x"}, {"y"});
    // With the relu, epilogue_fusion made mm1 and act one fused_matmul, lowered whole.
    std::vector<dtype> types = planned_types(planned, "matmul");
    for (dtype d : planned_types(planned, "fused_matmul")) types.push_back(d);
    EXPECT_EQ(types, (std::vector<dtype>{dtype::bf16, dtype::bf16}));
    // Casts: x, w1, w2 in, y out; the second product reads the first's bfloat16 result.
    EXPECT_EQ(count_op(describe(planned), "cast"), 4u) << log_text(s.explain_passes({"x"}, {"y"}));
  }
}

// Ops of the policy's follow list compute in 16 bits when all their float inputs are
// 16-bit results already, so a product -> max-pool -> product chain casts nothing between;
// with a float32 input they stay float32.
TEST(Amp, FollowOpsStayInTheLowPrecisionBetweenProducts) {
  graph g;
  graph_builder b(g);
  std::mt19937 rng(9);
  const output x = ops::placeholder(b, "x", dtype::f32, {2, 3, 8, 8});
  const output w1 = ops::variable(
      b, "w1", make_tensor(dtype::f32, {4, 3, 3, 3}, uniform(rng, 4 * 3 * 9, -0.5, 0.5)));
  const output w2 = ops::variable(
      b, "w2", make_tensor(dtype::f32, {4, 4, 3, 3}, uniform(rng, 4 * 4 * 9, -0.5, 0.5)));
  const output f = ops::placeholder(b, "f", dtype::f32, {2, 4, 4, 4});
  ops::conv2d_options c;
  c.padding = {1, 1};
  ops::pool_options p;
  p.kernel = {2, 2};
  p.strides = {2, 2};
  const output pooled = ops::max_pool2d(ops::conv2d(x, w1, c), p, {.name = "pool"});
  (void)ops::conv2d(pooled, w2, c, {.name = "y"});
  (void)ops::add(pooled, f, {.name = "mixed"});  // a float32 input: stays float32
  session s(g, amp_session());
  const auto log = s.explain_passes({"x", "f"}, {"y", "mixed"});
  EXPECT_EQ(records(log, pass, kind::rewrite, {"max_pool2d follows its inputs, which are bfloat16"})
                .size(),
            1u)
      << log_text(log);
  EXPECT_EQ(records(log, pass, kind::rewrite, {"add follows"}).size(), 0u) << log_text(log);
  const graph& planned = s.planned_graph({"x", "f"}, {"y", "mixed"});
  EXPECT_EQ(planned_types(planned, "max_pool2d"), (std::vector<dtype>{dtype::bf16}));
  EXPECT_EQ(planned_types(planned, "add"), (std::vector<dtype>{dtype::f32}));
  // And the answer: max-pool of bfloat16 values is exact, so y matches a float64 reference
  // of the rounded convolutions within one bfloat16 step, as the products alone do.
  const auto xv = uniform(rng, 2 * 3 * 8 * 8);
  const auto out =
      s.run({{"x", make_tensor(dtype::f32, {2, 3, 8, 8}, xv)},
             {"f", make_tensor(dtype::f32, {2, 4, 4, 4}, std::vector<double>(128, 0.0))}},
            {"y", "mixed"});
  session f32(g);
  const auto plain =
      f32.run({{"x", make_tensor(dtype::f32, {2, 3, 8, 8}, xv)},
               {"f", make_tensor(dtype::f32, {2, 4, 4, 4}, std::vector<double>(128, 0.0))}},
              {"y", "mixed"});
  expect_near_all(values(out[0]), values(plain[0]), 3e-2, 3e-2);
  expect_near_all(values(out[1]), values(plain[1]), 1e-2, 1e-2);
}

TEST(Amp, AWeightReadByTwoProductsIsCastOnce) {
  graph g;
  graph_builder b(g);
  std::mt19937 rng(3);
  const auto wv = uniform(rng, 8 * 8);
  const output x = ops::placeholder(b, "x", dtype::f32, {4, 8});
  const output w = ops::variable(b, "w", make_tensor(dtype::f32, {8, 8}, wv));
  (void)ops::add(ops::matmul(x, w), ops::matmul(x, w, false, true), {.name = "y"});
  session s(g, amp_session());
  const graph& planned = s.planned_graph({"x"}, {"y"});
  const auto log = s.explain_passes({"x"}, {"y"});
  // x and w cast once for both products (the add joined the second as its residual, which
  // reads the first's bfloat16 result), and the sum cast back.
  EXPECT_EQ(count_op(describe(planned), "cast"), 3u) << log_text(log);
  EXPECT_EQ(records(log, pass, kind::rewrite, {"2 casts in"}).size(), 1u) << log_text(log);
  EXPECT_EQ(records(log, pass, kind::rewrite, {"0 casts in"}).size(), 1u) << log_text(log);
}

// A small classifier's training step: gradients and a fused Adam update.
struct training_step {
  graph g;
  std::vector<std::string> targets;
  std::string found_inf;
};

training_step make_training_step() {
  training_step t;
  graph_builder b(t.g);
  std::mt19937 rng(11);
  const output x = ops::placeholder(b, "x", dtype::f32, {8, 12});
  const output labels = ops::placeholder(b, "labels", dtype::i32, {8});
  const output w1 =
      ops::variable(b, "w1", make_tensor(dtype::f32, {12, 16}, uniform(rng, 12 * 16, -0.3, 0.3)));
  const output b1 =
      ops::variable(b, "b1", make_tensor(dtype::f32, {16}, uniform(rng, 16, -0.1, 0.1)));
  const output w2 =
      ops::variable(b, "w2", make_tensor(dtype::f32, {16, 4}, uniform(rng, 16 * 4, -0.3, 0.3)));
  const output h = ops::relu(ops::bias_add(ops::matmul(x, w1), b1));
  const output logits = ops::matmul(h, w2);
  const output loss = ops::reduce_mean(ops::softmax_cross_entropy(logits, labels).loss, {}, false,
                                       {.name = "loss"});
  const std::vector<output> params{w1, b1, w2};
  const std::vector<output> grads = gradients(loss, params);
  const output step = ops::placeholder(b, "step", dtype::i64, {});
  const auto u = ops::fused_adam(params, grads, ops::scalar(b, 1e-2), step, ops::scalar(b, 1.0), {},
                                 {}, {.name = "adam"});
  t.targets = {u.name};
  t.found_inf = u.found_inf.name();
  return t;
}

// A float32 sum of a lowered node's result (a bias gradient's reduce_sum) reads the
// bfloat16 values and sums them into float32 itself (output_type): the cast back is gone,
// and the answer is the graph with the cast's, bit for bit.
TEST(Amp, AFloat32SumOfBfloat16ResultsReadsThemWithoutACast) {
  graph g;
  graph_builder b(g);
  std::mt19937 rng(11);
  const std::vector<double> xv = uniform(rng, 64 * 48);
  const std::vector<double> wv = uniform(rng, 48 * 40, -0.5, 0.5);
  const output x = ops::placeholder(b, "x", dtype::f32, {64, 48});
  const output w = ops::variable(b, "w", make_tensor(dtype::f32, {48, 40}, wv));
  const output h = ops::matmul(x, w, false, false, {.name = "mm"});
  (void)ops::reduce_sum(h, {0}, false, {.name = "colsum"});
  session s(g, amp_session());
  const tensor feed = make_tensor(dtype::f32, {64, 48}, xv);
  const tensor got = detach(s.run({{"x", feed}}, {"colsum"})[0]);
  const auto log = s.explain_passes({"x"}, {"colsum"});
  EXPECT_FALSE(records(log, pass, kind::rewrite, {"colsum", "sums bfloat16 values into float32"})
                   .empty())
      << log_text(log);
  const graph& planned = s.planned_graph({"x"}, {"colsum"});
  const node* sum = nullptr;
  for (const node& n : planned.nodes()) {
    if (n.op() == "reduce_sum") sum = &n;
  }
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(sum->attr<dtype>("T"), dtype::bf16);
  EXPECT_EQ(sum->attr<dtype>("output_type"), dtype::f32);
  // Casts: x and w in; nothing back (the sum reads the product's bfloat16 result).
  EXPECT_EQ(count_op(describe(planned), "cast"), 2u) << log_text(log);

  // The same graph written with the casts, run as written: the same bits.
  graph r;
  graph_builder rb(r);
  const output rx = ops::placeholder(rb, "x", dtype::f32, {64, 48});
  const output rw = ops::variable(rb, "w", make_tensor(dtype::f32, {48, 40}, wv));
  const output rh = ops::matmul(ops::cast(rx, dtype::bf16), ops::cast(rw, dtype::bf16));
  (void)ops::reduce_sum(ops::cast(rh, dtype::f32), {0}, false, {.name = "colsum"});
  session_options as_written;
  as_written.passes.enabled = false;
  session rs(r, as_written);
  EXPECT_EQ(values(got), values(rs.run({{"x", feed}}, {"colsum"})[0]));
  EXPECT_EQ(got.type(), dtype::f32);
}

TEST(Amp, ATrainingStepLowersForwardAndBackwardProductsAndTheUpdateReadsBfloat16Gradients) {
  training_step t = make_training_step();
  session s(t.g, amp_session());
  const std::vector<std::string> feeds{"x", "labels", "step"};
  const graph& planned = s.planned_graph(feeds, {"loss"}, t.targets);
  const auto log = s.explain_passes(feeds, {"loss"}, t.targets);
  // Forward: 2 products; backward: dW1, dW2 and dh (no dx: x is not a parameter).
  const auto types = planned_types(planned, "matmul");
  const auto fused_types = planned_types(planned, "fused_matmul");
  std::size_t low = 0;
  for (dtype d : types) low += d == dtype::bf16 ? 1 : 0;
  for (dtype d : fused_types) low += d == dtype::bf16 ? 1 : 0;
  EXPECT_EQ(low, types.size() + fused_types.size()) << log_text(log);
  EXPECT_GE(low, 5u) << log_text(log);
  // The loss stays float32, and the log says so.
  EXPECT_TRUE(refused_with(log, pass, {"kept float32", "softmax_cross_entropy", "float32 list"}))
      << log_text(log);
  // The update reads the bfloat16 weight gradients directly (b1's gradient is a float32
  // reduction and stays so, summing the bfloat16 values without a cast).
  const node* adam = nullptr;
  for (const node& n : planned.nodes()) {
    if (n.op() == "fused_adam") adam = &n;
  }
  ASSERT_NE(adam, nullptr);
  std::vector<dtype> grad_types;
  for (std::size_t k = 3; k < 6; ++k) grad_types.push_back(planned.type_of(adam->inputs[k]).type);
  EXPECT_EQ(grad_types, (std::vector<dtype>{dtype::bf16, dtype::f32, dtype::bf16}))
      << log_text(log);
  EXPECT_FALSE(records(log, pass, kind::rewrite, {"reads 2 bfloat16 gradients"}).empty())
      << log_text(log);
  EXPECT_FALSE(
      records(log, pass, kind::rewrite, {"sums bfloat16 values into float32 without a cast"})
          .empty())
      << log_text(log);

  // Master weights stay float32 and the steps train: the loss of a fixed batch falls.
  std::mt19937 rng(5);
  const tensor x = make_tensor(dtype::f32, {8, 12}, uniform(rng, 8 * 12));
  const tensor labels = make_tensor(dtype::i32, {8}, {0, 1, 2, 3, 0, 1, 2, 3});
  double first = 0;
  double last = 0;
  for (int k = 1; k <= 30; ++k) {
    tensor step = make_tensor(dtype::i64, {}, {static_cast<double>(k)});
    const auto out =
        s.run({{"x", x}, {"labels", labels}, {"step", step}}, {"loss", t.found_inf}, t.targets);
    const double loss = values(out[0])[0];
    EXPECT_FALSE(detach(out[1]).data<bool>()[0]);
    if (k == 1) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5 * first);
  EXPECT_EQ(values(s.run({}, {"w1"})[0]).size(), 12u * 16u);
  EXPECT_EQ(s.run({}, {"w1"})[0].type(), dtype::f32);
}

TEST(Amp, NodeOverridesAndOpListsDecide) {
  two_layers t = make_two_layers(false);
  {
    session_options o = amp_session();
    o.passes.amp.policy.nodes["mm1"] = false;
    o.passes.amp.policy.nodes["act"] = true;  // not in this graph
    session s(t.g, o);
    const auto log = s.explain_passes({"x"}, {"y"});
    EXPECT_EQ(planned_types(s.planned_graph({"x"}, {"y"}), "matmul"),
              (std::vector<dtype>{dtype::f32, dtype::bf16}));
    EXPECT_TRUE(refused_with(log, pass, {"kept float32", "the policy keeps this node"}))
        << log_text(log);
    EXPECT_TRUE(refused_with(log, pass, {"which this plan does not have"})) << log_text(log);
  }
  {
    // A node a fusion merged away (mm1 and act became fused/act) is named as missing.
    session_options o = amp_session();
    o.passes.amp.policy.nodes["mm1"] = false;
    two_layers fused = make_two_layers(true);
    session s(fused.g, o);
    const auto log = s.explain_passes({"x"}, {"y"});
    EXPECT_EQ(records(log, pass, kind::refused, {"which this plan does not have"}).size(), 1u)
        << log_text(log);
  }
  {
    // matmul moved to the float32 list: nothing is lowered, and each node says why.
    session_options o = amp_session();
    o.passes.amp.policy.lower.clear();
    o.passes.amp.policy.keep_float32.push_back("matmul");
    session s(t.g, o);
    const auto log = s.explain_passes({"x"}, {"y"});
    EXPECT_EQ(planned_types(s.planned_graph({"x"}, {"y"}), "matmul"),
              (std::vector<dtype>{dtype::f32, dtype::f32}));
    EXPECT_EQ(records(log, pass, kind::refused, {"matmul is in the policy's float32 list"}).size(),
              2u);
  }
  {
    // A node override lowers a node whose op no list names.
    session_options o = amp_session();
    o.passes.amp.policy.lower.clear();
    o.passes.amp.policy.nodes["y"] = true;
    session s(t.g, o);
    EXPECT_EQ(planned_types(s.planned_graph({"x"}, {"y"}), "matmul"),
              (std::vector<dtype>{dtype::f32, dtype::bf16}));
  }
}

// Note [short reductions stay float32]: a convolution over one channel and a 3x3 window
// (9 values summed for each output) and its filter gradient stay float32, with the reason;
// the next convolution (4 channels: 36 values) and its input and filter gradients are
// lowered, and the pool between them stays float32 (its input is float32); a
// node override lowers the short one anyway.
TEST(Amp, ConvolutionsOverFewInputValuesStayFloat32) {
  graph g;
  graph_builder b(g);
  std::mt19937 rng(13);
  const output x = ops::placeholder(b, "x", dtype::f32, {4, 1, 8, 8});
  const output w1 = ops::variable(b, "w1", make_tensor(dtype::f32, {4, 1, 3, 3}, uniform(rng, 36, -0.5, 0.5)));
  const output w2 = ops::variable(b, "w2", make_tensor(dtype::f32, {6, 4, 3, 3}, uniform(rng, 216, -0.5, 0.5)));
  ops::conv2d_options c;
  c.padding = {1, 1};
  ops::pool_options p;
  p.kernel = {2, 2};
  p.strides = {2, 2};
  const output h = ops::max_pool2d(ops::conv2d(x, w1, c, {.name = "first"}), p);
  const output y = ops::conv2d(h, w2, c, {.name = "second"});
  const output loss = ops::reduce_sum(y, {}, false, {.name = "loss"});
  const std::vector<output> grads = gradients(loss, {w1, w2});
  const std::vector<std::string> fetches{"loss", grads[0].name(), grads[1].name()};
  {
    session s(g, amp_session());
    const auto log = s.explain_passes({"x"}, fetches);
    const graph& planned = s.planned_graph({"x"}, fetches);
    EXPECT_EQ(planned_types(planned, "conv2d"), (std::vector<dtype>{dtype::f32, dtype::bf16})) << log_text(log);
    auto filters = planned_types(planned, "conv2d_backprop_filter");
    std::sort(filters.begin(), filters.end());
    EXPECT_EQ(filters, (std::vector<dtype>{dtype::f32, dtype::bf16})) << log_text(log);
    EXPECT_EQ(planned_types(planned, "conv2d_backprop_input"), (std::vector<dtype>{dtype::bf16})) << log_text(log);
    EXPECT_EQ(planned_types(planned, "max_pool2d"), (std::vector<dtype>{dtype::f32})) << log_text(log);
    EXPECT_EQ(records(log, pass, kind::refused,
                      {"kept float32: it sums 9 input values for each output, fewer than the 16 that make "
                       "bfloat16 products pay"})
                  .size(),
              2u)
        << log_text(log);
  }
  {
    session_options o = amp_session();
    o.passes.amp.policy.nodes["first"] = true;
    session s(g, o);
    EXPECT_EQ(planned_types(s.planned_graph({"x"}, fetches), "conv2d"), (std::vector<dtype>{dtype::bf16, dtype::bf16}));
  }
}

TEST(Amp, BadPoliciesAreErrorsNamingWhatIsWrong) {
  two_layers t = make_two_layers(true);
  session_options o = amp_session();
  o.passes.amp.policy.lower.push_back("matmull");
  EXPECT_NE(error_of([&] { session s(t.g, o); }).find("'matmull', which is not an op"),
            std::string::npos);
  session_options p = amp_session();
  p.passes.amp.type = dtype::f64;
  EXPECT_NE(error_of([&] { session s(t.g, p); }).find("bfloat16 or float16"), std::string::npos);
  EXPECT_THROW((void)passes::amp_type_from_name("int8"), invalid_argument);
  EXPECT_EQ(passes::amp_type_from_name("bf16"), dtype::bf16);
  EXPECT_EQ(passes::amp_type_from_name("fp16"), dtype::f16);
  EXPECT_EQ(passes::amp_type_from_name("off"), dtype::f32);
  EXPECT_NO_THROW(passes::validate({dtype::bf16, passes::default_amp_policy()}));
}

TEST(Amp, Float64NodesStayAsTheyAre) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f64, {2, 3});
  const output w = ops::placeholder(b, "w", dtype::f64, {3, 2});
  (void)ops::matmul(x, w, false, false, {.name = "y"});
  session s(g, amp_session());
  const auto log = s.explain_passes({"x", "w"}, {"y"});
  EXPECT_TRUE(refused_with(log, pass, {"kept float64", "float32 nodes only"})) << log_text(log);
  EXPECT_EQ(rewrites(log, pass), 0u);
}

// Where the CPU's kernels only emulate a precision (kernel_def::emulated), AMP keeps float32
// and says why, unless the policy allows emulation.
TEST(Amp, EmulatedPrecisionsStayFloat32WithTheKernelsReason) {
  const kernel_def* cpu = nullptr;
  for (const kernel_def* d : kernel_registry::global().kernels_for("matmul")) {
    if (d->device == device_type::cpu) cpu = d;
  }
  ASSERT_NE(cpu, nullptr);
  ASSERT_TRUE(static_cast<bool>(cpu->emulated));
  EXPECT_FALSE(cpu->emulated(dtype::f32).has_value());
  for (const dtype t : {dtype::bf16, dtype::f16}) {
    SCOPED_TRACE(to_string(t));
    two_layers g = make_two_layers(true);
    session_options o;
    o.passes.amp.type = t;
    session s(g.g, o);
    const auto log = s.explain_passes({"x"}, {"y"});
    if (const auto why = cpu->emulated(t)) {
      EXPECT_TRUE(refused_with(log, pass, {"kept float32", *why})) << log_text(log);
      EXPECT_EQ(rewrites(log, pass), 0u);
    } else {
      EXPECT_EQ(rewrites(log, pass), 2u) << log_text(log);
    }
    // Allowed, the same graph lowers either way.
    session lowered(g.g, amp_session(t));
    EXPECT_EQ(rewrites(lowered.explain_passes({"x"}, {"y"}), pass), 2u);
  }
}

TEST(Amp, OffByDefaultAndGraphsWithoutProductsAreUntouched) {
  two_layers t = make_two_layers(true);
  session plain(t.g);
  EXPECT_EQ(rewrites(plain.explain_passes({"x"}, {"y"}), pass), 0u);
  graph g;
  graph_builder b(g);
  (void)ops::exp(ops::placeholder(b, "x", dtype::f32, {4}), {.name = "y"});
  session s(g, amp_session());
  const auto log = s.explain_passes({"x"}, {"y"});
  EXPECT_EQ(rewrites(log, pass), 0u);
  EXPECT_TRUE(refused_with(log, pass, {"exp is in the policy's float32 list"})) << log_text(log);
}

}  // namespace
}  // namespace loom
