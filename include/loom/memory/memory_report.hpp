// Pictures of memory: one self-contained HTML page (no network: data, script and style
// inline) showing what a replayed allocation log did to a pool (loom memreplay --html,
// loom train --memory-report; docs/memory.md, "Reading a memory report").
#pragma once

#include <string>
#include <vector>

#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/replay.hpp"

namespace loom::memory {

/// Everything the page shows.
struct memory_picture {
  std::string title;     // "loom memreplay data/mlp_training.alloc.csv"
  std::string resource;  // what the log was replayed against
  /// The whole replay: its samples are the charts over time (bytes in use, reserved, the
  /// largest free block, fragmentation); its first failure, if any, is marked on them.
  replay_report report;
  /// The pool's regions at `at_event` (the peak of bytes in use, or the first failure), drawn
  /// as a map of chunks coloured by the tag of the block in each.
  std::vector<region_info> regions;
  /// The blocks live at `at_event`: the chunk map's tags and the table of the allocation
  /// sites (tags) holding the most bytes.
  std::vector<replay_block> blocks;
  std::size_t at_event = 0;
  bool at_failure = false;
};

/// The page, as one HTML document.
[[nodiscard]] std::string to_html(const memory_picture& picture);

}  // namespace loom::memory
