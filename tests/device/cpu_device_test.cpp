// cpu_device: attributes, allocation from its pool, copies to and from host memory (any
// strides), the memory limit, and concurrent use. Runs under TSan (label `device`).
#include "loom/device/cpu_device.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace {

using loom::cpu_device;
using loom::device_id;
using loom::device_type;
using loom::dtype;
using loom::shape;
using loom::tensor;

// A host tensor of f64 values 0, 1, 2, ... in row-major order.
tensor iota_host(const shape& s) {
  tensor t = loom::memory::host_tensor(dtype::f64, s);
  double* p = t.data<double>();
  for (std::int64_t i = 0; i < t.num_elements(); ++i) p[i] = static_cast<double>(i);
  return t;
}

TEST(CpuDevice, Attributes) {
  cpu_device dev(2, 3, 0, "test device");
  EXPECT_EQ(dev.name(), "/device:CPU:2");
  EXPECT_EQ(dev.id(), (device_id{device_type::cpu, 2}));
  EXPECT_EQ(dev.type(), device_type::cpu);
  EXPECT_EQ(dev.attributes().threads, 3);
  EXPECT_EQ(dev.attributes().memory_limit, 0u);
  EXPECT_EQ(dev.attributes().description, "test device");
  ASSERT_NE(dev.pool(), nullptr);
  EXPECT_EQ(dev.pool()->size(), 3);
  EXPECT_EQ(dev.memory_pool().options().name, "cpu:2");
  EXPECT_TRUE(dev.memory_pool().upstream().is_equal(loom::memory::host_resource::instance()));
  EXPECT_EQ(&dev.allocator(), static_cast<loom::memory::memory_resource*>(&dev.memory_pool()));
  dev.sync();  // a no-op on CPU
}

TEST(CpuDevice, RejectsBadArguments) {
  EXPECT_THROW(cpu_device(-1, 1, 0, ""), loom::invalid_argument);
  EXPECT_THROW(cpu_device(0, 0, 0, ""), loom::invalid_argument);
}

TEST(CpuDevice, AllocateComesFromItsPool) {
  cpu_device dev(1, 1, 0, "");
  const auto before = dev.memory_pool().get_stats();
  {
    tensor t = dev.allocate(dtype::f32, shape{2, 3});
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.device(), (device_id{device_type::cpu, 1}));
    EXPECT_EQ(t.type(), dtype::f32);
    EXPECT_EQ(t.shape(), (shape{2, 3}));
    const auto during = dev.memory_pool().get_stats();
    EXPECT_EQ(during.allocations_in_use, before.allocations_in_use + 1);
    EXPECT_EQ(during.bytes_in_use, before.bytes_in_use + 2 * 3 * sizeof(float));
    float* p = t.data<float>();
    for (int i = 0; i < 6; ++i) p[i] = static_cast<float>(i);
    EXPECT_EQ(p[5], 5.0f);
  }
  // The buffer went back to the pool with the last view.
  EXPECT_EQ(dev.memory_pool().get_stats().allocations_in_use, before.allocations_in_use);
  EXPECT_THROW((void)dev.allocate(dtype::f32, shape{-1, 3}), loom::invalid_argument);
}

TEST(CpuDevice, CopyFromHostOfAStridedViewIsDense) {
  cpu_device dev(0, 2, 0, "");
  const tensor src = iota_host(shape{3, 4});  // src[i][j] = 4i + j
  // The transpose: shape [4, 3], element (j, i) at 4i + j.
  const tensor transposed = tensor::strided(src.buf(), dtype::f64, shape{4, 3}, shape{1, 4}, 0);
  ASSERT_FALSE(transposed.is_contiguous());
  const tensor on_device = dev.copy_from_host(transposed);
  EXPECT_TRUE(on_device.is_contiguous());
  EXPECT_EQ(on_device.device(), dev.id());
  EXPECT_EQ(on_device.shape(), (shape{4, 3}));
  EXPECT_NE(on_device.raw_data(), src.raw_data());
  const double* d = on_device.data<double>();
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(d[j * 3 + i], 4.0 * i + j) << j << "," << i;
  }

  // A broadcast (stride 0) view with an offset: row 1 of src repeated twice.
  const tensor rows = tensor::strided(src.buf(), dtype::f64, shape{2, 4}, shape{0, 1}, 4);
  const tensor dense_rows = dev.copy_from_host(rows);
  const double* r = dense_rows.data<double>();
  for (int k = 0; k < 2; ++k) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(r[k * 4 + j], 4.0 + j);
  }
}

TEST(CpuDevice, CopyRoundTripKeepsEveryByte) {
  cpu_device dev(0, 1, 0, "");
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                  dtype::i8, dtype::u8, dtype::boolean}) {
    const shape s{5, 7};
    tensor host = loom::memory::host_tensor(t, s);
    auto* bytes = static_cast<unsigned char*>(host.raw_data());
    for (std::size_t i = 0; i < host.nbytes(); ++i) {
      // Booleans must hold 0 or 1; other types take any bit pattern.
      bytes[i] = t == dtype::boolean ? static_cast<unsigned char>(i % 2)
                                     : static_cast<unsigned char>((i * 131 + 7) & 0xff);
    }
    const tensor on_device = dev.copy_from_host(host);
    const tensor back = dev.copy_to_host(on_device, loom::memory::host_resource::instance());
    EXPECT_EQ(back.device(), (device_id{device_type::cpu, 0}));
    EXPECT_EQ(back.type(), t);
    EXPECT_EQ(back.shape(), s);
    EXPECT_TRUE(back.is_contiguous());
    EXPECT_NE(back.raw_data(), on_device.raw_data());
    ASSERT_EQ(back.nbytes(), host.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()), 0) << to_string(t);
  }
}

TEST(CpuDevice, CopyToHostOfAStridedViewIsDense) {
  cpu_device dev(0, 1, 0, "");
  const tensor on_device = dev.copy_from_host(iota_host(shape{2, 3, 4}));
  // Every other element of the last axis, from element 1: [2, 3, 2] with strides [12, 4, 2].
  const tensor view =
      tensor::strided(on_device.buf(), dtype::f64, shape{2, 3, 2}, shape{12, 4, 2}, 1);
  const tensor back = dev.copy_to_host(view, loom::memory::host_resource::instance());
  const double* b = back.data<double>();
  int k = 0;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int l = 0; l < 2; ++l) EXPECT_EQ(b[k++], 12.0 * i + 4.0 * j + 2.0 * l + 1.0);
    }
  }
}

TEST(CpuDevice, EmptyTensorsCopy) {
  cpu_device dev(0, 1, 0, "");
  const tensor host = loom::memory::host_tensor(dtype::f32, shape{0, 3});
  const tensor on_device = dev.copy_from_host(host);
  EXPECT_EQ(on_device.num_elements(), 0);
  EXPECT_EQ(on_device.shape(), (shape{0, 3}));
  const tensor back = dev.copy_to_host(on_device, loom::memory::host_resource::instance());
  EXPECT_EQ(back.shape(), (shape{0, 3}));
}

// A release function that borrows: the memory belongs to the test.
void borrow(void*, void*, std::size_t, std::size_t, loom::stream) noexcept {}

TEST(CpuDevice, CopiesRejectUndefinedAndDeviceMemory) {
  cpu_device dev(0, 1, 0, "");
  EXPECT_THROW((void)dev.copy_from_host(tensor{}), loom::invalid_argument);
  EXPECT_THROW((void)dev.copy_to_host(tensor{}, loom::memory::host_resource::instance()),
               loom::invalid_argument);
  // A tensor that claims to live in CUDA memory is no host tensor.
  alignas(64) static float storage[4] = {1, 2, 3, 4};
  const tensor cuda_tensor(
      loom::buffer::adopt(storage, sizeof storage, 64, device_id{device_type::cuda, 0},
                          loom::stream{}, &borrow, nullptr),
      dtype::f32, shape{4});
  try {
    (void)dev.copy_from_host(cuda_tensor);
    ADD_FAILURE() << "copied from CUDA memory";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/device:CPU:0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  // Pinned host memory is host memory.
  const tensor pinned(
      loom::buffer::adopt(storage, sizeof storage, 64, device_id{device_type::cuda_host, 0},
                          loom::stream{}, &borrow, nullptr),
      dtype::f32, shape{4});
  const tensor copied = dev.copy_from_host(pinned);
  EXPECT_EQ(copied.data<float>()[3], 4.0f);
}

TEST(CpuDevice, MemoryLimitIsEnforced) {
  constexpr std::size_t limit = std::size_t{1} << 20;
  cpu_device dev(3, 1, limit, "");
  EXPECT_EQ(dev.attributes().memory_limit, limit);
  EXPECT_EQ(dev.memory_pool().options().max_size, limit);
  // Beyond the limit at once.
  try {
    (void)dev.allocate(dtype::u8, shape{static_cast<std::int64_t>(limit) + 1});
    ADD_FAILURE() << "allocated past the limit";
  } catch (const loom::out_of_memory& e) {
    EXPECT_EQ(e.requested_bytes(), limit + 1);
    EXPECT_NE(e.refused_by().find("cpu:3"), std::string::npos) << e.refused_by();
  }
  // Up to the limit in pieces, then no more.
  const tensor a = dev.allocate(dtype::u8, shape{static_cast<std::int64_t>(limit / 2)});
  const tensor b = dev.allocate(dtype::u8, shape{static_cast<std::int64_t>(limit / 2)});
  EXPECT_THROW((void)dev.allocate(dtype::u8, shape{256}), loom::out_of_memory);
  EXPECT_LE(dev.memory_pool().get_stats().bytes_reserved, limit);
  // copy_from_host goes through the same pool and limit.
  EXPECT_THROW((void)dev.copy_from_host(loom::memory::host_tensor(dtype::f32, shape{16})),
               loom::out_of_memory);
}

TEST(CpuDevice, KernelsOnItsPoolAllocateConcurrently) {
  cpu_device dev(0, 4, 0, "");
  constexpr std::int64_t n = 256;
  std::vector<double> sums(n, 0.0);
  dev.pool()->parallel_for(n, 1e6, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      tensor t = dev.allocate(dtype::f64, shape{i + 1});
      double* p = t.data<double>();
      for (std::int64_t k = 0; k <= i; ++k) p[k] = static_cast<double>(k);
      const tensor back = dev.copy_to_host(t, loom::memory::host_resource::instance());
      double s = 0;
      for (std::int64_t k = 0; k <= i; ++k) s += back.data<double>()[k];
      sums[static_cast<std::size_t>(i)] = s;
    }
  });
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(sums[static_cast<std::size_t>(i)], static_cast<double>(i * (i + 1) / 2)) << i;
  }
  EXPECT_EQ(dev.memory_pool().get_stats().allocations_in_use, 0u);
  dev.memory_pool().check_invariants();
}

}  // namespace
