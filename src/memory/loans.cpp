#include "loom/memory/loans.hpp"

#include <functional>
#include <map>
#include <mutex>

namespace loom::memory {
namespace {

struct loan_book {
  std::mutex mutex;
  std::map<std::uint64_t, loan> loans;  // by ticket: the order they were made
  std::uint64_t next_ticket = 1;
};

// Never destroyed: deleters may run during static destruction (a NumPy array freed at exit).
loan_book& book() {
  static auto* b = new loan_book;
  return *b;
}

}  // namespace

std::uint64_t lend(const void* pointer, std::size_t bytes, std::string_view borrower) {
  loan_book& b = book();
  loan l{0, pointer, bytes, std::string(borrower)};
  const std::lock_guard lock(b.mutex);
  l.ticket = b.next_ticket;
  b.loans.emplace(l.ticket, std::move(l));
  return b.next_ticket++;
}

void give_back(std::uint64_t ticket) noexcept {
  if (ticket == 0) return;
  loan_book& b = book();
  const std::lock_guard lock(b.mutex);
  b.loans.erase(ticket);
}

std::vector<loan> outstanding_loans() {
  loan_book& b = book();
  const std::lock_guard lock(b.mutex);
  std::vector<loan> out;
  out.reserve(b.loans.size());
  for (const auto& [ticket, l] : b.loans) out.push_back(l);
  return out;
}

std::vector<loan> loans_within(const void* pointer, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(pointer);
  const std::uintptr_t end = begin + bytes;
  std::vector<loan> out;
  for (loan& l : outstanding_loans()) {
    const auto p = reinterpret_cast<std::uintptr_t>(l.pointer);
    // An empty loan sits at its address; others overlap by range.
    const bool overlaps = l.bytes == 0 ? (p >= begin && p < end) : (p < end && p + l.bytes > begin);
    if (overlaps) out.push_back(std::move(l));
  }
  return out;
}

}  // namespace loom::memory
