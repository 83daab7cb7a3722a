// tracking_adaptor against a shadow model of the outstanding allocations; its misuse
// reports, leak report and leak actions.
#include "loom/memory/tracking_adaptor.hpp"

#include <execinfo.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/memory/allocation_tag.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/misuse.hpp"
#include "loom/memory/statistics_adaptor.hpp"
#include "memory/test_upstreams.hpp"

namespace {

namespace lm = loom::memory;
using lm::testing::counting_upstream;
using lm::allocation_record;
using lm::leak_action;
using lm::tracking_adaptor;
using lm::tracking_options;

loom::stream fake_stream(std::uintptr_t n) {
  return loom::stream{reinterpret_cast<void*>(n)};
}

tracking_options named(std::string name) {
  tracking_options options;
  options.name = std::move(name);
  return options;
}

// Collects the misuse reports made while it lives.
class misuse_capture {
 public:
  misuse_capture() : previous_(lm::set_misuse_handler(&record)) {
    std::lock_guard lock(mutex());
    reports().clear();
  }
  misuse_capture(const misuse_capture&) = delete;
  misuse_capture& operator=(const misuse_capture&) = delete;
  ~misuse_capture() { lm::set_misuse_handler(previous_); }

  [[nodiscard]] std::vector<lm::misuse_report> taken() const {
    std::lock_guard lock(mutex());
    return reports();
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<lm::misuse_report>& reports() {
    static std::vector<lm::misuse_report> r;
    return r;
  }
  static void record(const lm::misuse_report& r) noexcept {
    std::lock_guard lock(mutex());
    reports().push_back(r);
  }

  lm::misuse_handler previous_;
};

// What tracking should hold: pointer -> record (pointer, sequence and thread included).
using model = std::map<const void*, allocation_record>;

void expect_matches(const tracking_adaptor& tracker, const model& m) {
  std::vector<allocation_record> expected;
  for (const auto& [p, r] : m) expected.push_back(r);
  std::sort(expected.begin(), expected.end(),
            [](const auto& a, const auto& b) { return a.sequence < b.sequence; });
  const std::vector<allocation_record> actual = tracker.outstanding();
  ASSERT_EQ(actual.size(), expected.size());
  std::map<std::string, std::size_t> by_tag;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].pointer, expected[i].pointer);
    EXPECT_EQ(actual[i].bytes, expected[i].bytes);
    EXPECT_EQ(actual[i].alignment, expected[i].alignment);
    EXPECT_EQ(actual[i].on_stream, expected[i].on_stream);
    EXPECT_EQ(actual[i].tag, expected[i].tag);
    EXPECT_EQ(actual[i].thread, expected[i].thread);
    EXPECT_EQ(actual[i].sequence, expected[i].sequence);
    EXPECT_TRUE(actual[i].stack.empty());
    by_tag[expected[i].tag] += expected[i].bytes;
    bytes += expected[i].bytes;
  }
  EXPECT_EQ(tracker.bytes_by_tag(), by_tag);
  EXPECT_EQ(tracker.outstanding_count(), m.size());
  EXPECT_EQ(tracker.outstanding_bytes(), bytes);
}

TEST(TrackingAdaptor, OutstandingMatchesTheModel) {
  counting_upstream upstream;
  tracking_adaptor tracker(upstream);
  const std::vector<std::string> tags = {"", "optimizer/adam", "session/conv2d:node7", "io"};
  std::mt19937_64 rng(3);
  model m;
  std::uint64_t next_sequence = 0;
  for (int i = 0; i < 3000; ++i) {
    if (m.empty() || rng() % 2 == 0) {
      const std::string& tag = tags[rng() % tags.size()];
      const std::size_t bytes = rng() % 3000;
      const std::size_t alignment = std::size_t{1} << (rng() % 12);
      const loom::stream s = fake_stream(rng() % 3);
      lm::tag_scope scope(tag);
      void* p = tracker.allocate(bytes, alignment, s);
      m[p] = {p, bytes, alignment, s, tag, std::this_thread::get_id(), next_sequence++, {}};
    } else {
      auto it = m.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % m.size()));
      const allocation_record& r = it->second;
      tracker.deallocate(const_cast<void*>(r.pointer), r.bytes, r.alignment, fake_stream(9));
      m.erase(it);
    }
    if (i % 100 == 0) expect_matches(tracker, m);
  }
  expect_matches(tracker, m);
  for (const auto& [p, r] : m) tracker.deallocate(const_cast<void*>(p), r.bytes, r.alignment);
  EXPECT_EQ(upstream.allocations.load(), upstream.deallocations.load());
}

TEST(TrackingAdaptor, RecordsEachThreadsAllocations) {
  counting_upstream upstream;
  tracking_adaptor tracker(upstream);
  constexpr int threads = 4;
  std::vector<std::thread::id> ids(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const std::string tag = fmt::format("worker {}", t);
      lm::tag_scope scope(tag);
      ids[static_cast<std::size_t>(t)] = std::this_thread::get_id();
      for (int i = 0; i < 200; ++i) {
        void* p = tracker.allocate(16);
        if (i % 2 == 0) tracker.deallocate(p, 16);  // keeps every other block
      }
    });
  }
  for (std::thread& w : workers) w.join();

  const std::vector<allocation_record> live = tracker.outstanding();
  ASSERT_EQ(live.size(), threads * 100u);
  std::map<std::string, std::size_t> expected_by_tag;
  for (const allocation_record& r : live) {
    const std::size_t t = static_cast<std::size_t>(r.tag.back() - '0');
    EXPECT_EQ(r.thread, ids[t]) << r.tag;
    expected_by_tag[r.tag] += r.bytes;
  }
  for (std::size_t i = 1; i < live.size(); ++i) EXPECT_LT(live[i - 1].sequence, live[i].sequence);
  EXPECT_EQ(tracker.bytes_by_tag(), expected_by_tag);
  EXPECT_EQ(expected_by_tag.size(), static_cast<std::size_t>(threads));
  for (const allocation_record& r : live) tracker.deallocate(const_cast<void*>(r.pointer), 16);
}

TEST(TrackingAdaptor, LeakReportGroupsByTagWithTotals) {
  counting_upstream upstream;
  tracking_adaptor tracker(upstream, named("report"));
  EXPECT_EQ(tracker.leak_report(), "tracking_adaptor 'report': no allocations outstanding\n");
  std::vector<std::pair<void*, std::size_t>> blocks;
  {
    lm::tag_scope a("a");
    blocks.emplace_back(tracker.allocate(100), 100);
    blocks.emplace_back(tracker.allocate(100), 100);
  }
  {
    lm::tag_scope b("b");
    blocks.emplace_back(tracker.allocate(2000), 2000);
  }
  blocks.emplace_back(tracker.allocate(10, fake_stream(0xabc)), 10);

  const std::string report = tracker.leak_report();
  for (const std::string expected :
       {"tracking_adaptor 'report': 4 allocations outstanding, 2210 bytes (2.16 KiB)\n",
        "  tag 'a': 2 allocations, 200 bytes\n", "  tag 'b': 1 allocation, 2000 bytes (1.95 KiB)\n",
        "  untagged: 1 allocation, 10 bytes\n"}) {
    EXPECT_NE(report.find(expected), std::string::npos) << expected << " in\n" << report;
  }
  EXPECT_NE(report.find(fmt::format("#3 at {}: 10 bytes, alignment 64, stream 0xabc, thread",
                                    blocks[3].first)),
            std::string::npos)
      << report;
  EXPECT_LT(report.find("tag 'a'"), report.find("#1 at"));  // grouped under its tag
  EXPECT_LT(report.find("tag 'b'"), report.find("#2 at"));
  for (const auto& [p, bytes] : blocks) tracker.deallocate(p, bytes);
}

TEST(TrackingAdaptor, CapturesTheCallersStackWhenAsked) {
  counting_upstream upstream;
  tracking_options options = named("stacks");
  options.capture_stack_traces = true;
  options.max_stack_depth = 64;
  tracking_adaptor tracker(upstream, options);
  void* p = tracker.allocate(32);
  std::vector<void*> here(64);
  here.resize(static_cast<std::size_t>(backtrace(here.data(), static_cast<int>(here.size()))));

  const std::vector<allocation_record> live = tracker.outstanding();
  ASSERT_EQ(live.size(), 1u);
  const std::vector<void*>& stack = live[0].stack;
  // From this test's caller outwards, the recorded stack and ours are the same; before
  // it, the recorded stack holds at most the call in this test and memory_resource's.
  const void* caller = __builtin_return_address(0);
  const auto ours = std::find(here.begin(), here.end(), caller);
  const auto recorded = std::find(stack.begin(), stack.end(), caller);
  ASSERT_NE(ours, here.end());
  ASSERT_NE(recorded, stack.end());
  EXPECT_LE(recorded - stack.begin(), 2);
  EXPECT_TRUE(std::equal(ours, here.end(), recorded, stack.end()));
  const std::string report = tracker.leak_report();
  EXPECT_NE(report.find(fmt::format("[{}]", stack.back())), std::string::npos) << report;
  EXPECT_NE(report.find("      #0 "), std::string::npos) << report;
  tracker.deallocate(p, 32);

  options.max_stack_depth = 3;
  tracking_adaptor shallow(upstream, options);
  void* q = shallow.allocate(32);
  EXPECT_EQ(shallow.outstanding()[0].stack.size(), 3u);
  shallow.deallocate(q, 32);

  tracking_adaptor plain(upstream);
  void* r = plain.allocate(32);
  EXPECT_TRUE(plain.outstanding()[0].stack.empty());
  plain.deallocate(r, 32);
}

TEST(TrackingAdaptor, ReportsMisuseAndDoesNotForwardIt) {
  counting_upstream upstream;
  tracking_adaptor tracker(upstream, named("strict"));
  misuse_capture capture;

  void* foreign = lm::host_resource::instance().allocate(64);
  tracker.deallocate(foreign, 64);
  void* freed = tracker.allocate(128);
  tracker.deallocate(freed, 128);
  tracker.deallocate(freed, 128);
  void* p = tracker.allocate(100);
  tracker.deallocate(p, 200);
  tracker.deallocate(p, 100, 128);
  EXPECT_EQ(upstream.deallocations.load(), 1);  // only the first free of `freed`

  const std::vector<lm::misuse_report> reports = capture.taken();
  ASSERT_EQ(reports.size(), 4u);
  EXPECT_EQ(reports[0].kind, lm::misuse_kind::unknown_pointer);
  EXPECT_EQ(reports[0].pointer, foreign);
  EXPECT_EQ(reports[1].kind, lm::misuse_kind::double_free);
  EXPECT_EQ(reports[1].pointer, freed);
  EXPECT_EQ(reports[2].kind, lm::misuse_kind::size_mismatch);
  EXPECT_EQ(reports[2].bytes, 200u);
  EXPECT_EQ(reports[2].expected, 100u);
  EXPECT_EQ(reports[3].kind, lm::misuse_kind::alignment_mismatch);
  EXPECT_EQ(reports[3].expected, lm::default_alignment);
  for (const lm::misuse_report& r : reports) {
    EXPECT_EQ(r.resource, "tracking_adaptor 'strict'");
    EXPECT_NE(r.message.find("not forwarded to the upstream"), std::string::npos) << r.message;
  }
  EXPECT_NE(reports[2].message.find("allocated with 100 bytes"), std::string::npos);

  EXPECT_EQ(tracker.outstanding_count(), 1u);  // the misused block is still tracked
  tracker.deallocate(p, 100);
  lm::host_resource::instance().deallocate(foreign, 64);
  EXPECT_EQ(capture.taken().size(), 4u);
}

TEST(TrackingAdaptor, ReportsLeaksAsMisuseByDefault) {
  counting_upstream upstream;
  misuse_capture capture;
  void* leaked = nullptr;
  {
    tracking_adaptor tracker(upstream, named("leaky"));
    lm::tag_scope tag("forgotten");
    leaked = tracker.allocate(300);
  }
  const std::vector<lm::misuse_report> reports = capture.taken();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, lm::misuse_kind::leak);
  EXPECT_EQ(reports[0].pointer, leaked);
  EXPECT_EQ(reports[0].bytes, 300u);
  EXPECT_NE(reports[0].message.find("tracking_adaptor 'leaky': 1 allocation outstanding"),
            std::string::npos)
      << reports[0].message;
  EXPECT_NE(reports[0].message.find("tag 'forgotten'"), std::string::npos);
  upstream.deallocate(leaked, 300);
}

TEST(TrackingAdaptor, IgnoresLeaksWhenAsked) {
  counting_upstream upstream;
  misuse_capture capture;
  void* leaked = nullptr;
  {
    tracking_options options;
    options.on_leak = leak_action::ignore;
    tracking_adaptor tracker(upstream, options);
    leaked = tracker.allocate(300);
  }
  EXPECT_TRUE(capture.taken().empty());
  upstream.deallocate(leaked, 300);
}

TEST(TrackingAdaptorDeathTest, AbortsOnALeakWhenAsked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        tracking_options options = named("strict");
        options.on_leak = leak_action::abort;
        tracking_adaptor tracker(lm::host_resource::instance(), options);
        lm::tag_scope tag("leaky op");
        (void)tracker.allocate(64);
      },
      "loom: memory leak: tracking_adaptor 'strict': 1 allocation outstanding, 64 bytes\n"
      "  tag 'leaky op': 1 allocation, 64 bytes");
}

TEST(TrackingAdaptor, StatsAreTheUpstreams) {
  counting_upstream upstream;
  lm::statistics_adaptor stats(upstream);
  tracking_adaptor tracker(stats);
  void* p = tracker.allocate(1000);
  ASSERT_TRUE(tracker.stats().has_value());
  EXPECT_EQ(tracker.stats()->bytes_in_use, 1000u);
  tracker.deallocate(p, 1000);
  EXPECT_FALSE(tracking_adaptor(upstream).stats().has_value());
}

}  // namespace
