// loom::progress: the terminal bar (rate, time left, redraw limit, the closing newline) and
// the plain lines for logs (none for short work, one per interval after that).
#include "loom/core/progress.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace loom {
namespace {

using namespace std::chrono_literals;
using clock_type = progress::clock;

// Everything written to a temporary file.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) s.push_back(static_cast<char>(c));
  return s;
}

TEST(Progress, DurationsReadAsClocks) {
  EXPECT_EQ(progress::format_duration(0), "0:00");
  EXPECT_EQ(progress::format_duration(7.4), "0:07");
  EXPECT_EQ(progress::format_duration(62), "1:02");
  EXPECT_EQ(progress::format_duration(3723), "1:02:03");
  EXPECT_EQ(progress::format_duration(-1), "?");
  EXPECT_EQ(progress::format_duration(1.0 / 0.0), "?");
}

TEST(Progress, TheTerminalBarShowsRateAndTimeLeft) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  const auto t0 = clock_type::now();
  {
    progress p("epoch 1/2", "samples", true, f);
    p.update(0, 1000, "", t0);
    p.update(250, 1000, "loss 0.5", t0 + 1s);  // 250 samples/s: 3 s left
    p.update(260, 1000, "loss 0.4", t0 + 1s + 10ms);  // within 100 ms: not drawn
    p.update(1000, 1000, "loss 0.3", t0 + 1s + 20ms);  // the last is always drawn
  }  // the destructor ends the line
  const std::string s = contents(f);
  std::fclose(f);
  EXPECT_NE(s.find("\repoch 1/2 [######..................] 250/1000  25%  250 samples/s  ETA 0:03"
                   "  loss 0.5\x1b[K"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("260/1000"), std::string::npos) << s;
  EXPECT_NE(s.find("[########################] 1000/1000 100%"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 0:00  loss 0.3"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\n');
  EXPECT_EQ(s.find('\n'), s.size() - 1) << "one line, redrawn in place";
}

TEST(Progress, PlainLinesOnlyForLongWork) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  const auto t0 = clock_type::now();
  {
    progress p("replay", "events", false, f, 5s);
    p.update(0, 100, "", t0);
    p.update(10, 100, "", t0 + 2s);  // short so far: nothing
    EXPECT_EQ(contents(f), "");
    p.update(50, 100, "peak 3 MiB", t0 + 5s);  // 10 events/s, 5 s left
    p.update(60, 100, "", t0 + 6s);            // within the interval: nothing
    p.update(100, 100, "", t0 + 10s);
    p.finish();
  }
  const std::string s = contents(f);
  std::fclose(f);
  EXPECT_EQ(s,
            "replay: 50/100 events (50%), 10.0 events/s, ETA 0:05, peak 3 MiB\n"
            "replay: 100/100 events (100%), 10.0 events/s, ETA 0:00\n");
}

TEST(Progress, UnknownTotalsAndRelabelling) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  const auto t0 = clock_type::now();
  progress p("epoch 1/2", "samples", false, f, 1s);
  p.update(0, 0, "", t0);
  p.update(300, 0, "", t0 + 2s);
  p.relabel("epoch 2/2");
  p.update(0, 10, "", t0 + 3s);  // the rate restarts
  p.update(5, 10, "", t0 + 8s);
  const std::string s = contents(f);
  std::fclose(f);
  EXPECT_EQ(s,
            "epoch 1/2: 300 samples, 150 samples/s\n"
            "epoch 2/2: 5/10 samples (50%), 1.0 samples/s, ETA 0:05\n");
}

}  // namespace
}  // namespace loom
