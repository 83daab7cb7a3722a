// cuda/interop: the CUDA calls that sharing GPU memory with other frameworks needs (the
// DLPack stream handshake, the CUDA array interface, other libraries allocating from loom's
// pools), behind an interface with no CUDA header in it.
//
// Builds with the CUDA backend implement these in src/backends/cuda/interop_cuda.cpp; builds
// without it in src/backends/no_cuda.cpp, where every function but
// cuda_interop_available() throws loom::unsupported_error saying loom was built without
// CUDA. With the backend but no driver or GPU they throw loom::cuda_error (CUDA's reason).
//
// Note [interop streams]
// Streams cross the boundary as integers, numbered as the Python array API's
// __dlpack__(stream=...) and the CUDA array interface's "stream" number them on CUDA: 1 is
// the legacy default stream, 2 the per-thread default stream, and any other positive value
// a cudaStream_t. (1 and 2 are also the values of CUDA's own cudaStreamLegacy and
// cudaStreamPerThread handles, so the integer is the handle: loom::stream{(void*)n}.) 0 is
// ambiguous and disallowed by both protocols; -1 (DLPack only) asks for no synchronisation.
//
// Which stream loom's work on a tensor is ordered on: its buffer's stream_of(). A CUDA
// buffer whose stream is the default (null) stream gives no such promise (loom's devices
// order their blocks on their compute stream, one per device and session, which the buffer
// does not name): for those, making another stream wait means waiting on the host for the
// whole device (cudaDeviceSynchronize), the one wait that covers every stream. Imports have
// the opposite problem: loom does not yet know on which stream it will use the memory. Unless
// the caller names one, loom hands producers its interop stream (one per GPU, for the whole
// process) and waits on the host for it before the import returns, so the memory is ready
// for any stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "loom/core/device_id.hpp"
#include "loom/core/stream.hpp"

namespace loom::interop {

/// Stream numbers of the protocols (Note [interop streams]).
inline constexpr std::int64_t legacy_default_stream = 1;
inline constexpr std::int64_t per_thread_default_stream = 2;
inline constexpr std::int64_t no_sync_stream = -1;

/// The loom::stream for a protocol stream number > 0 (Note [interop streams]).
[[nodiscard]] inline stream stream_from_protocol(std::int64_t number) noexcept {
  return stream{reinterpret_cast<void*>(static_cast<std::intptr_t>(number))};
}

/// The protocol number of a CUDA stream: the handle, with the default (null) stream, which
/// CUDA takes as the legacy default stream, as 1.
[[nodiscard]] inline std::int64_t protocol_stream_number(stream s) noexcept {
  return s.is_default() ? legacy_default_stream : static_cast<std::int64_t>(s.value());
}

/// True when loom was built with the CUDA backend, so the functions below may work.
[[nodiscard]] bool cuda_interop_available() noexcept;

/// Makes the work queued on `consumer` from now on wait for the work queued on `producer`
/// so far, on GPU `ordinal`: an event recorded on `producer` and cudaStreamWaitEvent on
/// `consumer`, with no wait on the host. Nothing when they are the same stream. A default
/// (null) `producer` names no stream (Note [interop streams]): the calling thread then waits
/// for the whole device instead. Throws loom::unsupported_error without CUDA and
/// loom::cuda_error when CUDA fails (an invalid stream handle, no driver).
void cuda_stream_wait(int ordinal, stream consumer, stream producer);

/// Blocks the calling thread until the work queued on `s` (GPU `ordinal`) so far is done;
/// for the default (null) stream, until the whole device is idle. Throws as cuda_stream_wait.
void cuda_stream_synchronize(int ordinal, stream s);

/// The process's interop stream of GPU `ordinal` (Note [interop streams]): non-blocking,
/// made on first use, never destroyed. Throws as cuda_stream_wait, and
/// loom::invalid_argument for an ordinal that is no visible GPU.
[[nodiscard]] stream cuda_interop_stream(int ordinal);

/// Where the memory at `p` lives, by cudaPointerGetAttributes: {cuda, n} for device memory
/// of GPU n, {cuda_managed, n} for managed memory, {cuda_host, 0} for page-locked host
/// memory, {cpu, 0} for host memory CUDA does not know. Throws as cuda_stream_wait.
[[nodiscard]] device_id cuda_pointer_device(const void* p);

/// The calling thread's current GPU (cudaGetDevice). Throws as cuda_stream_wait.
[[nodiscard]] int cuda_current_device();

/// Free and total bytes of GPU `ordinal` (cudaMemGetInfo). Throws as cuda_stream_wait.
[[nodiscard]] std::pair<std::size_t, std::size_t> cuda_memory_info(int ordinal);

/// Makes sure cuda:`ordinal` has the process's pool of that GPU behind the C ABI
/// (loom_allocate and loom_allocate_for for LOOM_DEVICE_CUDA): the pool a session of this
/// process uses, made now with the default cuda_options when no session made it first, and
/// set in the device registry when nothing serves cuda:`ordinal` yet. Throws as
/// cuda_stream_wait, and loom::invalid_argument for an ordinal that is no visible GPU.
void cuda_serve_c_api(int ordinal);

}  // namespace loom::interop
