// DLPack with CUDA memory (Note [cuda imports]) and the stream handshake.
//
// Without a GPU: imports of kDLCUDA / kDLCUDAManaged / kDLCUDAHost tensors whose data is an
// address nobody dereferences (an import needs no CUDA call), exports of tensors on CUDA
// devices read back by walking the structs, the deleter's lifetime, the stream numbers of
// the handshake and their errors, and the interop functions' failures without CUDA.
// With a GPU (LOOM_REQUIRE_GPU): real device memory exported and imported, read back on
// the host against the values written, strided views, the handshake's CUDA calls, and
// other libraries allocating from loom's pool of the GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "loom/core/error.hpp"
#include "loom/cuda/interop.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/interop/dlpack.hpp"
#include "loom/memory/c_api.h"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::interop {
namespace {

// The device type codes as the DLPack specification numbers them (not loom's constants).
constexpr std::int32_t spec_cpu = 1, spec_cuda = 2, spec_cuda_host = 3, spec_rocm = 10,
                       spec_cuda_managed = 13;

// An address in no mapping (never dereferenced), aligned to 256 bytes like cudaMalloc's.
void* fake_device_address(std::uintptr_t offset = 0) {
  return reinterpret_cast<void*>(std::uintptr_t{0x7f3a00000000} + offset);
}

// A producer's managed tensor over fake device memory, with a deleter counting its calls.
template <class Managed>
struct producer {
  Managed managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  int deleted = 0;

  producer(DLDevice device, std::vector<std::int64_t> s, std::vector<std::int64_t> st,
           std::uint64_t byte_offset = 0)
      : shape(std::move(s)), strides(std::move(st)) {
    DLTensor& d = managed.dl_tensor;
    d.data = fake_device_address();
    d.device = device;
    d.ndim = static_cast<std::int32_t>(shape.size());
    d.dtype = DLDataType{2 /* float */, 32, 1};
    d.shape = shape.data();
    d.strides = strides.empty() ? nullptr : strides.data();
    d.byte_offset = byte_offset;
    managed.manager_ctx = this;
    managed.deleter = [](Managed* self) { ++static_cast<producer*>(self->manager_ctx)->deleted; };
  }
};

// A tensor on `device` viewing fake memory (never dereferenced), released by nobody.
tensor fake_tensor(device_id device, const shape& dims, stream s = {}) {
  const std::size_t bytes = static_cast<std::size_t>(dims.num_elements()) * 4;
  return tensor(buffer::adopt(fake_device_address(), bytes, 256, device, s, nullptr, nullptr),
                dtype::f32, dims);
}

TEST(DlpackCudaImport, CudaMemoryBecomesATensorOnThatGpuWithoutACopy) {
  int token = 0;
  const stream consumer{&token};
  producer<DLManagedTensorVersioned> p({static_cast<DLDeviceType>(spec_cuda), 3}, {2, 3}, {}, 64);
  p.managed.version = {1, 0};
  {
    const tensor t = from_dlpack(&p.managed, consumer);
    EXPECT_EQ(t.device(), (device_id{device_type::cuda, 3}));
    EXPECT_EQ(t.shape(), (shape{2, 3}));
    EXPECT_EQ(t.strides(), (shape{3, 1}));
    EXPECT_EQ(t.type(), dtype::f32);
    // data + byte_offset: the same address, no copy.
    EXPECT_EQ(t.raw_data(), static_cast<std::byte*>(fake_device_address()) + 64);
    EXPECT_EQ(t.buf()->stream_of(), consumer);
    EXPECT_FALSE(t.buf()->read_only());
    const tensor view = t;  // a second reference
    EXPECT_EQ(p.deleted, 0);
  }
  EXPECT_EQ(p.deleted, 1);  // once, after the last reference
}

TEST(DlpackCudaImport, ManagedAndPinnedHostMemoryKeepTheirKinds) {
  struct row {
    std::int32_t code, id;
    device_id expected;
  };
  const row rows[] = {{spec_cuda_managed, 1, {device_type::cuda_managed, 1}},
                      {spec_cuda_host, 0, {device_type::cuda_host, 0}},
                      {spec_cuda_host, 2, {device_type::cuda_host, 0}},  // one pinned pool
                      {spec_cuda, 0, {device_type::cuda, 0}}};
  for (const row& r : rows) {
    SCOPED_TRACE(r.code);
    producer<DLManagedTensor> p({static_cast<DLDeviceType>(r.code), r.id}, {4, 5}, {1, 4});
    {
      const tensor t = from_dlpack(&p.managed);
      EXPECT_EQ(t.device(), r.expected);
      EXPECT_EQ(t.strides(), (shape{1, 4}));  // a transposed view stays one
      EXPECT_EQ(t.raw_data(), fake_device_address());
      EXPECT_TRUE(t.buf()->stream_of().is_default());  // no stream given
    }
    EXPECT_EQ(p.deleted, 1);
  }
}

TEST(DlpackCudaImport, HostMemoryIgnoresTheStream) {
  std::vector<float> data(6, 1.5F);
  producer<DLManagedTensor> p({static_cast<DLDeviceType>(spec_cpu), 0}, {6}, {});
  p.managed.dl_tensor.data = data.data();
  int token = 0;
  const tensor t = from_dlpack(&p.managed, stream{&token});
  EXPECT_EQ(t.device(), (device_id{device_type::cpu, 0}));
  EXPECT_TRUE(t.buf()->stream_of().is_default());
  EXPECT_EQ(t.data<float>()[5], 1.5F);
}

TEST(DlpackCudaImport, OtherDevicesAreRefusedAndTheStructStaysTheCallers) {
  producer<DLManagedTensor> rocm({static_cast<DLDeviceType>(spec_rocm), 0}, {2}, {});
  try {
    (void)from_dlpack(&rocm.managed);
    ADD_FAILURE() << "no error";
  } catch (const unsupported_error& e) {
    EXPECT_NE(std::string(e.what()).find("rocm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(10, 0)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rocm.deleted, 0);
  producer<DLManagedTensor> negative({static_cast<DLDeviceType>(spec_cuda), -1}, {2}, {});
  try {
    (void)from_dlpack(&negative.managed);
    ADD_FAILURE() << "no error";
  } catch (const unsupported_error& e) {
    ADD_FAILURE() << e.what();
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(negative.deleted, 0);
}

TEST(DlpackCudaExport, CarriesTheGpuAndTheAddress) {
  const device_id gpus[] = {{device_type::cuda, 0},
                            {device_type::cuda, 5},
                            {device_type::cuda_managed, 2},
                            {device_type::cuda_host, 0}};
  const std::int32_t codes[] = {spec_cuda, spec_cuda, spec_cuda_managed, spec_cuda_host};
  for (std::size_t i = 0; i < std::size(gpus); ++i) {
    SCOPED_TRACE(to_string(gpus[i]));
    const tensor t = fake_tensor(gpus[i], shape{3, 4});
    DLManagedTensorVersioned* m = to_dlpack_versioned(t);
    EXPECT_EQ(static_cast<std::int32_t>(m->dl_tensor.device.device_type), codes[i]);
    EXPECT_EQ(m->dl_tensor.device.device_id, gpus[i].index);
    EXPECT_EQ(m->dl_tensor.data, fake_device_address());
    EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
    EXPECT_EQ(m->dl_tensor.ndim, 2);
    EXPECT_EQ(m->dl_tensor.shape[0], 3);
    EXPECT_EQ(m->dl_tensor.strides[1], 1);
    // Back in: the same device and address; the export's deleter runs when the import goes.
    {
      const tensor back = from_dlpack(m);
      EXPECT_EQ(back.device(), gpus[i]);
      EXPECT_EQ(back.raw_data(), fake_device_address());
    }
    DLManagedTensor* legacy = to_dlpack(t);
    EXPECT_EQ(static_cast<std::int32_t>(legacy->dl_tensor.device.device_type), codes[i]);
    legacy->deleter(legacy);
  }
}

TEST(DlpackCudaHandshake, StreamNumbersFollowTheArrayApi) {
  const tensor gpu = fake_tensor({device_type::cuda, 0}, shape{2});
  const tensor managed = fake_tensor({device_type::cuda_managed, 0}, shape{2});
  for (const tensor& t : {gpu, managed}) {
    EXPECT_EQ(consumer_stream_for(t, std::nullopt), stream_from_protocol(1));  // legacy default
    EXPECT_EQ(consumer_stream_for(t, std::nullopt)->value(), 1u);
    EXPECT_EQ(consumer_stream_for(t, 1)->value(), 1u);
    EXPECT_EQ(consumer_stream_for(t, 2)->value(), 2u);
    EXPECT_EQ(consumer_stream_for(t, 0x7f00deadbe00)->value(), 0x7f00deadbe00u);
    EXPECT_FALSE(consumer_stream_for(t, -1));  // no synchronisation
    try {
      (void)consumer_stream_for(t, 0);
      ADD_FAILURE() << "0 accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("ambiguous"), std::string::npos) << e.what();
    }
    try {
      (void)consumer_stream_for(t, -7);
      ADD_FAILURE() << "-7 accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("-7"), std::string::npos) << e.what();
    }
  }
  const tensor host = memory::host_tensor(dtype::f32, shape{2});
  const tensor pinned = fake_tensor({device_type::cuda_host, 0}, shape{2});
  for (const tensor& t : {host, pinned}) {
    EXPECT_FALSE(consumer_stream_for(t, std::nullopt));
    EXPECT_FALSE(consumer_stream_for(t, -1));
    try {
      (void)consumer_stream_for(t, 1);
      ADD_FAILURE() << "a stream for host memory accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("no streams"), std::string::npos) << e.what();
    }
  }
  // Nothing to wait for: no CUDA call, so these work on any machine.
  EXPECT_NO_THROW(prepare_export(host, std::nullopt));
  EXPECT_NO_THROW(prepare_export(gpu, -1));
  EXPECT_THROW(prepare_export(gpu, 0), invalid_argument);
}

TEST(DlpackCudaHandshake, WithoutAGpuTheCudaCallsFailClearly) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present";
  const tensor gpu = fake_tensor({device_type::cuda, 0}, shape{2});
  EXPECT_THROW(prepare_export(gpu, 1), error);
  EXPECT_THROW((void)cuda_interop_stream(0), error);
  EXPECT_THROW((void)cuda_memory_info(0), error);
  EXPECT_THROW(cuda_serve_c_api(0), error);
  if (!cuda_interop_available()) {
    try {
      (void)cuda_current_device();
      ADD_FAILURE() << "no error";
    } catch (const unsupported_error& e) {
      EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
    }
  } else {
    try {
      (void)cuda_interop_stream(0);
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0 is no visible GPU"), std::string::npos)
          << e.what();
    }
  }
}

TEST(DlpackCudaHandshake, ProtocolNumbersAreStreamHandles) {
  EXPECT_EQ(protocol_stream_number(stream{}), 1);  // CUDA's null stream is the legacy one
  EXPECT_EQ(protocol_stream_number(stream_from_protocol(2)), 2);
  EXPECT_EQ(protocol_stream_number(stream_from_protocol(0x5000)), 0x5000);
}

// ---- with a GPU ---------------------------------------------------------------------------

std::unique_ptr<device> first_gpu() {
  device_factory* f = device_factory_registry::global().find(device_type::cuda);
  if (f == nullptr) return nullptr;
  device_options o;
  o.cuda_device_count = 1;
  auto devices = f->create_devices(o);
  return devices.empty() ? nullptr : std::move(devices.front());
}

TEST(DlpackCudaGpu, RealDeviceMemoryRoundTripsWithoutACopy) {
  LOOM_REQUIRE_GPU();
  std::unique_ptr<device> gpu = first_gpu();
  ASSERT_NE(gpu, nullptr);
  std::vector<float> values(12);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5F * static_cast<float>(i) - 2.0F;
  const tensor host = memory::host_tensor<float>(shape{3, 4}, values);
  const tensor d = gpu->copy_from_host(host);
  ASSERT_EQ(d.device(), (device_id{device_type::cuda, 0}));
  EXPECT_EQ(cuda_pointer_device(d.raw_data()), (device_id{device_type::cuda, 0}));
  EXPECT_EQ(cuda_pointer_device(host.raw_data()).type == device_type::cpu ||
                cuda_pointer_device(host.raw_data()).type == device_type::cuda_host,
            true);

  // The handshake: the consumer (the interop stream) waits for loom's work on d.
  const stream consumer = cuda_interop_stream(0);
  prepare_export(d, protocol_stream_number(consumer));
  DLManagedTensorVersioned* m = to_dlpack_versioned(d);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.data, d.raw_data());
  const tensor back = from_dlpack(m, consumer);
  EXPECT_EQ(back.raw_data(), d.raw_data());
  EXPECT_EQ(back.buf()->stream_of(), consumer);
  cuda_stream_synchronize(0, consumer);
  const tensor read = gpu->copy_to_host(back, memory::get_device_resource({device_type::cpu, 0}));
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(read.data<float>()[i], values[i]) << i;
  }

  // A transposed view goes out and back as a view, and reads back transposed.
  const tensor t = tensor::strided(d.buf(), dtype::f32, shape{4, 3}, shape{1, 4}, 0);
  DLManagedTensor* mt = to_dlpack(t);
  const tensor tb = from_dlpack(mt);
  EXPECT_EQ(tb.strides(), (shape{1, 4}));
  const tensor tr = gpu->copy_to_host(tb, memory::get_device_resource({device_type::cpu, 0}));
  for (std::int64_t r = 0; r < 4; ++r) {
    for (std::int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(tr.data<float>()[r * 3 + c], values[static_cast<std::size_t>(c * 4 + r)]);
    }
  }
  gpu->sync();
}

TEST(DlpackCudaGpu, StreamWaitsAndMemoryInfoWork) {
  LOOM_REQUIRE_GPU();
  const stream s = cuda_interop_stream(0);
  EXPECT_EQ(s, cuda_interop_stream(0));  // one per GPU
  EXPECT_FALSE(s.is_default());
  EXPECT_NO_THROW(cuda_stream_wait(0, s, stream_from_protocol(legacy_default_stream)));
  EXPECT_NO_THROW(cuda_stream_wait(0, stream_from_protocol(per_thread_default_stream), s));
  EXPECT_NO_THROW(cuda_stream_wait(0, s, stream{}));  // unknown producer: the whole device
  EXPECT_NO_THROW(cuda_stream_synchronize(0, s));
  const auto [free_bytes, total_bytes] = cuda_memory_info(0);
  EXPECT_GT(total_bytes, 0u);
  EXPECT_LE(free_bytes, total_bytes);
  EXPECT_GE(cuda_current_device(), 0);
  EXPECT_THROW((void)cuda_interop_stream(cuda::device_count()), invalid_argument);
}

TEST(DlpackCudaGpu, OtherLibrariesAllocateFromTheGpuPool) {
  LOOM_REQUIRE_GPU();
  cuda_serve_c_api(0);
  const loom_device cuda0{LOOM_DEVICE_CUDA, 0};
  loom_memory_statistics pool_before{};
  ASSERT_EQ(loom_memory_stats(cuda0, &pool_before), LOOM_OK);
  void* p = loom_allocate_for("dlpack_cuda_test", 1 << 20, 256, cuda0, nullptr);
  ASSERT_NE(p, nullptr) << loom_last_error_message();
  EXPECT_EQ(cuda_pointer_device(p), (device_id{device_type::cuda, 0}));
  loom_memory_statistics mine{};
  ASSERT_EQ(loom_memory_stats_for(cuda0, "dlpack_cuda_test", &mine), LOOM_OK);
  EXPECT_EQ(mine.bytes_in_use, std::size_t{1} << 20);
  loom_memory_statistics pool_during{};
  ASSERT_EQ(loom_memory_stats(cuda0, &pool_during), LOOM_OK);
  EXPECT_EQ(pool_during.bytes_in_use, pool_before.bytes_in_use + (1 << 20));
  loom_deallocate_for("dlpack_cuda_test", p, 1 << 20, 256, cuda0, nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_OK);
  ASSERT_EQ(loom_memory_stats_for(cuda0, "dlpack_cuda_test", &mine), LOOM_OK);
  EXPECT_EQ(mine.bytes_in_use, 0u);
}

}  // namespace
}  // namespace loom::interop
