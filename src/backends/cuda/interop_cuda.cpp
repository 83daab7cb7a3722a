// loom/cuda/interop.hpp for builds with the CUDA backend (Note [interop streams]).
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <mutex>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "loom/cuda/info.hpp"
#include "loom/cuda/interop.hpp"
#include "loom/memory/device_resources.hpp"

namespace loom::interop {
namespace {

cudaStream_t to_cuda(stream s) noexcept {
  return static_cast<cudaStream_t>(s.handle());
}

void check_ordinal(int ordinal, const char* what) {
  const int n = cuda::device_count();
  if (ordinal < 0 || ordinal >= n) {
    throw invalid_argument(fmt::format("{}: cuda:{} is no visible GPU ({} visible{})", what,
                                       ordinal, n,
                                       n == 0 ? ": " + cuda::availability() : std::string()));
  }
}

}  // namespace

bool cuda_interop_available() noexcept {
  return true;
}

void cuda_stream_wait(int ordinal, stream consumer, stream producer) {
  if (consumer == producer) return;
  const cuda::device_guard guard(ordinal);
  if (producer.is_default()) {
    // No stream named: only a wait for the whole device covers loom's non-blocking streams.
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  cudaEvent_t e = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(e, to_cuda(producer));
  if (status == cudaSuccess) status = cudaStreamWaitEvent(to_cuda(consumer), e, 0);
  (void)cudaEventDestroy(e);  // released by CUDA once the wait no longer needs it
  LOOM_CUDA_CHECK(status);
}

void cuda_stream_synchronize(int ordinal, stream s) {
  const cuda::device_guard guard(ordinal);
  if (s.is_default()) {
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(to_cuda(s)));
  }
}

stream cuda_interop_stream(int ordinal) {
  check_ordinal(ordinal, "cuda_interop_stream");
  // One per GPU for the process, never destroyed (the handle may be held by producers).
  static std::array<std::atomic<cudaStream_t>, memory::max_device_index> streams{};
  static std::mutex mutex;
  if (ordinal >= memory::max_device_index) {
    throw invalid_argument(fmt::format("cuda_interop_stream: cuda:{} is past loom's {} GPUs",
                                       ordinal, memory::max_device_index));
  }
  auto& slot = streams[static_cast<std::size_t>(ordinal)];
  if (cudaStream_t s = slot.load(std::memory_order_acquire)) return stream{s};
  const std::lock_guard lock(mutex);
  if (cudaStream_t s = slot.load(std::memory_order_acquire)) return stream{s};
  const cuda::device_guard guard(ordinal);
  cudaStream_t s = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  slot.store(s, std::memory_order_release);
  return stream{s};
}

device_id cuda_pointer_device(const void* p) {
  cudaPointerAttributes a{};
  LOOM_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  switch (a.type) {
    case cudaMemoryTypeDevice:
      return {device_type::cuda, a.device};
    case cudaMemoryTypeManaged:
      return {device_type::cuda_managed, a.device};
    case cudaMemoryTypeHost:
      return {device_type::cuda_host, 0};
    case cudaMemoryTypeUnregistered:
    default:
      return {device_type::cpu, 0};
  }
}

int cuda_current_device() {
  int d = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

std::pair<std::size_t, std::size_t> cuda_memory_info(int ordinal) {
  check_ordinal(ordinal, "cuda_memory_info");
  const cuda::device_guard guard(ordinal);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

void cuda_serve_c_api(int ordinal) {
  check_ordinal(ordinal, "cuda_serve_c_api");
  const device_id id{device_type::cuda, ordinal};
  if (memory::find_device_resource(id) != nullptr) return;
  // With the default options the process's memory sets itself in the registry
  // (cuda_options::serve_c_api); memory a session made with serve_c_api off does not.
  cuda::process_memory(ordinal, cuda_options{});
  if (memory::find_device_resource(id) == nullptr) {
    throw invalid_argument(fmt::format(
        "cuda_serve_c_api: the process's memory of cuda:{} was made with "
        "cuda_options::serve_c_api off; loom does not serve other libraries on that GPU",
        ordinal));
  }
}

}  // namespace loom::interop
