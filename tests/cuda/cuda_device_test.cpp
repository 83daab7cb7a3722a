// The CUDA device, its factory, memory resources, copies and placement. Tests that need no
// GPU run everywhere (this build has the backend; the machine may have no driver); the rest
// skip without a GPU (LOOM_REQUIRE_GPU).
#include "backends/cuda/cuda_device.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "backends/cuda/cuda_check.hpp"
#include "cuda_test_support.hpp"
#include "loom/cuda/info.hpp"
#include "loom/cuda/resources.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/memory/c_api.h"
#include "loom/memory/fallback_adaptor.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/trainer.hpp"

namespace loom {
namespace {

using memory::host_tensor;

std::vector<float> values_of(const tensor& t) {
  const tensor dense =
      t.is_contiguous() ? t
                        : memory::contiguous_copy(t, memory::host_resource::instance(), t.device());
  return {dense.data<float>(), dense.data<float>() + dense.num_elements()};
}

std::vector<float> iota_values(std::size_t n, float start = 0.5f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// ---- without a GPU -------------------------------------------------------------------------

TEST(CudaAvailability, BuiltAndHonestAboutDevices) {
  EXPECT_TRUE(cuda::is_built());
  const int n = cuda::device_count();
  EXPECT_GE(n, 0);
  if (n == 0) {
    EXPECT_FALSE(cuda::availability().empty());
    EXPECT_NE(cuda::describe().find("CUDA runtime 13"), std::string::npos) << cuda::describe();
  } else {
    EXPECT_EQ(cuda::availability(), "");
    EXPECT_NE(cuda::describe().find("GPU"), std::string::npos);
  }
}

TEST(CudaFactory, MakesOneDevicePerVisibleGpuAndCpuDevicesAsBefore) {
  device_options o;
  o.virtual_cpu_devices = 2;
  o.cpu_threads = 2;
  const auto devices = device_factory_registry::global().create_devices(o);
  int cpus = 0;
  int gpus = 0;
  for (const auto& d : devices) {
    if (d->type() == device_type::cpu) ++cpus;
    if (d->type() == device_type::cuda) {
      EXPECT_EQ(d->name(), fmt::format("/device:CUDA:{}", gpus));
      ++gpus;
    }
  }
  EXPECT_EQ(cpus, 2);
  EXPECT_EQ(gpus, cuda::device_count());
  // Pinned CPU memory only where a GPU can use it.
  const bool pinned = devices.front()->attributes().description.find("pinned") != std::string::npos;
  EXPECT_EQ(pinned, cuda::device_count() > 0);

  o.cuda_device_count = 0;  // GPUs switched off: CPU devices only, pageable
  for (const auto& d : device_factory_registry::global().create_devices(o)) {
    EXPECT_EQ(d->type(), device_type::cpu);
    EXPECT_EQ(d->attributes().description.find("pinned"), std::string::npos);
  }
}

TEST(CudaKernels, StateAndTransferOpsAreRegistered) {
  const auto& r = kernel_registry::global();
  for (const char* op : {"placeholder", "_arg", "const", "variable", "assign", "assign_add",
                         "assign_sub", "identity", "no_op", "_send", "_recv"}) {
    const auto kernels = r.kernels_for(op);
    EXPECT_TRUE(std::any_of(kernels.begin(), kernels.end(), [](const kernel_def* k) {
      return k->device == device_type::cuda;
    })) << op;
  }
}

TEST(CudaResources, FailWithATypedErrorWhereCudaCannotServe) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "checks the no-GPU error path";
  memory::cuda_resource r(0);
  try {
    (void)r.allocate(1024);
    FAIL() << "cudaMalloc without a GPU succeeded";
  } catch (const cuda_error& e) {
    EXPECT_NE(std::string(e.what()).find("driver"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)memory::pinned_host_resource::instance().allocate(64), cuda_error);
  // The C ABI names the device it has no resource for, and stays usable.
  loom_device gpu{LOOM_DEVICE_CUDA, 0};
  EXPECT_EQ(loom_allocate(64, 0, gpu, nullptr), nullptr);
  EXPECT_EQ(loom_last_error(), LOOM_ERROR_NO_DEVICE);
  loom_device cpu{LOOM_DEVICE_CPU, 0};
  void* p = loom_allocate(64, 0, cpu, nullptr);
  EXPECT_NE(p, nullptr);
  loom_deallocate(p, 64, 0, cpu, nullptr);
}

// An upstream with cudaMalloc's contract on host memory: alignments past CUDA's are refused.
class cuda_like_upstream final : public memory::memory_resource {
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override {
    if (alignment > memory::cuda_allocation_alignment) {
      throw invalid_argument(fmt::format("alignment {} refused", alignment));
    }
    return host_.allocate(bytes, memory::cuda_allocation_alignment, s);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t, stream s) noexcept override {
    host_.deallocate(p, bytes, memory::cuda_allocation_alignment, s);
  }
  bool do_is_equal(const memory_resource& other) const noexcept override { return this == &other; }
  memory::host_resource host_;
};

// The GPU pool asked cudaMalloc for page-aligned regions, which cuda_resource refuses: every
// GPU allocation failed on the first GPU this ran on. Its options now ask for what CUDA gives.
TEST(CudaDevice, PoolRegionsAskForNoMoreAlignmentThanCudaGives) {
  for (const bool preallocate : {false, true}) {
    cuda_options options;
    options.preallocate_fraction = preallocate ? 0.01 : 0.0;
    memory::bfc_pool_options o =
        cuda::gpu_pool_options(0, options, std::size_t{1} << 30, std::size_t{2} << 30);
    o.synchronize = {};  // no GPU streams here
    EXPECT_LE(std::max(o.region_alignment, o.granularity), memory::cuda_allocation_alignment);
    cuda_like_upstream upstream;
    memory::bfc_pool pool(upstream, o);
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (const std::size_t n : {std::size_t{256}, std::size_t{100} << 20, std::size_t{3000}}) {
      blocks.emplace_back(pool.allocate(n, 256, stream{}), n);  // grows past the first region
    }
    for (const auto& [p, n] : blocks) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
      pool.deallocate(p, n, 256, stream{});
    }
  }
}

TEST(CudaAvailability, TrimWithoutAPoolReleasesNothing) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "checks the no-GPU path";
  EXPECT_EQ(cuda::trim(0), 0u);
  EXPECT_EQ(cuda::trim(7), 0u);
}

TEST(CudaChecks, ErrorsNameTheCallAndCudasText) {
  try {
    LOOM_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL();
  } catch (const cuda_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda_device_test.cpp"), std::string::npos) << m;
    EXPECT_EQ(e.code(), static_cast<int>(cudaErrorInvalidValue));
  }
  EXPECT_THROW(LOOM_CUDA_CHECK(cudaErrorMemoryAllocation), out_of_memory);
  EXPECT_THROW(LOOM_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE), cuda_error);
}

TEST(CudaSession, WithoutAGpuEverythingRunsOnTheCpuAsBefore) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "checks the CPU-only placement";
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {3});
  (void)ops::relu(ops::add(x, x), {.name = "y"});
  session s(std::move(g));
  for (const auto& d : s.explain_placement({"x"}, {"y"})) EXPECT_EQ(d.device, "/device:CPU:0");
  const auto out = s.run({{"x", host_tensor({3}, {-1, 2, 3})}}, {"y"});
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{0, 4, 6}));
}

// ---- with a GPU -----------------------------------------------------------------------------

std::unique_ptr<cuda::cuda_device> make_gpu() {
  return std::make_unique<cuda::cuda_device>(0, cuda_options{});
}

TEST(CudaDevice, StreamGroupIsFourDistinctStreams) {
  LOOM_REQUIRE_GPU();
  auto dev = make_gpu();
  const auto& s = dev->streams();
  std::set<cudaStream_t> distinct{s.compute, s.h2d, s.d2h, s.d2d};
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_EQ(dev->name(), "/device:CUDA:0");
  EXPECT_NE(dev->attributes().description.find("sm_"), std::string::npos);
}

TEST(CudaDevice, CopiesRoundTripDenseAndStrided) {
  LOOM_REQUIRE_GPU();
  auto dev = make_gpu();
  const std::vector<float> v = iota_values(24);
  const tensor host = host_tensor({2, 3, 4}, v);
  const tensor on_gpu = dev->copy_from_host(host);
  EXPECT_EQ(on_gpu.device(), (device_id{device_type::cuda, 0}));
  EXPECT_EQ(values_of(dev->copy_to_host(on_gpu, memory::host_resource::instance())), v);

  // A transposed view on the GPU made dense there, and a strided host view copied over.
  const tensor t = tensor::strided(on_gpu.buf(), dtype::f32, {4, 3, 2}, {1, 4, 12}, 0);
  const tensor back = dev->copy_to_host(t, memory::host_resource::instance());
  const tensor expect = tensor::strided(host.buf(), dtype::f32, {4, 3, 2}, {1, 4, 12}, 0);
  EXPECT_EQ(values_of(back), values_of(expect));
  const tensor from_view = dev->copy_from_host(expect);
  EXPECT_EQ(values_of(dev->copy_to_host(from_view, memory::host_resource::instance())),
            values_of(expect));
  // A broadcast (stride 0) view.
  const tensor bcast = tensor::strided(host.buf(), dtype::f32, {3, 4}, {0, 1}, 0);
  EXPECT_EQ(
      values_of(dev->copy_to_host(dev->copy_from_host(bcast), memory::host_resource::instance())),
      values_of(bcast));
  // Empty tensors.
  const tensor empty = host_tensor(dtype::f32, {0, 3});
  EXPECT_EQ(dev->copy_from_host(empty).num_elements(), 0);
}

TEST(CudaDevice, PoolServesTensorsAndTheCApi) {
  LOOM_REQUIRE_GPU();
  auto dev = make_gpu();
  ASSERT_NE(dev->memory_pool(), nullptr);
  const auto before = dev->memory_pool()->get_stats();
  {
    tensor t = dev->allocate(dtype::f32, {1024, 1024});
    EXPECT_GE(dev->memory_pool()->get_stats().bytes_in_use, before.bytes_in_use + (4u << 20));
  }
  EXPECT_EQ(dev->memory_pool()->get_stats().bytes_in_use, before.bytes_in_use);
  // Other frameworks allocate from the same pool through the C ABI.
  loom_device gpu{LOOM_DEVICE_CUDA, 0};
  void* p = loom_allocate(1 << 20, 256, gpu, dev->compute_stream());
  ASSERT_NE(p, nullptr) << loom_last_error_message();
  EXPECT_GE(dev->memory_pool()->get_stats().bytes_in_use, before.bytes_in_use + (1u << 20));
  loom_deallocate(p, 1 << 20, 256, gpu, dev->compute_stream());
  dev->memory_pool()->check_invariants();
  // Released at run time: a large block freed, then trimmed away.
  { tensor big = dev->allocate(dtype::f32, {64, 1024, 1024}); }
  dev->sync();
  EXPECT_GE(cuda::trim(0), std::size_t{256} << 20);
  EXPECT_LT(dev->memory_pool()->get_stats().bytes_reserved, std::size_t{256} << 20);
}

TEST(CudaDevice, SpillsToManagedMemoryInsteadOfFailingWhenAsked) {
  LOOM_REQUIRE_GPU();
  // A pool of 64 MiB on a fresh upstream (not the process's: options differ), with spilling.
  memory::cuda_resource upstream(0);
  memory::bfc_pool_options po;
  po.max_size = 64u << 20;
  po.growth_step = 64u << 20;
  po.poison_free_memory = false;
  po.region_alignment = memory::cuda_allocation_alignment;  // cudaMalloc refuses more
  memory::bfc_pool pool(upstream, po);
  memory::managed_resource managed(0);
  memory::fallback_adaptor spill(pool, managed);
  void* a = spill.allocate(48u << 20);
  void* b = spill.allocate(48u << 20);  // past the pool's limit: managed
  EXPECT_EQ(spill.fallback_blocks(), 1u);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, b), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeManaged);
  spill.deallocate(b, 48u << 20);
  spill.deallocate(a, 48u << 20);
  EXPECT_EQ(spill.fallback_blocks(), 0u);
  EXPECT_THROW((void)pool.allocate(96u << 20), out_of_memory);  // without spilling: fails
}

TEST(CudaSession, PrefersTheGpuAndFallsBackPerNodeWithAReason) {
  LOOM_REQUIRE_GPU();
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {1, 1, 4, 4});
  auto w = ops::constant(b, host_tensor({1, 1, 1, 1}, {2.0f}), {.name = "w"});
  auto y = ops::relu(ops::add(x, x, {.name = "sum"}), {.name = "r"});
  (void)ops::conv2d(y, w, {}, {.name = "conv"});  // no CUDA conv2d: on the CPU
  session s(std::move(g));
  const auto placement = s.explain_placement({"x"}, {"conv"});
  for (const auto& d : placement) {
    if (d.node == "sum" || d.node == "r") {
      EXPECT_EQ(d.device, "/device:CUDA:0") << d.reason;
    }
    if (d.node == "conv") {
      EXPECT_EQ(d.device, "/device:CPU:0");
      EXPECT_NE(d.reason.find("/device:CUDA:0 has no cuda kernel"), std::string::npos) << d.reason;
    }
  }
  std::vector<float> v(16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 8.0f;
  const auto out = s.run({{"x", host_tensor({1, 1, 4, 4}, v)}}, {"conv", "r"});
  ASSERT_EQ(out[1].device().type, device_type::cuda);  // fetched where it was made
  const auto conv = values_of(out[0]);
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_FLOAT_EQ(conv[i], 2.0f * std::max(0.0f, 2.0f * v[i]));
}

TEST(CudaSession, VariablesLiveOnTheGpuAndUpdateInPlace) {
  LOOM_REQUIRE_GPU();
  graph g;
  graph_builder b(g);
  auto v = ops::variable(b, "v", host_tensor({4}, {1, 2, 3, 4}));
  auto d = ops::placeholder(b, "d", dtype::f32, {4});
  ops::assign_add(v, d, {.name = "inc"});
  ops::assign_sub(v, d, {.name = "dec"});
  session s(std::move(g));
  (void)s.run({{"d", host_tensor({4}, {10, 10, 10, 10})}}, {}, {"inc"});
  (void)s.run({{"d", host_tensor({4}, {1, 1, 1, 1})}}, {}, {"dec"});
  const auto out = s.run({}, {"v"});
  ASSERT_EQ(out[0].device().type, device_type::cuda);
  auto& gpu = dynamic_cast<cuda::cuda_device&>(s.find_device("cuda:0"));
  EXPECT_EQ(values_of(gpu.copy_to_host(out[0], memory::host_resource::instance())),
            (std::vector<float>{10, 11, 12, 13}));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// Fetched values stay on the GPU; session::host_value reads them. loom train read its GPU
// loss through a host pointer and crashed on the first GPU it ran on.
TEST(CudaSession, HostValueCopiesGpuFetchesAndPassesHostOnesThrough) {
  LOOM_REQUIRE_GPU();
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {4});
  (void)ops::mul(x, x, {.name = "y", .device = "cuda:0"});
  session s(std::move(g));
  tensor in = memory::host_tensor(dtype::f32, {4});
  for (int i = 0; i < 4; ++i) in.data<float>()[i] = static_cast<float>(i) - 1.5f;
  const tensor y = s.run({{"x", in}}, {"y"}).at(0);
  ASSERT_EQ(y.device().type, device_type::cuda);
  const tensor h = s.host_value(y);
  ASSERT_TRUE(is_host_accessible(h.device().type));
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(h.data<float>()[i], in.data<float>()[i] * in.data<float>()[i]);
  EXPECT_EQ(s.host_value(in).raw_data(), in.raw_data());  // host memory: itself
  EXPECT_FALSE(s.host_value(tensor()).defined());
}

// The trainer on a GPU (placement puts the model there): a short run learns the digits.
TEST(CudaSession, TheTrainerLearnsOnTheGpu) {
  LOOM_REQUIRE_GPU();
  const auto [tr, te] = train::split(train::make_digits(1500, 21), 0.2, 21);
  train::train_options o;
  o.hidden = {64};
  o.epochs = 2;
  o.batch = 32;
  o.lr = 3e-3;
  const auto report = train::train(tr, te, o);
  ASSERT_EQ(report.epochs.size(), 2u);
  EXPECT_LT(report.epochs[1].loss, report.epochs[0].loss);
  EXPECT_GT(report.test_accuracy, 0.6) << "chance is 0.10";
}

}  // namespace
}  // namespace loom
