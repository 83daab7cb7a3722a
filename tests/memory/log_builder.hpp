// Test helpers for allocation logs: a record type, a CSV writer independent of the parser,
// and a generator of random valid logs driven by a shadow model of the live blocks.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace loom::memory::testing {

struct log_record {
  std::uint64_t seq = 0;
  std::uint32_t thread = 0;
  std::uint64_t time_ns = 0;
  std::string action;  // "allocate" or "deallocate"
  std::uintptr_t pointer = 0;
  std::size_t bytes = 0;
  std::size_t alignment = 64;
  std::uintptr_t stream = 0;
  std::string tag;
  std::string outcome = "ok";
};

/// A tag as a CSV field: quoted, with quotes doubled, when it holds a comma, quote or line
/// break (RFC 4180).
inline std::string csv_field(const std::string& tag) {
  if (tag.find_first_of(",\"\r\n") == std::string::npos) return tag;
  std::string quoted = "\"";
  for (const char c : tag) {
    quoted += c;
    if (c == '"') quoted += '"';
  }
  return quoted + '"';
}

inline std::string csv_line(const log_record& r) {
  return fmt::format("{},{},{},{},{:#x},{},{},{:#x},{},{}\n", r.seq, r.thread, r.time_ns, r.action,
                     r.pointer, r.bytes, r.alignment, r.stream, csv_field(r.tag), r.outcome);
}

/// A whole log: the version comment (line 1), the header (line 2), then the records, one
/// per line, or more for tags that hold line breaks.
inline std::string to_csv(const std::vector<log_record>& records) {
  std::string text =
      "# loom allocation log v1\n"
      "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome\n";
  for (const log_record& r : records) text += csv_line(r);
  return text;
}

/// The line on which each record of to_csv(records) starts.
inline std::vector<std::size_t> first_lines(const std::vector<log_record>& records) {
  std::vector<std::size_t> lines;
  std::size_t line = 3;
  for (const log_record& r : records) {
    lines.push_back(line);
    line += 1 + static_cast<std::size_t>(std::count(r.tag.begin(), r.tag.end(), '\n'));
  }
  return lines;
}

struct random_log_options {
  std::size_t events = 2000;
  std::size_t max_live = 64;
  std::size_t max_bytes = 1 << 16;
  std::size_t max_alignment = 4096;
  /// Chance, per allocate, of one that failed in the log: half with an alignment that is
  /// not a power of two (invalid_argument), half of more bytes than any allocation may be
  /// (out_of_memory); both fail in any replay.
  double failed_fraction = 0.0;
  /// Tags to draw from.
  std::vector<std::string> tags = {"",    "mlp/forward", "adam/step",
                                   "a,b", "say \"hi\"",  "two\nlines"};
  std::vector<std::uintptr_t> streams = {0x0, 0x10, 0x20};
};

/// A valid log: every deallocate names a live block with its size and alignment; freed
/// addresses come back (addresses are drawn from a small set), so the same pointer stands
/// for different blocks over time. Blocks may stay live at the end.
inline std::vector<log_record> random_log(std::mt19937_64& rng, const random_log_options& o) {
  std::vector<log_record> records;
  std::vector<log_record> live;  // the allocate records of the live blocks
  std::vector<std::uintptr_t> free_addresses;
  for (std::uintptr_t a = 1; a <= 2 * o.max_live; ++a) free_addresses.push_back(a << 16);
  std::uint64_t time = 0;
  const auto pick = [&rng](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  std::bernoulli_distribution fails(o.failed_fraction);
  for (std::size_t i = 0; i < o.events; ++i) {
    log_record r;
    r.seq = i;
    r.thread = static_cast<std::uint32_t>(pick(3));
    r.time_ns = time += 1 + pick(1000);
    r.tag = o.tags[pick(o.tags.size())];
    r.stream = o.streams[pick(o.streams.size())];
    const bool allocate = live.empty() || (live.size() < o.max_live && pick(2) == 0);
    if (!allocate) {
      const std::size_t k = pick(live.size());
      r.action = "deallocate";
      r.pointer = live[k].pointer;
      r.bytes = live[k].bytes;
      r.alignment = live[k].alignment;
      free_addresses.push_back(r.pointer);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      r.action = "allocate";
      r.bytes = pick(o.max_bytes + 1);
      r.alignment = std::size_t{1}
                    << pick(static_cast<std::size_t>(std::countr_zero(o.max_alignment)) + 1);
      if (fails(rng)) {
        if (pick(2) == 0) {
          r.alignment = 3 * r.alignment;
          r.outcome = "invalid_argument";
        } else {
          r.bytes = std::size_t{1} << 63;
          r.outcome = "out_of_memory";
        }
      } else {
        const std::size_t k = pick(free_addresses.size());
        r.pointer = free_addresses[k];
        free_addresses.erase(free_addresses.begin() + static_cast<std::ptrdiff_t>(k));
        live.push_back(r);
      }
    }
    records.push_back(r);
  }
  return records;
}

}  // namespace loom::memory::testing
