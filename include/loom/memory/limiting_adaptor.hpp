// limiting_adaptor: a named byte budget in front of an upstream resource.
//
// A request that would take the budget over its limit throws loom::out_of_memory naming
// the budget; the budget stays usable. Budgets nest: a child budget allocates through its
// parent, so every allocation charges the whole chain (process -> session -> component),
// and a refusal names whichever budget refused:
//
//   limiting_adaptor process{pool, std::size_t{8} << 30, "process"};
//   limiting_adaptor session{process, std::size_t{2} << 30, "session 7"};
//   void* p = session.allocate(n);   // charged to "session 7" and to "process"
//
// When the parent refuses, the child takes back its own charge before the parent's error
// goes on to the caller.
//
// Note [budget leases]
// Charging one shared atomic counter on every call would cost an atomic read-modify-write
// per call. Instead, as Linux's memory cgroups batch per-CPU charges, each thread holds a
// *lease*: budget it has taken from the shared counter in quanta of lease_quantum() bytes
// (min(256 KiB, limit / 1024)) and hands out to its own requests with plain thread-local
// arithmetic. A request larger than a quantum, or one made when no whole quantum is left,
// spends the thread's lease and charges the rest to the shared counter exactly. Freed
// bytes go to the freeing thread's lease; a lease that grows past one quantum gives back
// all but half a quantum. So:
// - The shared counter, charged() = bytes in use + bytes in leases, never exceeds the
//   limit (unless set_limit lowered it below): a child never exceeds its parent, and a
//   budget is never exceeded.
// - A thread alone can always use the whole budget: its own lease counts toward its
//   request. A request may be refused while up to one quantum per *other* thread sits in
//   their leases; the error says how many bytes those leases hold. A thread's lease goes
//   back to the budget when the thread exits.
//
// An adaptor is equal (is_equal) only to itself: a block must go back through the budget
// that handed it out. stats() reports the upstream's figures.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "loom/memory/detail/thread_shards.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

class limiting_adaptor final : public memory_resource {
 public:
  /// A budget of `limit` bytes named `name` over `upstream`, which must outlive it.
  /// Throws std::bad_alloc.
  explicit limiting_adaptor(memory_resource& upstream, std::size_t limit, std::string name);
  /// A budget nested in `parent` (which must outlive it): allocates through the parent,
  /// so the parent is charged too. Throws loom::invalid_argument when `limit` exceeds the
  /// parent's limit.
  explicit limiting_adaptor(limiting_adaptor& parent, std::size_t limit, std::string name);
  ~limiting_adaptor() override;

  limiting_adaptor(const limiting_adaptor&) = delete;
  limiting_adaptor& operator=(const limiting_adaptor&) = delete;

  /// Bytes allocated through this budget and not yet given back (charged() less the
  /// leases). Exact whenever no call is in flight. Thread-safe.
  [[nodiscard]] std::size_t used() const;
  /// Bytes taken from the budget: used() plus the bytes held in threads' leases. Never
  /// more than limit(), unless set_limit lowered the limit below it. Thread-safe.
  [[nodiscard]] std::size_t charged() const noexcept;
  /// The limit in bytes. Thread-safe.
  [[nodiscard]] std::size_t limit() const noexcept;
  /// Changes the limit. Lowering it below the bytes charged now frees nothing: it refuses
  /// new requests until enough is given back. Throws loom::invalid_argument when this is a
  /// nested budget and `limit` exceeds the parent's limit. Thread-safe.
  void set_limit(std::size_t limit);
  /// The bytes of budget a thread takes at a time (Note [budget leases]). Thread-safe.
  [[nodiscard]] std::size_t lease_quantum() const noexcept;

  /// The budget's name, as errors give it.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The resource this budget allocates from (the parent, for a nested budget).
  [[nodiscard]] memory_resource& upstream() const noexcept { return upstream_; }
  /// The enclosing budget, or nullptr.
  [[nodiscard]] limiting_adaptor* parent() const noexcept { return parent_; }

 private:
  // The shared side of the budget (Note [budget leases]).
  struct budget {
    std::atomic<std::size_t> charged{0};  // bytes in use + bytes in leases
    std::atomic<std::size_t> limit{0};
    std::atomic<std::size_t> quantum{0};

    // Charges `bytes` when that keeps the budget within its limit.
    bool try_charge(std::size_t bytes) noexcept;
    void release(std::size_t bytes) noexcept;
  };
  struct lease;  // one thread's lease (src/memory/limiting_adaptor.cpp)

  limiting_adaptor(memory_resource& upstream, limiting_adaptor* parent, std::size_t limit,
                   std::string name);

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  std::optional<memory_stats> do_stats() const override { return upstream_.stats(); }

  // `own` is the calling thread's lease, nullptr when it has none (leases_.local()).
  void charge(lease* own, std::size_t bytes);  // beyond the calling thread's lease
  void uncharge(lease* own, std::size_t bytes) noexcept;
  [[nodiscard]] std::size_t leased() const;  // bytes in every thread's lease
  [[noreturn]] void refuse(std::size_t bytes) const;

  memory_resource& upstream_;
  limiting_adaptor* parent_;
  std::string name_;
  budget budget_;
  detail::thread_shards<budget, lease> leases_;
};

}  // namespace loom::memory
