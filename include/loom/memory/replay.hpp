// replay: re-runs an allocation log against a memory resource and reports what it needed.
//
// The question replay answers: "would this run's allocations have fit in that
// configuration, and how well?" Record a run through logging_adaptor, parse the log
// (allocation_log.hpp), and replay it against any resource: a fixed pool of some size, a
// growing pool, a budget. Replay calls the resource exactly as the log says, in log order,
// on the calling thread: allocate(bytes, alignment, stream) for each allocate, and
// deallocate with the logged size, alignment and stream of the replayed block for each
// deallocate. It is deterministic: the same log against the same configuration gives the
// same report, timings aside.
//
// Outcomes. An allocate that succeeded in the log but fails in replay is a *failure*: the
// first one stops the replay (unless replay_options::keep_going) and the report names it,
// with the statistics the resource carried in its out_of_memory. An allocate that failed
// in the log is attempted too: failing again is expected (counted); succeeding is counted,
// and the block stays live until the end, as nothing in the log frees it. With
// keep_going, the deallocate of a block whose allocate failed does nothing. When the
// replay stops, every block still live is given back.
//
// Note [replay sampling]: the replay reads resource.stats() only now and then, since a
// pool computes some figures under its lock: after every K-th event (K spreads
// replay_options::samples evenly over the log), after the last one, and at *growth
// points*. Nothing in a replay trims a pool, so its reservation changes only when it
// grows, and it must have grown when the bytes in use exceed the reservation last seen:
// the replay compares the two after each allocate and reads the statistics when that
// happens. So growth forced by volume is seen at the event that caused it, and growth
// forced by fragmentation (below the reservation last seen) at the next evenly spaced
// sample. A resource that reports less reserved than in use keeps no reservation figure;
// the replay then stops looking for growth points.
//
// Note [replay timing]: the loop is timed as a whole with steady_clock, from the first
// event to the stop (the final release of live blocks excluded), so the total and the
// mean per event are honest, including the replay's own bookkeeping. The means per action
// are estimated: about one event in 32, picked by a fixed-seed generator (so that a
// periodic log cannot bias the choice), is timed on its own, and the cost of reading the
// clock, measured before the loop, is subtracted. Those estimates carry the noise of
// timing single calls of tens of nanoseconds; the count of timed events is reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/memory_stats.hpp"
#include "loom/memory/allocation_log.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

/// A block the replay holds: where the resource put it, and what the log says of it.
struct replay_block {
  const void* pointer;
  std::size_t bytes;
  std::size_t event;  // the allocate that made it (index into allocation_log::events())
  std::string tag;
};

struct replay_options {
  /// Count every failure and go on, instead of stopping at the first.
  bool keep_going = false;
  /// About how many evenly spaced samples to take (Note [replay sampling]); 0: none but
  /// the last event and the growth points.
  std::size_t samples = 100;
  /// Called once when the replay has stopped (at the end of the log, or at the first
  /// failure), before the blocks still live are given back: the moment to inspect the
  /// resource in the state the log left it in. Exceptions propagate from replay().
  std::function<void()> on_stop;
  /// Called with (events replayed, events in the log) every `progress_interval` events and
  /// once at the end, for a progress display; its time is inside the replay's.
  std::function<void(std::size_t, std::size_t)> on_progress;
  std::size_t progress_interval = std::size_t{1} << 16;
  /// Stop after replaying this event (an index into allocation_log::events()), as if the
  /// log ended there: on_stop and on_stop_blocks see the resource in that state.
  std::optional<std::size_t> stop_after;
  /// Called with the blocks the replay holds when it stops, before they are given back.
  std::function<void(const std::vector<replay_block>&)> on_stop_blocks;
};

/// The resource's figures after an event (Note [replay sampling]).
struct replay_sample {
  /// Index of the event (into allocation_log::events()) just replayed.
  std::size_t event;
  /// Bytes of the blocks live in the replay, as requested: counted by the replay itself.
  std::size_t bytes_in_use;
  /// From the resource's statistics; 0 when it keeps none.
  std::size_t bytes_reserved;
  /// The largest block the resource could hand out without growing; 0 when it keeps no
  /// such figure.
  std::size_t largest_free_block;
  double fragmentation;
};

/// The first allocate that succeeded in the log and failed in replay.
struct replay_failure {
  std::size_t event;  // index into allocation_log::events()
  std::uint64_t seq;
  std::size_t line;
  std::size_t bytes;
  std::size_t alignment;
  std::uint32_t thread;
  std::string tag;
  /// "out of memory: <what the resource said>" or "invalid argument: <...>".
  std::string error;
  /// What refused it (loom::out_of_memory::refused_by), "" when not known.
  std::string refused_by;
  /// The refusing resource's statistics at that moment, when its out_of_memory had them.
  std::optional<memory_stats> stats;

  /// "event 1234 (line 1237): allocate 268435456 bytes, alignment 64, tag 'mlp/backward':
  /// out of memory: ...".
  [[nodiscard]] std::string describe() const;
};

/// Wall-clock figures (Note [replay timing]); the only part of a report that varies
/// between runs.
struct replay_timing {
  std::uint64_t total_ns = 0;
  double ns_per_event = 0;
  double allocate_mean_ns = 0;  // estimated from timed_allocates events
  double deallocate_mean_ns = 0;
  std::size_t timed_allocates = 0;
  std::size_t timed_deallocates = 0;
};

struct replay_report {
  std::size_t events_total = 0;     // in the log
  std::size_t events_replayed = 0;  // up to and including the stop
  std::size_t allocations = 0;      // replayed allocate events
  std::size_t deallocations = 0;    // replayed deallocate events
  /// Allocates that succeeded in the log and failed in replay.
  std::size_t failures = 0;
  /// Allocates that failed in the log and again in replay.
  std::size_t expected_failures = 0;
  /// Allocates that failed in the log and succeeded in replay (live until the end).
  std::size_t unexpected_successes = 0;
  std::optional<replay_failure> first_failure;

  /// The most bytes live at once in the replay (as requested), and the event where.
  std::size_t peak_bytes_in_use = 0;
  std::size_t peak_in_use_event = 0;
  /// The most bytes the resource held from its upstream, as the samples saw them (and the
  /// reading before the first event). 0 when the resource reports no reservation.
  std::size_t peak_bytes_reserved = 0;
  /// The event after which the largest reservation was first seen (the growth point, when
  /// the growth was seen there; see Note [replay sampling]); nullopt when the resource
  /// held it before the first event (a preallocated pool) or reports no reservation.
  std::optional<std::size_t> peak_reserved_event;

  /// In event order: the evenly spaced samples, the growth points and the last event.
  std::vector<replay_sample> samples;
  /// The resource's statistics after the replay gave back every live block.
  std::optional<memory_stats> final_stats;
  replay_timing timing;

  /// True when every allocate that succeeded in the log succeeded in replay.
  [[nodiscard]] bool ok() const noexcept { return failures == 0; }
  /// A readable summary of a few lines, with a table of some of the samples.
  [[nodiscard]] std::string to_text() const;
  /// Every figure, samples included, as one JSON object; the timings are under "timing".
  [[nodiscard]] std::string to_json() const;
};

/// Replays `log` against `resource` as described at the top, on the calling thread.
/// `resource` must not be used by anything else meanwhile if the report is to mean
/// anything (it may be; replay itself stays correct). Throws what the resource or
/// options.on_stop throw other than out_of_memory and invalid_argument from allocate,
/// after giving back every live block.
[[nodiscard]] replay_report replay(const allocation_log& log, memory_resource& resource,
                                   const replay_options& options = {});

}  // namespace loom::memory
