// The CUDA upstream resources (loom/cuda/resources.hpp).
#include "loom/cuda/resources.hpp"

#include <fmt/format.h>

#include "cuda_check.hpp"
#include "cuda_device.hpp"

namespace loom::memory {
namespace {

cudaStream_t to_cuda(stream s) noexcept {
  return static_cast<cudaStream_t>(s.handle());
}

// Turns CUDA's out-of-memory into loom::out_of_memory carrying the request and the
// resource's name; other errors throw loom::cuda_error.
void check_allocation(cudaError_t e, std::size_t bytes, const char* resource, const char* call,
                      int device) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    throw out_of_memory(fmt::format("{} on cuda:{}: {} of {} bytes failed: {}", resource, device,
                                    call, bytes, cuda::describe(e)),
                        bytes, resource);
  }
  throw cuda_error(fmt::format("{} on cuda:{}: {} of {} bytes failed: {}", resource, device, call,
                               bytes, cuda::describe(e)),
                   static_cast<int>(e));
}

// Device allocations are 256-byte aligned by CUDA; larger alignments are not offered.
void check_alignment(std::size_t alignment, const char* resource) {
  if (alignment > cuda_allocation_alignment) {
    throw invalid_argument(
        fmt::format("{}: alignment {} is not supported (CUDA allocations are {}-byte aligned)",
                    resource, alignment, cuda_allocation_alignment));
  }
}

}  // namespace

// ---- cuda_resource ----------------------------------------------------------------------

cuda_resource::cuda_resource(int device) : device_(device) {}

void* cuda_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream /*s*/) {
  check_alignment(alignment, "cuda_resource");
  const cuda::device_guard guard(device_);
  void* p = nullptr;
  check_allocation(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), bytes, "cuda_resource",
                   "cudaMalloc", device_);
  return p;
}

void cuda_resource::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/,
                                  stream /*s*/) noexcept {
  try {
    const cuda::device_guard guard(device_);
    (void)cudaFree(p);  // synchronises the device: every stream's use of p is over
  } catch (...) {
    (void)cudaFree(p);
  }
}

bool cuda_resource::do_is_equal(const memory_resource& other) const noexcept {
  const auto* o = dynamic_cast<const cuda_resource*>(&other);
  return o != nullptr && o->device_ == device_;
}

// ---- cuda_async_resource ----------------------------------------------------------------

cuda_async_resource::cuda_async_resource(int device, std::size_t release_threshold)
    : device_(device), pool_(nullptr) {
  const cuda::device_guard guard(device_);
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  LOOM_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  std::uint64_t threshold = release_threshold;
  const cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (e != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool);
    LOOM_CUDA_CHECK(e);
  }
  pool_ = pool;
}

cuda_async_resource::~cuda_async_resource() {
  const cuda::device_guard guard(device_);
  (void)cudaDeviceSynchronize();
  (void)cudaMemPoolDestroy(static_cast<cudaMemPool_t>(pool_));
}

void* cuda_async_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  check_alignment(alignment, "cuda_async_resource");
  const cuda::device_guard guard(device_);
  void* p = nullptr;
  check_allocation(cudaMallocFromPoolAsync(&p, std::max<std::size_t>(bytes, 1),
                                           static_cast<cudaMemPool_t>(pool_), to_cuda(s)),
                   bytes, "cuda_async_resource", "cudaMallocFromPoolAsync", device_);
  return p;
}

void cuda_async_resource::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/,
                                        stream s) noexcept {
  try {
    const cuda::device_guard guard(device_);
    (void)cudaFreeAsync(p, to_cuda(s));
  } catch (...) {
    (void)cudaFreeAsync(p, to_cuda(s));
  }
}

// ---- managed_resource -------------------------------------------------------------------

managed_resource::managed_resource(int device, managed_options options)
    : device_(device), options_(options) {}

namespace {
cudaMemLocation device_location(int device) {
  cudaMemLocation l{};
  l.type = cudaMemLocationTypeDevice;
  l.id = device;
  return l;
}
cudaMemLocation host_location() {
  cudaMemLocation l{};
  l.type = cudaMemLocationTypeHost;
  l.id = 0;
  return l;
}
}  // namespace

void* managed_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  check_alignment(alignment, "managed_resource");
  const cuda::device_guard guard(device_);
  void* p = nullptr;
  const std::size_t n = std::max<std::size_t>(bytes, 1);
  check_allocation(cudaMallocManaged(&p, n, cudaMemAttachGlobal), bytes, "managed_resource",
                   "cudaMallocManaged", device_);
  try {
    if (options_.prefer_device) {
      LOOM_CUDA_CHECK(
          cudaMemAdvise(p, n, cudaMemAdviseSetPreferredLocation, device_location(device_)));
    }
    if (options_.host_accesses) {
      LOOM_CUDA_CHECK(cudaMemAdvise(p, n, cudaMemAdviseSetAccessedBy, host_location()));
    }
    if (options_.prefetch_on_allocate) prefetch(p, n, true, s);
  } catch (...) {
    (void)cudaFree(p);
    throw;
  }
  return p;
}

void managed_resource::prefetch(const void* p, std::size_t bytes, bool to_device, stream s) const {
  const cuda::device_guard guard(device_);
  LOOM_CUDA_CHECK(cudaMemPrefetchAsync(
      p, bytes, to_device ? device_location(device_) : host_location(), 0, to_cuda(s)));
}

void managed_resource::advise_read_mostly(const void* p, std::size_t bytes) const {
  const cuda::device_guard guard(device_);
  LOOM_CUDA_CHECK(cudaMemAdvise(p, bytes, cudaMemAdviseSetReadMostly, device_location(device_)));
}

void managed_resource::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/,
                                     stream /*s*/) noexcept {
  (void)cudaFree(p);
}

bool managed_resource::do_is_equal(const memory_resource& other) const noexcept {
  const auto* o = dynamic_cast<const managed_resource*>(&other);
  return o != nullptr && o->device_ == device_;
}

// ---- pinned_host_resource ---------------------------------------------------------------

pinned_host_resource& pinned_host_resource::instance() noexcept {
  static pinned_host_resource* const r = new pinned_host_resource;
  return *r;
}

void* pinned_host_resource::do_allocate(std::size_t bytes, std::size_t alignment, stream /*s*/) {
  check_alignment(alignment > 4096 ? alignment : 0, "pinned_host_resource");
  void* p = nullptr;
  check_allocation(cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable), bytes,
                   "pinned_host_resource", "cudaHostAlloc", -1);
  return p;
}

void pinned_host_resource::do_deallocate(void* p, std::size_t /*bytes*/, std::size_t /*alignment*/,
                                         stream /*s*/) noexcept {
  (void)cudaFreeHost(p);
}

bool pinned_host_resource::do_is_equal(const memory_resource& other) const noexcept {
  return dynamic_cast<const pinned_host_resource*>(&other) != nullptr;
}

}  // namespace loom::memory
