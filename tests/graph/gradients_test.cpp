// gradients(): the walk itself — seeds, unconnected variables, devices of gradient nodes,
// and the errors it names. Values are checked in gradient_check_test.cpp.
#include "loom/graph/gradients.hpp"

#include <gtest/gtest.h>

#include <string>

#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

// The elements in row-major order (fetched gradients may be views, e.g. broadcast).
std::vector<float> values_of(const tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.num_elements()));
  copy_to_dense(t, v.data());
  return v;
}

TEST(Gradients, OfAVariableThroughASession) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, 2});
  auto w = ops::variable(b, "w", memory::host_tensor({2}, {3.0f, -1.0f}));
  auto loss = ops::reduce_sum(x * w);  // d/dw = column sums of x
  const auto grads = gradients(loss, {w, x});
  const std::vector<std::string> fetches{grads[0].name(), grads[1].name()};
  session s(std::move(g));
  const auto xv = memory::host_tensor({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
  const auto out = s.run({{"x", xv}}, fetches);
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{4.0f, 6.0f}));
  EXPECT_EQ(values_of(out[1]), (std::vector<float>{3.0f, -1.0f, 3.0f, -1.0f}));
}

TEST(Gradients, ASeedReplacesOnesAndAnUnconnectedXGetsZeros) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  auto unused = ops::placeholder(b, "unused", dtype::f32, {2});
  auto y = x * 2.0;
  auto seed = ops::constant(b, memory::host_tensor({3}, {1.0f, 10.0f, 100.0f}));
  const auto grads = gradients(y, {x, unused}, seed);
  const std::vector<std::string> fetches{grads[0].name(), grads[1].name()};
  session s(std::move(g));
  const auto out = s.run({{"x", memory::host_tensor({3}, {0.0f, 0.0f, 0.0f})}}, fetches);
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{2.0f, 20.0f, 200.0f}));
  EXPECT_EQ(values_of(out[1]), (std::vector<float>{0.0f, 0.0f}));
}

TEST(Gradients, GradientNodesAskForTheirForwardNodesDevice) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {4});
  output y;
  {
    auto scope = b.with_device("/device:CPU:1");
    y = ops::exp(x, {.name = "e"});
  }
  auto loss = ops::reduce_sum(y, {}, false, {.name = "loss"});
  const std::size_t before = g.num_nodes();
  (void)gradients(loss, {x});
  // exp's gradient (dy * y) is on CPU:1, reduce_sum's on the default device.
  bool saw_cpu1 = false;
  for (std::size_t id = before; id < g.num_nodes(); ++id) {
    const node& n = g.at(static_cast<node_id>(id));
    if (n.op() == "mul") {
      EXPECT_EQ(n.requested_device, "/device:CPU:1") << n.describe();
      saw_cpu1 = true;
    }
  }
  EXPECT_TRUE(saw_cpu1);
}

TEST(Gradients, ErrorsNameTheProblem) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  auto i = ops::placeholder(b, "i", dtype::i32, {2});
  auto unknown = ops::placeholder(b, "batch", dtype::f32, {shape::unknown, 2});
  auto loss = ops::reduce_sum(x * x);
  const auto int_loss = ops::reduce_sum(i);
  EXPECT_NE(message_of([&] { (void)gradients(int_loss, {x}); }).find("not a float type"),
            std::string::npos);
  EXPECT_NE(message_of([&] { (void)gradients(loss, {i}); }).find("int32"), std::string::npos);
  const auto unknown_loss = ops::reduce_sum(ops::exp(unknown));
  const auto msg = message_of([&] { (void)gradients(unknown_loss, {unknown}); });
  EXPECT_NE(msg.find("fully defined"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[?, 2]"), std::string::npos) << msg;
  auto wrong_seed = ops::constant(b, memory::host_tensor({2}, {1.0f, 1.0f}));
  EXPECT_NE(message_of([&] { (void)gradients(loss, {x}, wrong_seed); }).find("seed"),
            std::string::npos);
}

TEST(Gradients, AnOpWithoutAGradientOnThePathIsAnError) {
  // A registry that knows only reduce_sum: exp on the path has no gradient.
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  auto loss = ops::reduce_sum(ops::exp(x, {.name = "e"}));
  gradient_registry r;
  register_reduction_gradients(r);
  const auto msg = message_of([&] { (void)gradients(loss, {x}, std::nullopt, r); });
  EXPECT_NE(msg.find("'e' (exp)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no gradient"), std::string::npos) << msg;
}

TEST(Gradients, NothingFlowsThroughNonDifferentiableOps) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  // argmax cuts the path: the loss depends on x only through x itself.
  auto idx = ops::cast(ops::argmax(x), dtype::f32);
  auto loss = ops::reduce_sum(x) + idx;
  const std::string fetch = gradients(loss, {x})[0].name();
  session s(std::move(g));
  const auto out = s.run({{"x", memory::host_tensor({3}, {1.0f, 5.0f, 2.0f})}}, {fetch});
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{1.0f, 1.0f, 1.0f}));
}

TEST(Gradients, RegistryRejectsDuplicates) {
  gradient_registry r;
  r.add_none("argmax");
  EXPECT_THROW(r.add_none("argmax"), invalid_argument);
  EXPECT_THROW((void)r.find("nothing"), not_found);
  EXPECT_EQ(r.find("argmax"), nullptr);
}

TEST(Gradients, EveryDifferentiableStandardOpHasAnEntry) {
  // Every op of the standard registry is either differentiable or declared not to be, so a
  // new op cannot be forgotten silently.
  const auto& ops_r = op_registry::global();
  const auto& grads_r = gradient_registry::global();
  for (const auto& name : ops_r.names()) {
    if (name == "_send" || name == "_recv" || name == "_send_task" || name == "_recv_task") {
      continue;  // inserted by the partitioner
    }
    // Backward ops: a gradient through them (second order) is an error, by design.
    if (name.find("_grad") != std::string::npos || name.find("backprop") != std::string::npos) {
      continue;
    }
    EXPECT_TRUE(grads_r.knows(name)) << "op " << name << " has no gradient entry";
  }
}

}  // namespace
}  // namespace loom
