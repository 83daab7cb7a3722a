// thread_shards: per-(owner, thread) state that the owner's thread updates without locks
// or atomic read-modify-writes. An implementation detail of the memory adaptors.
//
// Note [per-thread shards]
// An adaptor that must account for every call from every thread cheaply (the statistics
// adaptor's counters, the limiting adaptor's budget leases) keeps one *shard* per thread
// that uses it. Only the shard's thread writes it, with relaxed atomic loads and stores
// (no `lock`-prefixed instruction); readers visit every shard under the registry's
// mutex, so sums are exact whenever no call is in flight.
//
// The shards live in a registry shared (shared_ptr) by the owner and every thread that
// has used it, so that either may go first:
// - A thread finds its shard through a thread_local list of {owner id, shard} entries,
//   searched linearly (a thread uses a handful of adaptors at most), in front of which
//   sits a cache of four entries, newest first. The fast path checks the newest only:
//   one load whose address does not depend on the owner, so it starts at once. A hit
//   further down does not reorder the cache, so a chain of nested budgets, used in turn,
//   stays in it without evictions. Owner ids come from a 64-bit counter and are never
//   reused, so a stale entry never matches a new owner.
// - When a thread exits, it hands each of its shards back: while the owner lives,
//   Shard::retire(Shared&) runs under the registry's mutex (the limiting adaptor returns
//   the thread's lease there); the shard goes on a free list for the next new thread,
//   keeping its counts.
// - When the owner is destroyed it closes the registry (under the mutex, so no retire
//   runs into a destroyed owner). A thread drops its entries for closed registries when
//   it next registers with an owner, or at exit; the last holder frees the registry.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "loom/memory/detail/instance_id.hpp"

namespace loom::memory::detail {

/// Adds `delta` to a counter that only the calling thread writes (Note [per-thread
/// shards]): a relaxed load and store, which other threads may read concurrently.
template <class T>
void owner_add(std::atomic<T>& counter, T delta) noexcept {
  counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
}

/// Per-thread shards of type Shard for one owner whose shared state is a Shared. Shard
/// must be default-constructible and have `void retire(Shared&) noexcept`. Shared and
/// Shard may be incomplete where only the declaration of a thread_shards is needed.
template <class Shared, class Shard>
class thread_shards {
 public:
  /// Shards for an owner whose shared state is `shared`, which must outlive *this.
  /// Throws std::bad_alloc.
  explicit thread_shards(Shared& shared) : registry_(std::make_shared<registry>(shared)) {}

  /// Closes the registry; threads let go of it lazily (see the Note). No call may be in
  /// flight.
  ~thread_shards() {
    std::lock_guard lock(registry_->mutex);
    registry_->shared.store(nullptr, std::memory_order_release);
  }

  thread_shards(const thread_shards&) = delete;
  thread_shards& operator=(const thread_shards&) = delete;

  /// The calling thread's shard, registered on its first use; nullptr when a new
  /// registration ran out of memory, or when the thread is exiting and has already let go
  /// of its shards. Only the calling thread may write the shard.
  [[nodiscard]] Shard* local() noexcept {
    if (t_cache.front().id == id_) [[likely]] {
      return t_cache.front().shard;
    }
    return find_or_attach();
  }

  /// Calls f(const Shard&) for every shard ever registered (exited threads' included),
  /// holding the registry's mutex: no thread registers or exits meanwhile.
  template <class F>
  void for_each(F&& f) const {
    std::lock_guard lock(registry_->mutex);
    for (const auto& s : registry_->shards) f(std::as_const(*s));
  }

 private:
  struct registry {
    explicit registry(Shared& s) : shared(&s) {}

    const std::uint64_t id = next_instance_id();
    std::mutex mutex;
    std::atomic<Shared*> shared;  // set to nullptr, under the mutex, when the owner goes
    std::vector<std::unique_ptr<Shard>> shards;  // every shard made, in use or free
    std::vector<Shard*> free;                    // shards of exited threads, for reuse
  };

  struct entry {
    std::uint64_t id;
    Shard* shard;
    std::shared_ptr<registry> owner;
  };

  // The calling thread's entries; at thread exit, every shard is handed back.
  struct entries {
    std::vector<entry> list;
    entries() = default;
    entries(const entries&) = delete;
    entries& operator=(const entries&) = delete;
    ~entries() {
      t_exited = true;
      t_cache.fill(cached{});
      for (entry& e : list) detach(e);
    }
  };

  // An entry found lately, in a trivially destructible thread_local: reading it needs no
  // initialisation check, and it stays readable while the thread exits.
  struct cached {
    std::uint64_t id = 0;  // instance ids start at 1
    Shard* shard = nullptr;
  };
  static constexpr std::size_t cache_size = 4;

  static void detach(entry& e) noexcept {
    registry& r = *e.owner;
    std::lock_guard lock(r.mutex);
    if (Shared* shared = r.shared.load(std::memory_order_relaxed)) e.shard->retire(*shared);
    r.free.push_back(e.shard);  // cannot throw: free.capacity() >= shards.size()
  }

  [[gnu::noinline]] Shard* find_or_attach() noexcept {
    // Once the thread's entries are destroyed (it is exiting, and a later thread_local
    // destructor allocates or frees), the owner falls back to its shared path.
    if (t_exited) return nullptr;
    for (const cached& c : t_cache) {
      if (c.id == id_) return c.shard;
    }
    Shard* shard = nullptr;
    for (const entry& e : t_entries.list) {
      if (e.id == id_) shard = e.shard;
    }
    if (shard == nullptr) shard = attach();
    if (shard != nullptr) {  // into the cache's front; the oldest entry drops out
      std::copy_backward(t_cache.begin(), t_cache.end() - 1, t_cache.end());
      t_cache.front() = {id_, shard};
    }
    return shard;
  }

  Shard* attach() noexcept {
    std::vector<entry>& list = t_entries.list;
    std::erase_if(list, [](entry& e) {
      if (e.owner->shared.load(std::memory_order_acquire) != nullptr) return false;
      detach(e);
      return true;
    });
    try {
      list.reserve(list.size() + 1);
      registry& r = *registry_;
      Shard* shard = nullptr;
      {
        std::lock_guard lock(r.mutex);
        if (r.free.empty()) {
          r.free.reserve(r.shards.size() + 1);
          r.shards.push_back(std::make_unique<Shard>());
          shard = r.shards.back().get();
        } else {
          shard = r.free.back();
          r.free.pop_back();
        }
      }
      list.push_back(entry{id_, shard, registry_});  // cannot throw: reserved above
      return shard;
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }

  // Note [initial-exec TLS]: libloom is position-independent (it will live in a Python
  // extension), where thread_locals default to the general-dynamic model: a call to
  // __tls_get_addr on every access, several ns on each adaptor call. The initial-exec
  // model reads them at a fixed offset from the thread pointer. It needs static TLS space
  // when the library is loaded with dlopen; these few dozen bytes fit in the surplus glibc
  // keeps for exactly this (as jemalloc's and tcmalloc's hot thread_locals do). Only the
  // trivially constructed ones on the hot path take it: t_entries, with a constructor and
  // a destructor, is reached through its TLS wrapper function in any model.
  static inline thread_local entries t_entries;
  [[gnu::tls_model("initial-exec")]] static inline thread_local std::array<cached, cache_size>
      t_cache;
  [[gnu::tls_model("initial-exec")]] static inline thread_local bool t_exited = false;

  std::shared_ptr<registry> registry_;
  std::uint64_t id_ = registry_->id;
};

}  // namespace loom::memory::detail
