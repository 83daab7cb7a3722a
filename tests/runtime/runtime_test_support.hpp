// Test support for sessions: a CPU-like device whose allocator is a tracking adaptor (so a
// test can assert nothing is outstanding after a run), registered through a local factory
// registry — which also exercises the plugin path of device factories.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "loom/device/device_factory.hpp"
#include "loom/device/thread_pool.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tracking_adaptor.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {

class tracked_cpu_device final : public device {
 public:
  tracked_cpu_device(int index, int threads)
      : device(device_attributes{fmt::format("/device:CPU:{}", index),
                                 {device_type::cpu, index},
                                 0,
                                 threads,
                                 "tracked test device"}),
        pool_(memory::host_resource::instance(), {.name = fmt::format("test cpu:{}", index)}),
        tracking_(pool_, {.name = fmt::format("cpu:{}", index),
                          .on_leak = memory::leak_action::abort}),
        threads_(threads, fmt::format("test{}", index)) {}

  memory::memory_resource& allocator() override { return tracking_; }
  thread_pool* pool() noexcept override { return &threads_; }
  memory::tracking_adaptor& tracking() noexcept { return tracking_; }

 private:
  memory::bfc_pool pool_;
  memory::tracking_adaptor tracking_;
  thread_pool threads_;
};

/// Makes `count` tracked devices and remembers them (they live as long as the session).
class tracked_factory final : public device_factory {
 public:
  tracked_factory(int count, int threads, std::vector<tracked_cpu_device*>* made)
      : count_(count), threads_(threads), made_(made) {}
  device_type type() const noexcept override { return device_type::cpu; }
  std::vector<std::unique_ptr<device>> create_devices(const device_options&) override {
    std::vector<std::unique_ptr<device>> out;
    for (int i = 0; i < count_; ++i) {
      auto d = std::make_unique<tracked_cpu_device>(i, threads_);
      made_->push_back(d.get());
      out.push_back(std::move(d));
    }
    return out;
  }

 private:
  int count_;
  int threads_;
  std::vector<tracked_cpu_device*>* made_;
};

/// A registry holding one tracked_factory, for session_options::factories.
struct tracked_devices {
  explicit tracked_devices(int count = 1, int threads = 2) {
    registry.register_factory(std::make_unique<tracked_factory>(count, threads, &devices), 10);
  }
  [[nodiscard]] std::size_t outstanding_bytes() const {
    std::size_t n = 0;
    for (auto* d : devices) n += d->tracking().outstanding_bytes();
    return n;
  }
  [[nodiscard]] std::size_t outstanding_count() const {
    std::size_t n = 0;
    for (auto* d : devices) n += d->tracking().outstanding_count();
    return n;
  }
  device_factory_registry registry;
  std::vector<tracked_cpu_device*> devices;
};

}  // namespace loom::testing
