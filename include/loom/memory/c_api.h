/* loom's C ABI allocator: allocate from loom's per-device memory resources from C, or from
 * any library that takes an allocator as a pair of C functions (PyTorch's
 * CUDAPluggableAllocator, CuPy, Numba).
 *
 * A C11 and C++ header. Every call goes to the resource that serves its device (see
 * loom/memory/device_resources.hpp): cpu:0 has a default pool; other devices have a
 * resource once loom (the CUDA backend) or the program sets one. Nothing throws across
 * this boundary: a call that fails returns NULL or a status code, and leaves an error
 * code and message for the calling thread, which loom_last_error() and
 * loom_last_error_message() read.
 *
 * Every function here is thread-safe. loom_allocate, loom_deallocate, loom_memory_stats and
 * their _for variants each set the calling thread's last error, to LOOM_OK when they
 * succeed. From C++ the functions are noexcept.
 */
#ifndef LOOM_MEMORY_C_API_H
#define LOOM_MEMORY_C_API_H

#include <stddef.h>
#include <stdint.h>

/* Exported even from a library built with hidden visibility. */
#if defined(__GNUC__)
#define LOOM_API __attribute__((visibility("default")))
#else
#define LOOM_API
#endif

#ifdef __cplusplus
#define LOOM_NOEXCEPT noexcept
extern "C" {
#else
#define LOOM_NOEXCEPT
#endif

/* Status codes: loom_last_error() and loom_memory_stats() return them. */
enum {
  LOOM_OK = 0,
  LOOM_ERROR_OUT_OF_MEMORY = 1,    /* the resource (or a budget in it) could not serve it */
  LOOM_ERROR_INVALID_ARGUMENT = 2, /* an alignment that is not a power of two, NULL out */
  LOOM_ERROR_NO_DEVICE = 3,        /* no resource serves that device */
  LOOM_ERROR_INTERNAL = 4          /* anything else; the message says what */
};

/* Device types: DLPack's DLDeviceType codes. */
enum {
  LOOM_DEVICE_CPU = 1,
  LOOM_DEVICE_CUDA = 2,
  LOOM_DEVICE_CUDA_HOST = 3,
  LOOM_DEVICE_CUDA_MANAGED = 13
};

/* A device: a LOOM_DEVICE_* type and an index, as DLPack's DLDevice. */
typedef struct loom_device {
  int32_t device_type;
  int32_t device_id;
} loom_device;

/* A stream handle (a cudaStream_t on CUDA); NULL is the default stream. */
typedef void* loom_stream;

/* A resource's figures, as loom_memory_stats() reports them; mirrors loom::memory_stats
 * (loom/core/memory_stats.hpp). A resource fills what it tracks and leaves the rest 0. */
typedef struct loom_memory_statistics {
  size_t bytes_in_use;
  size_t peak_bytes_in_use;
  uint64_t total_bytes_allocated;
  size_t bytes_reserved;
  size_t peak_bytes_reserved;
  uint64_t allocations_in_use;
  uint64_t num_allocs;
  uint64_t num_deallocs;
  uint64_t num_failed_allocs;
  size_t free_bytes;
  size_t largest_free_block;
  size_t unusable_bytes;
  uint64_t num_regions;
  double fragmentation; /* 1 - largest_free_block / free_bytes; 0 when nothing is free */
} loom_memory_statistics;

/* A block of at least `bytes` bytes, aligned to `alignment` (a power of two; 0 means 64),
 * for use on `stream` of `device`. allocate(0) returns a valid, distinct block. Returns
 * NULL on failure: LOOM_ERROR_OUT_OF_MEMORY, LOOM_ERROR_INVALID_ARGUMENT (alignment),
 * LOOM_ERROR_NO_DEVICE or LOOM_ERROR_INTERNAL. */
LOOM_API void* loom_allocate(size_t bytes, size_t alignment, loom_device device,
                             loom_stream stream) LOOM_NOEXCEPT;

/* Gives back a block from loom_allocate, with the same bytes, alignment (0 means 64) and
 * device; `stream` is the stream on which its last use was ordered. NULL does nothing.
 * Misuse the resource detects (a wrong size, a double free) goes to loom's misuse handler
 * (loom/memory/misuse.hpp) and leaves the block alone. Sets LOOM_ERROR_NO_DEVICE when no
 * resource serves the device (the block is then not given back). */
LOOM_API void loom_deallocate(void* p, size_t bytes, size_t alignment, loom_device device,
                              loom_stream stream) LOOM_NOEXCEPT;

/* Fills *out with the figures of the resource serving `device`. Returns LOOM_OK,
 * LOOM_ERROR_INVALID_ARGUMENT (out is NULL), LOOM_ERROR_NO_DEVICE or LOOM_ERROR_INTERNAL.
 * A resource that keeps no figures gives all zeros. */
LOOM_API int loom_memory_stats(loom_device device, loom_memory_statistics* out) LOOM_NOEXCEPT;

/* Per-library attribution: the same calls made on behalf of a named library ("torch",
 * "cupy", "numba": printable ASCII, 1 to 63 bytes), whose blocks are counted apart
 * (loom/memory/library_resources.hpp). The device's pool serves them exactly as it serves
 * loom_allocate, so loom_memory_stats(device) stays the total of everyone and
 * loom_memory_stats_for(device, library) is that library's share. A block from
 * loom_allocate_for goes back through loom_deallocate_for with the same library (and the
 * bytes, alignment and device of loom_allocate). */

/* As loom_allocate, counted for `library`. Also returns NULL with
 * LOOM_ERROR_INVALID_ARGUMENT for a NULL or bad library name. */
LOOM_API void* loom_allocate_for(const char* library, size_t bytes, size_t alignment,
                                 loom_device device, loom_stream stream) LOOM_NOEXCEPT;

/* As loom_deallocate, counted for `library`. NULL does nothing. Sets
 * LOOM_ERROR_INVALID_ARGUMENT, leaving the block alone, when `library` is NULL or has
 * allocated nothing on the device (so the block cannot be one of its). */
LOOM_API void loom_deallocate_for(const char* library, void* p, size_t bytes, size_t alignment,
                                  loom_device device, loom_stream stream) LOOM_NOEXCEPT;

/* Fills *out with `library`'s figures on `device`: bytes_in_use, peak_bytes_in_use,
 * total_bytes_allocated, allocations_in_use, num_allocs, num_deallocs, num_failed_allocs
 * (the pool's own fields, such as bytes_reserved, are 0: they belong to everyone). All zeros
 * for a library that has allocated nothing there. Returns LOOM_OK,
 * LOOM_ERROR_INVALID_ARGUMENT (out or library NULL, a bad name), LOOM_ERROR_NO_DEVICE (the
 * library has no figures there and no resource serves the device) or LOOM_ERROR_INTERNAL. */
LOOM_API int loom_memory_stats_for(loom_device device, const char* library,
                                   loom_memory_statistics* out) LOOM_NOEXCEPT;

/* The status of the calling thread's last call to a function above. */
LOOM_API int loom_last_error(void) LOOM_NOEXCEPT;

/* What went wrong in the calling thread's last call, "" after a success. The string
 * belongs to loom and stays valid until the thread's next call to a function above. */
LOOM_API const char* loom_last_error_message(void) LOOM_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOOM_MEMORY_C_API_H */
