// DLPack: sharing tensors with other frameworks without copying a byte.
//
// Export: to_dlpack(t) / to_dlpack_versioned(t) hand out a managed tensor that views t's
// memory and holds a reference to its buffer; the consumer calls the deleter (once) when
// it is done, and the buffer goes back to its pool only after both sides let go.
// Import: from_dlpack(m) wraps a producer's managed tensor in a loom tensor without a copy;
// the producer's deleter runs exactly once, when the last loom reference to that memory
// goes. Shapes, strides (in elements, any sign, or none for row-major), byte offsets, 0-d
// and empty tensors, bool, float16 and bfloat16 all go both ways.
//
// Both ABIs: the legacy DLManagedTensor (DLPack 0.x, capsule "dltensor") and the versioned
// DLManagedTensorVersioned of DLPack 1.x (capsule "dltensor_versioned"), whose flags carry
// READ_ONLY (an import is marked read-only: loom never writes it in place) and IS_COPIED.
// Debian's <dlpack/dlpack.h> is 0.6, which has no versioned struct: the declarations below
// are DLPack 1.0's, used only when the installed header lacks them (the layouts are the
// specification's, so either header gives the same ABI).
//
// Note [cuda imports]
// Memory on CUDA devices goes both ways without a copy. An export carries the tensor's
// device ({kDLCUDA, ordinal}, {kDLCUDAManaged, ordinal}, {kDLCUDAHost, 0}); an import of
// kDLCUDA, kDLCUDAManaged or kDLCUDAHost memory is a tensor on cuda:n, cuda_managed:n or
// cuda_host:0 viewing the producer's memory, which needs no CUDA call (DLPack says where the
// memory is). What does need CUDA is the stream handshake of the Python array API
// (__dlpack__(stream=...)): before handing memory over, the producer makes the consumer's
// stream wait for its own work on it (prepare_export here; the consumer side is the
// caller's, which passes the stream it will use and records it in the import's buffer).
// Streams are numbered as loom/cuda/interop.hpp's Note [interop streams] says.
//
// Loans: every export is recorded in loom::memory's loan book until its deleter runs, so a
// tracking_adaptor's leak report names buffers a consumer never gave back.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>

#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"

#if !defined(DLPACK_MAJOR_VERSION)
extern "C" {
/// DLPack 1.x's ABI version (major changes break the ABI).
typedef struct {  // NOLINT(modernize-use-using): the specification's C declaration
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

/// DLPack 1.x's managed tensor: a version, flags, and then the 0.x fields.
typedef struct DLManagedTensorVersioned {  // NOLINT(modernize-use-using)
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
}
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#endif

namespace loom::interop {

/// The DLPack version loom's versioned exports carry.
inline constexpr std::uint32_t dlpack_major_version = 1;
inline constexpr std::uint32_t dlpack_minor_version = 0;

/// The most dimensions an import takes (NumPy's limit): a larger ndim is refused before
/// the producer's shape array is read.
inline constexpr std::int32_t max_import_rank = 64;

/// DLPack 0.8's type code for bool (Debian's 0.6 header predates it).
inline constexpr std::uint8_t dl_bool_code = 6;

/// The DLDataType of a loom dtype (lanes 1).
[[nodiscard]] DLDataType to_dl_data_type(dtype t) noexcept;

/// The loom dtype of a DLDataType. Throws loom::unsupported_error naming the type for
/// those loom has no dtype for (lanes != 1, complex, int16, uint32, float8, ...). A uint8
/// or int8 of 8 bits is that integer; bool is DLPack's kDLBool of 8 bits.
[[nodiscard]] dtype dtype_from_dl(DLDataType t);

/// Exports `t` through the legacy ABI: the result views t's memory (shape and strides
/// copied, strides in elements), holds a reference to its buffer, and is freed by calling
/// its deleter exactly once. Throws std::bad_alloc only.
[[nodiscard]] DLManagedTensor* to_dlpack(const tensor& t);

/// Exports `t` through DLPack 1.x's versioned ABI, with `flags` (READ_ONLY is added when
/// t's buffer is read-only).
[[nodiscard]] DLManagedTensorVersioned* to_dlpack_versioned(const tensor& t,
                                                            std::uint64_t flags = 0);

/// Imports a producer's legacy managed tensor without copying. On success loom owns `m`:
/// its deleter runs exactly once, when the last tensor viewing the memory goes. On failure
/// (throws loom::invalid_argument or loom::unsupported_error naming the problem: a null
/// tensor, an unsupported dtype or device, a negative ndim or one above max_import_rank,
/// negative dimensions, strides or sizes that overflow, null data for elements, data +
/// byte_offset and the strides' reach wrapping around the address space, a first element
/// not aligned to its size) nothing happened to `m`: the caller still owns it. This is the
/// one check of a producer's tensor: every importer (C++, Python) goes through it. CPU,
/// CUDA, CUDA host and CUDA managed memory are taken (Note [cuda imports]); for memory on a
/// GPU, `s` is the stream the memory is ordered on, which the buffer records
/// (buffer::stream_of): the stream the consumer asked the producer to order its work on
/// (ignored for host memory).
[[nodiscard]] tensor from_dlpack(DLManagedTensor* m, stream s = {});

/// Imports a versioned managed tensor, as from_dlpack. A major version other than 1 is an
/// error (the layout after `version` may differ); READ_ONLY makes the tensor's buffer
/// read-only.
[[nodiscard]] tensor from_dlpack(DLManagedTensorVersioned* m, stream s = {});

/// The stream a consumer asks for with `stream_number` (the Python array API's
/// __dlpack__(stream=...): nullopt for None) when it takes `t`, or nullopt when no
/// synchronisation is wanted (host memory; -1). On CUDA (device or managed memory) None
/// means the legacy default stream (1). Throws loom::invalid_argument for 0 (ambiguous on
/// CUDA), numbers below -1, or any stream but None and -1 for host memory. No CUDA call.
[[nodiscard]] std::optional<stream> consumer_stream_for(const tensor& t,
                                                        std::optional<std::int64_t> stream_number);

/// The producer's half of the stream handshake (Note [cuda imports]): makes the consumer's
/// stream (consumer_stream_for) wait for loom's work on `t`, ordered on t's buffer's stream
/// (cuda_stream_wait: an event, or a wait for the whole device when the buffer names no
/// stream). Nothing for host memory. Throws as consumer_stream_for, and
/// loom::unsupported_error (a build without CUDA) or loom::cuda_error for tensors on a GPU.
void prepare_export(const tensor& t, std::optional<std::int64_t> consumer_stream);

}  // namespace loom::interop
