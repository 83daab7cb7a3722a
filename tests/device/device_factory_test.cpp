// device_factory_registry: priorities, order, the built-in CPU factory and its options.
// Runs under TSan (label `device`).
#include "loom/device/device_factory.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/cuda/info.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/memory/host_resource.hpp"

namespace {

using loom::device;
using loom::device_attributes;
using loom::device_factory;
using loom::device_factory_registry;
using loom::device_id;
using loom::device_options;
using loom::device_type;

// A device with no compute that allocates from the host.
class fake_device final : public device {
 public:
  explicit fake_device(device_id id)
      : device(device_attributes{loom::full_name(id), id, 0, 1, "fake"}) {}
  loom::memory::memory_resource& allocator() override {
    return loom::memory::host_resource::instance();
  }
};

// A factory of `count` fake devices of `type`, tagged so a test can tell factories apart.
class fake_factory final : public device_factory {
 public:
  fake_factory(device_type type, int tag, int count = 1, std::atomic<int>* destroyed = nullptr)
      : type_(type), tag_(tag), count_(count), destroyed_(destroyed) {}
  ~fake_factory() override {
    if (destroyed_ != nullptr) destroyed_->fetch_add(1);
  }
  device_type type() const noexcept override { return type_; }
  std::vector<std::unique_ptr<device>> create_devices(const device_options&) override {
    std::vector<std::unique_ptr<device>> out;
    for (int i = 0; i < count_; ++i)
      out.push_back(std::make_unique<fake_device>(device_id{type_, i}));
    return out;
  }
  [[nodiscard]] int tag() const noexcept { return tag_; }

 private:
  device_type type_;
  int tag_;
  int count_;
  std::atomic<int>* destroyed_;
};

int tag_of(const device_factory_registry& r, device_type t) {
  const auto* f = dynamic_cast<const fake_factory*>(r.find(t));
  return f == nullptr ? -1 : f->tag();
}

TEST(DeviceFactoryRegistry, HigherOrEqualPriorityReplaces) {
  device_factory_registry registry;
  EXPECT_EQ(registry.find(device_type::cuda), nullptr);
  std::atomic<int> destroyed{0};
  EXPECT_TRUE(registry.register_factory(
      std::make_unique<fake_factory>(device_type::cuda, 1, 1, &destroyed), 5));
  EXPECT_EQ(tag_of(registry, device_type::cuda), 1);
  // Lower priority: ignored, and the newcomer is destroyed.
  EXPECT_FALSE(registry.register_factory(
      std::make_unique<fake_factory>(device_type::cuda, 2, 1, &destroyed), 4));
  EXPECT_EQ(tag_of(registry, device_type::cuda), 1);
  EXPECT_EQ(destroyed.load(), 1);
  // A tie replaces, destroying the one replaced.
  EXPECT_TRUE(registry.register_factory(
      std::make_unique<fake_factory>(device_type::cuda, 3, 1, &destroyed), 5));
  EXPECT_EQ(tag_of(registry, device_type::cuda), 3);
  EXPECT_EQ(destroyed.load(), 2);
  // Higher replaces.
  EXPECT_TRUE(registry.register_factory(
      std::make_unique<fake_factory>(device_type::cuda, 4, 1, &destroyed), 100));
  EXPECT_EQ(tag_of(registry, device_type::cuda), 4);
  EXPECT_EQ(destroyed.load(), 3);
  // ... and what it replaced at 5 no longer counts: 99 is below 100.
  EXPECT_FALSE(registry.register_factory(
      std::make_unique<fake_factory>(device_type::cuda, 5, 1, &destroyed), 99));
  EXPECT_EQ(tag_of(registry, device_type::cuda), 4);
  // Other types are independent.
  EXPECT_EQ(registry.find(device_type::cpu), nullptr);
  EXPECT_TRUE(registry.register_factory(std::make_unique<fake_factory>(device_type::cpu, 6), -10));
  EXPECT_EQ(tag_of(registry, device_type::cpu), 6);
  EXPECT_EQ(tag_of(registry, device_type::cuda), 4);
}

TEST(DeviceFactoryRegistry, RejectsNullFactory) {
  device_factory_registry registry;
  EXPECT_THROW(registry.register_factory(nullptr, 0), loom::invalid_argument);
}

TEST(DeviceFactoryRegistry, CreateDevicesAsksEveryFactoryCpuFirst) {
  device_factory_registry registry;
  // Registered out of order on purpose.
  registry.register_factory(std::make_unique<fake_factory>(device_type::cuda_managed, 1, 1), 0);
  registry.register_factory(std::make_unique<fake_factory>(device_type::cuda, 2, 2), 0);
  registry.register_factory(std::make_unique<fake_factory>(device_type::vulkan, 3, 0), 0);
  registry.register_factory(std::make_unique<loom::cpu_device_factory>(), 0);
  device_options options;
  options.virtual_cpu_devices = 2;
  options.cpu_threads = 2;
  const auto devices = registry.create_devices(options);
  std::vector<std::string> names;
  for (const auto& d : devices) names.push_back(d->name());
  EXPECT_EQ(names, (std::vector<std::string>{"/device:CPU:0", "/device:CPU:1", "/device:CUDA:0",
                                             "/device:CUDA:1", "/device:CUDA_MANAGED:0"}));
}

TEST(DeviceFactoryRegistry, GlobalHasTheCpuFactory) {
  device_factory_registry& global = device_factory_registry::global();
  EXPECT_EQ(&global, &device_factory_registry::global());
  ASSERT_NE(global.find(device_type::cpu), nullptr);
  if (!loom::cuda::is_built()) {
    EXPECT_NE(dynamic_cast<loom::cpu_device_factory*>(global.find(device_type::cpu)), nullptr);
  } else {
    // The CUDA backend's GPU-compatible CPU factory (priority 10) replaced it.
    EXPECT_EQ(dynamic_cast<loom::cpu_device_factory*>(global.find(device_type::cpu)), nullptr);
    EXPECT_NE(global.find(device_type::cuda), nullptr);
  }
  device_options options;
  options.cpu_threads = 1;
  const auto devices = global.create_devices(options);
  ASSERT_GE(devices.size(), 1u);
  EXPECT_EQ(devices[0]->name(), "/device:CPU:0");
  EXPECT_EQ(devices[0]->attributes().threads, 1);
}

TEST(DeviceFactoryRegistry, GlobalIsSafeToUseFromManyThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> found{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      if (device_factory_registry::global().find(device_type::cpu) != nullptr) found.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(found.load(), 4);
}

TEST(CpuDeviceFactory, FourVirtualDevices) {
  device_factory_registry registry;
  loom::register_builtin_device_factories(registry);
  device_options options;
  options.virtual_cpu_devices = 4;
  options.cpu_threads = 8;
  options.cpu_memory_limit = std::size_t{64} << 20;
  const auto devices = registry.create_devices(options);
  ASSERT_EQ(devices.size(), 4u);
  std::set<const void*> allocators;
  std::set<const void*> pools;
  for (int i = 0; i < 4; ++i) {
    const device& d = *devices[static_cast<std::size_t>(i)];
    EXPECT_EQ(d.name(), "/device:CPU:" + std::to_string(i));
    EXPECT_EQ(d.id(), (device_id{device_type::cpu, i}));
    EXPECT_EQ(d.attributes().threads, 2);
    EXPECT_EQ(d.attributes().memory_limit, std::size_t{64} << 20);
    const std::string& description = d.attributes().description;
    EXPECT_NE(description.find(" host, 2 threads, virtual " + std::to_string(i + 1) + " of 4"),
              std::string::npos)
        << description;
    auto& cpu = dynamic_cast<loom::cpu_device&>(*devices[static_cast<std::size_t>(i)]);
    allocators.insert(&cpu.allocator());
    pools.insert(cpu.pool());
    ASSERT_NE(cpu.pool(), nullptr);
    EXPECT_EQ(cpu.pool()->size(), 2);
    EXPECT_EQ(cpu.memory_pool().options().name, "cpu:" + std::to_string(i));
    EXPECT_EQ(cpu.memory_pool().options().max_size, std::size_t{64} << 20);
  }
  EXPECT_EQ(allocators.size(), 4u);
  EXPECT_EQ(pools.size(), 4u);
  // Allocations land in their own device's pool only.
  auto& d0 = dynamic_cast<loom::cpu_device&>(*devices[0]);
  auto& d1 = dynamic_cast<loom::cpu_device&>(*devices[1]);
  const loom::tensor t = d1.allocate(loom::dtype::f32, loom::shape{100});
  EXPECT_EQ(t.device(), (device_id{device_type::cpu, 1}));
  EXPECT_EQ(d1.memory_pool().get_stats().allocations_in_use, 1u);
  EXPECT_EQ(d0.memory_pool().get_stats().allocations_in_use, 0u);
  EXPECT_FALSE(d0.allocator().is_equal(d1.allocator()));
}

TEST(CpuDeviceFactory, ThreadsAreDividedAtLeastOneEach) {
  loom::cpu_device_factory factory;
  device_options options;
  options.virtual_cpu_devices = 4;
  options.cpu_threads = 3;
  auto devices = factory.create_devices(options);
  ASSERT_EQ(devices.size(), 4u);
  for (const auto& d : devices) {
    EXPECT_EQ(d->attributes().threads, 1);
    EXPECT_NE(d->attributes().description.find(" host, 1 thread, virtual"), std::string::npos)
        << d->attributes().description;
  }
  options.virtual_cpu_devices = 2;
  options.cpu_threads = 5;
  devices = factory.create_devices(options);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0]->attributes().threads, 2);
  // One device: no "virtual" in the description, every thread, no limit.
  options.virtual_cpu_devices = 1;
  options.cpu_threads = 3;
  devices = factory.create_devices(options);
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0]->attributes().threads, 3);
  EXPECT_EQ(devices[0]->attributes().description.find("virtual"), std::string::npos);
  EXPECT_NE(devices[0]->attributes().description.find(" host, 3 threads"), std::string::npos);
  EXPECT_EQ(devices[0]->attributes().memory_limit, 0u);
  // cpu_threads 0: one per core.
  options.cpu_threads = 0;
  devices = factory.create_devices(options);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(devices[0]->attributes().threads, cores);
  EXPECT_EQ(devices[0]->pool()->size(), cores);
}

TEST(CpuDeviceFactory, RejectsInvalidOptions) {
  loom::cpu_device_factory factory;
  for (int n : {0, -1, -100}) {
    device_options options;
    options.virtual_cpu_devices = n;
    try {
      (void)factory.create_devices(options);
      ADD_FAILURE() << "accepted virtual_cpu_devices " << n;
    } catch (const loom::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("virtual_cpu_devices is " + std::to_string(n)),
                std::string::npos)
          << e.what();
    }
  }
  device_options options;
  options.cpu_threads = -2;
  EXPECT_THROW((void)factory.create_devices(options), loom::invalid_argument);
  // Through a registry too.
  device_factory_registry registry;
  loom::register_builtin_device_factories(registry);
  options = device_options{};
  options.virtual_cpu_devices = 0;
  EXPECT_THROW((void)registry.create_devices(options), loom::invalid_argument);
}

}  // namespace
