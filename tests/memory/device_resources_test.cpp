#include "loom/memory/device_resources.hpp"

#include <gtest/gtest.h>

#include <string>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"

namespace {

using loom::device_id;
using loom::device_type;
using loom::memory::find_device_resource;
using loom::memory::get_device_resource;
using loom::memory::set_device_resource;

constexpr device_id cpu0{device_type::cpu, 0};
constexpr device_id cuda0{device_type::cuda, 0};

TEST(DeviceResources, Cpu0StartsWithAGrowingPoolThatWorks) {
  auto* pool = dynamic_cast<loom::memory::bfc_pool*>(&get_device_resource(cpu0));
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->options().name, "cpu:0");
  EXPECT_GT(pool->options().growth_step, 0u);
  void* p = pool->allocate(100);
  EXPECT_EQ(find_device_resource(cpu0), pool);
  pool->deallocate(p, 100);
}

TEST(DeviceResources, OtherDevicesStartWithNone) {
  EXPECT_EQ(find_device_resource(cuda0), nullptr);
  try {
    (void)get_device_resource(cuda0);
    FAIL() << "found a resource for cuda:0";
  } catch (const loom::not_found& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(find_device_resource({device_type::cpu, 1}), nullptr);
}

TEST(DeviceResources, SetReturnsThePreviousResourceAndNullRestoresTheStart) {
  loom::memory::host_resource a;
  loom::memory::host_resource b;
  EXPECT_EQ(set_device_resource(cuda0, &a), nullptr);
  EXPECT_EQ(&get_device_resource(cuda0), &a);
  EXPECT_EQ(set_device_resource(cuda0, &b), &a);
  EXPECT_EQ(&get_device_resource(cuda0), &b);
  EXPECT_EQ(set_device_resource(cuda0, nullptr), &b);
  EXPECT_EQ(find_device_resource(cuda0), nullptr);

  loom::memory::memory_resource* const default_pool = &get_device_resource(cpu0);
  EXPECT_EQ(set_device_resource(cpu0, &a), default_pool);
  EXPECT_EQ(&get_device_resource(cpu0), &a);
  EXPECT_EQ(set_device_resource(cpu0, nullptr), &a);
  EXPECT_EQ(&get_device_resource(cpu0), default_pool);
}

TEST(DeviceResources, KeepsEachDeviceApart) {
  loom::memory::host_resource a;
  const device_id cuda3{device_type::cuda, 3};
  ASSERT_EQ(set_device_resource(cuda3, &a), nullptr);
  EXPECT_EQ(find_device_resource({device_type::cuda, 2}), nullptr);
  EXPECT_EQ(find_device_resource({device_type::cuda_host, 3}), nullptr);
  EXPECT_EQ(find_device_resource({device_type::cuda_managed, 3}), nullptr);
  const device_id last{device_type::cuda_managed, loom::memory::max_device_index - 1};
  EXPECT_EQ(set_device_resource(last, &a), nullptr);
  EXPECT_EQ(find_device_resource(cuda3), &a);
  EXPECT_EQ(set_device_resource(last, nullptr), &a);
  EXPECT_EQ(set_device_resource(cuda3, nullptr), &a);
}

TEST(DeviceResources, RejectsDevicesOutsideTheRegistry) {
  loom::memory::host_resource a;
  const device_id outside[] = {
      {device_type::cuda, loom::memory::max_device_index},
      {device_type::cuda, -1},
      {static_cast<device_type>(7), 0},
  };
  for (const device_id d : outside) {
    SCOPED_TRACE(loom::to_string(d));
    EXPECT_THROW((void)set_device_resource(d, &a), loom::invalid_argument);
    EXPECT_EQ(find_device_resource(d), nullptr);
    EXPECT_THROW((void)get_device_resource(d), loom::not_found);
  }
}

}  // namespace
