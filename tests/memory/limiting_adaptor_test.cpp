// limiting_adaptor: exact limits on one thread, nested budgets, the budget never exceeded
// under threads, and the per-thread leases of Note [budget leases].
#include "loom/memory/limiting_adaptor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/statistics_adaptor.hpp"
#include "memory/test_upstreams.hpp"

namespace {

namespace lm = loom::memory;
using lm::testing::counting_upstream;
using lm::limiting_adaptor;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

#if defined(LOOM_ASAN) || defined(LOOM_TSAN)
constexpr int ops_per_thread = 4000;
#else
constexpr int ops_per_thread = 40000;
#endif

// Runs `allocate` and returns the out_of_memory it throws; fails the test if it does not.
template <class F>
loom::out_of_memory refusal(F allocate) {
  try {
    allocate();
  } catch (const loom::out_of_memory& e) {
    return e;
  }
  ADD_FAILURE() << "the request was not refused";
  return loom::out_of_memory("", 0, "");
}

TEST(LimitingAdaptor, OneThreadCanUseExactlyTheWholeBudget) {
  counting_upstream upstream;
  limiting_adaptor budget(upstream, 1 * MiB, "exact");
  ASSERT_EQ(budget.lease_quantum(), 1 * KiB);

  void* all = budget.allocate(1 * MiB);
  EXPECT_EQ(refusal([&] { (void)budget.allocate(1); }).refused_by(), "exact");
  budget.deallocate(all, 1 * MiB);

  // A small request leaves the thread a lease; a large one spends it first.
  void* small = budget.allocate(100);
  void* rest = budget.allocate(1 * MiB - 100);
  EXPECT_EQ(budget.used(), 1 * MiB);
  EXPECT_EQ(refusal([&] { (void)budget.allocate(1); }).requested_bytes(), 1u);
  budget.deallocate(rest, 1 * MiB - 100);
  budget.deallocate(small, 100);

  // Many requests within one quantum add up to the limit exactly, too.
  std::vector<void*> blocks;
  for (int i = 0; i < 1024; ++i) blocks.push_back(budget.allocate(1 * KiB));
  EXPECT_EQ(budget.used(), 1 * MiB);
  EXPECT_THROW((void)budget.allocate(1), loom::out_of_memory);
  for (void* p : blocks) budget.deallocate(p, 1 * KiB);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(upstream.peak.load(), 1 * MiB);
}

TEST(LimitingAdaptor, SmallBudgetsChargeEveryRequestExactly) {
  counting_upstream upstream;
  limiting_adaptor budget(upstream, 1000, "tiny");
  EXPECT_EQ(budget.lease_quantum(), 0u);
  void* p = budget.allocate(999);
  void* q = budget.allocate(1);
  EXPECT_THROW((void)budget.allocate(1), loom::out_of_memory);
  void* empty = budget.allocate(0);  // costs nothing
  EXPECT_EQ(budget.charged(), 1000u);
  budget.deallocate(p, 999);
  budget.deallocate(q, 1);
  budget.deallocate(empty, 0);
  EXPECT_EQ(budget.charged(), 0u);
}

// On one thread a request is refused exactly when it would take the bytes in use past the
// limit, whatever the mix of small and large requests.
TEST(LimitingAdaptor, RefusesExactlyWhatTheModelRefuses) {
  counting_upstream upstream;
  limiting_adaptor budget(upstream, 4 * MiB, "model");
  std::mt19937_64 rng(7);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t used = 0;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const std::size_t bytes = rng() % 4 == 0 ? rng() % (1 * MiB) : rng() % (8 * KiB);
      if (used + bytes <= budget.limit()) {
        live.emplace_back(budget.allocate(bytes), bytes);
        used += bytes;
      } else {
        EXPECT_THROW((void)budget.allocate(bytes), loom::out_of_memory) << used << " + " << bytes;
      }
    } else {
      const std::size_t k = rng() % live.size();
      budget.deallocate(live[k].first, live[k].second);
      used -= live[k].second;
      live[k] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(budget.used(), used);
    ASSERT_LE(budget.charged(), budget.limit());
  }
  for (const auto& [p, bytes] : live) budget.deallocate(p, bytes);
}

TEST(LimitingAdaptor, TheErrorNamesTheBudgetLimitRequestAndUseAndCarriesTheStats) {
  counting_upstream upstream;
  lm::statistics_adaptor stats(upstream);
  limiting_adaptor budget(stats, 1 * MiB, "session 7");
  void* p = budget.allocate(600 * KiB);
  const loom::out_of_memory e = refusal([&] { (void)budget.allocate(500 * KiB); });
  const std::string message = e.what();
  EXPECT_NE(message.find("'session 7'"), std::string::npos) << message;
  EXPECT_NE(message.find("512000 bytes"), std::string::npos) << message;   // the request
  EXPECT_NE(message.find("1048576 bytes"), std::string::npos) << message;  // the limit
  EXPECT_NE(message.find("614400 bytes (600.00 KiB) in use"), std::string::npos) << message;
  EXPECT_NE(message.find("upstream: in use 600.00 KiB"), std::string::npos) << message;
  EXPECT_EQ(e.refused_by(), "session 7");
  EXPECT_EQ(e.requested_bytes(), 500 * KiB);
  ASSERT_TRUE(e.stats().has_value());
  EXPECT_EQ(e.stats()->bytes_in_use, 600 * KiB);
  EXPECT_EQ(e.stats()->num_allocs, 1u);
  budget.deallocate(p, 600 * KiB);

  limiting_adaptor over_host(lm::host_resource::instance(), 1 * KiB, "no stats");
  EXPECT_FALSE(refusal([&] { (void)over_host.allocate(2 * KiB); }).stats().has_value());
}

TEST(LimitingAdaptor, RollsBackItsChargeWhenTheUpstreamFails) {
  counting_upstream upstream;
  limiting_adaptor budget(upstream, 1 * MiB, "rollback");
  upstream.refuse = true;
  EXPECT_EQ(refusal([&] { (void)budget.allocate(100); }).refused_by(), "counting");
  EXPECT_EQ(refusal([&] { (void)budget.allocate(512 * KiB); }).refused_by(), "counting");
  EXPECT_EQ(budget.used(), 0u);
  upstream.refuse = false;
  void* p = budget.allocate(1 * MiB);
  budget.deallocate(p, 1 * MiB);
}

TEST(LimitingAdaptor, NestedBudgetsChargeTheWholeChain) {
  counting_upstream upstream;
  limiting_adaptor process(upstream, 1 * MiB, "process");
  EXPECT_THROW(limiting_adaptor too_big(process, 2 * MiB, "too big"), loom::invalid_argument);
  limiting_adaptor a(process, 768 * KiB, "session a");
  limiting_adaptor b(process, 768 * KiB, "session b");
  limiting_adaptor component(b, 512 * KiB, "component");
  EXPECT_EQ(component.parent(), &b);
  EXPECT_EQ(b.parent(), &process);

  void* in_a = a.allocate(700 * KiB);
  EXPECT_EQ(process.used(), 700 * KiB);

  // The siblings share the parent: b may not take what a holds, and the parent says so.
  const loom::out_of_memory by_parent = refusal([&] { (void)b.allocate(400 * KiB); });
  EXPECT_EQ(by_parent.refused_by(), "process");
  EXPECT_NE(std::string(by_parent.what()).find("'process'"), std::string::npos);
  EXPECT_EQ(b.used(), 0u);  // rolled back
  EXPECT_EQ(refusal([&] { (void)component.allocate(400 * KiB); }).refused_by(), "process");
  EXPECT_EQ(component.used(), 0u);
  EXPECT_EQ(b.used(), 0u);

  // A child refuses before asking its parent.
  EXPECT_EQ(refusal([&] { (void)a.allocate(100 * KiB); }).refused_by(), "session a");
  EXPECT_EQ(refusal([&] { (void)component.allocate(600 * KiB); }).refused_by(), "component");
  EXPECT_EQ(process.used(), 700 * KiB);

  // Once a gives its block back, the others can use the room.
  a.deallocate(in_a, 700 * KiB);
  void* in_b = b.allocate(200 * KiB);
  void* in_component = component.allocate(400 * KiB);
  EXPECT_EQ(b.used(), 600 * KiB);
  EXPECT_EQ(process.used(), 600 * KiB);
  EXPECT_LE(upstream.peak.load(), 1 * MiB);
  component.deallocate(in_component, 400 * KiB);
  b.deallocate(in_b, 200 * KiB);
  EXPECT_EQ(process.used(), 0u);
}

TEST(LimitingAdaptor, SetLimitChecksTheParentAndLoweringOnlyRefusesNewRequests) {
  counting_upstream upstream;
  limiting_adaptor process(upstream, 1 * MiB, "process");
  limiting_adaptor session(process, 1 * MiB, "session");
  EXPECT_THROW(session.set_limit(1 * MiB + 1), loom::invalid_argument);

  void* p = session.allocate(800 * KiB);
  session.set_limit(512 * KiB);
  EXPECT_EQ(session.limit(), 512 * KiB);
  EXPECT_EQ(refusal([&] { (void)session.allocate(1); }).refused_by(), "session");
  session.deallocate(p, 800 * KiB);
  void* q = session.allocate(512 * KiB);
  EXPECT_THROW((void)session.allocate(1), loom::out_of_memory);
  session.deallocate(q, 512 * KiB);
  EXPECT_EQ(session.used(), 0u);
}

// Threads allocate through a budget far smaller than they would like; the upstream
// checks that it never holds more than the limit, and a monitor checks the budget.
TEST(LimitingAdaptor, ThreadsNeverTakeTheBudgetPastItsLimit) {
  counting_upstream upstream;
  constexpr std::size_t limit = 4 * MiB;
  limiting_adaptor budget(upstream, limit, "shared");
  ASSERT_EQ(budget.lease_quantum(), 4 * KiB);

  std::atomic<bool> done{false};
  std::atomic<int> over_limit{0};
  std::thread monitor([&] {
    while (!done.load()) {
      if (budget.charged() > limit || budget.used() > limit) ++over_limit;
      std::this_thread::yield();
    }
  });
  constexpr int threads = 4;
  std::vector<int> refusals(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < ops_per_thread; ++i) {
        if (live.size() < 64 && (live.empty() || rng() % 2 == 0)) {
          const std::size_t bytes = rng() % 8 == 0 ? rng() % (1 * MiB) : rng() % (16 * KiB);
          try {
            live.emplace_back(budget.allocate(bytes), bytes);
          } catch (const loom::out_of_memory&) {
            ++refusals[static_cast<std::size_t>(t)];
          }
        } else {
          const std::size_t k = rng() % live.size();
          budget.deallocate(live[k].first, live[k].second);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (const auto& [p, bytes] : live) budget.deallocate(p, bytes);
    });
  }
  for (std::thread& w : workers) w.join();
  done = true;
  monitor.join();

  EXPECT_EQ(over_limit.load(), 0);
  EXPECT_LE(upstream.peak.load(), limit);
  int total_refusals = 0;
  for (const int r : refusals) total_refusals += r;
  EXPECT_GT(total_refusals, 0);  // the budget was tight enough to matter
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(budget.charged(), 0u);  // every exited thread gave its lease back
  EXPECT_EQ(upstream.in_use.load(), 0u);
}

// Holds a thread with a lease until released.
class lease_holder {
 public:
  explicit lease_holder(limiting_adaptor& budget)
      : thread_([this, &budget] {
          budget.deallocate(budget.allocate(1), 1);  // leaves this thread a lease
          std::unique_lock lock(mutex_);
          leased_ = true;
          changed_.notify_all();
          changed_.wait(lock, [this] { return released_; });
        }) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return leased_; });
  }
  lease_holder(const lease_holder&) = delete;
  lease_holder& operator=(const lease_holder&) = delete;
  ~lease_holder() { release(); }

  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool leased_ = false;
  bool released_ = false;
  std::thread thread_;
};

TEST(LimitingAdaptor, ReportsOtherThreadsLeasesAndTakesThemBackWhenTheyExit) {
  counting_upstream upstream;
  limiting_adaptor budget(upstream, 1 * MiB, "leased");
  lease_holder other(budget);
  EXPECT_EQ(budget.charged(), budget.lease_quantum());
  EXPECT_EQ(budget.used(), 0u);

  const loom::out_of_memory e = refusal([&] { (void)budget.allocate(1 * MiB); });
  EXPECT_NE(std::string(e.what()).find("1024 bytes (1.00 KiB) leased to other threads"),
            std::string::npos)
      << e.what();

  other.release();
  EXPECT_EQ(budget.charged(), 0u);
  void* p = budget.allocate(1 * MiB);
  budget.deallocate(p, 1 * MiB);
}

// One thread uses more budgets in turn than its cache of recent ones holds, and makes
// and drops budgets as it goes; each keeps its own account.
TEST(LimitingAdaptor, ManyBudgetsOnOneThreadKeepTheirOwnAccounts) {
  counting_upstream upstream;
  constexpr std::size_t budgets = 7;
  std::mt19937_64 rng(11);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::unique_ptr<limiting_adaptor>> all;
    for (std::size_t b = 0; b < budgets; ++b) {
      all.push_back(
          std::make_unique<limiting_adaptor>(upstream, 1 * MiB, "budget " + std::to_string(b)));
    }
    std::vector<std::vector<std::pair<void*, std::size_t>>> live(budgets);
    std::vector<std::size_t> used(budgets, 0);
    for (int i = 0; i < 500; ++i) {
      const std::size_t b = rng() % budgets;
      if (live[b].empty() || rng() % 2 == 0) {
        const std::size_t bytes = rng() % (4 * KiB);
        if (used[b] + bytes > 1 * MiB) continue;
        live[b].emplace_back(all[b]->allocate(bytes), bytes);
        used[b] += bytes;
      } else {
        all[b]->deallocate(live[b].back().first, live[b].back().second);
        used[b] -= live[b].back().second;
        live[b].pop_back();
      }
      ASSERT_EQ(all[b]->used(), used[b]) << "budget " << b;
    }
    for (std::size_t b = 0; b < budgets; ++b) {
      for (const auto& [p, bytes] : live[b]) all[b]->deallocate(p, bytes);
    }
  }
  EXPECT_EQ(upstream.in_use.load(), 0u);
}

// A thread may outlive a budget it used, and use another one afterwards.
TEST(LimitingAdaptor, ThreadsAndBudgetsMayEndInEitherOrder) {
  counting_upstream upstream;
  auto first = std::make_unique<limiting_adaptor>(upstream, 1 * MiB, "first");
  std::mutex mutex;
  std::condition_variable changed;
  int stage = 0;
  std::thread user([&] {
    first->deallocate(first->allocate(100), 100);
    std::unique_lock lock(mutex);
    stage = 1;
    changed.notify_all();
    changed.wait(lock, [&] { return stage == 2; });
    limiting_adaptor second(upstream, 1 * MiB, "second");  // drops the entry for `first`
    second.deallocate(second.allocate(100), 100);
  });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return stage == 1; });
    first.reset();
    stage = 2;
  }
  changed.notify_all();
  user.join();
  EXPECT_EQ(upstream.in_use.load(), 0u);
}

}  // namespace
