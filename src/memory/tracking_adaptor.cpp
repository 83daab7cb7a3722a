#include "loom/memory/tracking_adaptor.hpp"

#include <execinfo.h>
#include <fmt/format.h>
#include <fmt/std.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "loom/core/memory_stats.hpp"
#include "loom/memory/allocation_tag.hpp"
#include "loom/memory/loans.hpp"
#include "loom/memory/misuse.hpp"
#include "memory/describe_bytes.hpp"

namespace loom::memory {
namespace {

using detail::describe_bytes;

// Room in a captured stack for the frames above the caller's: the tracker's own, and one
// that a sanitizer's backtrace() interceptor adds.
constexpr std::size_t own_frames = 4;

std::string plural(std::size_t n, const char* noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// Appends the symbolised frames of `stack`, one per line.
void append_stack(std::string& out, const std::vector<void*>& stack) {
  if (stack.empty()) return;
  const int n = static_cast<int>(stack.size());
  char** symbols = backtrace_symbols(stack.data(), n);
  for (int i = 0; i < n; ++i) {
    const auto index = static_cast<std::size_t>(i);
    if (symbols != nullptr) {
      fmt::format_to(std::back_inserter(out), "      #{} {}\n", i, symbols[index]);
    } else {
      fmt::format_to(std::back_inserter(out), "      #{} [{}]\n", i, stack[index]);
    }
  }
  std::free(symbols);  // NOLINT(cppcoreguidelines-no-malloc): backtrace_symbols mallocs
}

}  // namespace

tracking_adaptor::tracking_adaptor(memory_resource& upstream, tracking_options options)
    : upstream_(upstream),
      options_(std::move(options)),
      label_(fmt::format("tracking_adaptor '{}'", options_.name)) {}

tracking_adaptor::~tracking_adaptor() {
  if (options_.on_leak == leak_action::ignore || outstanding_count() == 0) return;
  misuse_report report{misuse_kind::leak, {}, nullptr, outstanding_bytes(), 0, stream{}, {}};
  try {
    const std::vector<allocation_record> live = outstanding();
    report.pointer = live.front().pointer;
    report.resource = label_;
    report.message = format_report(live);
    report.message.pop_back();  // the final newline
  } catch (...) {
    // No memory for the report: report_misuse builds a shorter message.
  }
  if (options_.on_leak == leak_action::abort) {
    std::fprintf(stderr, "loom: memory leak: %s\n", report.message.c_str());
    std::abort();
  }
  report_misuse(std::move(report));
}

std::vector<void*> tracking_adaptor::capture_stack(const void* caller) const {
  std::vector<void*> frames(options_.max_stack_depth + own_frames);
  frames.resize(
      static_cast<std::size_t>(backtrace(frames.data(), static_cast<int>(frames.size()))));
  frames.erase(frames.begin(), std::find(frames.begin(), frames.end(), caller));
  frames.resize(std::min(frames.size(), options_.max_stack_depth));
  return frames;
}

void* tracking_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  void* p = upstream_.allocate(bytes, alignment, s);
  try {
    allocation_record record{p,
                             bytes,
                             alignment,
                             s,
                             std::string(current_tag()),
                             std::this_thread::get_id(),
                             0,
                             options_.capture_stack_traces
                                 ? capture_stack(__builtin_return_address(0))
                                 : std::vector<void*>{}};
    std::lock_guard lock(mutex_);
    record.sequence = next_sequence_;
    // A live record for p means the block went back to the upstream behind this
    // adaptor's back; the new allocation is the real one.
    records_.insert_or_assign(p, std::move(record));
    ++next_sequence_;
  } catch (...) {
    upstream_.deallocate(p, bytes, alignment, s);
    throw;
  }
  return p;
}

void tracking_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                     stream s) noexcept {
  // Misuse is reported after unlocking, so that the handler may call into the adaptor.
  std::unique_lock lock(mutex_);
  const auto it = records_.find(p);
  if (it == records_.end()) {
    const misuse_kind kind =
        freed_recently(p) ? misuse_kind::double_free : misuse_kind::unknown_pointer;
    lock.unlock();
    report_bad_deallocate(kind, p, bytes, alignment, 0, s);
    return;
  }
  const allocation_record& record = it->second;
  if (record.bytes != bytes || record.alignment != alignment) {
    const bool size = record.bytes != bytes;
    const std::size_t expected = size ? record.bytes : record.alignment;
    lock.unlock();
    report_bad_deallocate(size ? misuse_kind::size_mismatch : misuse_kind::alignment_mismatch, p,
                          bytes, alignment, expected, s);
    return;
  }
  records_.erase(it);
  recently_freed_[next_freed_slot_] = p;
  next_freed_slot_ = (next_freed_slot_ + 1) % recently_freed_.size();
  lock.unlock();
  upstream_.deallocate(p, bytes, alignment, s);
}

void tracking_adaptor::report_bad_deallocate(misuse_kind kind, const void* p, std::size_t bytes,
                                             std::size_t alignment, std::size_t expected,
                                             stream s) const noexcept {
  misuse_report report{kind, {}, p, bytes, expected, s, {}};
  try {
    report.resource = label_;
    const std::string call = fmt::format("{}: deallocate({}, {} bytes, alignment {}, stream {:#x})",
                                         label_, p, bytes, alignment, s.value());
    switch (kind) {
      case misuse_kind::double_free:
        report.message = call + " of a block already given back (double free)";
        break;
      case misuse_kind::size_mismatch:
        report.message = fmt::format("{}: the block was allocated with {} bytes", call, expected);
        break;
      case misuse_kind::alignment_mismatch:
        report.message =
            fmt::format("{}: the block was allocated with alignment {}", call, expected);
        break;
      default:
        report.message = call + " of a pointer this adaptor did not hand out";
        break;
    }
    report.message += "; not forwarded to the upstream";
  } catch (...) {
    // No memory for the message: report_misuse builds a shorter one.
  }
  report_misuse(std::move(report));
}

bool tracking_adaptor::freed_recently(const void* p) const noexcept {
  return std::find(recently_freed_.begin(), recently_freed_.end(), p) != recently_freed_.end();
}

std::vector<allocation_record> tracking_adaptor::outstanding() const {
  std::vector<allocation_record> out;
  {
    std::lock_guard lock(mutex_);
    out.reserve(records_.size());
    for (const auto& [p, record] : records_) out.push_back(record);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.sequence < b.sequence; });
  return out;
}

std::map<std::string, std::size_t> tracking_adaptor::bytes_by_tag() const {
  std::map<std::string, std::size_t> out;
  std::lock_guard lock(mutex_);
  for (const auto& [p, record] : records_) out[record.tag] += record.bytes;
  return out;
}

std::size_t tracking_adaptor::outstanding_count() const {
  std::lock_guard lock(mutex_);
  return records_.size();
}

std::size_t tracking_adaptor::outstanding_bytes() const {
  std::size_t sum = 0;
  std::lock_guard lock(mutex_);
  for (const auto& [p, record] : records_) sum += record.bytes;
  return sum;
}

std::string tracking_adaptor::leak_report() const {
  return format_report(outstanding());
}

std::string tracking_adaptor::format_report(const std::vector<allocation_record>& live) const {
  if (live.empty()) return label_ + ": no allocations outstanding\n";

  std::map<std::string_view, std::vector<const allocation_record*>> by_tag;
  std::size_t total = 0;
  for (const allocation_record& r : live) {
    by_tag[r.tag].push_back(&r);
    total += r.bytes;
  }
  std::string out = fmt::format("{}: {} outstanding, {}\n", label_,
                                plural(live.size(), "allocation"), describe_bytes(total));
  auto it = std::back_inserter(out);
  for (const auto& [tag, records] : by_tag) {
    std::size_t bytes = 0;
    for (const allocation_record* r : records) bytes += r->bytes;
    fmt::format_to(it, "  {}: {}, {}\n",
                   tag.empty() ? std::string("untagged") : fmt::format("tag '{}'", tag),
                   plural(records.size(), "allocation"), describe_bytes(bytes));
    for (const allocation_record* r : records) {
      fmt::format_to(it, "    #{} at {}: {}, alignment {}, stream {:#x}, thread {}\n", r->sequence,
                     r->pointer, describe_bytes(r->bytes), r->alignment, r->on_stream.value(),
                     r->thread);
      for (const loan& l : loans_within(r->pointer, r->bytes)) {
        fmt::format_to(it, "      lent to {} ({} at {}), not given back\n", l.borrower,
                       describe_bytes(l.bytes), l.pointer);
      }
      append_stack(out, r->stack);
    }
  }
  return out;
}

}  // namespace loom::memory
