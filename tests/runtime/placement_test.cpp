// Placement and partitioning on virtual CPU devices: explicit requests (full and partial),
// colocation, soft placement, the reasons recorded, and _send/_recv on crossing edges.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using memory::host_tensor;

session_options virtual_cpus(int n) {
  session_options o;
  o.devices.virtual_cpu_devices = n;
  o.devices.cpu_threads = n;
  return o;
}

const placement_decision& decision(const std::vector<placement_decision>& all, const std::string& n) {
  auto it = std::find_if(all.begin(), all.end(), [&](const auto& d) { return d.node == n; });
  EXPECT_NE(it, all.end()) << n;
  return *it;
}

TEST(Placement, VirtualCpuDevicesAreSeparateDevices) {
  graph g;
  session s(std::move(g), virtual_cpus(4));
  ASSERT_EQ(s.devices().size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(s.devices()[static_cast<std::size_t>(i)]->name(), fmt::format("/device:CPU:{}", i));
  }
  EXPECT_NE(&s.devices()[0]->allocator(), &s.devices()[1]->allocator());
  EXPECT_EQ(&s.find_device("cpu:2"), s.devices()[2].get());
  EXPECT_THROW((void)s.find_device("cpu:9"), not_found);
}

TEST(Placement, RequestsColocationAndCopiesBetweenDevices) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  auto a = ops::identity(x, {.name = "a", .device = "/device:CPU:1"});
  auto c = ops::identity(a, {.name = "c", .device = "cpu:2"});
  auto d = ops::identity(c, {.name = "d", .device = "cpu"});  // partial: any CPU → the first
  auto v = ops::variable(b, "v", host_tensor({3}, {0, 0, 0}));
  {
    auto scope = b.with_device("cpu:3");
    (void)ops::identity(v, {.name = "read_v"});
  }
  ops::assign_add(v, d, {.name = "update"});  // no request: follows the variable's group
  session s(std::move(g), virtual_cpus(4));

  const auto placement = s.explain_placement({"x"}, {"d", "read_v"}, {"update"});
  EXPECT_EQ(decision(placement, "a").device, "/device:CPU:1");
  EXPECT_NE(decision(placement, "a").reason.find("requested"), std::string::npos);
  EXPECT_EQ(decision(placement, "c").device, "/device:CPU:2");
  EXPECT_EQ(decision(placement, "d").device, "/device:CPU:0");
  EXPECT_EQ(decision(placement, "read_v").device, "/device:CPU:3");
  EXPECT_EQ(decision(placement, "v").device, "/device:CPU:0");
  EXPECT_EQ(decision(placement, "update").device, "/device:CPU:0");
  EXPECT_NE(decision(placement, "update").reason.find("colocated"), std::string::npos);

  // Partitions: one per device used, with _send/_recv pairs on the crossing edges.
  const auto parts = s.partitions({"x"}, {"d", "read_v"}, {"update"});
  std::size_t sends = 0;
  std::size_t recvs = 0;
  for (const auto& [dev, names] : parts) {
    for (const auto& nm : names) {
      sends += nm.starts_with("_send/");
      recvs += nm.starts_with("_recv/");
    }
  }
  // x(feed)→a stays zero-copy; a(1)→c(2), c(2)→d(0), v(0)→read_v(3): three copies.
  EXPECT_EQ(sends, 3u);
  EXPECT_EQ(recvs, 3u);

  const auto out = s.run({{"x", host_tensor({3}, {1, 2, 3})}}, {"d", "read_v", "c"}, {"update"});
  EXPECT_EQ(out[0].device(), (device_id{device_type::cpu, 0}));
  EXPECT_EQ(out[2].device(), (device_id{device_type::cpu, 2}));
  EXPECT_EQ(std::vector<float>(out[0].span<float>().begin(), out[0].span<float>().end()),
            (std::vector<float>{1, 2, 3}));
  const auto after = s.run({}, {"read_v"});
  EXPECT_EQ(after[0].device(), (device_id{device_type::cpu, 3}));
  EXPECT_EQ(std::vector<float>(after[0].span<float>().begin(), after[0].span<float>().end()),
            (std::vector<float>{1, 2, 3}));
}

TEST(Placement, MissingDeviceFailsUnlessSoftPlacement) {
  auto build = [] {
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, {1});
    ops::identity(x, {.name = "far", .device = "/device:CPU:7"});
    return g;
  };
  {
    session s(build(), virtual_cpus(2));
    try {
      (void)s.run({{"x", host_tensor({1}, {1})}}, {"far"});
      FAIL() << "expected invalid_argument";
    } catch (const invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'far'"), std::string::npos) << m;
      EXPECT_NE(m.find("/device:CPU:7"), std::string::npos) << m;
      EXPECT_NE(m.find("/device:CPU:1"), std::string::npos) << m;  // lists what exists
    }
  }
  auto soft = virtual_cpus(2);
  soft.allow_soft_placement = true;
  session s(build(), soft);
  const auto placement = s.explain_placement({"x"}, {"far"});
  EXPECT_EQ(decision(placement, "far").device, "/device:CPU:0");
  EXPECT_NE(decision(placement, "far").reason.find("soft placement"), std::string::npos);
  EXPECT_EQ(s.run({{"x", host_tensor({1}, {4})}}, {"far"})[0].span<float>()[0], 4.0f);
}

TEST(Placement, ConflictingColocatedRequestsAreAnError) {
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "v", host_tensor({1}, {0}));
  g.set_requested_device(v.ep().node, "cpu:0");
  auto one = ops::constant(b, host_tensor({1}, {1}));
  ops::assign_add(v, one, {.name = "bump", .device = "cpu:1"});
  session s(std::move(g), virtual_cpus(2));
  try {
    (void)s.run({}, {}, {"bump"});
    FAIL() << "expected invalid_argument";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bump"), std::string::npos) << e.what();
  }
}

TEST(Placement, MalformedDeviceNamesFailAtConstruction) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1});
  try {
    (void)ops::identity(x, {.name = "bad", .device = "/device:TPU:0"});
    FAIL() << "expected invalid_argument";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'bad'"), std::string::npos) << e.what();
  }
}

TEST(Placement, ConcurrentRunsOnOneSession) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  auto y = ops::identity(x, {.name = "y", .device = "cpu:1"});
  ops::identity(y, {.name = "z", .device = "cpu:0"});
  auto v = ops::variable(b, "counter", host_tensor({1}, {0}));
  auto one = ops::constant(b, host_tensor({1}, {1}));
  ops::assign_add(v, one, {.name = "count"});
  session s(std::move(g), virtual_cpus(2));
  constexpr int threads = 4;
  constexpr int runs = 200;
  std::vector<std::thread> pool;
  std::atomic<int> wrong{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < runs; ++i) {
        const float v0 = static_cast<float>(t * 1000 + i);
        auto out = s.run({{"x", host_tensor({2}, {v0, -v0})}}, {"z"}, {"count"});
        if (out[0].span<float>()[0] != v0 || out[0].span<float>()[1] != -v0) ++wrong;
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(s.run({}, {"counter"})[0].span<float>()[0], static_cast<float>(threads * runs));
  EXPECT_EQ(s.plan_count(), 2u);
}

}  // namespace
}  // namespace loom
