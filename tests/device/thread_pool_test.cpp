// thread_pool: coverage of parallel_for, nesting, exceptions, scheduling from many threads,
// shutdown with queued work, thread indices. Runs under TSan (label `device`).
#include "loom/device/thread_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"

namespace {

using loom::thread_pool;

// Runs parallel_for(n, cost) and checks that the ranges are well formed and cover [0, n)
// exactly once; returns how many ranges there were.
std::int64_t check_cover(thread_pool& pool, std::int64_t n, double cost) {
  std::vector<std::atomic<int>> hits(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  std::atomic<std::int64_t> ranges{0};
  std::atomic<bool> bad_range{false};
  pool.parallel_for(n, cost, [&](std::int64_t begin, std::int64_t end) {
    if (begin < 0 || end > n || begin >= end) bad_range = true;
    ranges.fetch_add(1);
    for (std::int64_t i = begin; i < end && i >= 0 && i < n; ++i) {
      hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    }
  });
  EXPECT_FALSE(bad_range.load()) << "n=" << n << " cost=" << cost;
  for (std::int64_t i = 0; i < n; ++i) {
    if (hits[static_cast<std::size_t>(i)].load() != 1) {
      ADD_FAILURE() << "index " << i << " hit " << hits[static_cast<std::size_t>(i)].load()
                    << " times; n=" << n << " cost=" << cost;
      break;
    }
  }
  return ranges.load();
}

TEST(ThreadPool, RejectsFewerThanOneThread) {
  EXPECT_THROW(thread_pool(0), loom::invalid_argument);
  EXPECT_THROW(thread_pool(-3), loom::invalid_argument);
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 4}) {
    thread_pool pool(threads, "cover");
    EXPECT_EQ(pool.size(), threads);
    for (std::int64_t n : {0, 1, 2, 3, 7, 16, 17, 100, 1000, 4097}) {
      for (double cost : {0.0, -1.0, 1.0, 100.0, 5000.0, 20000.0, 1e6, 1e12}) {
        const std::int64_t ranges = check_cover(pool, n, cost);
        // Never more than size()*4 ranges, nor more than n; nothing for n == 0.
        EXPECT_LE(ranges, std::min<std::int64_t>(n, threads * 4)) << n << " " << cost;
        if (n > 0) {
          EXPECT_GE(ranges, 1);
        } else {
          EXPECT_EQ(ranges, 0);
        }
      }
    }
  }
}

TEST(ThreadPool, SplitsByCost) {
  thread_pool pool(4, "split");
  // Cheap work runs as one range on the caller.
  EXPECT_EQ(check_cover(pool, 1000, 1.0), 1);  // 1 µs in all
  EXPECT_EQ(check_cover(pool, 1, 1e9), 1);     // one item cannot be split
  // 1000 items of 100 ns = 100 µs: at most 5 ranges of 20 µs.
  const std::int64_t mid = check_cover(pool, 1000, 100.0);
  EXPECT_EQ(mid, 5);
  // Expensive work: size()*4 ranges.
  EXPECT_EQ(check_cover(pool, 1000, 1e6), 16);
  // NaN and infinities do not break the split.
  EXPECT_EQ(check_cover(pool, 100, std::numeric_limits<double>::quiet_NaN()), 1);
  EXPECT_EQ(check_cover(pool, 100, std::numeric_limits<double>::infinity()), 16);
}

TEST(ThreadPool, RunsInlineAgreesWithTheSplit) {
  // runs_inline (which kernel_context::parallel_for uses to skip the pool) says "one range"
  // exactly when parallel_for makes one range.
  thread_pool pool(4, "agree");
  const double costs[] = {0.0,
                          0.5,
                          1.0,
                          19.9,
                          20.0,
                          39.9,
                          40.0,
                          100.0,
                          1e6,
                          -1.0,
                          std::numeric_limits<double>::quiet_NaN()};
  for (const std::int64_t n : {1, 2, 3, 1000, 2000, 4000}) {
    for (const double cost : costs) {
      EXPECT_EQ(thread_pool::runs_inline(n, cost, pool.size()), check_cover(pool, n, cost) == 1)
          << "n " << n << ", cost " << cost;
    }
  }
  EXPECT_TRUE(thread_pool::runs_inline(1000000, 1e6, 1));
}

TEST(ThreadPool, InlineWhenSmallRunsOnTheCaller) {
  thread_pool pool(4, "inline");
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id ran_on;
  pool.parallel_for(10, 1.0, [&](std::int64_t b, std::int64_t e) {
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    ran_on = std::this_thread::get_id();
  });
  EXPECT_EQ(ran_on, me);
}

TEST(ThreadPool, ParallelForUsesSeveralThreads) {
  thread_pool pool(4, "spread");
  std::mutex m;
  std::set<std::thread::id> seen;
  // Ranges that wait for one another can only finish if they run at once.
  std::atomic<int> started{0};
  pool.parallel_for(4, 1e9, [&](std::int64_t, std::int64_t) {
    {
      const std::lock_guard<std::mutex> lock(m);
      seen.insert(std::this_thread::get_id());
    }
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  });
  EXPECT_GE(seen.size(), 2u);
}

TEST(ThreadPool, NestedParallelForFromWorkersDoesNotDeadlock) {
  for (int threads : {1, 2, 4}) {
    thread_pool pool(threads, "nested");
    constexpr std::int64_t outer = 16;
    constexpr std::int64_t inner = 64;
    std::vector<std::atomic<int>> hits(outer * inner);
    pool.parallel_for(outer, 1e6, [&](std::int64_t ob, std::int64_t oe) {
      for (std::int64_t o = ob; o < oe; ++o) {
        pool.parallel_for(inner, 1e6, [&, o](std::int64_t ib, std::int64_t ie) {
          for (std::int64_t i = ib; i < ie; ++i) {
            hits[static_cast<std::size_t>(o * inner + i)].fetch_add(1);
          }
        });
      }
    });
    for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  }
}

TEST(ThreadPool, NestedParallelForFromScheduledTasks) {
  thread_pool pool(3, "tasks");
  constexpr int tasks = 8;
  std::atomic<std::int64_t> sum{0};
  std::atomic<int> finished{0};
  for (int t = 0; t < tasks; ++t) {
    pool.schedule([&] {
      pool.parallel_for(1000, 1e5, [&](std::int64_t b, std::int64_t e) {
        std::int64_t s = 0;
        for (std::int64_t i = b; i < e; ++i) s += i;
        sum.fetch_add(s);
      });
      finished.fetch_add(1);
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (finished.load() < tasks && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(finished.load(), tasks);
  EXPECT_EQ(sum.load(), tasks * (999 * 1000 / 2));
}

TEST(ThreadPool, FirstExceptionPropagatesAfterRangesFinish) {
  for (int threads : {1, 2, 4}) {
    thread_pool pool(threads, "throw");
    std::atomic<int> running{0};
    try {
      pool.parallel_for(64, 1e6, [&](std::int64_t b, std::int64_t) {
        running.fetch_add(1);
        if (b == 0) {
          running.fetch_sub(1);
          throw std::runtime_error("range 0 failed");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        running.fetch_sub(1);
      });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "range 0 failed");
      // Every range had finished when parallel_for rethrew.
      EXPECT_EQ(running.load(), 0);
    }
    // The pool still works afterwards.
    EXPECT_EQ(check_cover(pool, 1000, 1e5), threads == 1 ? 1 : threads * 4);
  }
}

TEST(ThreadPool, ExceptionFromEveryRangeRethrowsOne) {
  thread_pool pool(4, "throw-all");
  EXPECT_THROW(pool.parallel_for(1000, 1e6,
                                 [](std::int64_t b, std::int64_t) {
                                   throw loom::invalid_argument("range " + std::to_string(b));
                                 }),
               loom::invalid_argument);
  // Inline path too.
  EXPECT_THROW(
      pool.parallel_for(3, 1.0, [](std::int64_t, std::int64_t) { throw std::logic_error("x"); }),
      std::logic_error);
}

TEST(ThreadPool, RangesNotStartedAfterAThrowAreSkipped) {
  thread_pool pool(2, "skip");
  std::atomic<int> calls{0};
  // 8 ranges; every call throws. A thread that has thrown starts no further range, so no
  // thread runs more than one.
  EXPECT_THROW(pool.parallel_for(64, 1e9,
                                 [&](std::int64_t, std::int64_t) {
                                   calls.fetch_add(1);
                                   std::this_thread::sleep_for(std::chrono::milliseconds(2));
                                   throw std::runtime_error("fail");
                                 }),
               std::runtime_error);
  EXPECT_GE(calls.load(), 1);
  EXPECT_LE(calls.load(), pool.size());
}

TEST(ThreadPool, ScheduleFromManyThreads) {
  thread_pool pool(4, "many");
  constexpr int producers = 8;
  constexpr int per_producer = 2000;
  std::atomic<int> count{0};
  std::atomic<std::int64_t> sum{0};
  {
    std::vector<std::thread> threads;
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&, p] {
        for (int i = 0; i < per_producer; ++i) {
          pool.schedule([&, v = p * per_producer + i] {
            sum.fetch_add(v, std::memory_order_relaxed);
            count.fetch_add(1, std::memory_order_release);
          });
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count.load(std::memory_order_acquire) < producers * per_producer &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  constexpr std::int64_t total = std::int64_t{producers} * per_producer;
  ASSERT_EQ(count.load(), total);
  EXPECT_EQ(sum.load(), total * (total - 1) / 2);
}

TEST(ThreadPool, ScheduledWorkRunsAfterIdlePeriods) {
  // Workers that went to sleep wake for new work (no lost wake-up).
  thread_pool pool(3, "sleepy");
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(round % 4 == 0 ? 5 : 0));
    std::atomic<int> done{0};
    for (int i = 0; i < 5; ++i) pool.schedule([&] { done.fetch_add(1); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (done.load() < 5 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_EQ(done.load(), 5) << "round " << round;
  }
}

// Holds the pool's only worker in a task until let_go() (or 30 s pass, so a broken pool
// fails the test instead of hanging it).
struct worker_hold {
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  std::atomic<bool> left{false};

  explicit worker_hold(thread_pool& pool) {
    pool.schedule([this] {
      started = true;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!release.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      left = true;
    });
    while (!started.load()) std::this_thread::yield();
  }
  worker_hold(const worker_hold&) = delete;
  worker_hold& operator=(const worker_hold&) = delete;
  ~worker_hold() { let_go(); }

  void let_go() {
    release = true;
    while (!left.load()) std::this_thread::yield();
  }
};

TEST(ThreadPool, RunUntilRunsQueuedWorkOnTheCaller) {
  thread_pool pool(2, "helper");
  worker_hold hold(pool);
  // The worker is busy, so only the caller, waiting in run_until, can run these.
  std::atomic<bool> done{false};
  std::atomic<int> ran{0};
  std::atomic<bool> elsewhere{false};
  const std::thread::id me = std::this_thread::get_id();
  for (int i = 0; i < 3; ++i) {
    pool.schedule([&] {
      if (std::this_thread::get_id() != me) elsewhere = true;
      if (ran.fetch_add(1) + 1 == 3) {
        pool.set_and_wake(done);
      }
    });
  }
  pool.run_until(done);
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(elsewhere.load());
  EXPECT_FALSE(hold.left.load());  // returned while the worker was still occupied
  hold.let_go();
  pool.run_until(done);  // already set: returns at once
}

TEST(ThreadPool, RunUntilWakesForLaterWorkAndForItsFlag) {
  thread_pool pool(2, "waiter");
  for (int round = 0; round < 10; ++round) {
    worker_hold hold(pool);
    std::atomic<bool> done{false};
    std::atomic<bool> on_caller{false};
    const std::thread::id me = std::this_thread::get_id();
    // Work arrives after the caller has gone to sleep in run_until: a sleeping waiter must
    // be woken for it, since the only worker is busy.
    std::thread late([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(round % 2 == 0 ? 5 : 0));
      pool.schedule([&] {
        on_caller = std::this_thread::get_id() == me;
        pool.set_and_wake(done);
      });
    });
    pool.run_until(done);
    late.join();
    EXPECT_TRUE(on_caller.load()) << round;
    hold.let_go();
    // A flag set from outside, with no work at all, wakes the waiter too.
    std::atomic<bool> flag{false};
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(round % 2 == 0 ? 5 : 0));
      pool.set_and_wake(flag);
    });
    pool.run_until(flag);
    setter.join();
  }
}

TEST(ThreadPool, AWaiterMayDestroyThePoolAsSoonAsItSeesItsFlag) {
  // A session.run whose last node ends on a thread outside the pool: the caller returns as
  // soon as it sees the flag and destroys the pool while the setter may still be waking it
  // (ThreadSanitizer reports any use of the pool after the destructor began).
  for (int round = 0; round < 200; ++round) {
    auto pool = std::make_unique<thread_pool>(2, "brief");
    std::atomic<bool> flag{false};
    std::thread setter([&flag, p = pool.get()] { p->set_and_wake(flag); });
    pool->run_until(flag);
    pool.reset();
    setter.join();
    EXPECT_TRUE(flag.load());
  }
}

TEST(ThreadPool, DestructionRunsQueuedWork) {
  for (int threads : {1, 2, 4}) {
    std::atomic<int> ran{0};
    std::atomic<int> chained{0};
    {
      thread_pool pool(threads, "drain");
      for (int i = 0; i < 200; ++i) {
        pool.schedule([&ran, &chained, &pool, i] {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          ran.fetch_add(1);
          // Work queued by queued work runs too.
          if (i % 10 == 0) pool.schedule([&chained] { chained.fetch_add(1); });
        });
      }
    }
    EXPECT_EQ(ran.load(), 200) << threads;
    EXPECT_EQ(chained.load(), 20) << threads;
  }
}

TEST(ThreadPool, SizeOnePoolRunsEverythingOnTheCaller) {
  thread_pool pool(1, "solo");
  EXPECT_EQ(pool.size(), 1);
  const std::thread::id me = std::this_thread::get_id();
  bool ran = false;
  pool.schedule([&] {
    ran = true;
    EXPECT_EQ(std::this_thread::get_id(), me);
  });
  EXPECT_TRUE(ran);  // schedule ran it before returning
  std::int64_t ranges = 0;
  pool.parallel_for(1000, 1e9, [&](std::int64_t b, std::int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 1000);
    ++ranges;
  });
  EXPECT_EQ(ranges, 1);
  EXPECT_EQ(pool.current_thread_index(), 0);
}

TEST(ThreadPool, CurrentThreadIndex) {
  thread_pool pool(4, "index");
  thread_pool other(2, "other");
  EXPECT_EQ(pool.current_thread_index(), 0);
  std::mutex m;
  std::set<int> indices;
  std::atomic<int> other_index_seen{-1};
  std::atomic<int> done{0};
  constexpr int tasks = 200;
  for (int i = 0; i < tasks; ++i) {
    pool.schedule([&] {
      const int idx = pool.current_thread_index();
      {
        const std::lock_guard<std::mutex> lock(m);
        indices.insert(idx);
      }
      // A worker of one pool is no worker of another.
      other_index_seen.store(other.current_thread_index());
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      done.fetch_add(1);
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done.load() < tasks && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(done.load(), tasks);
  const std::lock_guard<std::mutex> lock(m);
  ASSERT_FALSE(indices.empty());
  for (int idx : indices) {
    EXPECT_GE(idx, 1);
    EXPECT_LE(idx, 3);
  }
  EXPECT_EQ(other_index_seen.load(), 0);
}

TEST(ThreadPool, ScheduleRejectsEmptyFunction) {
  thread_pool pool(2, "empty");
  EXPECT_THROW(pool.schedule(std::function<void()>()), loom::invalid_argument);
}

TEST(ThreadPool, ManyConcurrentParallelFors) {
  thread_pool pool(4, "concurrent");
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 50; ++rep) {
        const std::int64_t n = 100 + c * 37 + rep;
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        pool.parallel_for(n, 1e5, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
        });
        for (auto& h : hits) {
          if (h.load() != 1) failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// A team (Note [a thread's team]) that splits [0, n) into `threads` ranges run in turn on
// the caller, counting its calls and the thread counts it was given.
std::atomic<int> g_team_calls{0};
std::atomic<int> g_team_threads{0};
void counting_team(int threads, std::int64_t n, double /*cost_per_item*/,
                   const std::function<void(std::int64_t, std::int64_t)>& fn) {
  g_team_calls.fetch_add(1);
  g_team_threads.store(threads);
  for (int part = 0; part < threads; ++part) fn(n * part / threads, n * (part + 1) / threads);
}

// Restores the calling thread's team when a test ends, whatever happened in it.
struct team_scope {
  explicit team_scope(thread_pool::team_runner team) { thread_pool::use_team_on_this_thread(team); }
  ~team_scope() { thread_pool::use_team_on_this_thread(nullptr); }
  team_scope(const team_scope&) = delete;
  team_scope& operator=(const team_scope&) = delete;
};

TEST(ThreadPool, ATeamRunsTheCallersSplitWorkAndCoversEveryIndexOnce) {
  thread_pool pool(3);
  g_team_calls = 0;
  const team_scope scope(&counting_team);
  EXPECT_GE(check_cover(pool, 1000, 1000.0), 2);
  EXPECT_EQ(g_team_calls.load(), 1);
  EXPECT_EQ(g_team_threads.load(), 3);  // the pool's size
  // Work too small to split stays inline and never reaches the team.
  EXPECT_EQ(check_cover(pool, 10, 1.0), 1);
  EXPECT_EQ(g_team_calls.load(), 1);
}

TEST(ThreadPool, ATeamRethrowsTheFirstExceptionAndSkipsLaterRanges) {
  thread_pool pool(4);
  const team_scope scope(&counting_team);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(1000, 1000.0,
                                 [&](std::int64_t, std::int64_t) {
                                   ran.fetch_add(1);
                                   throw std::runtime_error("range failed");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 1);  // counting_team runs the ranges in turn: the rest are skipped
}

TEST(ThreadPool, ThePoolsOwnWorkersSplitOnThePoolNotOnTheirTeam) {
  thread_pool pool(2);
  g_team_calls = 0;
  std::atomic<bool> done{false};
  std::atomic<bool> on_worker{false};
  std::atomic<std::int64_t> covered{0};
  pool.schedule([&] {
    // On the worker: a team registered here is not used for this pool's work.
    on_worker = pool.current_thread_index() > 0;
    thread_pool::use_team_on_this_thread(&counting_team);
    pool.parallel_for(1000, 1000.0, [&](std::int64_t b, std::int64_t e) { covered += e - b; });
    thread_pool::use_team_on_this_thread(nullptr);
    done = true;
  });
  // Not run_until: this thread must not take the task itself.
  while (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
  EXPECT_TRUE(on_worker.load());
  EXPECT_EQ(covered.load(), 1000);
  EXPECT_EQ(g_team_calls.load(), 0);
}

TEST(ThreadPool, WithoutATeamTheWorkersSplitAgain) {
  thread_pool pool(2);
  g_team_calls = 0;
  { const team_scope scope(&counting_team); }
  EXPECT_GE(check_cover(pool, 1000, 1000.0), 2);
  EXPECT_EQ(g_team_calls.load(), 0);
}

}  // namespace
