#include "loom/memory/loans.hpp"

#include <functional>
#include <map>
#include <mutex>

namespace loom::memory {
namespace {

// A loan as the book keeps it: the borrower's name is the caller's (static) string.
struct entry {
  const void* pointer;
  std::size_t bytes;
  std::string_view borrower;
};

struct loan_book {
  std::mutex mutex;
  std::map<std::uint64_t, entry> loans;  // by ticket: the order they were made
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
  const std::lock_guard lock(b.mutex);
  b.loans.emplace(b.next_ticket, entry{pointer, bytes, borrower});
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
  for (const auto& [ticket, e] : b.loans) {
    out.push_back(loan{ticket, e.pointer, e.bytes, std::string(e.borrower)});
  }
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
