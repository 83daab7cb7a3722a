// The executor with real kernels: in-place buffer forwarding, buffers returned as soon as
// their last consumer is done, independent branches, errors stopping a run with the node's
// name, and a serialized chain through the session.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "loom/device/cpu_device.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/run_metadata.hpp"
#include "loom/runtime/session.hpp"
#include "runtime/runtime_test_support.hpp"

namespace loom {
namespace {

using memory::host_tensor;

std::vector<float> iota(std::size_t n, float start = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

session_options on(testing::tracked_devices& d) {
  session_options o;
  o.factories = &d.registry;
  return o;
}

TEST(Executor, ElementwiseChainsRunInPlace) {
  testing::tracked_devices devices(1);
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {4096});
  output cur = ops::neg(x);  // reads the caller's feed: must allocate once
  for (int i = 0; i < 99; ++i) cur = (i % 2 == 0) ? ops::abs(cur) : ops::neg(cur);
  const std::string last = cur.name();
  session s(std::move(g), on(devices));
  const auto feed = host_tensor<float>({4096}, iota(4096, -2048));
  (void)s.run({{"x", feed}}, {last});
  auto& pool = devices.devices[0]->tracking();
  const auto before = pool.upstream().stats()->num_allocs;
  const auto out = s.run({{"x", feed}}, {last});
  const auto allocs = pool.upstream().stats()->num_allocs - before;
  // 100 element-wise nodes, one buffer: the first node allocates, the rest write in place.
  EXPECT_EQ(allocs, 1u);
  const auto v = out[0].span<float>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], std::fabs(static_cast<float>(i) - 2048.0f)) << i;  // ends with abs
  }
  // The feed was never written.
  EXPECT_EQ(feed.span<float>()[0], -2048.0f);
}

TEST(Executor, RepeatedRunsReuseTheirRunBuffersAndHoldNothingBetweenRuns) {
  // A run takes its slots from the plan's cache and gives them back (Note [buffer
  // forwarding]); whatever a run fetched, fed or computed must not stay alive in them.
  testing::tracked_devices devices(1);
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {64});
  auto y = ops::placeholder(b, "y", dtype::f32, {shape::unknown});  // checked at run time
  auto h = ops::exp(x * 0.5, {.name = "h"});  // fetched and read by the next node
  auto z = ops::add(h, y, {.name = "z"});
  ops::neg(z, {.name = "unfetched"});
  session s(std::move(g), on(devices));
  for (int rep = 0; rep < 5; ++rep) {
    const float shift = static_cast<float>(rep);
    const auto xv = host_tensor<float>({64}, iota(64, -32));
    const auto yv = host_tensor<float>({64}, std::vector<float>(64, shift));
    {
      // x is fetched as it was fed (a feed slot that is also a fetch slot).
      const auto out = s.run({{"x", xv}, {"y", yv}}, {"z", "h", "x"});
      const auto zs = out[0].span<float>();
      const auto hs = out[1].span<float>();
      for (std::size_t i = 0; i < 64; ++i) {
        const float want_h = std::exp((static_cast<float>(i) - 32.0f) * 0.5f);
        ASSERT_FLOAT_EQ(hs[i], want_h) << i;
        ASSERT_FLOAT_EQ(zs[i], want_h + shift) << i;
      }
      EXPECT_EQ(out[2].buf().get(), xv.buf().get());
      // Only the two fetched results are live on the device.
      EXPECT_EQ(devices.outstanding_count(), 2u) << devices.devices[0]->tracking().leak_report();
    }
    EXPECT_EQ(devices.outstanding_count(), 0u) << devices.devices[0]->tracking().leak_report();
    // A run of the same plan that fails half-way (z's inputs do not broadcast, after h ran)
    // leaves nothing behind in the buffers either.
    const auto bad = host_tensor<float>({3}, {1.0f, 2.0f, 3.0f});
    EXPECT_THROW((void)s.run({{"x", xv}, {"y", bad}}, {"z", "h", "x"}), loom::node_error);
    EXPECT_EQ(devices.outstanding_count(), 0u) << devices.devices[0]->tracking().leak_report();
  }
  EXPECT_EQ(s.plan_count(), 1u);
}

TEST(Executor, NoForwardingIntoABufferSomeoneElseReads) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  auto y = ops::neg(x, {.name = "y"});
  auto z = ops::abs(y, {.name = "z"});  // y is also fetched: z may not overwrite it
  ops::add(y, z, {.name = "sum"});
  session s(std::move(g));
  const auto out = s.run({{"x", host_tensor({3}, {1, -2, 3})}}, {"y", "z", "sum"});
  EXPECT_EQ(std::vector<float>(out[0].span<float>().begin(), out[0].span<float>().end()),
            (std::vector<float>{-1, 2, -3}));
  EXPECT_EQ(std::vector<float>(out[1].span<float>().begin(), out[1].span<float>().end()),
            (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(std::vector<float>(out[2].span<float>().begin(), out[2].span<float>().end()),
            (std::vector<float>{0, 4, 0}));
}

// Note [constants bound with the plan]: a constant never runs (no trace record) and its value
// is there on every run; the element-wise chain reading it may not write into its buffer
// (three runs give the same answer and leave the constant's tensor as it was); a fetched
// constant comes back; a node reading constants alone is a root; a constant with a control
// input runs as a node.
TEST(Executor, ConstantsAreBoundWithThePlanAndNeverRun) {
  graph g;
  graph_builder b(g);
  const tensor value = host_tensor<float>({4}, {1, -2, 3, -4});
  auto c = ops::constant(b, value, {.name = "c"});
  auto y = ops::abs(ops::neg(c, {.name = "n"}), {.name = "y"});  // in place, were c's buffer free
  auto x = ops::placeholder(b, "x", dtype::f32, {4});
  ops::add(x, c, {.name = "sum"});
  auto late = ops::constant(b, host_tensor<float>({1}, {7}), {.name = "late"});
  g.add_control_input(late.ep().node, y.ep().node);  // runs after y
  ops::neg(late, {.name = "late_neg"});
  session_options o;
  o.passes.enabled = false;  // no folding: every node as written
  session s(std::move(g), o);
  for (int run = 0; run < 3; ++run) {
    run_metadata meta;
    run_options ro;
    ro.trace = true;
    const auto out = s.run({{"x", host_tensor<float>({4}, {10, 10, 10, 10})}}, {"y", "sum", "c", "late_neg"}, {},
                           &meta, ro);
    EXPECT_EQ(std::vector<float>(out[0].span<float>().begin(), out[0].span<float>().end()),
              (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(std::vector<float>(out[1].span<float>().begin(), out[1].span<float>().end()),
              (std::vector<float>{11, 8, 13, 6}));
    EXPECT_EQ(std::vector<float>(out[2].span<float>().begin(), out[2].span<float>().end()),
              (std::vector<float>{1, -2, 3, -4}));
    EXPECT_EQ(out[3].span<float>()[0], -7.0f);
    std::set<std::string> ran;
    for (const auto& n : meta.nodes) ran.insert(n.node);
    EXPECT_EQ(ran.count("c"), 0u) << "a constant ran";
    EXPECT_EQ(ran.count("late"), 1u) << "a constant with a control input did not run";
    EXPECT_EQ(ran.count("n"), 1u);
  }
  EXPECT_EQ(std::vector<float>(value.span<float>().begin(), value.span<float>().end()),
            (std::vector<float>{1, -2, 3, -4}));
}

TEST(Executor, IntermediateBuffersReturnWhenTheirLastConsumerIsDone) {
  testing::tracked_devices devices(1);
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1 << 16});
  // A ladder: each rung adds two fresh values; without early release, peak grows with depth.
  output cur = x;
  for (int i = 0; i < 32; ++i) cur = ops::add(ops::exp(cur * 0.0), ops::abs(cur));
  const std::string last = cur.name();
  session s(std::move(g), on(devices));
  const auto feed = host_tensor<float>({1 << 16}, std::vector<float>(1 << 16, 1.0f));
  const auto out = s.run({{"x", feed}}, {last});
  EXPECT_EQ(out[0].span<float>()[0], 33.0f);  // 1 + 32 × exp(0)
  const auto stats = *devices.devices[0]->tracking().upstream().stats();
  // A handful of live buffers of 256 KiB at any time, never one per node (96 of them).
  EXPECT_LE(stats.peak_bytes_in_use, std::size_t{8} * (1 << 18)) << to_string(stats);
}

TEST(Executor, AnErrorStopsTheRunNamingTheNodeAndLeavesTheSessionUsable) {
  testing::tracked_devices devices(1, 2);
  graph g;
  graph_builder b(g);
  auto a = ops::placeholder(b, "a", dtype::i32, {4});
  auto d = ops::placeholder(b, "d", dtype::i32, {4});
  auto q = ops::div(a, d, {.name = "quotient"});
  ops::add(q, q, {.name = "twice"});
  session s(std::move(g), on(devices));
  const auto ints = [](std::vector<std::int32_t> v) { return host_tensor<std::int32_t>({4}, v); };
  try {
    (void)s.run({{"a", ints({1, 2, 3, 4})}, {"d", ints({1, 0, 1, 1})}}, {"twice"});
    FAIL() << "expected node_error";
  } catch (const node_error& e) {
    EXPECT_EQ(e.node_name(), "quotient");
    EXPECT_EQ(e.op(), "div");
  }
  EXPECT_EQ(devices.outstanding_count(), 0u) << devices.devices[0]->tracking().leak_report();
  const auto out = s.run({{"a", ints({2, 4, 6, 8})}, {"d", ints({2, 2, 2, 2})}}, {"twice"});
  EXPECT_EQ(std::vector<std::int32_t>(out[0].span<std::int32_t>().begin(),
                                      out[0].span<std::int32_t>().end()),
            (std::vector<std::int32_t>{2, 4, 6, 8}));
}

TEST(Executor, WideGraphsRunOnManyThreadsAndAgree) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1 << 14});
  std::vector<output> branches;
  for (int i = 0; i < 16; ++i) branches.push_back(ops::exp(x * (static_cast<double>(i) * 1e-5)));
  output sum = branches[0];
  for (int i = 1; i < 16; ++i) sum = sum + branches[static_cast<std::size_t>(i)];
  const std::string last = sum.name();
  session_options o;
  o.devices.cpu_threads = 4;
  session s(std::move(g), o);
  const auto feed = host_tensor<float>({1 << 14}, iota(1 << 14, 0));
  for (int rep = 0; rep < 20; ++rep) {
    const auto out = s.run({{"x", feed}}, {last});
    const auto v = out[0].span<float>();
    for (std::size_t k : {std::size_t{0}, std::size_t{100}, std::size_t{16383}}) {
      double want = 0;
      for (int i = 0; i < 16; ++i) want += std::exp(static_cast<double>(k) * (i * 1e-5));
      ASSERT_NEAR(v[k], want, 1e-4 * want) << k;
    }
  }
}

TEST(Executor, TheCallerRunsScheduledNodesWhileItWaits) {
  // Note [caller helps]: with the device's only worker occupied, a run whose independent
  // branches go to the pool still finishes, on the caller's thread. (Small tensors: a
  // parallel_for would also run queued nodes while it waits, hiding a caller that sleeps.)
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {64});
  // t's four consumers become ready together: the thread that ran t runs one, and the
  // others go to the pool.
  auto t = x * 1e-2;
  output sum = ((ops::exp(t) + ops::tanh(t)) + ops::square(t)) + ops::abs(t);
  const std::string last = sum.name();
  session_options o;
  o.devices.cpu_threads = 2;
  session s(std::move(g), o);
  thread_pool* pool = s.devices().front()->pool();
  ASSERT_NE(pool, nullptr);
  ASSERT_EQ(pool->size(), 2);
  const auto feed = host_tensor<float>({64}, iota(64, 0));
  for (int rep = 0; rep < 5; ++rep) {
    // Hold the worker (for 30 s at most, so a caller that sleeps fails the test instead of
    // hanging it).
    std::atomic<bool> started{false};
    std::atomic<bool> release{false};
    std::atomic<bool> left{false};
    pool->schedule([&] {
      started = true;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!release.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      left = true;
    });
    while (!started.load()) std::this_thread::yield();
    run_metadata meta;
    run_options ro;
    ro.trace = true;
    const auto out = s.run({{"x", feed}}, {last}, {}, &meta, ro);
    EXPECT_FALSE(left.load()) << "the run waited for the occupied worker";
    release = true;
    while (!left.load()) std::this_thread::yield();
    std::set<int> threads;
    for (const auto& n : meta.nodes) threads.insert(n.thread);
    EXPECT_EQ(threads.size(), 1u) << "every node ran on the caller";
    for (std::size_t k : {std::size_t{0}, std::size_t{31}, std::size_t{63}}) {
      const double v = static_cast<double>(k) * 1e-2;
      const double want = std::exp(v) + std::tanh(v) + v * v + std::abs(v);
      ASSERT_NEAR(out[0].span<float>()[k], want, 1e-5 * want + 1e-6) << k;
    }
  }
}

// Test ops for Note [blocking nodes]: test_wait_for_flag(x) blocks until test_raise_flag(x)
// has run (for 30 s at most, then it fails, so an executor that runs both on one thread
// fails the test instead of hanging it); both pass x through.
std::atomic<bool> test_flag{false};

class wait_for_flag_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  [[nodiscard]] bool blocks() const noexcept override { return true; }
  void compute(kernel_context& ctx) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!test_flag.load()) {
      if (std::chrono::steady_clock::now() > deadline) ctx.fail("the flag was never raised");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ctx.set_output(0, ctx.input(0));
  }
};

class raise_flag_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    test_flag = true;
    ctx.set_output(0, ctx.input(0));
  }
};

void register_flag_ops() {
  static const bool once = [] {
    for (const char* name : {"test_wait_for_flag", "test_raise_flag"}) {
      op_def d;
      d.name = name;
      d.inputs = {{.name = "x", .type_attr = "T"}};
      d.outputs = {{.name = "y", .type_attr = "T"}};
      d.attrs = {{.name = "T", .type = attr_type::type}};
      d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
      d.is_stateful = true;
      op_registry::global().add(std::move(d));
    }
    kernel_registry::global().add(
        make_kernel_def<wait_for_flag_kernel>("test_wait_for_flag", device_type::cpu));
    kernel_registry::global().add(
        make_kernel_def<raise_flag_kernel>("test_raise_flag", device_type::cpu));
    return true;
  }();
  (void)once;
}

TEST(Executor, ABlockingNodeWaitsOffTheDevicesThreads) {
  // With one thread, a blocking node that ran on the device's thread would wait for a node
  // that only that thread can run. Both orders of the two roots, and 1 and 2 threads.
  register_flag_ops();
  for (const int threads : {1, 2}) {
    for (const bool wait_first : {true, false}) {
      graph g;
      graph_builder b(g);
      auto x = ops::placeholder(b, "x", dtype::f32, {8});
      auto t = ops::exp(x);
      output waited;
      output raised;
      if (wait_first) {
        waited = b.add1("test_wait_for_flag", {t});
        raised = b.add1("test_raise_flag", {ops::tanh(x)});
      } else {
        raised = b.add1("test_raise_flag", {ops::tanh(x)});
        waited = b.add1("test_wait_for_flag", {t});
      }
      // A consumer of the blocking node, computed once it is done.
      const std::string sum = ops::add(ops::neg(waited), raised).name();
      session_options o;
      o.devices.cpu_threads = threads;
      session s(std::move(g), o);
      const auto feed = host_tensor<float>({8}, iota(8, -4));
      test_flag = false;
      run_metadata meta;
      run_options ro;
      ro.trace = true;
      const auto out = s.run({{"x", feed}}, {sum}, {}, &meta, ro);
      for (std::size_t k = 0; k < 8; ++k) {
        const double v = static_cast<double>(k) - 4;
        ASSERT_NEAR(out[0].span<float>()[k], std::tanh(v) - std::exp(v), 1e-5) << k;
      }
      // The blocking node ran on a thread that no other node ran on.
      int blocking_thread = -1;
      for (const auto& n : meta.nodes) {
        if (n.op == "test_wait_for_flag") blocking_thread = n.thread;
      }
      ASSERT_GE(blocking_thread, 0);
      for (const auto& n : meta.nodes) {
        if (n.op != "test_wait_for_flag") {
          EXPECT_NE(n.thread, blocking_thread) << n.node;
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom
