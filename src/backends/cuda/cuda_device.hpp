// cuda_device: one GPU, its stream group and its memory.
//
// Note [cuda stream group]
// Each device owns four non-blocking streams: `compute` (every kernel of the device runs on
// it, in the order the executor issues them, so kernels need no events between each other),
// `h2d` and `d2h` (copies to and from the host, so transfers overlap compute) and `d2d`
// (copies from other GPUs). Work crosses streams only through events: a copy onto the
// device records an event on its copy stream and the compute stream waits for it
// (cudaStreamWaitEvent, no host wait); a copy off the device waits on an event recorded on
// the compute stream. Kernels return as soon as their work is queued; the host waits only
// where it must read results (a copy to the host, device::sync()).
//
// Note [cuda memory]
// Tensors on the device come from allocator(): a stream-binding adaptor that orders every
// block on the compute stream (a block freed there is reusable at once by later kernels, in
// stream order), over the device's bfc_pool over the upstream (cudaMalloc, cudaMallocAsync
// or managed memory; cuda_options). The pool is the process's, one per GPU, shared by every
// session and, through the C ABI, by other frameworks (docs/cuda.md): it synchronises with
// a stream by waiting on an event recorded there before it hands that stream's freed blocks
// to another stream.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <vector>

#include "loom/device/device.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/kernel/op_kernel.hpp"
#include "loom/memory/bfc_pool.hpp"

namespace loom::cuda {

struct stream_group {
  cudaStream_t compute = nullptr;
  cudaStream_t h2d = nullptr;
  cudaStream_t d2h = nullptr;
  cudaStream_t d2d = nullptr;
};

/// The process-wide memory of GPU `ordinal`: its upstream, pool and pinned staging, made on
/// first use with `options` (later calls get the same one, whatever their options).
class device_memory;
device_memory& process_memory(int ordinal, const cuda_options& options);
/// The pool of GPU `ordinal` when process_memory made one, else nullptr.
memory::bfc_pool* find_process_pool(int ordinal);
/// The options of GPU `ordinal`'s pool, for a card with `free_bytes` of `total_bytes` free
/// (the cuda_options' limit, preallocation and growth; regions aligned as CUDA's
/// resources align). Throws loom::invalid_argument for options that cannot work.
memory::bfc_pool_options gpu_pool_options(int ordinal, const cuda_options& options,
                                          std::size_t free_bytes, std::size_t total_bytes);

class cuda_device final : public device {
 public:
  /// GPU `ordinal` ("/device:CUDA:<ordinal>"). Throws loom::cuda_error when CUDA cannot
  /// use it.
  cuda_device(int ordinal, const cuda_options& options);
  /// Waits for the device's streams, then destroys them.
  ~cuda_device() override;

  memory::memory_resource& allocator() override;
  /// The compute stream: device tensors are ordered on it (Note [cuda memory]).
  stream tensor_stream() const noexcept override { return stream(streams_.compute); }
  /// Waits for every stream of the group.
  void sync() override;
  /// `src` in host memory (any strides) or on another GPU, copied to a new dense tensor
  /// here: on the h2d (d2d) stream, with the compute stream made to wait for it.
  tensor copy_from_host(const tensor& src) override;
  /// `src` on this device (any strides) copied into `host` memory on the d2h stream, after
  /// the compute stream's work; returns once the copy is done.
  tensor copy_to_host(const tensor& src, memory::memory_resource& host) override;
  /// A dense copy on the compute stream (a strided gather kernel).
  tensor contiguous_copy(const tensor& src) override;

  [[nodiscard]] int ordinal() const noexcept { return ordinal_; }
  [[nodiscard]] const stream_group& streams() const noexcept { return streams_; }
  [[nodiscard]] cudaStream_t compute_stream() const noexcept { return streams_.compute; }
  [[nodiscard]] const cudaDeviceProp& properties() const noexcept { return properties_; }
  /// Page-locked host memory (a pool over pinned_host_resource) for staging and results.
  [[nodiscard]] memory::memory_resource& pinned_host();
  /// The device's pool (the process's for this GPU).
  [[nodiscard]] memory::bfc_pool* memory_pool() noexcept;

  /// A cuBLAS handle bound to the compute stream, for the calling thread (cuBLAS handles
  /// must not be used by two threads at once). Made on first use.
  [[nodiscard]] cublasHandle_t cublas();
  /// The cuBLASLt handle (thread-safe) and a workspace on the compute stream for it.
  [[nodiscard]] cublasLtHandle_t cublas_lt() const noexcept { return lt_; }
  [[nodiscard]] void* lt_workspace() const noexcept { return lt_workspace_; }
  [[nodiscard]] std::size_t lt_workspace_bytes() const noexcept { return lt_workspace_bytes_; }

  /// Makes the compute stream wait for the work queued on `s` so far (an event).
  void compute_waits_for(cudaStream_t s);
  /// Makes `s` wait for the work queued on the compute stream so far (an event).
  void waits_for_compute(cudaStream_t s);

 private:
  /// Throws loom::invalid_argument, naming `what`, unless `src` is defined and on this device.
  void require_own(const char* what, const tensor& src) const;

  struct impl;
  int ordinal_;
  cudaDeviceProp properties_{};
  stream_group streams_;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  std::size_t lt_workspace_bytes_ = 0;
  std::unique_ptr<impl> impl_;
};

/// Makes `ordinal` the calling thread's current device for the guard's lifetime.
class device_guard {
 public:
  explicit device_guard(int ordinal);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// What a CUDA kernel's compute() starts with: the device (current on this thread for the
/// scope's lifetime) and its compute stream.
struct launch_scope {
  explicit launch_scope(kernel_context& ctx);
  cuda_device& dev;
  cudaStream_t stream;
  device_guard guard;
};

/// Throws loom::node_error naming the node when the last launch failed
/// (cudaGetLastError), e.g. an invalid configuration.
void check_launch(kernel_context& ctx, const char* kernel);

/// The device `ctx` runs on, as a cuda_device (kernels registered for device_type::cuda
/// only ever run on one).
[[nodiscard]] cuda_device& device_of(kernel_context& ctx);
[[nodiscard]] cuda_device& device_of(const kernel_construction& c);

/// Makes the cuda devices (one per visible GPU up to options.cuda_device_count).
class cuda_device_factory final : public device_factory {
 public:
  device_type type() const noexcept override { return device_type::cuda; }
  std::vector<std::unique_ptr<device>> create_devices(const device_options& options) override;
};

}  // namespace loom::cuda
