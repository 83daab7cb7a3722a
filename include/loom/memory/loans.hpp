// loans: memory lent to a consumer outside loom, until it gives it back.
//
// When loom exports a tensor through DLPack (or the array interfaces), the consumer holds
// a reference to the tensor's buffer until it calls the deleter. A loan records that:
// lend() when the export is made, give_back() from the deleter. Outstanding loans are
// listed by outstanding_loans(), and a tracking_adaptor's leak report marks the allocations
// they fall in ("lent to numpy through DLPack, not given back"), so a buffer kept alive by
// a consumer that never released it is told apart from a leak inside loom.
//
// Thread-safe; a loan costs one mutex-protected map insertion and erasure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::memory {

/// One outstanding loan.
struct loan {
  std::uint64_t ticket = 0;  // from lend(), unique for the process
  const void* pointer = nullptr;
  std::size_t bytes = 0;
  std::string borrower;  // "DLPack (legacy)", "DLPack 1.0", ...
};

/// Records that [pointer, pointer + bytes) is lent to `borrower`, a string that outlives
/// the loan (a literal); returns the ticket that give_back takes. Throws std::bad_alloc
/// when out of memory (nothing is recorded).
std::uint64_t lend(const void* pointer, std::size_t bytes, std::string_view borrower);

/// Ends the loan `ticket` (a ticket already given back, or 0, is ignored).
void give_back(std::uint64_t ticket) noexcept;

/// The loans not given back, in the order they were made.
[[nodiscard]] std::vector<loan> outstanding_loans();

/// The outstanding loans that overlap [pointer, pointer + bytes), in order.
[[nodiscard]] std::vector<loan> loans_within(const void* pointer, std::size_t bytes);

}  // namespace loom::memory
