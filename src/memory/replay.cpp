#include "loom/memory/replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <new>

#include "loom/core/error.hpp"

namespace loom::memory {
namespace {

using replay_clock = std::chrono::steady_clock;

constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

// Picks the events that are timed on their own (Note [replay timing]): each gap is drawn
// uniformly from [1, 63] by a fixed-seed xorshift generator, so about one event in 32 is
// timed, the same ones in every run, and no periodic pattern in the log lines up with it.
class timing_schedule {
 public:
  std::size_t next_after(std::size_t event) noexcept {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return event + 1 + static_cast<std::size_t>(state_ % 63);
  }

 private:
  std::uint64_t state_ = 0x9e3779b97f4a7c15;
};

// The cost of one steady_clock::now(), in ns: the mean gap between back-to-back reads.
double clock_read_ns() {
  constexpr int reads = 1000;
  const auto start = replay_clock::now();
  for (int i = 0; i < reads; ++i) (void)replay_clock::now();
  const std::chrono::duration<double, std::nano> elapsed = replay_clock::now() - start;
  return elapsed.count() / (reads + 1);
}

struct time_total {
  std::uint64_t ns = 0;
  std::size_t count = 0;

  [[nodiscard]] double mean_less(double overhead_ns) const noexcept {
    return count == 0
               ? 0.0
               : std::max(0.0, static_cast<double>(ns) / static_cast<double>(count) - overhead_ns);
  }
};

// One replay: the loop and its bookkeeping. Gives back every block still live when it
// ends, also when an exception leaves run().
class replayer {
 public:
  replayer(const allocation_log& log, memory_resource& resource, const replay_options& options)
      : log_(log),
        events_(log.events()),
        resource_(resource),
        options_(options),
        slots_(log.slot_count()) {}

  ~replayer() { release_live(); }
  replayer(const replayer&) = delete;
  replayer& operator=(const replayer&) = delete;

  replay_report run();

 private:
  // A block handed out by the replay, with the event that allocated it.
  struct live_block {
    void* pointer = nullptr;
    const log_event* allocated_by = nullptr;
  };

  bool step(std::size_t i);
  bool timed_step(std::size_t i);
  bool on_allocate_failure(std::size_t i);
  replay_failure describe_failure(std::size_t i) const;
  void take_sample(std::size_t i);
  void release_live() noexcept;
  std::vector<replay_block> held_blocks() const;
  void finish_timing(std::uint64_t total_ns, double clock_ns);

  const allocation_log& log_;
  const std::vector<log_event>& events_;
  memory_resource& resource_;
  const replay_options& options_;
  replay_report report_;

  std::vector<live_block> slots_;       // by log_event::slot
  std::vector<live_block> unexpected_;  // allocates that failed in the log but not here
  std::size_t in_use_ = 0;
  // The reservation last seen; none when the resource keeps no such figure.
  std::size_t reserved_seen_ = 0;
  time_total allocate_time_;
  time_total deallocate_time_;
};

// Returns false when the replay must stop.
bool replayer::step(std::size_t i) {
  const log_event& e = events_[i];
  if (e.action == log_action::deallocate) {
    live_block& b = slots_[e.slot];
    if (b.pointer != nullptr) {  // null: its allocate failed here (keep_going)
      resource_.deallocate(b.pointer, e.bytes, e.alignment, e.on_stream);
      b.pointer = nullptr;
      in_use_ -= e.bytes;
    }
    return true;
  }
  void* p = nullptr;
  try {
    p = resource_.allocate(e.bytes, e.alignment, e.on_stream);
  } catch (const std::bad_alloc&) {
    return on_allocate_failure(i);
  } catch (const invalid_argument&) {
    return on_allocate_failure(i);
  }
  if (e.outcome == log_outcome::ok) [[likely]] {
    slots_[e.slot] = {p, &e};
  } else {
    unexpected_.push_back({p, &e});
    ++report_.unexpected_successes;
  }
  in_use_ += e.bytes;
  if (in_use_ > report_.peak_bytes_in_use) {
    report_.peak_bytes_in_use = in_use_;
    report_.peak_in_use_event = i;
  }
  // Note [replay sampling]: in use beyond the reservation seen means the resource grew.
  if (in_use_ > reserved_seen_) [[unlikely]] {
    take_sample(i);
  }
  return true;
}

bool replayer::timed_step(std::size_t i) {
  const auto start = replay_clock::now();
  const bool go_on = step(i);
  const auto ns = std::chrono::nanoseconds(replay_clock::now() - start).count();
  time_total& t = events_[i].action == log_action::allocate ? allocate_time_ : deallocate_time_;
  t.ns += static_cast<std::uint64_t>(ns);
  ++t.count;
  return go_on;
}

// Called from the handler of the exception that allocate threw for event i.
bool replayer::on_allocate_failure(std::size_t i) {
  if (events_[i].outcome != log_outcome::ok) {
    ++report_.expected_failures;
    return true;
  }
  ++report_.failures;
  if (!report_.first_failure) report_.first_failure = describe_failure(i);
  return options_.keep_going;
}

// Must run inside the handler of the exception that allocate threw for event i.
replay_failure replayer::describe_failure(std::size_t i) const {
  const log_event& e = events_[i];
  const log_origin& o = log_.origins()[i];
  replay_failure f{i, o.seq, o.line, e.bytes, e.alignment, o.thread, log_.tag_of(i), {}, {}, {}};
  try {
    throw;
  } catch (const out_of_memory& oom) {
    f.error = fmt::format("out of memory: {}", oom.what());
    f.refused_by = oom.refused_by();
    f.stats = oom.stats();
  } catch (const std::bad_alloc& oom) {
    f.error = fmt::format("out of memory: {}", oom.what());
  } catch (const invalid_argument& bad) {
    f.error = fmt::format("invalid argument: {}", bad.what());
  }
  return f;
}

void replayer::take_sample(std::size_t i) {
  if (!report_.samples.empty() && report_.samples.back().event == i) return;
  const std::optional<memory_stats> s = resource_.stats();
  replay_sample sample{i, in_use_, 0, 0, 0.0};
  if (s) {
    sample.bytes_reserved = s->bytes_reserved;
    sample.largest_free_block = s->largest_free_block;
    sample.fragmentation = s->fragmentation();
  }
  if (!s || s->bytes_reserved < in_use_) {
    reserved_seen_ = none;  // no reservation figure: stop looking for growth points
  } else if (reserved_seen_ != none) {
    reserved_seen_ = s->bytes_reserved;
  }
  if (sample.bytes_reserved > report_.peak_bytes_reserved) {
    report_.peak_bytes_reserved = sample.bytes_reserved;
    report_.peak_reserved_event = i;
  }
  report_.samples.push_back(sample);
}

void replayer::release_live() noexcept {
  const auto release = [this](live_block& b) {
    if (b.pointer == nullptr) return;
    const log_event& e = *b.allocated_by;
    resource_.deallocate(b.pointer, e.bytes, e.alignment, e.on_stream);
    b.pointer = nullptr;
    in_use_ -= e.bytes;
  };
  std::for_each(slots_.begin(), slots_.end(), release);
  std::for_each(unexpected_.begin(), unexpected_.end(), release);
  unexpected_.clear();
}

void replayer::finish_timing(std::uint64_t total_ns, double clock_ns) {
  replay_timing& t = report_.timing;
  t.total_ns = total_ns;
  t.ns_per_event = report_.events_replayed == 0 ? 0.0
                                                : static_cast<double>(total_ns) /
                                                      static_cast<double>(report_.events_replayed);
  t.allocate_mean_ns = allocate_time_.mean_less(clock_ns);
  t.deallocate_mean_ns = deallocate_time_.mean_less(clock_ns);
  t.timed_allocates = allocate_time_.count;
  t.timed_deallocates = deallocate_time_.count;
}

std::vector<replay_block> replayer::held_blocks() const {
  std::vector<replay_block> out;
  for (const auto* list : {&slots_, &unexpected_}) {
    for (const live_block& b : *list) {
      if (b.pointer == nullptr) continue;
      const auto event = static_cast<std::size_t>(b.allocated_by - events_.data());
      out.push_back({b.pointer, b.allocated_by->bytes, event, log_.tag_of(event)});
    }
  }
  return out;
}

replay_report replayer::run() {
  const std::size_t n = events_.size();
  report_.events_total = n;
  const std::optional<memory_stats> initial = resource_.stats();
  reserved_seen_ = initial ? initial->bytes_reserved : none;
  report_.peak_bytes_reserved = initial ? initial->bytes_reserved : 0;

  // Note [replay sampling]: after every interval-th event.
  const std::size_t interval =
      options_.samples == 0 ? none : std::max<std::size_t>(1, n / options_.samples);
  std::size_t next_sample = interval == none ? none : interval - 1;
  timing_schedule schedule;
  std::size_t next_timed = schedule.next_after(0);
  const double clock_ns = clock_read_ns();

  const std::size_t progress_every =
      options_.on_progress ? std::max<std::size_t>(1, options_.progress_interval) : none;
  std::size_t next_progress = progress_every == none ? none : progress_every - 1;

  std::size_t i = 0;
  bool go_on = true;
  // The events to replay: all, or up to options_.stop_after.
  const std::size_t end = options_.stop_after ? std::min(n, *options_.stop_after + 1) : n;
  const auto start = replay_clock::now();
  for (; go_on && i < end; ++i) {
    if (i == next_timed) [[unlikely]] {
      go_on = timed_step(i);
      next_timed = schedule.next_after(i);
    } else {
      go_on = step(i);
    }
    if (i == next_sample) [[unlikely]] {
      take_sample(i);
      next_sample += interval;
    }
    if (i == next_progress) [[unlikely]] {
      options_.on_progress(i + 1, n);
      next_progress += progress_every;
    }
  }
  if (options_.on_progress) options_.on_progress(i, n);
  const auto elapsed = std::chrono::nanoseconds(replay_clock::now() - start).count();

  report_.events_replayed = i;
  if (i > 0) take_sample(i - 1);
  const auto replayed = events_.begin() + static_cast<std::ptrdiff_t>(i);
  report_.allocations =
      static_cast<std::size_t>(std::count_if(events_.begin(), replayed, [](const log_event& e) {
        return e.action == log_action::allocate;
      }));
  report_.deallocations = i - report_.allocations;
  finish_timing(static_cast<std::uint64_t>(elapsed), clock_ns);

  if (options_.on_stop) options_.on_stop();
  if (options_.on_stop_blocks) options_.on_stop_blocks(held_blocks());
  release_live();
  report_.final_stats = resource_.stats();
  return std::move(report_);
}

}  // namespace

std::string replay_failure::describe() const {
  return fmt::format("event {} (line {}): allocate {} bytes, alignment {}, tag '{}': {}", seq, line,
                     bytes, alignment, tag, error);
}

replay_report replay(const allocation_log& log, memory_resource& resource,
                     const replay_options& options) {
  return replayer(log, resource, options).run();
}

}  // namespace loom::memory
