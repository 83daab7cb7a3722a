// logging_adaptor: the CSV log, parsed back by an RFC 4180 reader written here, against
// the calls that were made.
#include "loom/memory/logging_adaptor.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/allocation_tag.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/statistics_adaptor.hpp"
#include "memory/test_upstreams.hpp"

namespace {

namespace lm = loom::memory;
using lm::testing::picky_upstream;
using lm::logging_adaptor;

#if defined(LOOM_ASAN) || defined(LOOM_TSAN)
constexpr int pairs_per_thread = 1500;
#else
constexpr int pairs_per_thread = 5000;
#endif

const std::vector<std::string> header = {"seq",   "thread",    "time_ns", "action", "pointer",
                                         "bytes", "alignment", "stream",  "tag",    "outcome"};

// Splits CSV text into records of fields, per RFC 4180: a quoted field may hold commas,
// line breaks and quotes (doubled).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',' || c == '\n') {
      record.push_back(std::move(field));
      field.clear();
      if (c == '\n') {
        records.push_back(std::move(record));
        record.clear();
      }
    } else {
      field += c;
    }
  }
  EXPECT_TRUE(field.empty() && record.empty()) << "the log does not end with a line break";
  return records;
}

struct event {
  std::uint64_t seq;
  std::uint32_t thread;
  std::uint64_t time_ns;
  std::string action;
  std::string pointer;
  std::size_t bytes;
  std::size_t alignment;
  std::string stream;
  std::string tag;
  std::string outcome;
};

// The events of a log, after checking its two header lines.
std::vector<event> parse_log(const std::string& text) {
  const std::vector<std::vector<std::string>> records = parse_csv(text);
  std::vector<event> events;
  if (records.size() < 2) {
    ADD_FAILURE() << "no header in:\n" << text;
    return events;
  }
  EXPECT_EQ(records[0], std::vector<std::string>{"# loom allocation log v1"});
  EXPECT_EQ(records[1], header);
  for (std::size_t i = 2; i < records.size(); ++i) {
    const std::vector<std::string>& r = records[i];
    if (r.size() != header.size()) {
      ADD_FAILURE() << "record " << i << " has " << r.size() << " fields";
      continue;
    }
    events.push_back({std::stoull(r[0]), static_cast<std::uint32_t>(std::stoul(r[1])),
                      std::stoull(r[2]), r[3], r[4], std::stoull(r[5]), std::stoull(r[6]), r[7],
                      r[8], r[9]});
  }
  return events;
}

std::string hex(const void* p) {
  return fmt::format("{:#x}", reinterpret_cast<std::uintptr_t>(p));
}
loom::stream fake_stream(std::uintptr_t n) {
  return loom::stream{reinterpret_cast<void*>(n)};
}

TEST(LoggingAdaptor, LogsEveryCallWithItsOutcome) {
  picky_upstream upstream;
  std::ostringstream out;
  logging_adaptor log(upstream, out);

  void* a = nullptr;
  void* b = nullptr;
  {
    lm::tag_scope tag("model/forward");
    a = log.allocate(4096, 128, fake_stream(0xbeef));
    EXPECT_THROW((void)log.allocate(2 << 20), loom::out_of_memory);
  }
  b = log.allocate(0);
  EXPECT_THROW((void)log.allocate(777, 16), loom::invalid_argument);
  log.deallocate(a, 4096, 128, fake_stream(0xcafe));
  log.deallocate(b, 0);
  log.flush();

  const std::vector<event> events = parse_log(out.str());
  struct expected {
    std::string action;
    std::string pointer;
    std::size_t bytes;
    std::size_t alignment;
    std::string stream;
    std::string tag;
    std::string outcome;
  };
  const std::vector<expected> calls = {
      {"allocate", hex(a), 4096, 128, "0xbeef", "model/forward", "ok"},
      {"allocate", "0x0", 2 << 20, 64, "0x0", "model/forward", "out_of_memory"},
      {"allocate", hex(b), 0, 64, "0x0", "", "ok"},
      {"allocate", "0x0", 777, 16, "0x0", "", "invalid_argument"},
      {"deallocate", hex(a), 4096, 128, "0xcafe", "", "ok"},
      {"deallocate", hex(b), 0, 64, "0x0", "", "ok"},
  };
  ASSERT_EQ(events.size(), calls.size()) << out.str();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(events[i].seq, i);
    EXPECT_EQ(events[i].thread, 0u);
    if (i > 0) {
      EXPECT_LE(events[i - 1].time_ns, events[i].time_ns);
    }
    EXPECT_EQ(events[i].action, calls[i].action);
    EXPECT_EQ(events[i].pointer, calls[i].pointer);
    EXPECT_EQ(events[i].bytes, calls[i].bytes);
    EXPECT_EQ(events[i].alignment, calls[i].alignment);
    EXPECT_EQ(events[i].stream, calls[i].stream);
    EXPECT_EQ(events[i].tag, calls[i].tag);
    EXPECT_EQ(events[i].outcome, calls[i].outcome);
  }
}

TEST(LoggingAdaptor, QuotesTagsThatNeedIt) {
  picky_upstream upstream;
  std::ostringstream out;
  const std::vector<std::string> tags = {"plain",  "a,b", "say \"hi\"", "two\nlines",
                                         "cr\rlf", "",    "\"\""};
  {
    logging_adaptor log(upstream, out);
    for (const std::string& tag : tags) {
      lm::tag_scope scope(tag);
      log.deallocate(log.allocate(8), 8);
    }
  }
  const std::string text = out.str();
  EXPECT_NE(text.find(",\"a,b\","), std::string::npos) << text;
  EXPECT_NE(text.find(",\"say \"\"hi\"\"\","), std::string::npos) << text;
  EXPECT_NE(text.find(",plain,"), std::string::npos) << text;
  const std::vector<event> events = parse_log(text);
  ASSERT_EQ(events.size(), 2 * tags.size());
  for (std::size_t i = 0; i < tags.size(); ++i) {
    EXPECT_EQ(events[2 * i].tag, tags[i]);
    EXPECT_EQ(events[2 * i + 1].tag, tags[i]);
  }
}

// Threads allocate and free through a pool that hands freed blocks to whichever thread
// asks next; the log must still read as a valid history, in seq order.
TEST(LoggingAdaptor, LogsSeveralThreadsInOrder) {
  lm::bfc_pool pool(lm::host_resource::instance());
  std::ostringstream out;
  constexpr int threads = 4;
  {
    logging_adaptor log(pool, out);
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const std::string tag = fmt::format("worker {}", t);
        lm::tag_scope scope(tag);
        std::vector<std::pair<void*, std::size_t>> live;
        for (int i = 0; i < pairs_per_thread; ++i) {
          const auto bytes = static_cast<std::size_t>(64 * (1 + (i * 7 + t) % 16));
          live.emplace_back(log.allocate(bytes), bytes);
          if (live.size() > 8 || i + 1 == pairs_per_thread) {
            for (const auto& [p, n] : live) log.deallocate(p, n);
            live.clear();
          }
        }
      });
    }
    for (std::thread& w : workers) w.join();
  }  // the destructor flushes

  const std::vector<event> events = parse_log(out.str());
  ASSERT_EQ(events.size(), static_cast<std::size_t>(threads * pairs_per_thread * 2));
  std::map<std::string, std::size_t> live;      // pointer -> bytes
  std::map<std::uint32_t, std::string> tag_of;  // thread id -> its tag
  std::uint32_t next_thread = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const event& e = events[i];
    ASSERT_EQ(e.seq, i);
    if (i > 0) {
      ASSERT_LE(events[i - 1].time_ns, e.time_ns);
    }
    ASSERT_LE(e.thread, next_thread) << "thread ids follow their first appearance";
    if (e.thread == next_thread) {
      ++next_thread;
      tag_of[e.thread] = e.tag;
    }
    ASSERT_EQ(tag_of[e.thread], e.tag) << "one thread, one id";
    ASSERT_EQ(e.outcome, "ok");
    if (e.action == "allocate") {
      ASSERT_TRUE(live.emplace(e.pointer, e.bytes).second) << e.pointer << " is already live";
    } else {
      const auto it = live.find(e.pointer);
      ASSERT_NE(it, live.end()) << e.pointer << " is not live at seq " << e.seq;
      ASSERT_EQ(it->second, e.bytes);
      live.erase(it);
    }
  }
  EXPECT_TRUE(live.empty());
  EXPECT_EQ(next_thread, static_cast<std::uint32_t>(threads));
  std::set<std::string> tags;
  for (const auto& [id, tag] : tag_of) tags.insert(tag);
  EXPECT_EQ(tags.size(), static_cast<std::size_t>(threads));
}

TEST(LoggingAdaptor, FlushWritesEverythingLoggedSoFar) {
  picky_upstream upstream;
  std::ostringstream out;
  logging_adaptor log(upstream, out);
  void* p = log.allocate(100);
  log.flush();
  EXPECT_EQ(parse_log(out.str()).size(), 1u);
  log.deallocate(p, 100);
  log.flush();
  EXPECT_EQ(parse_log(out.str()).size(), 2u);
}

TEST(LoggingAdaptor, WritesToAFileItOpens) {
  const std::filesystem::path path =
      std::filesystem::path(testing::TempDir()) / "loom_logging_adaptor_test.csv";
  picky_upstream upstream;
  void* p = nullptr;
  {
    logging_adaptor log(upstream, path);
    p = log.allocate(48);
    log.deallocate(p, 48);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const std::vector<event> events = parse_log(text.str());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].pointer, hex(p));
  EXPECT_EQ(events[1].action, "deallocate");
  std::filesystem::remove(path);

  const std::filesystem::path nowhere = path.parent_path() / "no such directory" / "log.csv";
  try {
    logging_adaptor bad(upstream, nowhere);
    ADD_FAILURE() << "opened " << nowhere;
  } catch (const loom::error& e) {
    EXPECT_NE(std::string(e.what()).find(nowhere.string()), std::string::npos) << e.what();
  }
}

TEST(LoggingAdaptor, StatsAreTheUpstreams) {
  picky_upstream upstream;
  lm::statistics_adaptor stats(upstream);
  std::ostringstream out;
  logging_adaptor log(stats, out);
  void* p = log.allocate(1000);
  ASSERT_TRUE(log.stats().has_value());
  EXPECT_EQ(log.stats()->bytes_in_use, 1000u);
  log.deallocate(p, 1000);
}

}  // namespace
