/* The C ABI allocator, from C: allocate, write, free; alignment; statistics; error codes.
 * Exit status 0 when every check passes; each failure is printed. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "loom/memory/c_api.h"

static int failures = 0;

#define CHECK(cond)                                                                               \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      fprintf(stderr, "%s:%d: check failed: %s (last error %d: %s)\n", __FILE__, __LINE__, #cond, \
              loom_last_error(), loom_last_error_message());                                      \
      ++failures;                                                                                 \
    }                                                                                             \
  } while (0)

static const loom_device cpu = {LOOM_DEVICE_CPU, 0};

static loom_memory_statistics stats_now(void) {
  loom_memory_statistics s;
  memset(&s, 0xff, sizeof s);
  CHECK(loom_memory_stats(cpu, &s) == LOOM_OK);
  return s;
}

static void allocate_write_free(void) {
  const loom_memory_statistics before = stats_now();
  unsigned char* p = (unsigned char*)loom_allocate(1000, 0, cpu, NULL);
  CHECK(p != NULL);
  CHECK(loom_last_error() == LOOM_OK);
  CHECK(strcmp(loom_last_error_message(), "") == 0);
  if (p == NULL) return;
  CHECK((uintptr_t)p % 64 == 0); /* alignment 0 means 64 */
  memset(p, 0xab, 1000);
  CHECK(p[0] == 0xab && p[999] == 0xab);

  const loom_memory_statistics during = stats_now();
  CHECK(during.bytes_in_use == before.bytes_in_use + 1000);
  CHECK(during.allocations_in_use == before.allocations_in_use + 1);
  CHECK(during.num_allocs == before.num_allocs + 1);
  CHECK(during.bytes_reserved >= during.bytes_in_use);
  CHECK(during.peak_bytes_in_use >= during.bytes_in_use);

  loom_deallocate(p, 1000, 0, cpu, NULL);
  CHECK(loom_last_error() == LOOM_OK);
  const loom_memory_statistics after = stats_now();
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.allocations_in_use == before.allocations_in_use);
  CHECK(after.num_deallocs == before.num_deallocs + 1);
  CHECK(after.fragmentation >= 0.0 && after.fragmentation <= 1.0);
}

static void honours_alignment(void) {
  size_t alignment;
  for (alignment = 1; alignment <= 65536; alignment *= 4) {
    void* p = loom_allocate(3 * alignment + 1, alignment, cpu, NULL);
    CHECK(p != NULL);
    CHECK((uintptr_t)p % alignment == 0);
    loom_deallocate(p, 3 * alignment + 1, alignment, cpu, NULL);
  }
  {
    void* zero = loom_allocate(0, 0, cpu, NULL);
    void* other = loom_allocate(0, 0, cpu, NULL);
    CHECK(zero != NULL && other != NULL && zero != other);
    loom_deallocate(zero, 0, 0, cpu, NULL);
    loom_deallocate(other, 0, 0, cpu, NULL);
  }
}

static void reports_errors(void) {
  const loom_device cuda = {LOOM_DEVICE_CUDA, 0};
  const loom_device unknown = {7, 0};
  loom_memory_statistics s;

  CHECK(loom_allocate(64, 0, cuda, NULL) == NULL);
  CHECK(loom_last_error() == LOOM_ERROR_NO_DEVICE);
  CHECK(strstr(loom_last_error_message(), "cuda:0") != NULL);
  CHECK(loom_memory_stats(cuda, &s) == LOOM_ERROR_NO_DEVICE);
  CHECK(loom_allocate(64, 0, unknown, NULL) == NULL);
  CHECK(loom_last_error() == LOOM_ERROR_NO_DEVICE);

  CHECK(loom_allocate(64, 48, cpu, NULL) == NULL);
  CHECK(loom_last_error() == LOOM_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(loom_last_error_message(), "48") != NULL);

  CHECK(loom_allocate(SIZE_MAX, 0, cpu, NULL) == NULL);
  CHECK(loom_last_error() == LOOM_ERROR_OUT_OF_MEMORY);
  CHECK(strlen(loom_last_error_message()) > 0);

  CHECK(loom_memory_stats(cpu, NULL) == LOOM_ERROR_INVALID_ARGUMENT);
  CHECK(loom_last_error() == LOOM_ERROR_INVALID_ARGUMENT);

  /* A success clears the last error. */
  loom_deallocate(NULL, 64, 0, cpu, NULL);
  CHECK(loom_last_error() == LOOM_OK);
  CHECK(strcmp(loom_last_error_message(), "") == 0);
}

int main(void) {
  allocate_write_free();
  honours_alignment();
  reports_errors();
  if (failures != 0) {
    fprintf(stderr, "c_abi_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_abi_test: all checks passed\n");
  return 0;
}
