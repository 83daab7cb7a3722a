#include "loom/memory/limiting_adaptor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <optional>

#include "loom/core/error.hpp"
#include "loom/memory/detail/single_threaded.hpp"
#include "memory/describe_bytes.hpp"

namespace loom::memory {
namespace {

using detail::describe_bytes;

constexpr std::size_t max_quantum = std::size_t{256} << 10;

constexpr std::size_t quantum_for(std::size_t limit) noexcept {
  return std::min(max_quantum, limit / 1024);
}

}  // namespace

// A thread's lease: budget charged to the shared counter and not yet handed out.
struct alignas(64) limiting_adaptor::lease {
  std::atomic<std::size_t> bytes{0};

  void retire(budget& b) noexcept {
    b.release(bytes.load(std::memory_order_relaxed));
    bytes.store(0, std::memory_order_relaxed);
  }
};

bool limiting_adaptor::budget::try_charge(std::size_t bytes) noexcept {
  const std::size_t lim = limit.load(std::memory_order_relaxed);
  std::size_t now = charged.load(std::memory_order_relaxed);
  if (detail::single_threaded()) {  // Note [single-threaded elision]
    if (bytes > lim || now > lim - bytes) return false;
    charged.store(now + bytes, std::memory_order_relaxed);
    return true;
  }
  do {
    if (bytes > lim || now > lim - bytes) return false;
  } while (!charged.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  return true;
}

void limiting_adaptor::budget::release(std::size_t bytes) noexcept {
  detail::shared_fetch_sub(charged, bytes);
}

limiting_adaptor::limiting_adaptor(memory_resource& upstream, std::size_t limit, std::string name)
    : limiting_adaptor(upstream, nullptr, limit, std::move(name)) {}

limiting_adaptor::limiting_adaptor(limiting_adaptor& parent, std::size_t limit, std::string name)
    : limiting_adaptor(parent, &parent, limit, std::move(name)) {}

limiting_adaptor::limiting_adaptor(memory_resource& upstream, limiting_adaptor* parent,
                                   std::size_t limit, std::string name)
    : upstream_(upstream), parent_(parent), name_(std::move(name)), leases_(budget_) {
  set_limit(limit);  // checks the limit against the parent's
}

limiting_adaptor::~limiting_adaptor() = default;

std::size_t limiting_adaptor::leased() const {
  std::size_t sum = 0;
  leases_.for_each([&](const lease& l) { sum += l.bytes.load(std::memory_order_relaxed); });
  return sum;
}

std::size_t limiting_adaptor::used() const {
  const std::size_t in_leases = leased();
  const std::size_t total = charged();
  return total > in_leases ? total - in_leases : 0;  // a thread may be between two updates
}

std::size_t limiting_adaptor::charged() const noexcept {
  return budget_.charged.load(std::memory_order_relaxed);
}

std::size_t limiting_adaptor::limit() const noexcept {
  return budget_.limit.load(std::memory_order_relaxed);
}

std::size_t limiting_adaptor::lease_quantum() const noexcept {
  return budget_.quantum.load(std::memory_order_relaxed);
}

void limiting_adaptor::set_limit(std::size_t limit) {
  if (parent_ != nullptr && limit > parent_->limit()) {
    throw invalid_argument(fmt::format(
        "limiting_adaptor '{}': a limit of {} exceeds the limit of its parent budget '{}', {}",
        name_, describe_bytes(limit), parent_->name(), describe_bytes(parent_->limit())));
  }
  budget_.limit.store(limit, std::memory_order_relaxed);
  budget_.quantum.store(quantum_for(limit), std::memory_order_relaxed);
}

void* limiting_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  lease* own = leases_.local();
  const std::size_t have = own != nullptr ? own->bytes.load(std::memory_order_relaxed) : 0;
  if (own != nullptr && bytes <= have) [[likely]] {
    own->bytes.store(have - bytes, std::memory_order_relaxed);
  } else {
    charge(own, bytes);
  }
  try {
    return upstream_.allocate(bytes, alignment, s);
  } catch (...) {
    uncharge(own, bytes);  // a parent's refusal must not leave this budget charged
    throw;
  }
}

void limiting_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                     stream s) noexcept {
  // The block goes back first, so that the upstream never holds more than the budget.
  upstream_.deallocate(p, bytes, alignment, s);
  uncharge(leases_.local(), bytes);
}

void limiting_adaptor::charge(lease* own, std::size_t bytes) {
  if (own == nullptr) {  // no shard for this thread (out of memory): charge exactly
    if (!budget_.try_charge(bytes)) refuse(bytes);
    return;
  }
  const std::size_t have = own->bytes.load(std::memory_order_relaxed);
  const std::size_t quantum = budget_.quantum.load(std::memory_order_relaxed);
  if (bytes <= quantum && budget_.try_charge(quantum)) {
    own->bytes.store(have + quantum - bytes, std::memory_order_relaxed);
    return;
  }
  // A large request, or no quantum left: spend the whole lease and charge the rest exactly.
  own->bytes.store(0, std::memory_order_relaxed);
  if (budget_.try_charge(bytes - have)) return;
  budget_.release(have);  // the lease goes back to the budget, for the other threads
  refuse(bytes);
}

void limiting_adaptor::uncharge(lease* own, std::size_t bytes) noexcept {
  if (own == nullptr) {
    budget_.release(bytes);
    return;
  }
  const std::size_t have = own->bytes.load(std::memory_order_relaxed) + bytes;
  const std::size_t quantum = budget_.quantum.load(std::memory_order_relaxed);
  if (have <= quantum) [[likely]] {
    own->bytes.store(have, std::memory_order_relaxed);
    return;
  }
  // Keep half a quantum, so that alternating frees and allocations stay thread-local.
  const std::size_t keep = quantum / 2;
  own->bytes.store(keep, std::memory_order_relaxed);
  budget_.release(have - keep);
}

void limiting_adaptor::refuse(std::size_t bytes) const {
  const std::size_t in_leases = leased();
  const std::size_t total = charged();
  std::optional<memory_stats> upstream_stats = upstream_.stats();
  std::string message = fmt::format(
      "limiting_adaptor '{}': a request of {} would exceed its limit of {}: {} in use, {} "
      "leased to other threads",
      name_, describe_bytes(bytes), describe_bytes(limit()),
      describe_bytes(total > in_leases ? total - in_leases : 0), describe_bytes(in_leases));
  if (upstream_stats) message += "; upstream: " + to_string(*upstream_stats);
  throw out_of_memory(std::move(message), bytes, name_, upstream_stats);
}

}  // namespace loom::memory
