// The MPI communicator against references every rank computes for itself: each rank's
// tensors are a function of (rank, element), so every rank knows what every other rank
// sent. Run as one process (a world of one rank) and under `mpirun -np 2` and `-np 4`
// (tests/CMakeLists.txt): every rank runs every test, in the same order.
//
// Values are small integers wherever the reduction order could matter (MPI does not fix
// the order in which it combines ranks), so sums, products and their averages are exact in
// every dtype; one float test uses random values against a float64 sum with a tolerance.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "loom/core/half.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/tensor_allocation.hpp"




namespace loom::distributed {
namespace {

std::shared_ptr<communicator> w() { return world(); }

// Element i of rank r's tensor: a small integer in [-3, 3] (unsigned: [0, 6]; for prod 1, 2
// or -1, unsigned 1 or 2; bool: (r + i) % 3 == 0).
double value(int r, std::int64_t i, dtype t, reduce_op op) {
  const std::int64_t k = (static_cast<std::int64_t>(r) * 5 + i * 3) % 7;
  if (t == dtype::boolean) return (r + i) % 3 == 0 ? 1 : 0;
  if (op == reduce_op::prod) return k % 3 == 0 ? 1 : (k % 3 == 1 ? 2 : (t == dtype::u8 ? 1 : -1));
  return t == dtype::u8 ? static_cast<double>(k) : static_cast<double>(k - 3);
}

tensor make(dtype t, const shape& s) { return memory::host_tensor(t, s); }

void set(const tensor& x, std::int64_t i, double v) {
  switch (x.type()) {
    case dtype::f32: x.data<float>()[i] = static_cast<float>(v); break;
    case dtype::f64: x.data<double>()[i] = v; break;
    case dtype::f16: x.data<half>()[i] = half(static_cast<float>(v)); break;
    case dtype::bf16: x.data<bfloat16>()[i] = bfloat16(static_cast<float>(v)); break;
    case dtype::i32: x.data<std::int32_t>()[i] = static_cast<std::int32_t>(v); break;
    case dtype::i64: x.data<std::int64_t>()[i] = static_cast<std::int64_t>(v); break;
    case dtype::i8: x.data<std::int8_t>()[i] = static_cast<std::int8_t>(v); break;
    case dtype::u8: x.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(v); break;
    case dtype::boolean: x.data<bool>()[i] = v != 0; break;
  }
}

double get(const tensor& x, std::int64_t i) {
  switch (x.type()) {
    case dtype::f32: return x.data<float>()[i];
    case dtype::f64: return x.data<double>()[i];
    case dtype::f16: return static_cast<float>(x.data<half>()[i]);
    case dtype::bf16: return static_cast<float>(x.data<bfloat16>()[i]);
    case dtype::i32: return x.data<std::int32_t>()[i];
    case dtype::i64: return static_cast<double>(x.data<std::int64_t>()[i]);
    case dtype::i8: return x.data<std::int8_t>()[i];
    case dtype::u8: return x.data<std::uint8_t>()[i];
    case dtype::boolean: return x.data<bool>()[i] ? 1 : 0;
  }
  return 0;
}

tensor filled(dtype t, const shape& s, int r, reduce_op op) {
  tensor x = make(t, s);
  for (std::int64_t i = 0; i < x.num_elements(); ++i) set(x, i, value(r, i, t, op));
  return x;
}

// op over the ranks' element i, as the dtype holds it.
double expected(dtype t, reduce_op op, std::int64_t i, int size) {
  double acc = value(0, i, t, op);
  for (int r = 1; r < size; ++r) {
    const double v = value(r, i, t, op);
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg: acc += v; break;
      case reduce_op::max: acc = std::max(acc, v); break;
      case reduce_op::min: acc = std::min(acc, v); break;
      case reduce_op::prod: acc *= v; break;
    }
  }
  if (t == dtype::boolean) return acc != 0 ? 1 : 0;  // sum is "any", prod "all"
  if (op == reduce_op::avg) acc /= size;
  return acc;
}

constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32,
                                dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min,
                                 reduce_op::prod};
constexpr std::int64_t sizes[] = {1, 7, 1000, 65537};

bool is_float(dtype t) { return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16; }

TEST(Communicator, WorldHasARankAndASize) {
  const auto c = w();
  EXPECT_GE(c->size(), 1);
  EXPECT_GE(c->rank(), 0);
  EXPECT_LT(c->rank(), c->size());
  EXPECT_EQ(c->backend(), "mpi");
}

TEST(Communicator, AllReduceEveryDtypeOpAndSize) {
  const auto c = w();
  for (const dtype t : all_dtypes) {
    for (const reduce_op op : all_ops) {
      if (op == reduce_op::avg && !is_float(t)) continue;
      for (const std::int64_t n : sizes) {
        SCOPED_TRACE(fmt::format("{} {} n={}", to_string(t), to_string(op), n));
        const tensor in = filled(t, shape{n}, c->rank(), op);
        const tensor before = filled(t, shape{n}, c->rank(), op);
        const tensor out = make(t, shape{n});
        c->all_reduce(in, out, op)->wait();
        int bad = 0;
        for (std::int64_t i = 0; i < n && bad < 5; ++i) {
          const double want = expected(t, op, i, c->size());
          if (get(out, i) != want) {
            ADD_FAILURE() << "element " << i << ": " << get(out, i) << ", expected " << want;
            ++bad;
          }
        }
        // The input is untouched.
        ASSERT_EQ(std::memcmp(in.raw_data(), before.raw_data(), in.nbytes()), 0);
      }
    }
  }
}

TEST(Communicator, AllReduceInPlaceAndRandomFloatsAgainstFloat64) {
  const auto c = w();
  const std::int64_t n = 4099;
  tensor x = make(dtype::f32, shape{n});
  std::vector<double> want(static_cast<std::size_t>(n), 0.0);
  for (int r = 0; r < c->size(); ++r) {
    std::mt19937 rng(static_cast<unsigned>(100 + r));
    std::normal_distribution<float> d;
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = d(rng);
      want[static_cast<std::size_t>(i)] += v;
      if (r == c->rank()) x.data<float>()[i] = v;
    }
  }
  c->all_reduce(x, x, reduce_op::sum)->wait();
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(x.data<float>()[i], want[static_cast<std::size_t>(i)], 1e-5 * c->size()) << i;
  }
}

TEST(Communicator, BroadcastFromEveryRoot) {
  const auto c = w();
  for (const dtype t : all_dtypes) {
    for (int root = 0; root < c->size(); ++root) {
      const tensor x = filled(t, shape{3, 11}, c->rank(), reduce_op::sum);
      c->broadcast(x, root)->wait();
      for (std::int64_t i = 0; i < x.num_elements(); ++i) {
        ASSERT_EQ(get(x, i), get(filled(t, shape{3, 11}, root, reduce_op::sum), i))
            << to_string(t) << " root " << root << " element " << i;
      }
    }
  }
}

TEST(Communicator, AllGatherConcatenatesInRankOrder) {
  const auto c = w();
  for (const dtype t : all_dtypes) {
    const tensor in = filled(t, shape{3, 5}, c->rank(), reduce_op::sum);
    const tensor out = make(t, shape{3 * c->size(), 5});
    c->all_gather(in, out)->wait();
    for (int r = 0; r < c->size(); ++r) {
      const tensor theirs = filled(t, shape{3, 5}, r, reduce_op::sum);
      for (std::int64_t i = 0; i < 15; ++i) ASSERT_EQ(get(out, r * 15 + i), get(theirs, i)) << to_string(t);
    }
  }
}

TEST(Communicator, ReduceScatterGivesEachRankItsBlock) {
  const auto c = w();
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::i64, dtype::i32}) {
    for (const reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
      const std::int64_t block = 13;
      const tensor in = filled(t, shape{block * c->size()}, c->rank(), op);
      const tensor out = make(t, shape{block});
      c->reduce_scatter(in, out, op)->wait();
      for (std::int64_t i = 0; i < block; ++i) {
        ASSERT_EQ(get(out, i), expected(t, op, c->rank() * block + i, c->size()))
            << to_string(t) << " " << to_string(op) << " " << i;
      }
    }
  }
}

TEST(Communicator, SendAndReceiveAroundARing) {
  const auto c = w();
  const int next = (c->rank() + 1) % c->size();
  const int prev = (c->rank() + c->size() - 1) % c->size();
  const tensor mine = filled(dtype::f64, shape{257}, c->rank(), reduce_op::sum);
  const tensor got = make(dtype::f64, shape{257});
  auto r = c->recv(got, prev, 7);
  auto s = c->send(mine, next, 7);
  s->wait();
  r->wait();
  EXPECT_TRUE(r->test());
  for (std::int64_t i = 0; i < 257; ++i) ASSERT_EQ(get(got, i), value(prev, i, dtype::f64, reduce_op::sum));
}

TEST(Communicator, OperationsOverlapWithWorkAndBarrierCompletes) {
  const auto c = w();
  const tensor big = filled(dtype::f32, shape{1 << 20}, c->rank(), reduce_op::sum);
  auto op = c->all_reduce(big, big, reduce_op::sum);
  // Work between start and wait; test() may say either, wait() completes it.
  double s = 0;
  for (int i = 0; i < 100000; ++i) s += std::sqrt(static_cast<double>(i));
  EXPECT_GT(s, 0);
  (void)op->test();
  op->wait();
  EXPECT_TRUE(op->test());
  EXPECT_EQ(get(big, 5), expected(dtype::f32, reduce_op::sum, 5, c->size()));
  c->barrier()->wait();
}

// Nobody waits: the communicator's own thread runs it, and test() sees it done.
TEST(Communicator, ACollectiveNobodyWaitsForCompletesOnTheCommunicatorsThread) {
  const auto c = w();
  const tensor x = filled(dtype::i32, shape{1000}, c->rank(), reduce_op::sum);
  auto op = c->all_reduce(x, x, reduce_op::sum);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!op->test() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(op->test()) << "the all_reduce made no progress without wait()";
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(get(x, i), expected(dtype::i32, reduce_op::sum, i, c->size()));
}

// Started in one order on one thread, waited for in the reverse order on three: each completes
// with its own result (the queue runs them in the order they were started).
TEST(Communicator, CollectivesWaitedForOnOtherThreadsInAnotherOrderComplete) {
  const auto c = w();
  std::vector<tensor> xs;
  std::vector<std::unique_ptr<work>> ops;
  for (int k = 0; k < 3; ++k) {
    xs.push_back(filled(dtype::f64, shape{100 + 50 * k}, c->rank() + k, reduce_op::max));
    ops.push_back(c->all_reduce(xs.back(), xs.back(), reduce_op::max));
  }
  std::vector<std::thread> waiters;
  for (int k = 2; k >= 0; --k) waiters.emplace_back([&, k] { ops[static_cast<std::size_t>(k)]->wait(); });
  for (auto& t : waiters) t.join();
  for (int k = 0; k < 3; ++k) {
    for (std::int64_t i = 0; i < xs[static_cast<std::size_t>(k)].num_elements(); ++i) {
      double want = value(k, i, dtype::f64, reduce_op::max);
      for (int r = 1; r < c->size(); ++r) want = std::max(want, value(r + k, i, dtype::f64, reduce_op::max));
      ASSERT_EQ(get(xs[static_cast<std::size_t>(k)], i), want) << "collective " << k << ", element " << i;
    }
  }
}

// Unchecked (set_checked(false)): the same results, sub-groups inherit it, and what one rank
// can see wrong is still refused before anything starts.
TEST(Communicator, AnUncheckedCommunicatorGivesTheSameResults) {
  const auto c = w()->split(0, w()->rank());
  c->set_checked(false);
  const auto sub = c->split(0, c->rank());
  EXPECT_FALSE(sub->checked());
  for (const dtype t : {dtype::f32, dtype::i64, dtype::bf16}) {
    const tensor x = filled(t, shape{33}, sub->rank(), reduce_op::sum);
    sub->all_reduce(x, x, reduce_op::sum)->wait();
    for (std::int64_t i = 0; i < 33; ++i) ASSERT_EQ(get(x, i), expected(t, reduce_op::sum, i, sub->size())) << to_string(t);
  }
  const tensor b = filled(dtype::f32, shape{5}, sub->rank(), reduce_op::sum);
  sub->broadcast(b, sub->size() - 1)->wait();
  for (std::int64_t i = 0; i < 5; ++i) ASSERT_EQ(get(b, i), value(sub->size() - 1, i, dtype::f32, reduce_op::sum));
  EXPECT_THROW((void)sub->all_reduce(b, make(dtype::f32, shape{6}), reduce_op::sum), distributed_error);
  sub->barrier()->wait();
  EXPECT_TRUE(w()->checked());
}

TEST(Communicator, SplitMakesSubGroups) {
  const auto c = w();
  const int color = c->rank() % 2;
  const auto sub = c->split(color, -c->rank());  // reversed order inside each group
  const int members = (c->size() + 1 - color) / 2;
  ASSERT_EQ(sub->size(), members);
  // Keys are -rank: the highest world rank of the group is sub-rank 0.
  EXPECT_EQ(sub->rank(), members - 1 - (c->rank() - color) / 2);
  tensor x = make(dtype::i64, shape{1});
  x.data<std::int64_t>()[0] = c->rank();
  sub->all_reduce(x, x, reduce_op::sum)->wait();
  std::int64_t want = 0;
  for (int r = color; r < c->size(); r += 2) want += r;
  EXPECT_EQ(x.data<std::int64_t>()[0], want);
}

TEST(Communicator, BadCallsAreTypedErrorsAndStartNothing) {
  const auto c = w();
  const tensor i32 = make(dtype::i32, shape{4});
  try {
    (void)c->all_reduce(i32, i32, reduce_op::avg);
    FAIL() << "avg of int32 was accepted";
  } catch (const distributed_error& e) {
    EXPECT_EQ(e.rank(), c->rank());
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {} of {}", c->rank(), c->size())), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("avg needs a floating-point dtype"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)c->all_reduce(make(dtype::f32, shape{4}), make(dtype::f32, shape{5}), reduce_op::sum),
               distributed_error);
  EXPECT_THROW((void)c->broadcast(make(dtype::f32, shape{4}), c->size()), distributed_error);
  EXPECT_THROW((void)c->all_gather(make(dtype::f32, shape{4}), make(dtype::f32, shape{4 * c->size() + 1})),
               distributed_error);
  EXPECT_THROW((void)c->reduce_scatter(make(dtype::f32, shape{3 * c->size() + 1}), make(dtype::f32, shape{3}),
                                       reduce_op::sum),
               distributed_error);
  EXPECT_THROW((void)c->send(make(dtype::f32, shape{2}), 0, -1), invalid_argument);
  EXPECT_THROW((void)c->recv(make(dtype::f32, shape{2}), -1, 0), distributed_error);
  EXPECT_THROW((void)reduce_op_from_string("mean"), invalid_argument);
  EXPECT_EQ(reduce_op_from_string("max"), reduce_op::max);
  // A view that is not dense.
  const tensor m = make(dtype::f32, shape{4, 4});
  const tensor col = tensor::strided(m.buf(), dtype::f32, shape{4}, shape{4}, 0);
  EXPECT_THROW((void)c->all_reduce(col, col, reduce_op::sum), distributed_error);
  // The communicator still works.
  tensor one = make(dtype::f32, shape{1});
  one.data<float>()[0] = 1;
  c->all_reduce(one, one, reduce_op::sum)->wait();
  EXPECT_EQ(one.data<float>()[0], static_cast<float>(c->size()));
}

// Note [agreeing ranks]: every rank fails, naming what each rank asked for, and goes on.
TEST(Communicator, RanksThatDisagreeAllFailAndTheCommunicatorGoesOn) {
  const auto c = w();
  if (c->size() < 2) GTEST_SKIP() << "needs two ranks (mpirun -np 2)";
  const tensor x = make(dtype::f32, shape{c->rank() == 0 ? 4 : 5});
  try {
    c->all_reduce(x, x, reduce_op::sum)->wait();
    FAIL() << "an all_reduce of 4 and 5 elements completed";
  } catch (const distributed_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("rank {} of {}: all_reduce (sum)", c->rank(), c->size())), std::string::npos) << m;
    EXPECT_NE(m.find("the ranks disagree: rank 0 all_reduce (sum) of 4 float32 elements; "
                     "rank 1 all_reduce (sum) of 5 float32 elements"),
              std::string::npos)
        << m;
  }
  try {
    c->rank() == 0 ? c->barrier()->wait() : c->broadcast(x, 0)->wait();
    FAIL() << "a barrier met a broadcast";
  } catch (const distributed_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 barrier; rank 1 broadcast of 5 float32 elements from rank 0"),
              std::string::npos)
        << e.what();
  }
  tensor one = make(dtype::f32, shape{1});
  one.data<float>()[0] = 1;
  c->all_reduce(one, one, reduce_op::sum)->wait();
  EXPECT_EQ(one.data<float>()[0], static_cast<float>(c->size()));
}

// Last: rank 0 waits on a collective rank 1 joins only after rank 0's timeout.
TEST(Communicator, AnOperationARankDoesNotJoinTimesOutWithTheRankNamed) {
  const auto c = w();
  if (c->size() < 2) GTEST_SKIP() << "needs two ranks (mpirun -np 2)";
  const auto sub = c->split(0, c->rank());
  sub->set_timeout(std::chrono::milliseconds(300));
  tensor x = make(dtype::f32, shape{8});
  if (c->rank() == 0) {
    auto op = sub->all_reduce(x, x, reduce_op::sum);
    try {
      op->wait();
      FAIL() << "the all_reduce completed without rank 1";
    } catch (const distributed_error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 of"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("timed out after 300 ms"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)sub->barrier(), distributed_error);  // the communicator is unusable
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    sub->set_timeout(std::chrono::seconds(60));
    sub->all_reduce(x, x, reduce_op::sum)->wait();  // rank 0's abandoned request completes it
  }
  c->barrier()->wait();
}

}  // namespace
}  // namespace loom::distributed
