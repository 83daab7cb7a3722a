#include "loom/core/progress.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace loom {

progress::progress(std::string label, std::string unit, bool terminal, std::FILE* out,
                   clock::duration plain_interval)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      terminal_(terminal),
      out_(out),
      plain_interval_(plain_interval) {}

progress::~progress() { finish(); }

void progress::update(std::int64_t done, std::int64_t total, std::string_view detail) {
  update(done, total, detail, clock::now());
}

void progress::update(std::int64_t done, std::int64_t total, std::string_view detail,
                      clock::time_point now) {
  if (!started_) {
    started_ = true;
    start_ = now;
    last_ = now;
    if (!terminal_) return;  // nothing to say yet
  }
  const bool complete = total > 0 && done >= total;
  if (terminal_) {
    // At most ten redraws a second, and always the last.
    if (drawn_ && !complete && now - last_ < std::chrono::milliseconds(100)) return;
  } else if (now - last_ < plain_interval_) {
    return;
  }
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::string text = line(done, total, detail, elapsed);
  if (terminal_) {
    fmt::print(out_, "\r{}\x1b[K", text);  // \x1b[K clears what a longer line left
    drawn_ = true;
  } else {
    fmt::print(out_, "{}\n", text);
  }
  std::fflush(out_);
}

void progress::relabel(std::string label) {
  label_ = std::move(label);
  started_ = false;
}

void progress::finish() {
  if (drawn_) {
    fmt::print(out_, "\n");
    std::fflush(out_);
    drawn_ = false;
  }
}

std::string progress::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string progress::line(std::int64_t done, std::int64_t total, std::string_view detail,
                           double elapsed) const {
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  const bool known = total > 0;
  const double fraction =
      known ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 0.0;
  std::string eta = "?";
  if (known && done >= total) {
    eta = "0:00";
  } else if (known && rate > 0) {
    eta = format_duration(static_cast<double>(total - done) / rate);
  }
  const std::string rate_text = rate > 0 ? fmt::format("{:.{}f} {}/s", rate, rate < 100 ? 1 : 0, unit_)
                                         : fmt::format("- {}/s", unit_);
  std::string out;
  if (terminal_) {
    constexpr int width = 24;
    const int filled = static_cast<int>(width * fraction);
    out = known ? fmt::format("{} [{:#<{}}{:.<{}}] {}/{} {:3.0f}%  {}  ETA {}", label_, "", filled,
                              "", width - filled, done, total, 100 * fraction, rate_text, eta)
                : fmt::format("{} {} {}  {}", label_, done, unit_, rate_text);
    if (!detail.empty()) out += fmt::format("  {}", detail);
  } else {
    out = known ? fmt::format("{}: {}/{} {} ({:.0f}%), {}, ETA {}", label_, done, total, unit_,
                              100 * fraction, rate_text, eta)
                : fmt::format("{}: {} {}, {}", label_, done, unit_, rate_text);
    if (!detail.empty()) out += fmt::format(", {}", detail);
  }
  return out;
}

}  // namespace loom
