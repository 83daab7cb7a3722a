#include "loom/memory/allocation_log.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "loom/core/error.hpp"
#include "loom/memory/allocation_tag.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/logging_adaptor.hpp"
#include "memory/log_builder.hpp"

namespace {

using loom::memory::allocation_log;
using loom::memory::log_action;
using loom::memory::log_event;
using loom::memory::log_outcome;
using loom::memory::testing::first_lines;
using loom::memory::testing::log_record;
using loom::memory::testing::random_log;
using loom::memory::testing::random_log_options;
using loom::memory::testing::to_csv;

allocation_log parse(const std::string& text) {
  std::istringstream in(text);
  return loom::memory::parse_allocation_log(in);
}

constexpr const char* header =
    "seq,thread,time_ns,action,pointer,bytes,alignment,stream,tag,outcome\n";

TEST(AllocationLog, ParsesEveryFieldAndSkipsCommentsAndBlankLines) {
  const allocation_log log = parse(std::string("# loom allocation log v1\n\n") + header +
                                   "0,3,100,allocate,0xAB00,4096,256,0x7f10,mlp/forward,ok\r\n"
                                   "# a comment between events\n"
                                   "  \t\n"
                                   "1,1,250,allocate,0x0,64,48,0x0,,invalid_argument\n"
                                   "2,0,300,deallocate,0xab00,4096,256,0x0,mlp/backward,ok");
  ASSERT_EQ(log.size(), 3u);
  const log_event& a = log.events()[0];
  EXPECT_EQ(a.action, log_action::allocate);
  EXPECT_EQ(a.outcome, log_outcome::ok);
  EXPECT_EQ(a.bytes, 4096u);
  EXPECT_EQ(a.alignment, 256u);
  EXPECT_EQ(a.on_stream.value(), 0x7f10u);
  EXPECT_EQ(log.origins()[0].seq, 0u);
  EXPECT_EQ(log.origins()[0].thread, 3u);
  EXPECT_EQ(log.origins()[0].time_ns, 100u);
  EXPECT_EQ(log.origins()[0].line, 4u);
  EXPECT_EQ(log.tag_of(0), "mlp/forward");

  const log_event& failed = log.events()[1];
  EXPECT_EQ(failed.outcome, log_outcome::invalid_argument);
  EXPECT_EQ(failed.alignment, 48u);
  EXPECT_EQ(failed.slot, log_event::no_slot);
  EXPECT_EQ(log.origins()[1].line, 7u);
  EXPECT_EQ(log.tag_of(1), "");

  const log_event& d = log.events()[2];
  EXPECT_EQ(d.action, log_action::deallocate);
  EXPECT_TRUE(d.on_stream.is_default());
  EXPECT_EQ(d.slot, a.slot);
  EXPECT_EQ(log.origins()[2].line, 8u);
  EXPECT_EQ(log.tag_of(2), "mlp/backward");
  EXPECT_EQ(log.slot_count(), 1u);
}

TEST(AllocationLog, UnquotesTagsAndCountsTheLinesInsideThem) {
  const allocation_log log = parse(std::string(header) +
                                   "0,0,1,allocate,0x100,8,64,0x0,\"a,b\",ok\n"
                                   "1,0,2,allocate,0x200,8,64,0x0,\"say \"\"hi\"\"\",ok\n"
                                   "2,0,3,allocate,0x300,8,64,0x0,\"two\nlines\",ok\n"
                                   "3,0,4,allocate,0x400,8,64,0x0,\"a,b\",ok\r\n"
                                   "4,0,5,allocate,0x500,8,64,0x0,\"\",ok\n");
  ASSERT_EQ(log.size(), 5u);
  EXPECT_EQ(log.tag_of(0), "a,b");
  EXPECT_EQ(log.tag_of(1), "say \"hi\"");
  EXPECT_EQ(log.tag_of(2), "two\nlines");
  EXPECT_EQ(log.tag_of(4), "");
  EXPECT_EQ(log.origins()[2].line, 4u);
  EXPECT_EQ(log.origins()[3].line, 6u);                   // after the record that spans two lines
  EXPECT_EQ(log.origins()[3].tag, log.origins()[0].tag);  // interned
  EXPECT_EQ(log.tags().size(), 4u);
  EXPECT_EQ(log.slot_count(), 5u);
}

// Parses random valid logs and checks every event against the records written, and the
// slots against a shadow map of live blocks.
TEST(AllocationLog, RandomLogsRoundTripAndSlotsNameTheirBlocks) {
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 10; ++round) {
    random_log_options o;
    o.failed_fraction = 0.05;
    const std::vector<log_record> records = random_log(rng, o);
    const std::vector<std::size_t> lines = first_lines(records);
    const allocation_log log = parse(to_csv(records));
    ASSERT_EQ(log.size(), records.size());

    std::map<std::uintptr_t, std::uint32_t> slot_of;  // live pointer -> its slot
    std::map<std::uint32_t, std::uintptr_t> owner;    // occupied slot -> its pointer
    std::size_t most_live = 0;
    for (std::size_t i = 0; i < records.size(); ++i) {
      const log_record& r = records[i];
      const log_event& e = log.events()[i];
      ASSERT_EQ(to_string(e.action), r.action) << "event " << i;
      ASSERT_EQ(to_string(e.outcome), r.outcome);
      ASSERT_EQ(e.bytes, r.bytes);
      ASSERT_EQ(e.alignment, r.alignment);
      ASSERT_EQ(e.on_stream.value(), r.stream);
      ASSERT_EQ(log.origins()[i].seq, r.seq);
      ASSERT_EQ(log.origins()[i].thread, r.thread);
      ASSERT_EQ(log.origins()[i].time_ns, r.time_ns);
      ASSERT_EQ(log.origins()[i].line, lines[i]);
      ASSERT_EQ(log.tag_of(i), r.tag);
      if (r.outcome != "ok") {
        ASSERT_EQ(e.slot, log_event::no_slot);
      } else if (r.action == "allocate") {
        ASSERT_LT(e.slot, log.slot_count());
        ASSERT_EQ(owner.count(e.slot), 0u) << "slot " << e.slot << " is taken";
        owner[e.slot] = r.pointer;
        slot_of[r.pointer] = e.slot;
        most_live = std::max(most_live, owner.size());
      } else {
        ASSERT_EQ(e.slot, slot_of.at(r.pointer));
        owner.erase(e.slot);
        slot_of.erase(r.pointer);
      }
    }
    EXPECT_EQ(log.slot_count(), most_live);
  }
}

struct malformed_case {
  const char* name;
  std::string body;  // after the comment and the header (lines 1 and 2)
  std::size_t line;
  const char* message;
};

TEST(AllocationLog, RejectsMalformedLogsNamingTheLineAndTheProblem) {
  const std::string ok_alloc = "0,0,1,allocate,0x100,8,64,0x0,t,ok\n";
  const std::vector<malformed_case> cases = {
      {"too few fields", "0,0,1,allocate,0x100,8,64,0x0,ok\n", 3, "expected 10 fields, found 9"},
      {"too many fields", "0,0,1,allocate,0x100,8,64,0x0,t,ok,x\n", 3,
       "expected 10 fields, found 11"},
      {"bad decimal", "0,0,1,allocate,0x100,8x,64,0x0,t,ok\n", 3,
       "field 'bytes': '8x' is not an unsigned decimal number"},
      {"negative", "0,-1,1,allocate,0x100,8,64,0x0,t,ok\n", 3, "field 'thread': '-1' is not"},
      {"empty number", "0,0,,allocate,0x100,8,64,0x0,t,ok\n", 3, "field 'time_ns': '' is not"},
      {"out of range", "0,4294967296,1,allocate,0x100,8,64,0x0,t,ok\n", 3,
       "field 'thread': '4294967296' is out of range"},
      {"hex without prefix", "0,0,1,allocate,100,8,64,0x0,t,ok\n", 3,
       "field 'pointer': '100' is not a hexadecimal number with a 0x prefix"},
      {"bad hex", "0,0,1,allocate,0x100,8,64,0xzz,t,ok\n", 3, "field 'stream': '0xzz' is not"},
      {"unknown action", "0,0,1,free,0x100,8,64,0x0,t,ok\n", 3, "unknown action 'free'"},
      {"unknown outcome", "0,0,1,allocate,0x100,8,64,0x0,t,fine\n", 3, "unknown outcome 'fine'"},
      {"alignment", "0,0,1,allocate,0x100,8,48,0x0,t,ok\n", 3,
       "field 'alignment': 48 is not a power of two"},
      {"zero alignment", "0,0,1,allocate,0x0,8,0,0x0,t,out_of_memory\n", 3,
       "field 'alignment': 0 is not a power of two"},
      {"free of a block never allocated", "0,0,1,deallocate,0x100,8,64,0x0,t,ok\n", 3,
       "deallocate of 0x100, which is not live at this point in the log"},
      {"double free",
       ok_alloc + "1,0,2,deallocate,0x100,8,64,0x0,t,ok\n2,0,3,deallocate,0x100,8,64,0x0,t,ok\n", 5,
       "deallocate of 0x100, which is not live"},
      {"allocate of a live block", ok_alloc + "1,0,2,allocate,0x100,16,64,0x0,t,ok\n", 4,
       "allocate returned 0x100, which is still live (allocated on line 3)"},
      {"free with another size", ok_alloc + "1,0,2,deallocate,0x100,16,64,0x0,t,ok\n", 4,
       "with 16 bytes, alignment 64, but it was allocated with 8 bytes, alignment 64 on line 3"},
      {"free with another alignment", ok_alloc + "1,0,2,deallocate,0x100,8,128,0x0,t,ok\n", 4,
       "but it was allocated with 8 bytes, alignment 64"},
      {"failed allocate with a pointer", "0,0,1,allocate,0x100,8,64,0x0,t,out_of_memory\n", 3,
       "a failed allocate must have pointer 0x0"},
      {"ok allocate of null", "0,0,1,allocate,0x0,8,64,0x0,t,ok\n", 3,
       "an allocate that succeeded cannot have returned 0x0"},
      {"failed deallocate", ok_alloc + "1,0,2,deallocate,0x100,8,64,0x0,t,out_of_memory\n", 4,
       "a deallocate cannot have outcome 'out_of_memory'"},
      {"unterminated quote", ok_alloc + "1,0,2,allocate,0x200,8,64,0x0,\"open\n\nstill,ok\n", 4,
       "unterminated quote in field 'tag'"},
      {"text after a closing quote", "0,0,1,allocate,0x100,8,64,0x0,\"t\"x,ok\n", 3,
       "unexpected 'x' after the closing quote of field 'tag'"},
      {"error after a multi-line tag",
       "0,0,1,allocate,0x100,8,64,0x0,\"a\nb\",ok\n1,0,2,allocate,0x200,8,64,0x0,t,maybe\n", 5,
       "unknown outcome 'maybe'"},
  };
  for (const malformed_case& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      (void)parse(std::string("# loom allocation log v1\n") + header + c.body);
      ADD_FAILURE() << "parsed";
    } catch (const loom::parse_error& e) {
      EXPECT_EQ(e.line(), c.line);
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("line " + std::to_string(c.line) + ": ", 0), 0u) << what;
      EXPECT_NE(what.find(c.message), std::string::npos) << what;
    }
  }
}

TEST(AllocationLog, RequiresTheHeaderBeforeAnyEvent) {
  const std::vector<std::pair<std::string, std::size_t>> cases = {
      {"", 1},
      {"# only a comment\n\n", 3},
      {"# loom allocation log v1\n0,0,1,allocate,0x100,8,64,0x0,t,ok\n", 2},
      {"seq,thread,time,action,pointer,bytes,alignment,stream,tag,outcome\n", 1},
  };
  for (const auto& [text, line] : cases) {
    SCOPED_TRACE(text);
    try {
      (void)parse(text);
      ADD_FAILURE() << "parsed";
    } catch (const loom::parse_error& e) {
      EXPECT_EQ(e.line(), line);
      EXPECT_NE(std::string(e.what()).find("missing header"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse(std::string("# v1\n") + header).size(), 0u);
}

TEST(AllocationLog, ReadsFilesAndNamesThemInErrors) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("loom_allocation_log_test_" + std::to_string(::getpid()) + ".csv");
  {
    std::ofstream out(path, std::ios::binary);
    out << header << "0,0,1,allocate,0x100,8,64,0x0,t,ok\n1,0,2,deallocate,0x200,8,64,0x0,t,ok\n";
  }
  try {
    (void)loom::memory::parse_allocation_log(path);
    ADD_FAILURE() << "parsed";
  } catch (const loom::parse_error& e) {
    EXPECT_EQ(e.line(), 3u);
    EXPECT_EQ(std::string(e.what()).rfind(path.string() + ":3: deallocate of 0x200", 0), 0u)
        << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW((void)loom::memory::parse_allocation_log(path), loom::not_found);
}

// The parser reads what logging_adaptor writes, also when threads log at once: each
// thread's calls come back in its order, with their tags, and the log is consistent.
TEST(AllocationLog, ReadsWhatTheLoggingAdaptorWritesFromManyThreads) {
  struct call {
    std::string action;
    std::size_t bytes;
    std::size_t alignment;
    std::uintptr_t stream;
    std::string outcome;
  };
  const std::vector<std::string> tags = {"plain/tag", "with, comma", "with \"quotes\"",
                                         "two\nlines"};
  std::vector<std::vector<call>> made(tags.size());
  std::ostringstream out;
  {
    loom::memory::bfc_pool_options o;
    o.growth_step = 1 << 20;
    o.max_size = 4 << 20;  // requests beyond it fail: out_of_memory in the log
    loom::memory::bfc_pool pool(loom::memory::host_resource::instance(), o);
    loom::memory::logging_adaptor logger(pool, out);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < tags.size(); ++t) {
      threads.emplace_back([&, t] {
        const loom::memory::tag_scope scope(tags[t]);
        std::mt19937_64 rng(t);
        std::vector<std::tuple<void*, std::size_t, std::size_t, loom::stream>> live;
        for (int i = 0; i < 300; ++i) {
          if (live.empty() || (live.size() < 8 && rng() % 2 == 0)) {
            const std::size_t bytes = rng() % 10 == 0 ? (8u << 20) : rng() % 50000;
            const std::size_t alignment = std::size_t{8} << (rng() % 6);
            const loom::stream s(reinterpret_cast<void*>(rng() % 2 * 0x40));
            try {
              live.emplace_back(logger.allocate(bytes, alignment, s), bytes, alignment, s);
              made[t].push_back({"allocate", bytes, alignment, s.value(), "ok"});
            } catch (const std::bad_alloc&) {
              made[t].push_back({"allocate", bytes, alignment, s.value(), "out_of_memory"});
            }
          } else {
            const auto [p, bytes, alignment, s] = live.back();
            live.pop_back();
            logger.deallocate(p, bytes, alignment, s);
            made[t].push_back({"deallocate", bytes, alignment, s.value(), "ok"});
          }
        }
        for (const auto& [p, bytes, alignment, s] : live) {
          logger.deallocate(p, bytes, alignment, s);
          made[t].push_back({"deallocate", bytes, alignment, s.value(), "ok"});
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  const allocation_log log = parse(out.str());
  std::vector<std::size_t> next(tags.size(), 0);
  for (std::size_t i = 0; i < log.size(); ++i) {
    const auto t =
        static_cast<std::size_t>(std::find(tags.begin(), tags.end(), log.tag_of(i)) - tags.begin());
    ASSERT_LT(t, tags.size()) << "unknown tag " << log.tag_of(i);
    ASSERT_LT(next[t], made[t].size());
    const call& c = made[t][next[t]++];
    const log_event& e = log.events()[i];
    ASSERT_EQ(to_string(e.action), c.action) << "event " << i;
    ASSERT_EQ(e.bytes, c.bytes);
    ASSERT_EQ(e.alignment, c.alignment);
    ASSERT_EQ(e.on_stream.value(), c.stream);
    ASSERT_EQ(to_string(e.outcome), c.outcome);
  }
  for (std::size_t t = 0; t < tags.size(); ++t) EXPECT_EQ(next[t], made[t].size());
}

}  // namespace
