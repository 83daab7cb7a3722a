// The contract of memory_resource (loom/memory/memory_resource.hpp), checked the same way
// for every resource and adaptor: the host resource, BFC pools in three configurations,
// each adaptor over a pool and over the host resource, and the full stack
// statistics -> limiting -> tracking -> logging -> bfc_pool -> host.
//
// After each test, every layer of the stack must be back where it started: pools pass
// their invariant check, the tracking adaptor holds nothing, the statistics adaptor and
// the budget count nothing in use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/limiting_adaptor.hpp"
#include "loom/memory/logging_adaptor.hpp"
#include "loom/memory/statistics_adaptor.hpp"
#include "loom/memory/tracking_adaptor.hpp"

// The huge-size test asks the C library for 2^62 bytes; the sanitizers' allocators must
// answer that with nullptr, as glibc does, rather than stop the program.
#if defined(LOOM_ASAN)
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}
#endif
#if defined(LOOM_TSAN)
extern "C" const char* __tsan_default_options() {
  return "allocator_may_return_null=1";
}
#endif

namespace {

namespace lm = loom::memory;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

#if defined(LOOM_ASAN) || defined(LOOM_TSAN)
constexpr int stress_ops_per_thread = 4000;
#else
constexpr int stress_ops_per_thread = 40000;
#endif

// A resource with everything beneath it, destroyed top first; `checks` state what each
// layer must look like once every block has been given back.
struct resource_stack {
  std::ostringstream log;  // what logging adaptors write; outlives them
  std::vector<std::unique_ptr<lm::memory_resource>> layers;  // bottom first
  std::vector<std::function<void()>> checks;

  resource_stack() = default;
  resource_stack(const resource_stack&) = delete;
  resource_stack& operator=(const resource_stack&) = delete;
  ~resource_stack() {
    while (!layers.empty()) layers.pop_back();
  }

  lm::memory_resource& top() {
    return layers.empty() ? lm::host_resource::instance() : *layers.back();
  }

  // Puts an R over the current top, built from (top(), args...).
  template <class R, class... Args>
  R& push(Args&&... args) {
    auto layer = std::make_unique<R>(top(), std::forward<Args>(args)...);
    R& r = *layer;
    layers.push_back(std::move(layer));
    return r;
  }

  void push_pool(lm::bfc_pool_options options) {
    auto& pool = push<lm::bfc_pool>(std::move(options));
    checks.emplace_back([&pool] {
      EXPECT_NO_THROW(pool.check_invariants());
      EXPECT_EQ(pool.get_stats().allocations_in_use, 0u);
    });
  }
  void push_statistics() {
    auto& stats = push<lm::statistics_adaptor>();
    checks.emplace_back([&stats] {
      const loom::memory_stats s = stats.get_stats();
      EXPECT_EQ(s.bytes_in_use, 0u);
      EXPECT_EQ(s.allocations_in_use, 0u);
      EXPECT_EQ(s.num_allocs, s.num_deallocs);
    });
  }
  void push_limiting(std::size_t limit) {
    auto& budget = push<lm::limiting_adaptor>(limit, "conformance budget");
    checks.emplace_back([&budget] { EXPECT_EQ(budget.used(), 0u); });
  }
  void push_tracking() {
    auto& tracker = push<lm::tracking_adaptor>(lm::tracking_options{});
    checks.emplace_back([&tracker] { EXPECT_EQ(tracker.outstanding_count(), 0u); });
  }
  void push_logging() { push<lm::logging_adaptor>(log); }
};

lm::bfc_pool_options pool_options(std::string name, std::size_t initial_size,
                                  std::size_t growth_step, std::size_t granularity) {
  lm::bfc_pool_options options;
  options.name = std::move(name);
  options.initial_size = initial_size;
  options.growth_step = growth_step;
  options.granularity = granularity;
  return options;
}
lm::bfc_pool_options growing_pool() {
  return pool_options("growing", 0, 1 * MiB, 256);
}
lm::bfc_pool_options fixed_pool() {
  return pool_options("fixed", 64 * MiB, 0, 256);
}
lm::bfc_pool_options fine_pool() {
  return pool_options("fine", 0, 1 * MiB, 64);
}

struct config {
  std::string name;
  std::function<void(resource_stack&)> build;
};

// Every resource the suite runs against.
std::vector<config> configs() {
  std::vector<config> out = {
      {"host", [](resource_stack&) {}},
      {"bfc_growing", [](resource_stack& s) { s.push_pool(growing_pool()); }},
      {"bfc_fixed", [](resource_stack& s) { s.push_pool(fixed_pool()); }},
      {"bfc_small_granularity", [](resource_stack& s) { s.push_pool(fine_pool()); }},
      {"full_stack",
       [](resource_stack& s) {
         s.push_pool(growing_pool());
         s.push_logging();
         s.push_tracking();
         s.push_limiting(std::size_t{1} << 30);
         s.push_statistics();
       }},
  };
  const std::vector<config> adaptors = {
      {"statistics", [](resource_stack& s) { s.push_statistics(); }},
      {"tracking", [](resource_stack& s) { s.push_tracking(); }},
      {"limiting", [](resource_stack& s) { s.push_limiting(std::size_t{1} << 30); }},
      {"logging", [](resource_stack& s) { s.push_logging(); }},
  };
  for (const config& a : adaptors) {
    out.push_back({a.name + "_over_host", a.build});
    out.push_back({a.name + "_over_bfc", [build = a.build](resource_stack& s) {
                     s.push_pool(growing_pool());
                     build(s);
                   }});
  }
  return out;
}

class ResourceConformance : public testing::TestWithParam<config> {
 protected:
  void SetUp() override { GetParam().build(stack_); }
  void TearDown() override {
    for (const auto& check : stack_.checks) check();
  }
  lm::memory_resource& resource() { return stack_.top(); }

  resource_stack stack_;
};

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// Fills a block with one byte value, and checks that it still holds it (memcmp of the
// block against itself shifted by one: every byte equals the first).
void fill(void* p, std::size_t bytes, unsigned char value) {
  std::memset(p, value, bytes);
}
bool holds(const void* p, std::size_t bytes, unsigned char value) {
  if (bytes == 0) return true;
  const auto* c = static_cast<const unsigned char*>(p);
  return c[0] == value && std::memcmp(c, c + 1, bytes - 1) == 0;
}

struct block {
  void* p;
  std::size_t bytes;
  std::size_t alignment;
  unsigned char value;
};

TEST_P(ResourceConformance, HonoursEveryAlignment) {
  for (std::size_t alignment = 1; alignment <= 1 * MiB; alignment *= 2) {
    std::vector<block> live;
    for (const std::size_t bytes : {std::size_t{0}, std::size_t{1}, alignment, 3 * alignment + 5}) {
      void* p = resource().allocate(bytes, alignment);
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(aligned(p, alignment)) << p << " for alignment " << alignment;
      fill(p, bytes, 0x5a);
      live.push_back({p, bytes, alignment, 0x5a});
    }
    for (const block& b : live) {
      EXPECT_TRUE(holds(b.p, b.bytes, b.value));
      resource().deallocate(b.p, b.bytes, b.alignment);
    }
  }
}

TEST_P(ResourceConformance, LiveBlocksDoNotOverlapAndKeepTheirContent) {
  std::mt19937_64 rng(42);
  std::vector<block> live;
  for (int i = 0; i < 600; ++i) {
    const std::size_t bytes = rng() % 5000;
    const std::size_t alignment = std::size_t{1} << (rng() % 10);
    void* p = resource().allocate(bytes, alignment);
    const auto value = static_cast<unsigned char>(i);
    fill(p, bytes, value);
    live.push_back({p, bytes, alignment, value});
  }
  std::sort(live.begin(), live.end(), [](const block& a, const block& b) {
    return reinterpret_cast<std::uintptr_t>(a.p) < reinterpret_cast<std::uintptr_t>(b.p);
  });
  for (std::size_t i = 0; i + 1 < live.size(); ++i) {
    // Every block owns at least one byte, so that even empty blocks are distinct.
    const auto end =
        reinterpret_cast<std::uintptr_t>(live[i].p) + std::max<std::size_t>(live[i].bytes, 1);
    EXPECT_LE(end, reinterpret_cast<std::uintptr_t>(live[i + 1].p))
        << "blocks at " << live[i].p << " and " << live[i + 1].p << " overlap";
  }
  for (const block& b : live) {
    EXPECT_TRUE(holds(b.p, b.bytes, b.value)) << "block at " << b.p << " was overwritten";
    resource().deallocate(b.p, b.bytes, b.alignment);
  }
}

TEST_P(ResourceConformance, ZeroByteBlocksAreDistinctAndValid) {
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) {
    void* p = resource().allocate(0);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(aligned(p, lm::default_alignment));
    blocks.push_back(p);
  }
  std::vector<void*> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  for (void* p : blocks) resource().deallocate(p, 0);
}

TEST_P(ResourceConformance, RejectsAnAlignmentThatIsNotAPowerOfTwo) {
  for (const std::size_t alignment : {std::size_t{0}, std::size_t{3}, std::size_t{48}}) {
    EXPECT_THROW((void)resource().allocate(64, alignment), loom::invalid_argument);
  }
  void* p = resource().allocate(64);  // still usable
  resource().deallocate(p, 64);
}

TEST_P(ResourceConformance, RefusesAHugeRequestWithOutOfMemory) {
  for (const std::size_t bytes : {lm::max_allocation_size, lm::max_allocation_size + 1,
                                  std::numeric_limits<std::size_t>::max()}) {
    try {
      (void)resource().allocate(bytes);
      ADD_FAILURE() << "a request of " << bytes << " bytes succeeded";
    } catch (const std::bad_alloc& e) {
      const auto* oom = dynamic_cast<const loom::out_of_memory*>(&e);
      ASSERT_NE(oom, nullptr) << "not a loom::out_of_memory: " << e.what();
      EXPECT_EQ(oom->requested_bytes(), bytes);
    }
  }
  void* p = resource().allocate(64);  // still usable
  resource().deallocate(p, 64);
}

TEST_P(ResourceConformance, SurvivesFourThreadsAllocatingAndFreeingAtOnce) {
  constexpr int threads = 4;
  std::vector<int> broken(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([this, t, &broken] {
      std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(t));
      std::vector<block> live;
      for (int i = 0; i < stress_ops_per_thread; ++i) {
        if (live.size() < 48 && (live.empty() || rng() % 2 == 0)) {
          const std::size_t bytes = rng() % 16 == 0 ? rng() % (64 * KiB) : rng() % 2048;
          const std::size_t alignment = std::size_t{1} << (rng() % 8);
          const auto value = static_cast<unsigned char>(t * 64 + i);
          void* p = resource().allocate(bytes, alignment);
          fill(p, bytes, value);
          live.push_back({p, bytes, alignment, value});
        } else {
          const std::size_t k = rng() % live.size();
          const block b = live[k];
          live[k] = live.back();
          live.pop_back();
          if (!holds(b.p, b.bytes, b.value)) ++broken[static_cast<std::size_t>(t)];
          resource().deallocate(b.p, b.bytes, b.alignment);
        }
      }
      for (const block& b : live) {
        if (!holds(b.p, b.bytes, b.value)) ++broken[static_cast<std::size_t>(t)];
        resource().deallocate(b.p, b.bytes, b.alignment);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(broken[static_cast<std::size_t>(t)], 0) << "thread " << t;
  }
}

TEST_P(ResourceConformance, IsEqualToItself) {
  EXPECT_TRUE(resource().is_equal(resource()));
}

INSTANTIATE_TEST_SUITE_P(Resources, ResourceConformance, testing::ValuesIn(configs()),
                         [](const testing::TestParamInfo<config>& param) {
                           return param.param.name;
                         });

}  // namespace
