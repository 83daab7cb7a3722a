// Cheap shared counters while the process has one thread (private to the memory room).
//
// Note [single-threaded elision]: an atomic read-modify-write (x86's lock prefix) waits for
// every earlier store of the thread to reach the cache. On the allocation path the caller
// has usually just written to a block whose line is not cached, so each such instruction
// costs a memory miss (~25 ns here), not its nominal ~6 ns. While the C library says the
// process has only one thread (glibc's __libc_single_threaded, the flag its own malloc and
// libstdc++'s shared_ptr use to skip atomics), no other thread can touch the counter, so a
// relaxed load and store do the same work without the wait. The flag only goes from true
// to false, when a second thread is created, and thread creation orders every earlier
// store before the new thread's first access.
#pragma once

#include <atomic>

#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define LOOM_HAVE_SINGLE_THREADED 1
#endif

namespace loom::memory::detail {

/// True only while the process certainly has one thread.
[[nodiscard]] inline bool single_threaded() noexcept {
#if defined(LOOM_HAVE_SINGLE_THREADED)
  return __libc_single_threaded != 0;
#else
  return false;
#endif
}

/// counter.fetch_add(delta, relaxed), elided to a load and a store while single-threaded.
template <class T>
T shared_fetch_add(std::atomic<T>& counter, T delta) noexcept {
  if (single_threaded()) {
    const T old = counter.load(std::memory_order_relaxed);
    counter.store(old + delta, std::memory_order_relaxed);
    return old;
  }
  return counter.fetch_add(delta, std::memory_order_relaxed);
}

/// counter.fetch_sub(delta, relaxed), elided likewise.
template <class T>
T shared_fetch_sub(std::atomic<T>& counter, T delta) noexcept {
  if (single_threaded()) {
    const T old = counter.load(std::memory_order_relaxed);
    counter.store(old - delta, std::memory_order_relaxed);
    return old;
  }
  return counter.fetch_sub(delta, std::memory_order_relaxed);
}

/// Raises counter to at least `value` (a running maximum), elided likewise.
template <class T>
void shared_fetch_max(std::atomic<T>& counter, T value) noexcept {
  T seen = counter.load(std::memory_order_relaxed);
  if (value <= seen) return;
  if (single_threaded()) {
    counter.store(value, std::memory_order_relaxed);
    return;
  }
  while (value > seen &&
         !counter.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace loom::memory::detail
