// Sessions with the state ops: feeds, fetches, targets, variables across runs, plan caching,
// and every bad-input error, with the session still usable afterwards.
#include <gtest/gtest.h>

#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#include "runtime/runtime_test_support.hpp"

namespace loom {
namespace {

using memory::host_tensor;

std::vector<float> floats(const tensor& t) {
  auto s = t.span<float>();
  return {s.begin(), s.end()};
}

TEST(Session, FeedsFlowToFetches) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, -1});
  ops::identity(x, {.name = "y"});
  session s(std::move(g));
  const auto out = s.run({{"x", host_tensor({2, 2}, {1, 2, 3, 4})}}, {"y", "x"});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(floats(out[0]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(floats(out[1]), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(out[0].shape(), (shape{2, 2}));
}

TEST(Session, HostValuesOfHostTensorsAreThemselves) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  ops::identity(x, {.name = "y"});
  session s(std::move(g));
  const tensor y = s.run({{"x", host_tensor({2}, {1, 2})}}, {"y"}).at(0);
  EXPECT_EQ(s.host_value(y).raw_data(), y.raw_data());
  EXPECT_FALSE(s.host_value(tensor()).defined());
}

TEST(Session, PlansAreCachedPerSignature) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {-1});
  ops::identity(x, {.name = "y"});
  session s(std::move(g));
  for (int i = 0; i < 5; ++i) {
    auto out = s.run({{"x", host_tensor({1}, {static_cast<float>(i)})}}, {"y"});
    EXPECT_EQ(out[0].span<float>()[0], static_cast<float>(i));
  }
  EXPECT_EQ(s.plan_count(), 1u);
  (void)s.run({{"x", host_tensor({1}, {0})}}, {"x"});
  EXPECT_EQ(s.plan_count(), 2u);
}

TEST(Session, VariablesLiveAcrossRuns) {
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "v", host_tensor({2}, {1, 1}));
  auto step = ops::placeholder(b, "step", dtype::f32, {2});
  ops::assign_add(v, step, {.name = "update"});
  session s(std::move(g));
  for (int i = 0; i < 3; ++i) (void)s.run({{"step", host_tensor({2}, {1, 2})}}, {}, {"update"});
  EXPECT_EQ(floats(s.run({}, {"v"})[0]), (std::vector<float>{4, 7}));
}

TEST(Session, ReadingAnUnassignedVariableNamesIt) {
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "w", dtype::f32, {3});
  auto value = ops::placeholder(b, "value", dtype::f32, {3});
  ops::assign(v, value, {.name = "init"});
  session s(std::move(g));
  try {
    (void)s.run({}, {"w"});
    FAIL() << "expected node_error";
  } catch (const node_error& e) {
    EXPECT_EQ(e.node_name(), "w");
    EXPECT_NE(std::string(e.what()).find("read before it is assigned"), std::string::npos);
  }
  (void)s.run({{"value", host_tensor({3}, {1, 2, 3})}}, {}, {"init"});
  EXPECT_EQ(floats(s.run({}, {"w"})[0]), (std::vector<float>{1, 2, 3}));
}

TEST(Session, BadRequestsAreTypedErrorsNamingWhatWasWrong) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  ops::identity(x, {.name = "y"});
  session s(std::move(g));
  auto message = [&](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THROW((void)s.run({}, {"nope"}), not_found);
  EXPECT_NE(message([&] { (void)s.run({}, {"nope"}); }).find("nope"), std::string::npos);
  EXPECT_THROW((void)s.run({{"zz", host_tensor({2}, {1, 2})}}, {"y"}), not_found);
  EXPECT_THROW((void)s.run({}, {"y"}, {"missing_target"}), not_found);
  EXPECT_THROW((void)s.run({}, {"y:3"}), not_found);
  // Missing feed names the placeholder.
  EXPECT_NE(message([&] { (void)s.run({}, {"y"}); }).find("placeholder 'x'"), std::string::npos);
  // Wrong dtype and wrong shape name the feed and the node.
  tensor ints = memory::host_tensor<std::int32_t>({2}, std::vector<std::int32_t>{1, 2});
  const auto dtype_msg = message([&] { (void)s.run({{"x", ints}}, {"y"}); });
  EXPECT_NE(dtype_msg.find("int32"), std::string::npos) << dtype_msg;
  EXPECT_NE(dtype_msg.find("'x'"), std::string::npos) << dtype_msg;
  const auto shape_msg = message([&] { (void)s.run({{"x", host_tensor({3}, {1, 2, 3})}}, {"y"}); });
  EXPECT_NE(shape_msg.find("[3]"), std::string::npos) << shape_msg;
  EXPECT_THROW((void)s.run({{"x", host_tensor({3}, {1, 2, 3})}}, {"y"}), invalid_argument);
  // Still usable.
  EXPECT_EQ(floats(s.run({{"x", host_tensor({2}, {5, 6})}}, {"y"})[0]), (std::vector<float>{5, 6}));
}

TEST(Session, FailedRunLeavesNothingOutstanding) {
  testing::tracked_devices devices(1);
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "w", dtype::f32, {4});
  auto c = ops::constant(b, host_tensor({4}, {1, 2, 3, 4}));
  ops::assign_add(v, c, {.name = "bump"});  // fails: w was never assigned
  ops::identity(c, {.name = "copy"});
  session_options opts;
  opts.factories = &devices.registry;
  {
    session s(std::move(g), opts);
    EXPECT_THROW((void)s.run({}, {"copy", "bump"}), node_error);
    // The plan's constant copy lives on the device; nothing else may.
    const std::size_t after_failure = devices.outstanding_count();
    EXPECT_LE(after_failure, 1u) << devices.devices[0]->tracking().leak_report();
    EXPECT_THROW((void)s.run({}, {"copy", "bump"}), node_error);
    EXPECT_EQ(devices.outstanding_count(), after_failure);
  }
  // The devices died with the session; their tracking adaptors abort on anything left.
}

TEST(Session, CancelStopsARunFromAnotherThread) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1});
  output cur = x;
  for (int i = 0; i < 20000; ++i) cur = ops::identity(cur);
  const std::string last = cur.name();
  session_options no_passes;
  no_passes.passes.enabled = false;  // the chain is the point: remove_identities would drop it
  session s(std::move(g), no_passes);
  std::atomic<bool> stop{true};  // raised before the run starts: nothing runs
  run_options opts;
  opts.cancel = &stop;
  EXPECT_THROW((void)s.run({{"x", host_tensor({1}, {1})}}, {last}, {}, nullptr, opts),
               cancelled_error);
  // From another thread, while runs are in flight: each run either finishes or is cancelled.
  std::atomic<bool> done{false};
  std::thread canceller([&] {
    while (!done.load()) {
      s.cancel();
      std::this_thread::yield();
    }
  });
  int cancelled = 0;
  for (int i = 0; i < 20; ++i) {
    try {
      auto out = s.run({{"x", host_tensor({1}, {2})}}, {last});
      EXPECT_EQ(out[0].span<float>()[0], 2.0f);
    } catch (const cancelled_error&) {
      ++cancelled;
    }
  }
  done = true;
  canceller.join();
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(s.run({{"x", host_tensor({1}, {3})}}, {last})[0].span<float>()[0], 3.0f);
}

TEST(Session, TraceRecordsEveryNode) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  auto y = ops::identity(x, {.name = "y"});
  ops::identity(y, {.name = "z"});
  session_options no_passes;
  no_passes.passes.enabled = false;  // both identities must run to be traced
  session s(std::move(g), no_passes);
  run_metadata md;
  run_options opts;
  opts.trace = true;
  (void)s.run({{"x", host_tensor({2}, {1, 2})}}, {"z"}, {}, &md, opts);
  ASSERT_EQ(md.nodes.size(), 2u);
  EXPECT_EQ(md.nodes[0].device, "/device:CPU:0");
  const std::string trace = md.chrome_trace();
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("\"ph\":\"X\""), std::string::npos);
  EXPECT_NE(trace.find("\"z\""), std::string::npos);
}

}  // namespace
}  // namespace loom
