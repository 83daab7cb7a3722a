// The collective ops in graphs (include/loom/graph/ops/collective.hpp), run by sessions on
// every rank: results against what every rank can compute for itself, the order of
// independent collectives on several threads, and the errors. Run as one process and under
// mpirun -np 2 / -np 4 (tests/CMakeLists.txt).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

#include "loom/distributed/communicator.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/collective.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using memory::host_tensor;

int rank() { return distributed::world()->rank(); }
int size() { return distributed::world()->size(); }

// Rank r's feed: [rows, 3] with element (i, j) = 100 r + 10 i + j.
tensor feed_of(int r, std::int64_t rows) {
  std::vector<float> v;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 3; ++j) v.push_back(static_cast<float>(100 * r + 10 * i + j));
  }
  return host_tensor(shape{rows, 3}, v);
}

std::vector<float> floats(const tensor& t) {
  auto s = t.span<float>();
  return {s.begin(), s.end()};
}

TEST(CollectiveOps, EveryCollectiveInOneGraph) {
  const int n = size();
  const std::int64_t rows = 2 * n;
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {rows, 3});
  ops::all_reduce(x, "sum", "world", {.name = "sum"});
  ops::all_reduce(x, "max", "world", {.name = "max"});
  ops::all_reduce(x, "avg", "world", {.name = "avg"});
  ops::broadcast(x, n - 1, "world", {.name = "bcast"});
  auto gathered = ops::all_gather(x, n, "world", {.name = "gather"});
  ASSERT_EQ(to_string(*gathered.type().shape), to_string(shape{rows * n, 3}));
  auto scattered = ops::reduce_scatter(x, "sum", n, "world", {.name = "scatter"});
  ASSERT_EQ(to_string(*scattered.type().shape), to_string(shape{2, 3}));
  session s(std::move(g));
  for (int run = 0; run < 3; ++run) {  // plans are cached; collectives run every time
    const auto out = s.run({{"x", feed_of(rank(), rows)}}, {"sum", "max", "avg", "bcast", "gather", "scatter"});
    std::vector<float> sum(static_cast<std::size_t>(rows * 3), 0.0F);
    std::vector<float> mx(sum.size(), -1e30F);
    std::vector<float> gather;
    for (int r = 0; r < n; ++r) {
      const auto f = floats(feed_of(r, rows));
      for (std::size_t k = 0; k < f.size(); ++k) {
        sum[k] += f[k];
        mx[k] = std::max(mx[k], f[k]);
      }
      gather.insert(gather.end(), f.begin(), f.end());
    }
    EXPECT_EQ(floats(out[0]), sum);
    EXPECT_EQ(floats(out[1]), mx);
    for (std::size_t k = 0; k < sum.size(); ++k) EXPECT_EQ(floats(out[2])[k], sum[k] / static_cast<float>(n));
    EXPECT_EQ(floats(out[3]), floats(feed_of(n - 1, rows)));
    EXPECT_EQ(floats(out[4]), gather);
    const std::vector<float> mine(sum.begin() + rank() * 6, sum.begin() + rank() * 6 + 6);
    EXPECT_EQ(floats(out[5]), mine);
  }
}

// Eight independent all_reduces on two threads: without the builders' order (Note
// [collective order]) ranks could start them in different orders and mix the sums up.
TEST(CollectiveOps, IndependentCollectivesKeepOneOrderOnEveryRank) {
  graph g;
  graph_builder b(g);
  std::vector<std::string> fetches;
  for (int k = 0; k < 8; ++k) {
    auto x = ops::placeholder(b, fmt::format("x{}", k), dtype::f32, {64});
    auto y = ops::mul(x, x);  // some work before each, so that they become ready in any order
    ops::all_reduce(y, "sum", "world", {.name = fmt::format("r{}", k)});
    fetches.push_back(fmt::format("r{}", k));
  }
  session_options so;
  so.devices.cpu_threads = 2;
  session s(std::move(g), so);
  std::vector<feed> feeds;
  for (int k = 0; k < 8; ++k) {
    feeds.emplace_back(fmt::format("x{}", k), host_tensor(shape{64}, std::vector<float>(64, static_cast<float>(k + rank()))));
  }
  for (int run = 0; run < 5; ++run) {
    const auto out = s.run(feeds, fetches);
    for (int k = 0; k < 8; ++k) {
      float want = 0;
      for (int r = 0; r < size(); ++r) want += static_cast<float>((k + r) * (k + r));
      EXPECT_EQ(floats(out[static_cast<std::size_t>(k)])[17], want) << "r" << k;
    }
  }
}

TEST(CollectiveOps, SubGroupsByNameAndErrorsNameTheNode) {
  const auto world = distributed::world();
  distributed::register_group("halves", world->split(rank() % 2, rank()));
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::i64, {1});
  ops::all_reduce(x, "sum", "halves", {.name = "half_sum"});
  ops::all_reduce(x, "sum", "nobody", {.name = "lost"});
  session s(std::move(g));
  const auto out = s.run({{"x", host_tensor(shape{1}, std::vector<std::int64_t>{rank()})}}, {"half_sum"});
  std::int64_t want = 0;
  for (int r = rank() % 2; r < size(); r += 2) want += r;
  EXPECT_EQ(out[0].data<std::int64_t>()[0], want);
  try {
    (void)s.run({{"x", host_tensor(shape{1}, std::vector<std::int64_t>{1})}}, {"lost"});
    FAIL() << "a group nobody registered ran";
  } catch (const node_error& e) {
    EXPECT_EQ(e.node_name(), "lost");
    EXPECT_NE(std::string(e.what()).find("no communicator registered as group 'nobody'"), std::string::npos) << e.what();
  }
  // Bad attributes fail where the node is added.
  graph g2;
  graph_builder b2(g2);
  auto i = ops::placeholder(b2, "i", dtype::i32, {4});
  EXPECT_THROW(ops::all_reduce(i, "mean"), invalid_argument);
  EXPECT_THROW(ops::all_reduce(i, "avg"), invalid_argument);
  EXPECT_THROW(ops::reduce_scatter(ops::placeholder(b2, "j", dtype::f32, {5}), "sum", 2), invalid_argument);
  // The session goes on.
  const auto again = s.run({{"x", host_tensor(shape{1}, std::vector<std::int64_t>{rank()})}}, {"half_sum"});
  EXPECT_EQ(again[0].data<std::int64_t>()[0], want);
}

TEST(CollectiveOps, RanksThatDisagreeFailWithADistributedErrorNamingTheNode) {
  // Rank r all-reduces r + 1 elements: every rank fails, with the node and its rank named,
  // and the session and the communicator go on.
  if (size() < 2) GTEST_SKIP() << "needs two ranks (mpirun -np 2)";
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {shape::unknown});
  ops::all_reduce(x, "sum", "world", {.name = "uneven"});
  session s(std::move(g));
  try {
    (void)s.run({{"x", host_tensor(shape{rank() + 1}, std::vector<float>(rank() + 1, 1.0F))}},
                {"uneven"});
    FAIL() << "ranks of other shapes were reduced";
  } catch (const distributed_error& e) {
    EXPECT_EQ(e.rank(), rank());
    EXPECT_NE(std::string(e.what()).find("node 'uneven' (all_reduce)"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {} of {}", rank(), size())),
              std::string::npos)
        << e.what();
  }
  const auto out = s.run({{"x", host_tensor(shape{2}, std::vector<float>{1.0F, 2.0F})}}, {"uneven"});
  EXPECT_EQ(floats(out[0]), (std::vector<float>{1.0F * size(), 2.0F * size()}));
}

// Rank r weighs its y by r + 1, so d(its loss)/d(my x) summed over the ranks' losses is
// 1 + 2 + ... + n for every element: what the collectives' gradients must give.
TEST(CollectiveOps, GradientsAreCollectivesOfTheGradients) {
  const int n = size();
  const float want = static_cast<float>(n * (n + 1)) / 2;
  for (const std::string op : {"all_reduce", "all_gather"}) {
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, {2 * n, 3});
    auto y = op == "all_reduce" ? ops::all_reduce(x, "sum") : ops::all_gather(x, n);
    auto w = ops::placeholder(b, "w", dtype::f32, {});
    auto loss = ops::reduce_sum(ops::mul(y, w));
    const std::string dx = gradients(loss, {x})[0].name();
    session s(std::move(g));
    const auto out = s.run({{"x", feed_of(rank(), 2 * n)},
                            {"w", host_tensor(shape{}, std::vector<float>{static_cast<float>(rank() + 1)})}},
                           {dx});
    for (const float v : floats(out[0])) ASSERT_EQ(v, want) << op;
  }
  // reduce_scatter: my x's block k reaches rank k alone, weighted k + 1.
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2 * n, 3});
  auto w = ops::placeholder(b, "w", dtype::f32, {});
  auto loss = ops::reduce_sum(ops::mul(ops::reduce_scatter(x, "sum", n), w));
  const std::string dx = gradients(loss, {x})[0].name();
  session s(std::move(g));
  const auto out = s.run({{"x", feed_of(rank(), 2 * n)},
                          {"w", host_tensor(shape{}, std::vector<float>{static_cast<float>(rank() + 1)})}},
                         {dx});
  const auto d = floats(out[0]);
  for (std::size_t k = 0; k < d.size(); ++k) ASSERT_EQ(d[k], static_cast<float>(k / 6 + 1)) << k;
  // max has no gradient: a typed error naming the node.
  graph g2;
  graph_builder b2(g2);
  auto x2 = ops::placeholder(b2, "x", dtype::f32, {4});
  auto m = ops::all_reduce(x2, "max", "world", {.name = "peak"});
  EXPECT_THROW((void)gradients(ops::reduce_sum(m), {x2}), invalid_argument);
}

}  // namespace
}  // namespace loom
