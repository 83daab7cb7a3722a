// Memory reports from the command line: `loom memreplay --html` and `loom train
// --memory-report` (loom/memory/memory_report.hpp draws the page).
#pragma once

#include <cstddef>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "loom/memory/memory_report.hpp"
#include "loom/memory/replay.hpp"

namespace loom::tools {

/// Samples a replay takes for a report's charts over time (about this many points a line).
inline constexpr std::size_t report_samples = 2000;

/// A memory report's file, opened for writing before any work is done; throws
/// loom::invalid_argument naming the path and the reason when it cannot be.
[[nodiscard]] std::ofstream open_report(const std::string& path);

/// Writes `picture` as HTML into `out` (opened by open_report(path)) and says where.
void write_report(std::ofstream& out, const std::string& path,
                  const memory::memory_picture& picture);

/// The picture of a replay: `report` (of the whole log), then the log replayed again on a
/// fresh target from make() as far as the moment to show (the first failure, else the peak
/// of bytes in use), where the pool's chunks and the blocks in them are taken. A target has
/// resource(), pool() (or nullptr) and describe().
template <class MakeTarget>
memory::memory_picture picture_of(const memory::allocation_log& log,
                                  const memory::replay_report& report, MakeTarget&& make,
                                  std::string title) {
  memory::memory_picture p;
  p.title = std::move(title);
  p.report = report;
  p.at_failure = report.first_failure.has_value();
  p.at_event = p.at_failure ? report.first_failure->event : report.peak_in_use_event;
  const auto again = make();
  p.resource = again.describe();
  memory::replay_options o;
  o.samples = 0;
  o.stop_after = p.at_event;
  o.on_stop = [&] {
    if (again.pool() != nullptr) p.regions = again.pool()->regions();
  };
  o.on_stop_blocks = [&](const std::vector<memory::replay_block>& blocks) { p.blocks = blocks; };
  (void)memory::replay(log, again.resource(), o);
  return p;
}

}  // namespace loom::tools
