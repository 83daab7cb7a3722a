// cuda_device: streams, events, copies and memory of one GPU (Notes [cuda stream group] and
// [cuda memory] in cuda_device.hpp).
#include "cuda_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cuda_check.hpp"
#include "kernels/strided_copy.cuh"
#include "loom/cuda/resources.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/memory/fallback_adaptor.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cuda {
namespace {

cudaStream_t to_cuda(stream s) noexcept {
  return static_cast<cudaStream_t>(s.handle());
}

// Orders every block handed out through it on one stream when the caller names none (the
// default stream): tensors on a device are used by its compute stream (Note [cuda memory]).
class stream_binding final : public memory::memory_resource {
 public:
  stream_binding(memory::memory_resource& upstream, cudaStream_t bound)
      : upstream_(&upstream), bound_(bound) {}

 private:
  stream pick(stream s) const noexcept { return s.is_default() ? stream(bound_) : s; }
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override {
    return upstream_->allocate(bytes, alignment, pick(s));
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     stream s) noexcept override {
    upstream_->deallocate(p, bytes, alignment, pick(s));
  }
  bool do_is_equal(const memory_resource& other) const noexcept override {
    const auto* o = dynamic_cast<const stream_binding*>(&other);
    return o != nullptr && upstream_->is_equal(*o->upstream_);
  }
  std::optional<memory_stats> do_stats() const override { return upstream_->stats(); }

  memory::memory_resource* upstream_;
  cudaStream_t bound_;
};

// Waits for the work queued on `s` so far by recording an event there and waiting for it:
// the pool's stream_synchronizer for device memory (Note [stream-ordered memory]).
void wait_for_stream(int ordinal, stream s) {
  const device_guard guard(ordinal);
  cudaEvent_t e = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(e, to_cuda(s));
  if (status == cudaSuccess) status = cudaEventSynchronize(e);
  (void)cudaEventDestroy(e);
  LOOM_CUDA_CHECK(status);
}

// Note [cuda stream reuse]
// A stream handle outlives the device that made it: the process-wide pool remembers the
// stream each block was freed on, and a fetched tensor records its device's compute stream
// and frees its block there, maybe after the session is gone. A destroyed stream's handle
// in either place made the next session's allocation wait on a dead stream (on the first
// GPU run: "context is destroyed", then segmentation faults in cuBLAS). So stream groups are
// never destroyed: a device takes one from its GPU's free list and gives it back, its work
// finished, when it is destroyed. A block pending on a reused stream is then ordered after
// the stream's new work, which is only later than needed.
class stream_groups {
 public:
  static stream_groups& instance() {
    static auto* const groups = new stream_groups;  // never destroyed: handles live on
    return *groups;
  }
  stream_group take(int ordinal) {
    {
      const std::lock_guard lock(mutex_);
      auto& free = free_[ordinal];
      if (!free.empty()) {
        const stream_group g = free.back();
        free.pop_back();
        return g;
      }
    }
    stream_group g;
    try {
      for (cudaStream_t* s : {&g.compute, &g.h2d, &g.d2h, &g.d2d}) {
        LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
      }
    } catch (...) {
      for (cudaStream_t s : {g.compute, g.h2d, g.d2h, g.d2d}) {
        if (s != nullptr) (void)cudaStreamDestroy(s);
      }
      throw;
    }
    return g;
  }
  void give_back(int ordinal, const stream_group& g) {
    const std::lock_guard lock(mutex_);
    free_[ordinal].push_back(g);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<stream_group>> free_;
};

std::string gib(std::size_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / static_cast<double>(1ull << 30));
}

}  // namespace

// ---- process-wide memory per GPU ---------------------------------------------------------

memory::bfc_pool_options gpu_pool_options(int ordinal, const cuda_options& options,
                                          std::size_t free_bytes, std::size_t total_bytes) {
  memory::bfc_pool_options o;
  o.name = fmt::format("cuda:{}", ordinal);
  if (options.preallocate_fraction < 0 || options.preallocate_fraction > 1) {
    throw invalid_argument(fmt::format("cuda:{}: preallocate_fraction {} is not within [0, 1]",
                                       ordinal, options.preallocate_fraction));
  }
  const std::size_t limit = options.memory_limit != 0 ? options.memory_limit : free_bytes;
  o.max_size = std::max<std::size_t>(limit, 1);
  o.initial_size = std::min(limit, static_cast<std::size_t>(options.preallocate_fraction *
                                                            static_cast<double>(total_bytes)));
  if (!options.allow_growth) {
    if (o.initial_size == 0) {
      throw invalid_argument(fmt::format(
          "cuda:{}: allow_growth is off and preallocate_fraction is 0: the pool would hold "
          "no memory",
          ordinal));
    }
    o.growth_step = 0;
  } else {
    // Regions of 2 MiB and up, doubling (TensorFlow's), capped at 1 GiB: few cudaMallocs
    // on a large card, little waste on a small job.
    o.growth_step = std::size_t{64} << 20;
  }
  o.poison_free_memory = false;  // the CPU cannot touch device memory
  o.region_alignment = memory::cuda_allocation_alignment;
  o.synchronize = [ordinal](stream s) { wait_for_stream(ordinal, s); };
  return o;
}

class device_memory {
 public:
  device_memory(int ordinal, const cuda_options& options) {
    const device_guard guard(ordinal);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    switch (options.upstream) {
      case cuda_options::upstream_kind::cuda:
        upstream_ = std::make_unique<memory::cuda_resource>(ordinal);
        break;
      case cuda_options::upstream_kind::cuda_async:
        upstream_ = std::make_unique<memory::cuda_async_resource>(ordinal);
        break;
      case cuda_options::upstream_kind::managed:
        upstream_ = std::make_unique<memory::managed_resource>(ordinal);
        break;
    }
    memory::memory_resource* top = upstream_.get();
    if (options.pool) {
      pool_ = std::make_unique<memory::bfc_pool>(
          *upstream_, gpu_pool_options(ordinal, options, free_bytes, total_bytes));
      top = pool_.get();
    }
    if (options.spill_to_managed && options.upstream != cuda_options::upstream_kind::managed) {
      managed_ = std::make_unique<memory::managed_resource>(ordinal);
      spill_ = std::make_unique<memory::fallback_adaptor>(*top, *managed_);
      top = spill_.get();
    }
    top_ = top;
    if (options.serve_c_api) {
      (void)memory::set_device_resource(device_id{device_type::cuda, ordinal}, top_);
    }
  }

  [[nodiscard]] memory::memory_resource& top() noexcept { return *top_; }
  [[nodiscard]] memory::bfc_pool* pool() noexcept { return pool_.get(); }

 private:
  std::unique_ptr<memory::memory_resource> upstream_;
  std::unique_ptr<memory::bfc_pool> pool_;
  std::unique_ptr<memory::managed_resource> managed_;
  std::unique_ptr<memory::fallback_adaptor> spill_;
  memory::memory_resource* top_ = nullptr;
};

namespace {
// Immortal, as the cpu:0 default pool: blocks may come back from static destructors and
// from other frameworks at exit.
std::mutex& memories_mutex() {
  static std::mutex* const m = new std::mutex;
  return *m;
}
std::map<int, std::unique_ptr<device_memory>>& memories() {
  static auto* const m = new std::map<int, std::unique_ptr<device_memory>>;
  return *m;
}
}  // namespace

device_memory& process_memory(int ordinal, const cuda_options& options) {
  const std::lock_guard lock(memories_mutex());
  auto& m = memories()[ordinal];
  if (!m) m = std::make_unique<device_memory>(ordinal, options);
  return *m;
}

memory::bfc_pool* find_process_pool(int ordinal) {
  const std::lock_guard lock(memories_mutex());
  const auto it = memories().find(ordinal);
  return it == memories().end() ? nullptr : it->second->pool();
}

namespace {

// Pinned host memory for staging and for results copied to the host: one growing pool over
// cudaHostAlloc for the process (cudaHostAlloc is slow: pooling it is what makes it cheap).
memory::bfc_pool& pinned_pool() {
  static memory::bfc_pool* const pool = [] {
    memory::bfc_pool_options o;
    o.name = "cuda_host:0";
    o.growth_step = std::size_t{32} << 20;
    auto* p = new memory::bfc_pool(memory::pinned_host_resource::instance(), std::move(o));
    (void)memory::set_device_resource(device_id{device_type::cuda_host, 0}, p);
    return p;
  }();
  return *pool;
}

}  // namespace

// ---- device_guard, launch_scope ----------------------------------------------------------

device_guard::device_guard(int ordinal) {
  cudaError_t e = cudaGetDevice(&previous_);
  if (e == cudaSuccess && previous_ != ordinal) {
    e = cudaSetDevice(ordinal);
    changed_ = e == cudaSuccess;
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw cuda_error(
        fmt::format("cannot make cuda:{} the current device: {}", ordinal, describe(e)),
        static_cast<int>(e));
  }
}

device_guard::~device_guard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

launch_scope::launch_scope(kernel_context& ctx)
    : dev(device_of(ctx)), stream(dev.compute_stream()), guard(dev.ordinal()) {}

void check_launch(kernel_context& ctx, const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) ctx.fail("CUDA kernel {} failed to launch: {}", kernel, describe(e));
}

cuda_device& device_of(kernel_context& ctx) {
  auto* d = dynamic_cast<cuda_device*>(&ctx.device());
  if (d == nullptr)
    ctx.fail("a CUDA kernel runs on {}, which is no CUDA device", ctx.device().name());
  return *d;
}

cuda_device& device_of(const kernel_construction& c) {
  auto* d = dynamic_cast<cuda_device*>(&c.device());
  if (d == nullptr)
    c.fail(fmt::format("a CUDA kernel is made for {}, which is no CUDA device", c.device().name()));
  return *d;
}

// ---- cuda_device -------------------------------------------------------------------------

struct cuda_device::impl {
  explicit impl(memory::memory_resource& pool, cudaStream_t compute) : bound(pool, compute) {}
  stream_binding bound;
  device_memory* memory = nullptr;
  std::mutex mutex;
  std::unordered_map<std::thread::id, cublasHandle_t> cublas;
  // Pinned sources of copies still in flight, kept alive until their event completes.
  std::deque<std::pair<cudaEvent_t, tensor>> in_flight;

  void reap(bool wait) {
    const std::lock_guard lock(mutex);
    while (!in_flight.empty()) {
      auto& [e, t] = in_flight.front();
      const cudaError_t status = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
      if (status == cudaErrorNotReady) break;
      (void)cudaEventDestroy(e);
      in_flight.pop_front();
    }
    (void)cudaGetLastError();
  }
};

namespace {

device_attributes cuda_attributes(int ordinal, const cuda_options& options) {
  const device_guard guard(ordinal);
  cudaDeviceProp props{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&props, ordinal));
  device_attributes a;
  a.id = device_id{device_type::cuda, ordinal};
  a.name = full_name(a.id);
  a.memory_limit = options.memory_limit != 0 ? options.memory_limit : props.totalGlobalMem;
  a.threads = props.multiProcessorCount;
  a.description = fmt::format("{}, sm_{}{}, {}, {} SMs", props.name, props.major, props.minor,
                              gib(props.totalGlobalMem), props.multiProcessorCount);
  return a;
}

}  // namespace

cuda_device::cuda_device(int ordinal, const cuda_options& options)
    : device(cuda_attributes(ordinal, options)), ordinal_(ordinal) {
  const device_guard guard(ordinal);
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&properties_, ordinal));
  device_memory& memory = process_memory(ordinal, options);
  streams_ = stream_groups::instance().take(ordinal);  // Note [cuda stream reuse]
  try {
    impl_ = std::make_unique<impl>(memory.top(), streams_.compute);
    impl_->memory = &memory;
    LOOM_CUBLAS_CHECK(cublasLtCreate(&lt_));
    // cuBLASLt's recommended workspace on Hopper: 32 MiB.
    lt_workspace_bytes_ = std::size_t{32} << 20;
    lt_workspace_ = impl_->bound.allocate(lt_workspace_bytes_, 256);
  } catch (...) {
    if (lt_ != nullptr) (void)cublasLtDestroy(lt_);
    stream_groups::instance().give_back(ordinal, streams_);
    throw;
  }
}

cuda_device::~cuda_device() {
  try {
    const device_guard guard(ordinal_);
    sync();
    impl_->reap(true);
    for (auto& [id, h] : impl_->cublas) (void)cublasDestroy(h);
    impl_->bound.deallocate(lt_workspace_, lt_workspace_bytes_, 256);
    (void)cublasLtDestroy(lt_);
    stream_groups::instance().give_back(ordinal_, streams_);  // idle since the sync above  // Note [cuda stream reuse]
  } catch (...) {
    // A device whose context is gone (a sticky error) cannot be cleaned up further.
  }
}

memory::memory_resource& cuda_device::allocator() {
  return impl_->bound;
}

memory::memory_resource& cuda_device::pinned_host() {
  return pinned_pool();
}

memory::bfc_pool* cuda_device::memory_pool() noexcept {
  return impl_->memory->pool();
}

void cuda_device::sync() {
  const device_guard guard(ordinal_);
  for (cudaStream_t s : {streams_.compute, streams_.h2d, streams_.d2h, streams_.d2d}) {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  impl_->reap(false);
}

cublasHandle_t cuda_device::cublas() {
  const std::lock_guard lock(impl_->mutex);
  auto& h = impl_->cublas[std::this_thread::get_id()];
  if (h == nullptr) {
    const device_guard guard(ordinal_);
    LOOM_CUBLAS_CHECK(cublasCreate(&h));
    LOOM_CUBLAS_CHECK(cublasSetStream(h, streams_.compute));
  }
  return h;
}

namespace {

// Makes `waiter` wait for the work queued on `on` so far: an event recorded on `on`, waited
// for on `waiter` (no host wait). The event is released once the wait no longer needs it.
void stream_waits(cudaStream_t waiter, cudaStream_t on) {
  cudaEvent_t e = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(e, on);
  if (status == cudaSuccess) status = cudaStreamWaitEvent(waiter, e, 0);
  (void)cudaEventDestroy(e);
  LOOM_CUDA_CHECK(status);
}

}  // namespace

void cuda_device::compute_waits_for(cudaStream_t s) {
  stream_waits(streams_.compute, s);
}

void cuda_device::waits_for_compute(cudaStream_t s) {
  stream_waits(s, streams_.compute);
}

namespace {

// Copies the view `t` densely into `dst` on `stream`. Dimensions of size 1 are dropped and
// neighbours that are contiguous with each other merged; a view that still has more than
// strided_layout's rank takes one launch per index of its outer dimensions.
void gather_view(const tensor& t, void* dst, cudaStream_t stream) {
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  for (std::size_t d = 0; d < t.rank(); ++d) {
    if (t.dim(d) == 1) continue;
    if (!sizes.empty() && strides.back() == t.strides()[d] * t.dim(d)) {
      sizes.back() *= t.dim(d);
      strides.back() = t.strides()[d];
      continue;
    }
    sizes.push_back(t.dim(d));
    strides.push_back(t.strides()[d]);
  }
  const std::size_t inner_rank =
      std::min(sizes.size(), static_cast<std::size_t>(kernels::max_strided_rank));
  const std::size_t outer_rank = sizes.size() - inner_rank;
  kernels::strided_layout l;
  l.rank = static_cast<int>(inner_rank);
  std::int64_t inner_count = 1;
  for (std::size_t d = 0; d < inner_rank; ++d) {
    l.sizes[d] = sizes[outer_rank + d];
    l.strides[d] = strides[outer_rank + d];
    inner_count *= l.sizes[d];
  }
  const std::size_t esize = size_of(t.type());
  const auto* src = static_cast<const std::byte*>(t.raw_data());
  auto* out = static_cast<std::byte*>(dst);
  std::vector<std::int64_t> index(outer_rank, 0);
  for (std::int64_t done = 0; done < t.num_elements(); done += inner_count) {
    std::int64_t offset = 0;  // elements, of the outer index
    for (std::size_t d = 0; d < outer_rank; ++d) offset += index[d] * strides[d];
    LOOM_CUDA_CHECK(kernels::strided_copy(src + offset * static_cast<std::int64_t>(esize),
                                          out + done * static_cast<std::int64_t>(esize), esize, l,
                                          inner_count, stream));
    for (std::size_t d = outer_rank; d-- > 0;) {  // the next outer index, row-major
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

bool is_pinned(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

}  // namespace

void cuda_device::require_own(const char* what, const tensor& src) const {
  if (!src.defined())
    throw invalid_argument(fmt::format("{} on {}: undefined tensor", what, name()));
  if (src.device() != id()) {
    throw invalid_argument(
        fmt::format("{} on {}: {} is not on this device", what, name(), src.describe()));
  }
}

tensor cuda_device::contiguous_copy(const tensor& src) {
  require_own("contiguous_copy", src);
  const device_guard guard(ordinal_);
  tensor out = allocate(src.type(), src.shape());
  if (src.num_elements() == 0) return out;
  if (src.is_contiguous()) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), src.raw_data(), src.nbytes(),
                                    cudaMemcpyDeviceToDevice, streams_.compute));
    return out;
  }
  gather_view(src, out.raw_data(), streams_.compute);
  return out;
}

tensor cuda_device::copy_from_host(const tensor& src) {
  if (!src.defined())
    throw invalid_argument(fmt::format("copy_from_host on {}: undefined tensor", name()));
  const device_guard guard(ordinal_);
  impl_->reap(false);
  const device_id from = src.device();
  if (from == id()) return contiguous_copy(src);
  tensor out = allocate(src.type(), src.shape());
  if (src.num_elements() == 0) return out;

  if (from.type == device_type::cuda) {
    // Another GPU: the smallest span of its buffer holding the view comes over on the d2d
    // stream; a non-contiguous view is then gathered here.
    std::int64_t extent = 1;
    for (std::size_t d = 0; d < src.rank(); ++d) extent += (src.dim(d) - 1) * src.strides()[d];
    const std::size_t bytes = static_cast<std::size_t>(extent) * size_of(src.type());
    tensor staged = src.is_contiguous() ? out : allocate(src.type(), shape{extent});
    waits_for_compute(streams_.d2d);  // the destination's earlier users are done
    LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(staged.raw_data(), ordinal_, src.raw_data(), from.index,
                                        bytes, streams_.d2d));
    compute_waits_for(streams_.d2d);
    // The source's own device may reuse its buffer once this copy is done: wait for it
    // here, since the source's stream knows nothing of ours.
    LOOM_CUDA_CHECK(cudaStreamSynchronize(streams_.d2d));
    if (!src.is_contiguous()) {
      const tensor view = tensor::strided(staged.buf(), src.type(), src.shape(), src.strides(), 0);
      gather_view(view, out.raw_data(), streams_.compute);
    }
    return out;
  }
  if (!is_host_accessible(from.type)) {
    throw invalid_argument(
        fmt::format("copy_from_host on {}: the source {} is neither in host "
                    "memory nor on a CUDA device",
                    name(), src.describe()));
  }
  // Host memory: dense first (into pinned memory, so the copy is truly asynchronous).
  tensor host = src;
  if (!src.is_contiguous()) {
    host = memory::contiguous_copy(src, pinned_pool(), device_id{device_type::cuda_host, 0});
  }
  waits_for_compute(streams_.h2d);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), host.raw_data(), host.nbytes(),
                                  cudaMemcpyHostToDevice, streams_.h2d));
  compute_waits_for(streams_.h2d);
  if (is_pinned(host.raw_data())) {
    // The copy reads the source after this returns: keep it alive until the copy is done.
    cudaEvent_t e = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    LOOM_CUDA_CHECK(cudaEventRecord(e, streams_.h2d));
    const std::lock_guard lock(impl_->mutex);
    impl_->in_flight.emplace_back(e, std::move(host));
  }
  // (From pageable memory cudaMemcpyAsync returns once the source has been staged.)
  return out;
}

tensor cuda_device::copy_to_host(const tensor& src, memory::memory_resource& host) {
  require_own("copy_to_host", src);
  const device_guard guard(ordinal_);
  const tensor dense = src.is_contiguous() ? src : contiguous_copy(src);
  tensor out =
      memory::allocate_tensor(host, device_id{device_type::cpu, 0}, src.type(), src.shape());
  if (src.num_elements() == 0) return out;
  waits_for_compute(streams_.d2h);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), dense.raw_data(), dense.nbytes(),
                                  cudaMemcpyDeviceToHost, streams_.d2h));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(streams_.d2h));
  return out;
}

// ---- the factory ---------------------------------------------------------------------------

std::vector<std::unique_ptr<device>> cuda_device_factory::create_devices(
    const device_options& options) {
  std::vector<std::unique_ptr<device>> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return out;  // no driver or no GPU: no devices (not an error)
  }
  if (options.cuda_device_count >= 0) count = std::min(count, options.cuda_device_count);
  for (int i = 0; i < count; ++i) out.push_back(std::make_unique<cuda_device>(i, options.cuda));
  return out;
}

}  // namespace loom::cuda
