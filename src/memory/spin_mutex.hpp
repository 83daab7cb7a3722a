// spin_mutex: a small lock for short critical sections (private to the memory room).
//
// The pool's critical sections last tens of nanoseconds, where the cost of std::mutex's
// calls into the C library shows. spin_mutex takes the lock with one atomic exchange when
// it is free, spins briefly when it is held, and then sleeps in the kernel
// (std::atomic::wait, a futex on Linux) rather than burning a core; unlock wakes a sleeper
// only when one may exist. It is Drepper's three-state mutex ("Futexes Are Tricky"):
// 0 free, 1 held, 2 held and someone may be asleep. Satisfies Lockable.
//
// Lock elision (Note [single-threaded elision] in loom/memory/detail/single_threaded.hpp):
// while the process has one thread, lock and unlock are plain stores. They still mark the
// lock held, so a thread started from inside a critical section finds it taken, and
// unlock takes the atomic path whenever the process has more than one thread by then, so
// no sleeper is missed.
#pragma once

#include <atomic>
#include <cstdint>

#include "loom/memory/detail/single_threaded.hpp"


#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace loom::memory::detail {

class spin_mutex {
 public:
  spin_mutex() = default;
  spin_mutex(const spin_mutex&) = delete;
  spin_mutex& operator=(const spin_mutex&) = delete;

  void lock() noexcept {
    if (single_threaded()) {
      state_.store(held, std::memory_order_relaxed);
      return;
    }
    std::uint32_t expected = free;
    if (state_.compare_exchange_strong(expected, held, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
      return;
    }
    lock_slow();
  }

  bool try_lock() noexcept {
    std::uint32_t expected = free;
    return state_.compare_exchange_strong(expected, held, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }

  void unlock() noexcept {
    if (single_threaded()) {
      state_.store(free, std::memory_order_release);
      return;
    }
    if (state_.exchange(free, std::memory_order_release) == contended) state_.notify_one();
  }

 private:
  static constexpr std::uint32_t free = 0;
  static constexpr std::uint32_t held = 1;
  static constexpr std::uint32_t contended = 2;
  static constexpr int spins = 128;


  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

  void lock_slow() noexcept {
    for (int i = 0; i < spins; ++i) {
      pause();
      if (state_.load(std::memory_order_relaxed) == free && try_lock()) return;
    }
    // Mark the lock contended so that its holder wakes us, and sleep until it is free.
    while (state_.exchange(contended, std::memory_order_acquire) != free) {
      state_.wait(contended, std::memory_order_relaxed);
    }
  }

  std::atomic<std::uint32_t> state_{free};
};

}  // namespace loom::memory::detail
