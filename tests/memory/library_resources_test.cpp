// Per-library attribution (loom/memory/library_resources.hpp and the C ABI's _for calls):
// each library's figures are its own allocations, counted by hand in the test; the pool's
// totals cover every library; blocks reach the resource serving the device with their
// stream and alignment; bad names, unknown libraries, missing devices and failures give the
// documented status codes and leave blocks alone; many threads at once.
#include "loom/memory/library_resources.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/c_api.h"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/host_resource.hpp"

namespace {

constexpr loom_device cpu{LOOM_DEVICE_CPU, 0};

static_assert(noexcept(loom_allocate_for("x", 0, 0, cpu, nullptr)));
static_assert(noexcept(loom_deallocate_for("x", nullptr, 0, 0, cpu, nullptr)));
static_assert(noexcept(loom_memory_stats_for(cpu, "x", nullptr)));

// Serves from the host, records the calls that reach it (thread-safe), reports the bytes it
// holds as its statistics, and throws `failure` (when set) from allocate.
class recording_resource final : public loom::memory::memory_resource {
 public:
  struct call {
    void* pointer;
    std::size_t bytes;
    std::size_t alignment;
    void* stream;
  };
  std::vector<call> allocations() const {
    std::lock_guard lock(mutex_);
    return allocations_;
  }
  std::vector<call> deallocations() const {
    std::lock_guard lock(mutex_);
    return deallocations_;
  }
  void fail_with(std::exception_ptr e) { failure_ = std::move(e); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, loom::stream s) override {
    if (failure_) std::rethrow_exception(failure_);
    void* p = loom::memory::host_resource::instance().allocate(bytes, alignment, s);
    std::lock_guard lock(mutex_);
    allocations_.push_back({p, bytes, alignment, s.handle()});
    in_use_ += bytes;
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     loom::stream s) noexcept override {
    {
      std::lock_guard lock(mutex_);
      deallocations_.push_back({p, bytes, alignment, s.handle()});
      in_use_ -= bytes;
    }
    loom::memory::host_resource::instance().deallocate(p, bytes, alignment, s);
  }
  std::optional<loom::memory_stats> do_stats() const override {
    std::lock_guard lock(mutex_);
    loom::memory_stats st;
    st.bytes_in_use = in_use_;
    st.num_allocs = allocations_.size();
    st.bytes_reserved = in_use_;
    return st;
  }

  mutable std::mutex mutex_;
  std::vector<call> allocations_;
  std::vector<call> deallocations_;
  std::size_t in_use_ = 0;
  std::exception_ptr failure_;
};

class scoped_device_resource {
 public:
  scoped_device_resource(loom_device d, loom::memory::memory_resource* r)
      : device_{static_cast<loom::device_type>(d.device_type), d.device_id},
        previous_(loom::memory::set_device_resource(device_, r)) {}
  ~scoped_device_resource() { loom::memory::set_device_resource(device_, previous_); }
  scoped_device_resource(const scoped_device_resource&) = delete;
  scoped_device_resource& operator=(const scoped_device_resource&) = delete;

 private:
  loom::device_id device_;
  loom::memory::memory_resource* previous_;
};

loom_memory_statistics stats(loom_device d) {
  loom_memory_statistics s;
  std::memset(&s, 0xff, sizeof s);
  EXPECT_EQ(loom_memory_stats(d, &s), LOOM_OK) << loom_last_error_message();
  return s;
}

loom_memory_statistics stats_for(loom_device d, const char* library) {
  loom_memory_statistics s;
  std::memset(&s, 0xff, sizeof s);  // every field must be written
  EXPECT_EQ(loom_memory_stats_for(d, library, &s), LOOM_OK) << loom_last_error_message();
  return s;
}

bool message_has(const char* needle) {
  return std::string(loom_last_error_message()).find(needle) != std::string::npos;
}

// Library names are process-wide and never forgotten: each test uses names of its own.

TEST(LibraryResources, EachLibraryCountsItsOwnBlocksAndThePoolCountsAll) {
  const loom_memory_statistics pool_before = stats(cpu);
  void* t1 = loom_allocate_for("attr.torch", 1000, 0, cpu, nullptr);
  ASSERT_NE(t1, nullptr) << loom_last_error_message();
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  void* t2 = loom_allocate_for("attr.torch", 24, 256, cpu, nullptr);
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t2) % 256, 0u);
  void* c1 = loom_allocate_for("attr.cupy", 3000, 0, cpu, nullptr);
  ASSERT_NE(c1, nullptr);
  std::memset(t1, 1, 1000);
  std::memset(c1, 2, 3000);

  loom_memory_statistics torch = stats_for(cpu, "attr.torch");
  EXPECT_EQ(torch.bytes_in_use, 1024u);
  EXPECT_EQ(torch.peak_bytes_in_use, 1024u);
  EXPECT_EQ(torch.total_bytes_allocated, 1024u);
  EXPECT_EQ(torch.allocations_in_use, 2u);
  EXPECT_EQ(torch.num_allocs, 2u);
  EXPECT_EQ(torch.num_deallocs, 0u);
  EXPECT_EQ(torch.num_failed_allocs, 0u);
  EXPECT_EQ(torch.bytes_reserved, 0u);  // the pool's, not the library's
  EXPECT_EQ(torch.num_regions, 0u);
  EXPECT_EQ(torch.fragmentation, 0.0);
  loom_memory_statistics cupy = stats_for(cpu, "attr.cupy");
  EXPECT_EQ(cupy.bytes_in_use, 3000u);
  EXPECT_EQ(cupy.num_allocs, 1u);
  const loom_memory_statistics pool_during = stats(cpu);
  EXPECT_EQ(pool_during.bytes_in_use, pool_before.bytes_in_use + 4024);
  EXPECT_EQ(pool_during.num_allocs, pool_before.num_allocs + 3);

  loom_deallocate_for("attr.torch", t1, 1000, 0, cpu, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  torch = stats_for(cpu, "attr.torch");
  EXPECT_EQ(torch.bytes_in_use, 24u);
  EXPECT_EQ(torch.peak_bytes_in_use, 1024u);  // the peak stays
  EXPECT_EQ(torch.allocations_in_use, 1u);
  EXPECT_EQ(torch.num_deallocs, 1u);
  EXPECT_EQ(stats_for(cpu, "attr.cupy").bytes_in_use, 3000u);  // untouched

  loom_deallocate_for("attr.torch", t2, 24, 256, cpu, nullptr);
  loom_deallocate_for("attr.cupy", c1, 3000, 0, cpu, nullptr);
  EXPECT_EQ(stats_for(cpu, "attr.torch").bytes_in_use, 0u);
  EXPECT_EQ(stats_for(cpu, "attr.cupy").allocations_in_use, 0u);
  const loom_memory_statistics pool_after = stats(cpu);
  EXPECT_EQ(pool_after.bytes_in_use, pool_before.bytes_in_use);
  EXPECT_EQ(pool_after.num_deallocs, pool_before.num_deallocs + 3);
}

TEST(LibraryResources, PlainCallsAreNoLibrarysShare) {
  void* mine = loom_allocate_for("plain.lib", 100, 0, cpu, nullptr);
  ASSERT_NE(mine, nullptr);
  void* plain = loom_allocate(5000, 0, cpu, nullptr);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(stats_for(cpu, "plain.lib").bytes_in_use, 100u);
  loom_deallocate(plain, 5000, 0, cpu, nullptr);
  loom_deallocate_for("plain.lib", mine, 100, 0, cpu, nullptr);
  EXPECT_EQ(stats_for(cpu, "plain.lib").bytes_in_use, 0u);
}

TEST(LibraryResources, ALibraryThatAllocatedNothingHasZeros) {
  const loom_memory_statistics s = stats_for(cpu, "never.allocated");
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.peak_bytes_in_use, 0u);
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.num_failed_allocs, 0u);
  EXPECT_EQ(s.free_bytes, 0u);
  EXPECT_EQ(s.fragmentation, 0.0);
  EXPECT_EQ(loom::memory::find_library_resource({loom::device_type::cpu, 0}, "never.allocated"),
            nullptr);
  EXPECT_FALSE(loom::memory::library_stats({loom::device_type::cpu, 0}, "never.allocated"));
}

TEST(LibraryResources, CallsReachTheResourceServingTheDeviceWithStreamAndAlignment) {
  constexpr loom_device managed{LOOM_DEVICE_CUDA_MANAGED, 7};
  EXPECT_EQ(loom_allocate_for("route.numba", 64, 0, managed, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_NO_DEVICE);
  EXPECT_TRUE(message_has("cuda_managed:7")) << loom_last_error_message();
  loom_memory_statistics s{};
  EXPECT_EQ(loom_memory_stats_for(managed, "route.numba", &s), LOOM_ERROR_NO_DEVICE);

  recording_resource resource;
  int token = 0;
  void* const stream = &token;
  {
    const scoped_device_resource scope(managed, &resource);
    void* p = loom_allocate_for("route.numba", 777, 512, managed, stream);
    ASSERT_NE(p, nullptr) << loom_last_error_message();
    void* q = loom_allocate_for("route.other", 5, 0, managed, nullptr);
    ASSERT_NE(q, nullptr);
    const auto calls = resource.allocations();
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0].pointer, p);
    EXPECT_EQ(calls[0].bytes, 777u);
    EXPECT_EQ(calls[0].alignment, 512u);
    EXPECT_EQ(calls[0].stream, stream);
    EXPECT_EQ(calls[1].alignment, 64u);  // 0 means the default
    EXPECT_EQ(stats_for(managed, "route.numba").bytes_in_use, 777u);
    EXPECT_EQ(stats_for(managed, "route.other").bytes_in_use, 5u);
    EXPECT_EQ(stats(managed).bytes_in_use, 782u);  // the device's total
    // Another device's figures for the same name are apart.
    EXPECT_EQ(stats_for(cpu, "route.numba").bytes_in_use, 0u);

    loom_deallocate_for("route.numba", p, 777, 512, managed, stream);
    loom_deallocate_for("route.other", q, 5, 0, managed, nullptr);
    const auto frees = resource.deallocations();
    ASSERT_EQ(frees.size(), 2u);
    EXPECT_EQ(frees[0].pointer, p);
    EXPECT_EQ(frees[0].bytes, 777u);
    EXPECT_EQ(frees[0].alignment, 512u);
    EXPECT_EQ(frees[0].stream, stream);
    EXPECT_EQ(stats(managed).bytes_in_use, 0u);
  }
  // The device lost its resource: its figures for the library remain readable.
  EXPECT_EQ(stats_for(managed, "route.numba").num_allocs, 1u);
  EXPECT_EQ(stats_for(managed, "route.numba").num_deallocs, 1u);
  const std::vector<std::string> names =
      loom::memory::libraries({loom::device_type::cuda_managed, 7});
  EXPECT_EQ(names, (std::vector<std::string>{"route.numba", "route.other"}));
}

TEST(LibraryResources, FailuresAreCountedForTheLibrary) {
  constexpr loom_device host{LOOM_DEVICE_CUDA_HOST, 3};
  recording_resource resource;
  const scoped_device_resource scope(host, &resource);
  resource.fail_with(std::make_exception_ptr(loom::out_of_memory("card is full", 99, "pool")));
  EXPECT_EQ(loom_allocate_for("fail.lib", 99, 0, host, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(message_has("card is full")) << loom_last_error_message();
  const loom_memory_statistics s = stats_for(host, "fail.lib");
  EXPECT_EQ(s.num_failed_allocs, 1u);
  EXPECT_EQ(s.num_allocs, 0u);
  EXPECT_EQ(s.bytes_in_use, 0u);
  // A bad alignment is refused before any resource is reached (and is no failed allocation).
  resource.fail_with(nullptr);
  EXPECT_EQ(loom_allocate_for("fail.lib", 8, 3, host, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stats_for(host, "fail.lib").num_failed_allocs, 1u);
  EXPECT_TRUE(resource.allocations().empty());
}

TEST(LibraryResources, BadNamesAreRefused) {
  const std::string long_name(64, 'n');
  const std::string longest(63, 'n');
  const char* const bad[] = {nullptr, "", long_name.c_str(), "tab\there", "caf\xc3\xa9"};
  const char* const why[] = {"NULL", "empty", "longer than 63", "0x09", "0xc3"};
  for (std::size_t i = 0; i < std::size(bad); ++i) {
    SCOPED_TRACE(why[i]);
    EXPECT_EQ(loom_allocate_for(bad[i], 8, 0, cpu, nullptr), nullptr);
    EXPECT_EQ(loom_last_error(), LOOM_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(message_has(why[i])) << loom_last_error_message();
    EXPECT_TRUE(message_has("loom_allocate_for")) << loom_last_error_message();
    loom_memory_statistics s{};
    EXPECT_EQ(loom_memory_stats_for(cpu, bad[i], &s), LOOM_ERROR_INVALID_ARGUMENT);
    int dummy = 0;
    loom_deallocate_for(bad[i], &dummy, 4, 0, cpu, nullptr);
    EXPECT_EQ(loom_last_error(), LOOM_ERROR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(loom_memory_stats_for(cpu, "x", nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  // 63 bytes is allowed.
  void* p = loom_allocate_for(longest.c_str(), 8, 0, cpu, nullptr);
  ASSERT_NE(p, nullptr) << loom_last_error_message();
  loom_deallocate_for(longest.c_str(), p, 8, 0, cpu, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  // The C++ entry points throw.
  EXPECT_THROW((void)loom::memory::library_resource({loom::device_type::cpu, 0}, ""),
               loom::invalid_argument);
  EXPECT_THROW((void)loom::memory::library_resource({loom::device_type::opencl, 0}, "ok"),
               loom::invalid_argument);
  EXPECT_THROW((void)loom::memory::library_resource({loom::device_type::cuda, 64}, "ok"),
               loom::invalid_argument);
  EXPECT_EQ(loom::memory::check_library_name("torch"), "");
}

TEST(LibraryResources, DevicesOutsideTheRegistryHaveNoResource) {
  const loom_device bad[] = {{4 /* OpenCL */, 0}, {LOOM_DEVICE_CUDA, 64}, {LOOM_DEVICE_CPU, -1}};
  for (const loom_device d : bad) {
    EXPECT_EQ(loom_allocate_for("nodev.lib", 8, 0, d, nullptr), nullptr);
    EXPECT_EQ(loom_last_error(), LOOM_ERROR_NO_DEVICE);
    loom_memory_statistics s{};
    EXPECT_EQ(loom_memory_stats_for(d, "nodev.lib", &s), LOOM_ERROR_NO_DEVICE);
  }
}

TEST(LibraryResources, BlocksGoBackOnlyThroughALibraryThatAllocated) {
  void* p = loom_allocate_for("owner.lib", 128, 0, cpu, nullptr);
  ASSERT_NE(p, nullptr);
  const loom_memory_statistics pool = stats(cpu);
  loom_deallocate_for("stranger.lib", p, 128, 0, cpu, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("stranger.lib")) << loom_last_error_message();
  EXPECT_TRUE(message_has("not freed")) << loom_last_error_message();
  EXPECT_EQ(stats(cpu).bytes_in_use, pool.bytes_in_use);          // still allocated
  std::memset(p, 7, 128);                                         // and still usable
  loom_deallocate_for("owner.lib", nullptr, 0, 0, cpu, nullptr);  // NULL does nothing
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  loom_deallocate_for("owner.lib", p, 128, 0, cpu, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  EXPECT_EQ(stats(cpu).bytes_in_use, pool.bytes_in_use - 128);
}

TEST(LibraryResources, TheCxxResourceIsTheOneTheCAbiUses) {
  const loom::device_id d{loom::device_type::cpu, 0};
  loom::memory::statistics_adaptor& r = loom::memory::library_resource(d, "cxx.lib");
  EXPECT_EQ(&r, &loom::memory::library_resource(d, "cxx.lib"));
  EXPECT_EQ(&r, loom::memory::find_library_resource(d, "cxx.lib"));
  void* p = r.allocate(300);
  EXPECT_EQ(stats_for(cpu, "cxx.lib").bytes_in_use, 300u);
  loom_deallocate_for("cxx.lib", p, 300, 0, cpu, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  EXPECT_EQ(loom::memory::library_stats(d, "cxx.lib")->bytes_in_use, 0u);
  const auto names = loom::memory::libraries(d);
  EXPECT_NE(std::find(names.begin(), names.end(), "cxx.lib"), names.end());
}

// Threads allocate and free for two libraries at once; each library's counts are what its
// threads did, and the pool's change is their sum.
TEST(LibraryResources, ManyThreadsKeepExactCounts) {
  const loom_memory_statistics pool_before = stats(cpu);
  constexpr int threads = 4;
  constexpr int iterations = 3000;
  const char* const names[] = {"threads.a", "threads.b"};
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> allocs[2]{};
  std::atomic<std::uint64_t> bytes[2]{};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const int lib = t % 2;
      std::mt19937 rng(static_cast<unsigned>(t + 10));
      std::vector<std::pair<unsigned char*, std::size_t>> live;
      for (int i = 0; i < iterations; ++i) {
        if (live.size() < 8 && rng() % 2 == 0) {
          const std::size_t n = 1 + rng() % 5000;
          auto* p = static_cast<unsigned char*>(loom_allocate_for(names[lib], n, 0, cpu, nullptr));
          if (p == nullptr) {
            ++failures;
            continue;
          }
          std::memset(p, t, n);
          live.emplace_back(p, n);
          ++allocs[lib];
          bytes[lib] += n;
        } else if (!live.empty()) {
          const auto [p, n] = live.back();
          live.pop_back();
          if (p[0] != t || p[n - 1] != t) ++failures;
          loom_deallocate_for(names[lib], p, n, 0, cpu, nullptr);
        }
      }
      for (const auto& [p, n] : live) loom_deallocate_for(names[lib], p, n, 0, cpu, nullptr);
    });
  }
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  std::uint64_t total = 0;
  for (int lib = 0; lib < 2; ++lib) {
    const loom_memory_statistics s = stats_for(cpu, names[lib]);
    EXPECT_EQ(s.num_allocs, allocs[lib].load());
    EXPECT_EQ(s.num_deallocs, allocs[lib].load());
    EXPECT_EQ(s.total_bytes_allocated, bytes[lib].load());
    EXPECT_EQ(s.bytes_in_use, 0u);
    EXPECT_EQ(s.allocations_in_use, 0u);
    EXPECT_GT(s.peak_bytes_in_use, 0u);
    total += s.num_allocs;
  }
  const loom_memory_statistics pool_after = stats(cpu);
  EXPECT_EQ(pool_after.num_allocs - pool_before.num_allocs, total);
  EXPECT_EQ(pool_after.bytes_in_use, pool_before.bytes_in_use);
}

// Fills the process's table to its limit; true when the next library is refused with a
// message naming the limit and existing names still resolve.
bool table_refuses_past_its_limit() {
  const loom::device_id d{loom::device_type::cpu, 0};
  const std::size_t existing = loom::memory::libraries(d).size();
  for (std::size_t i = existing; i < loom::memory::max_library_resources; ++i) {
    (void)loom::memory::library_resource(d, "fill." + std::to_string(i));
  }
  (void)loom::memory::library_resource(d, "fill.255");  // existing names still resolve
  return loom_allocate_for("one.too.many", 8, 0, cpu, nullptr) == nullptr &&
         loom_last_error() == LOOM_ERROR_INVALID_ARGUMENT && message_has("256");
}

// In a child process, since the table is the process's.
TEST(LibraryResourcesDeathTest, TheTableHasALimit) {
  EXPECT_EXIT(std::exit(table_refuses_past_its_limit() ? 0 : 1), testing::ExitedWithCode(0), "");
}

}  // namespace
