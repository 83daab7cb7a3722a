#pragma once
// Progress of long work on a terminal or in a log (loom train, loom memreplay).
//
// On a terminal: one line redrawn in place at most ten times a second,
//   "epoch 1/3 [##########..........]  120/156  52%  31.2 steps/s  ETA 0:01  loss 0.35 ..."
// Elsewhere (a pipe, a file, CI): plain lines, at most one every `plain_interval`, so that
// work shorter than that prints none,
//   "epoch 1/3: 120/156 (77%), 31.2 steps/s, ETA 0:01, loss 0.35 ..."
// The rate is of `done` since the first update; the time left assumes it holds.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace loom {

class progress {
 public:
  using clock = std::chrono::steady_clock;

  /// `unit` names what `done` counts ("steps", "events"). `terminal`: draw a bar; otherwise
  /// plain lines. Writes to `out` (stderr by default).
  progress(std::string label, std::string unit, bool terminal, std::FILE* out = stderr,
           clock::duration plain_interval = std::chrono::seconds(5));
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress();

  /// `done` of `total` (total 0: unknown), with `detail` appended to the line.
  void update(std::int64_t done, std::int64_t total, std::string_view detail = {});
  /// As update(), at time `now` (for tests).
  void update(std::int64_t done, std::int64_t total, std::string_view detail, clock::time_point now);
  /// Starts a new piece of work under another label (the next epoch): the rate restarts.
  void relabel(std::string label);
  /// Ends the terminal line (the next output starts on a line of its own). Idempotent.
  void finish();

  /// "0:07", "1:02:03".
  [[nodiscard]] static std::string format_duration(double seconds);

 private:
  std::string line(std::int64_t done, std::int64_t total, std::string_view detail,
                   double elapsed) const;

  std::string label_;
  std::string unit_;
  bool terminal_;
  std::FILE* out_;
  clock::duration plain_interval_;
  bool started_ = false;
  clock::time_point start_{};
  clock::time_point last_{};
  bool drawn_ = false;  // a terminal line is open
};

}  // namespace loom
