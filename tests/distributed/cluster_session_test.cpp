// Devices in other processes (session_options::cluster, Note [tasks] in
// src/runtime/partitioner.cpp): nodes pinned to /job:worker/task:k run on rank k, values
// cross between ranks point to point, and every rank gets what one process computes.
// Run as one process (task 0 alone) and under mpirun -np 2 / -np 4 (tests/CMakeLists.txt).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "loom/distributed/communicator.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using memory::host_tensor;

std::shared_ptr<distributed::communicator> w() { return distributed::world(); }
int last_task() { return w()->size() - 1; }

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

session_options one_thread() {
  session_options o;
  o.devices.cpu_threads = 1;
  return o;
}

session_options on_every_rank() {
  session_options o = one_thread();
  o.cluster = w();
  return o;
}

// A two-layer MLP: layer 1 on `first`, layer 2 on `second` ("" for every task), with a
// variable per layer; returns the name of the loss.
std::string build_mlp(graph& g, const std::string& first, const std::string& second) {
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {8, 16});
  output h;
  {
    const auto scope = b.with_device(first);
    auto w1 = ops::variable(b, "w1", host_tensor({16, 32}, random_values(16 * 32, 1)));
    h = ops::relu(ops::matmul(x, w1, false, false, {.name = "layer1"}));
  }
  output y;
  {
    const auto scope = b.with_device(second);
    auto w2 = ops::variable(b, "w2", host_tensor({32, 4}, random_values(32 * 4, 2)));
    y = ops::matmul(h, w2, false, false, {.name = "layer2"});
  }
  return ops::reduce_mean(ops::square(y), {}, false, {.name = "loss"}).name();
}

tensor batch() { return host_tensor({8, 16}, random_values(8 * 16, 3)); }

TEST(ClusterSession, EveryTaskSeesTheDevicesOfAll) {
  graph g;
  session s(std::move(g), on_every_rank());
  const auto names = s.cluster_devices();
  ASSERT_EQ(names.size(), s.devices().size() * static_cast<std::size_t>(w()->size()));
  for (int t = 0; t < w()->size(); ++t) {
    EXPECT_NE(std::find(names.begin(), names.end(), fmt::format("/job:worker/task:{}/device:CPU:0", t)),
              names.end())
        << t;
  }
}

TEST(ClusterSession, ALayerOnEachTaskComputesWhatOneProcessDoes) {
  graph one;
  const std::string loss = build_mlp(one, "", "");
  session alone(std::move(one), one_thread());
  const float want = alone.run({{"x", batch()}}, {loss})[0].data<float>()[0];

  graph g;
  (void)build_mlp(g, "/job:worker/task:0/device:CPU:0", fmt::format("/job:worker/task:{}", last_task()));
  session s(std::move(g), on_every_rank());
  for (int run = 0; run < 3; ++run) {  // the plan is cached; the messages go every run
    const auto out = s.run({{"x", batch()}}, {loss, "layer2", "layer1"});
    EXPECT_FLOAT_EQ(out[0].data<float>()[0], want) << "run " << run;
    EXPECT_EQ(to_string(out[1].shape()), to_string(shape{8, 4}));
    EXPECT_EQ(to_string(out[2].shape()), to_string(shape{8, 32}));
  }
  // Placement names the other task's device.
  bool named = false;
  for (const auto& d : s.explain_placement({"x"}, {loss})) {
    if (d.node == "layer2") {
      named = true;
      // One process keeps the plain name.
      EXPECT_EQ(d.device, w()->size() == 1
                              ? std::string("/device:CPU:0")
                              : fmt::format("/job:worker/task:{}/device:CPU:0", last_task()));
    }
  }
  EXPECT_TRUE(named);
}

TEST(ClusterSession, AParameterServerTrainsAsOneProcessDoes) {
  // The variables and their updates live on the last task (colocated with the variables);
  // the gradients are computed on every task from the same batch; every task reads the
  // parameters back.
  const auto build = [](graph& g, const std::string& ps) {
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, {8, 16});
    output w1;
    output w2;
    {
      const auto scope = b.with_device(ps);
      w1 = ops::variable(b, "w1", host_tensor({16, 32}, random_values(16 * 32, 1)));
      w2 = ops::variable(b, "w2", host_tensor({32, 4}, random_values(32 * 4, 2)));
    }
    auto y = ops::matmul(ops::tanh(ops::matmul(x, w1)), w2);
    auto loss = ops::reduce_mean(ops::square(y), {}, false, {.name = "loss"});
    const auto grads = gradients(loss, {w1, w2});
    const auto lr = ops::scalar(b, 0.1, dtype::f32);
    ops::sgd_options sgd;
    (void)ops::apply_sgd(w1, grads[0], lr, sgd, {.name = "update1"});
    (void)ops::apply_sgd(w2, grads[1], lr, sgd, {.name = "update2"});
  };
  graph one;
  build(one, "");
  session alone(std::move(one), one_thread());
  graph g;
  build(g, fmt::format("/job:worker/task:{}", last_task()));
  session s(std::move(g), on_every_rank());
  for (int step = 0; step < 3; ++step) {
    const auto a = alone.run({{"x", batch()}}, {"loss"}, {"update1", "update2"});
    const auto b = s.run({{"x", batch()}}, {"loss"}, {"update1", "update2"});
    EXPECT_FLOAT_EQ(b[0].data<float>()[0], a[0].data<float>()[0]) << "step " << step;
  }
  const auto a = alone.run({}, {"w1", "w2"});
  const auto b = s.run({}, {"w1", "w2"});
  for (std::size_t k = 0; k < 2; ++k) {
    const auto va = a[k].span<float>();
    const auto vb = b[k].span<float>();
    ASSERT_EQ(va.size(), vb.size());
    for (std::size_t i = 0; i < va.size(); ++i) ASSERT_FLOAT_EQ(vb[i], va[i]) << k << " " << i;
  }
}

TEST(ClusterSession, RequestsForTasksThatDoNotExistAreErrorsNamingThem) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  ops::neg(x, {.name = "far", .device = fmt::format("/job:worker/task:{}/cpu:0", w()->size() + 3)});
  session s(std::move(g), on_every_rank());
  try {
    (void)s.run({{"x", host_tensor({2}, {1.0F, 2.0F})}}, {"far"});
    FAIL() << "placed on a task that does not exist";
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("asks for task {}", w()->size() + 3)), std::string::npos) << what;
    EXPECT_NE(what.find("'far'"), std::string::npos) << what;
  }
  // Malformed requests fail where the node is added.
  graph g2;
  graph_builder b2(g2);
  auto y = ops::placeholder(b2, "y", dtype::f32, {2});
  EXPECT_THROW(ops::neg(y, {.device = "/job:ps/task:0/cpu:0"}), invalid_argument);
  EXPECT_THROW(ops::neg(y, {.device = "/job:worker/task:x/cpu:0"}), invalid_argument);
  EXPECT_THROW(ops::neg(y, {.device = "/job:worker/replica:2/task:0"}), invalid_argument);
  // Task 0 is this process in a session of one.
  ops::neg(y, {.name = "here", .device = "/job:worker/task:0/cpu:0"});
  session alone(std::move(g2), one_thread());
  EXPECT_EQ(alone.run({{"y", host_tensor({2}, {1.0F, 2.0F})}}, {"here"})[0].data<float>()[1], -2.0F);
}

TEST(ClusterSession, AControlEdgeBetweenTasksIsRefusedNamingBothNodes) {
  if (w()->size() < 2) GTEST_SKIP() << "needs two ranks (mpirun -np 2)";
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  auto first = ops::neg(x, {.name = "first", .device = "/job:worker/task:0"});
  auto second = ops::abs(x, {.name = "second", .device = "/job:worker/task:1"});
  g.add_control_input(second.ep().node, first.ep().node);
  session s(std::move(g), on_every_rank());
  try {
    (void)s.run({{"x", host_tensor({2}, {1.0F, 2.0F})}}, {"second"});
    FAIL() << "ran";
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'second'"), std::string::npos) << what;
    EXPECT_NE(what.find("'first'"), std::string::npos) << what;
    EXPECT_NE(what.find("control edges cannot cross tasks"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace loom
