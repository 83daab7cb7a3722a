#include "loom/memory/c_api.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/host_resource.hpp"

namespace {

constexpr loom_device cpu{LOOM_DEVICE_CPU, 0};
constexpr loom_device cuda{LOOM_DEVICE_CUDA, 0};

static_assert(noexcept(loom_allocate(0, 0, cpu, nullptr)));
static_assert(noexcept(loom_deallocate(nullptr, 0, 0, cpu, nullptr)));
static_assert(noexcept(loom_memory_stats(cpu, nullptr)));

// Serves from the host and records the calls that reach it; thread-safe. Reports its own
// byte count as statistics. Throws `failure` (when set) from allocate instead.
class counting_resource final : public loom::memory::memory_resource {
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
    loom::memory_stats s;
    s.bytes_in_use = in_use_;
    s.num_allocs = allocations_.size();
    return s;
  }

  mutable std::mutex mutex_;
  std::vector<call> allocations_;
  std::vector<call> deallocations_;
  std::size_t in_use_ = 0;
  std::exception_ptr failure_;
};

// Sets a resource for a device for the scope of a test, then restores the previous one.
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

TEST(CApi, AllocatesFromTheDefaultCpuPool) {
  loom_memory_statistics before{};
  ASSERT_EQ(loom_memory_stats(cpu, &before), LOOM_OK);
  void* p = loom_allocate(4096, 256, cpu, nullptr);
  ASSERT_NE(p, nullptr) << loom_last_error_message();
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
  std::memset(p, 0x5a, 4096);
  loom_memory_statistics during{};
  ASSERT_EQ(loom_memory_stats(cpu, &during), LOOM_OK);
  EXPECT_EQ(during.bytes_in_use, before.bytes_in_use + 4096);
  EXPECT_EQ(during.num_allocs, before.num_allocs + 1);
  loom_deallocate(p, 4096, 256, cpu, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  loom_memory_statistics after{};
  ASSERT_EQ(loom_memory_stats(cpu, &after), LOOM_OK);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.num_deallocs, before.num_deallocs + 1);
}

TEST(CApi, CallsReachTheResourceSetForTheDevice) {
  EXPECT_EQ(loom_allocate(64, 0, cuda, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_NO_DEVICE);

  counting_resource resource;
  {
    const scoped_device_resource scope(cuda, &resource);
    int stream_token = 0;
    void* const stream = &stream_token;
    void* p = loom_allocate(1000, 0, cuda, stream);
    ASSERT_NE(p, nullptr) << loom_last_error_message();
    const auto allocations = resource.allocations();
    ASSERT_EQ(allocations.size(), 1u);
    EXPECT_EQ(allocations[0].pointer, p);
    EXPECT_EQ(allocations[0].bytes, 1000u);
    EXPECT_EQ(allocations[0].alignment, 64u);  // 0 means the default
    EXPECT_EQ(allocations[0].stream, stream);

    loom_memory_statistics s{};
    ASSERT_EQ(loom_memory_stats(cuda, &s), LOOM_OK);
    EXPECT_EQ(s.bytes_in_use, 1000u);
    EXPECT_EQ(s.num_allocs, 1u);
    EXPECT_EQ(s.bytes_reserved, 0u);  // not tracked by this resource

    loom_deallocate(p, 1000, 0, cuda, stream);
    const auto deallocations = resource.deallocations();
    ASSERT_EQ(deallocations.size(), 1u);
    EXPECT_EQ(deallocations[0].pointer, p);
    EXPECT_EQ(deallocations[0].bytes, 1000u);
    EXPECT_EQ(deallocations[0].alignment, 64u);
    EXPECT_EQ(deallocations[0].stream, stream);
  }
  EXPECT_EQ(loom_allocate(64, 0, cuda, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_NO_DEVICE);
}

TEST(CApi, MapsEveryExceptionToAStatusCode) {
  counting_resource resource;
  const scoped_device_resource scope(cpu, &resource);
  struct error_case {
    std::exception_ptr thrown;
    int code;
    const char* message;
  };
  const error_case cases[] = {
      {std::make_exception_ptr(loom::out_of_memory("budget 'x' is full", 64, "budget 'x'")),
       LOOM_ERROR_OUT_OF_MEMORY, "budget 'x' is full"},
      {std::make_exception_ptr(std::bad_alloc()), LOOM_ERROR_OUT_OF_MEMORY, "bad_alloc"},
      {std::make_exception_ptr(loom::invalid_argument("no such thing")),
       LOOM_ERROR_INVALID_ARGUMENT, "no such thing"},
      {std::make_exception_ptr(loom::not_found("lost")), LOOM_ERROR_INTERNAL, "lost"},
      {std::make_exception_ptr(std::string(600, 'x')), LOOM_ERROR_INTERNAL, "not a std::exception"},
  };
  for (const error_case& c : cases) {
    SCOPED_TRACE(c.message);
    resource.fail_with(c.thrown);
    EXPECT_EQ(loom_allocate(64, 0, cpu, nullptr), nullptr);
    EXPECT_EQ(loom_last_error(), c.code);
    EXPECT_NE(std::string(loom_last_error_message()).find(c.message), std::string::npos)
        << loom_last_error_message();
  }
  // A message longer than the buffer is cut, not overrun.
  resource.fail_with(std::make_exception_ptr(loom::error(std::string(10'000, 'y'))));
  EXPECT_EQ(loom_allocate(64, 0, cpu, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_INTERNAL);
  EXPECT_GT(std::strlen(loom_last_error_message()), 100u);
  EXPECT_LT(std::strlen(loom_last_error_message()), 10'000u);
}

TEST(CApi, RejectsBadArguments) {
  EXPECT_EQ(loom_allocate(64, 12, cpu, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(loom_allocate(SIZE_MAX - 8, 0, cpu, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(loom_memory_stats(cpu, nullptr), LOOM_ERROR_INVALID_ARGUMENT);
  loom_memory_statistics s{};
  EXPECT_EQ(loom_memory_stats(loom_device{LOOM_DEVICE_CUDA_MANAGED, 1000}, &s),
            LOOM_ERROR_NO_DEVICE);
}

// Threads allocate, write and free through the C ABI at once; each thread's last error is
// its own; the pool ends where it started.
TEST(CApi, ServesManyThreadsAtOnce) {
  loom_memory_statistics before{};
  ASSERT_EQ(loom_memory_stats(cpu, &before), LOOM_OK);
  constexpr int threads = 4;
  constexpr int iterations = 2000;
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([t, &failures] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::pair<unsigned char*, std::size_t>> live;
      for (int i = 0; i < iterations; ++i) {
        if (t == 0 && i % 10 == 0) {  // errors on one thread only
          if (loom_allocate(8, 3, cpu, nullptr) != nullptr ||
              loom_last_error() != LOOM_ERROR_INVALID_ARGUMENT) {
            ++failures;
          }
        }
        if (live.size() < 16 && rng() % 2 == 0) {
          const std::size_t bytes = 1 + rng() % 20000;
          auto* p = static_cast<unsigned char*>(loom_allocate(bytes, 0, cpu, nullptr));
          if (p == nullptr || loom_last_error() != LOOM_OK) {
            ++failures;
            continue;
          }
          std::memset(p, t, bytes);
          live.emplace_back(p, bytes);
        } else if (!live.empty()) {
          const auto [p, bytes] = live.back();
          live.pop_back();
          if (p[0] != t || p[bytes - 1] != t) ++failures;
          loom_deallocate(p, bytes, 0, cpu, nullptr);
        }
      }
      for (const auto& [p, bytes] : live) loom_deallocate(p, bytes, 0, cpu, nullptr);
    });
  }
  for (std::thread& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  loom_memory_statistics after{};
  ASSERT_EQ(loom_memory_stats(cpu, &after), LOOM_OK);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.allocations_in_use, before.allocations_in_use);
}

// One thread sets and clears a device's resource while others allocate for that device:
// each allocation either finds no resource or comes from the one set.
TEST(CApi, SeesResourcesSetByOtherThreads) {
  counting_resource resource;
  constexpr loom_device cuda1{LOOM_DEVICE_CUDA, 1};
  const loom::device_id id{loom::device_type::cuda, 1};
  std::atomic<bool> done{false};
  std::thread setter([&] {
    for (int i = 0; i < 2000; ++i) {
      loom::memory::set_device_resource(id, i % 2 == 0 ? &resource : nullptr);
    }
    loom::memory::set_device_resource(id, nullptr);
    done = true;
  });
  std::atomic<int> served{0};
  std::atomic<int> unexpected{0};
  std::vector<std::thread> users;
  for (int t = 0; t < 2; ++t) {
    users.emplace_back([&] {
      while (!done) {
        void* p = loom_allocate(32, 0, cuda1, nullptr);
        if (p != nullptr) {
          ++served;
          resource.deallocate(p, 32);  // straight back: the device may have lost it meanwhile
        } else if (loom_last_error() != LOOM_ERROR_NO_DEVICE) {
          ++unexpected;
        }
      }
    });
  }
  setter.join();
  for (std::thread& u : users) u.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(resource.allocations().size(), static_cast<std::size_t>(served.load()));
  EXPECT_EQ(resource.deallocations().size(), static_cast<std::size_t>(served.load()));
}

}  // namespace
