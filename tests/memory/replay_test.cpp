#include "loom/memory/replay.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/logging_adaptor.hpp"
#include "memory/log_builder.hpp"

namespace {

using loom::memory::allocation_log;
using loom::memory::log_action;
using loom::memory::memory_resource;
using loom::memory::replay;
using loom::memory::replay_options;
using loom::memory::replay_report;
using loom::memory::testing::first_lines;
using loom::memory::testing::log_record;
using loom::memory::testing::random_log;
using loom::memory::testing::random_log_options;
using loom::memory::testing::to_csv;

allocation_log parse(const std::vector<log_record>& records) {
  std::istringstream in(to_csv(records));
  return loom::memory::parse_allocation_log(in);
}

// Serves blocks from the host and records every call. Refuses an allocation that would
// take the bytes in use over `budget`. Reports a reservation that, when `growth` is set,
// grows in steps of `growth` as the bytes in use pass it (as a pool's does), and
// remembers the calls at which it grew; with growth 0 it reports none (0).
class recording_resource final : public memory_resource {
 public:
  struct call {
    log_action action;
    void* pointer;
    std::size_t bytes;
    std::size_t alignment;
    std::uintptr_t stream;
  };

  explicit recording_resource(std::size_t budget = loom::memory::max_allocation_size,
                              std::size_t growth = 0)
      : budget_(budget), growth_(growth) {}

  ~recording_resource() override { EXPECT_TRUE(live_.empty()) << live_.size() << " leaked"; }

  std::vector<call> calls;
  std::vector<std::size_t> growth_calls;  // indices into calls
  std::size_t stats_calls = 0;
  std::size_t in_use = 0;
  std::size_t reserved = 0;
  // Throw loom::error instead of allocating once this many calls have been made.
  std::size_t throw_on_call = std::numeric_limits<std::size_t>::max();

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, loom::stream s) override {
    if (calls.size() >= throw_on_call) throw loom::error("the resource broke");
    if (in_use + bytes > budget_) {
      throw loom::out_of_memory("test budget: no room", bytes, "test budget", do_stats());
    }
    void* p = upstream_.allocate(bytes, alignment, s);
    live_.emplace(p, bytes);
    in_use += bytes;
    calls.push_back({log_action::allocate, p, bytes, alignment, s.value()});
    if (growth_ != 0 && in_use > reserved) {
      reserved = loom::memory::align_up(in_use, growth_);
      growth_calls.push_back(calls.size() - 1);
    }
    return p;
  }

  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     loom::stream s) noexcept override {
    const auto it = live_.find(p);
    EXPECT_NE(it, live_.end()) << "unknown block " << p;
    if (it == live_.end()) return;
    EXPECT_EQ(it->second, bytes);
    live_.erase(it);
    in_use -= bytes;
    calls.push_back({log_action::deallocate, p, bytes, alignment, s.value()});
    upstream_.deallocate(p, bytes, alignment, s);
  }

  std::optional<loom::memory_stats> do_stats() const override {
    ++const_cast<recording_resource*>(this)->stats_calls;
    loom::memory_stats s;
    s.bytes_in_use = in_use;
    s.bytes_reserved = reserved;
    s.free_bytes = reserved > in_use ? reserved - in_use : 0;
    s.largest_free_block = s.free_bytes / 2;  // so that fragmentation is 0.5 when any is free
    return s;
  }

  loom::memory::host_resource upstream_;
  std::map<void*, std::size_t> live_;
  std::size_t budget_;
  std::size_t growth_;
};

// The bytes in use after each record, replayed by a shadow model under `budget`, where
// allocates that failed in the log fail (as random_log makes them).
std::vector<std::size_t> shadow_in_use(const std::vector<log_record>& records, std::size_t budget,
                                       std::size_t* failures = nullptr) {
  std::vector<std::size_t> after;
  std::map<std::uintptr_t, std::size_t> live;
  std::size_t in_use = 0;
  for (const log_record& r : records) {
    if (r.outcome == "ok" && r.action == "allocate") {
      if (in_use + r.bytes <= budget) {
        live[r.pointer] = r.bytes;
        in_use += r.bytes;
      } else if (failures != nullptr) {
        ++*failures;
      }
    } else if (r.action == "deallocate" && live.count(r.pointer) != 0) {
      in_use -= live[r.pointer];
      live.erase(r.pointer);
    }
    after.push_back(in_use);
  }
  return after;
}

TEST(Replay, CallsTheResourceAsTheLogSaysAndFreesWhatIsLeft) {
  std::mt19937_64 rng(99);
  random_log_options o;
  o.failed_fraction = 0.05;
  const std::vector<log_record> records = random_log(rng, o);
  const allocation_log log = parse(records);
  recording_resource resource;
  const replay_report report = replay(log, resource, {});

  // Calls, in order: one per event, except the allocates that failed in the log (they
  // fail again, before reaching the resource), then a deallocate per block left live.
  std::map<std::uintptr_t, void*> replayed;  // logged pointer -> replayed pointer
  std::map<void*, const log_record*> left;   // still live at the end of the log
  std::size_t c = 0;
  std::size_t expected_failures = 0;
  for (const log_record& r : records) {
    if (r.outcome != "ok") {
      ++expected_failures;
      continue;
    }
    ASSERT_LT(c, resource.calls.size());
    const recording_resource::call& call = resource.calls[c++];
    ASSERT_EQ(to_string(call.action), r.action);
    ASSERT_EQ(call.bytes, r.bytes);
    ASSERT_EQ(call.alignment, r.alignment);
    ASSERT_EQ(call.stream, r.stream);
    if (r.action == "allocate") {
      replayed[r.pointer] = call.pointer;
      left[call.pointer] = &r;
    } else {
      ASSERT_EQ(call.pointer, replayed.at(r.pointer));
      replayed.erase(r.pointer);
      left.erase(call.pointer);
    }
  }
  ASSERT_EQ(resource.calls.size(), c + left.size());
  for (; c < resource.calls.size(); ++c) {
    const recording_resource::call& call = resource.calls[c];
    ASSERT_EQ(call.action, log_action::deallocate);
    const auto it = left.find(call.pointer);
    ASSERT_NE(it, left.end());
    EXPECT_EQ(call.bytes, it->second->bytes);
    EXPECT_EQ(call.alignment, it->second->alignment);
    EXPECT_EQ(call.stream, it->second->stream);
    left.erase(it);
  }
  EXPECT_EQ(resource.in_use, 0u);

  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.events_total, records.size());
  EXPECT_EQ(report.events_replayed, records.size());
  EXPECT_EQ(report.allocations + report.deallocations, records.size());
  EXPECT_EQ(report.deallocations, static_cast<std::size_t>(std::count_if(
                                      records.begin(), records.end(), [](const log_record& r) {
                                        return r.action == "deallocate";
                                      })));
  EXPECT_EQ(report.expected_failures, expected_failures);
  EXPECT_EQ(report.unexpected_successes, 0u);
  const std::vector<std::size_t> in_use = shadow_in_use(records, SIZE_MAX);
  const auto peak = std::max_element(in_use.begin(), in_use.end());
  EXPECT_EQ(report.peak_bytes_in_use, *peak);
  EXPECT_EQ(report.peak_in_use_event, static_cast<std::size_t>(peak - in_use.begin()));
}

TEST(Replay, StopsAtTheFirstFailureAndNamesIt) {
  std::mt19937_64 rng(7);
  const std::vector<log_record> records = random_log(rng, {});
  const std::vector<std::size_t> lines = first_lines(records);
  const std::size_t budget = 200'000;
  const std::vector<std::size_t> in_use = shadow_in_use(records, SIZE_MAX);
  // The first allocate that takes the shadow's bytes in use over the budget.
  std::size_t first = 0;
  while (in_use[first] <= budget) ++first;
  ASSERT_EQ(records[first].action, "allocate");
  const log_record& r = records[first];

  recording_resource resource(budget);
  std::size_t live_at_stop = 0;
  replay_options options;
  options.on_stop = [&] { live_at_stop = resource.in_use; };
  const replay_report report = replay(parse(records), resource, options);

  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.failures, 1u);
  EXPECT_EQ(report.events_replayed, first + 1);
  EXPECT_EQ(live_at_stop, in_use[first - 1]);
  EXPECT_EQ(resource.in_use, 0u);  // everything given back after on_stop
  ASSERT_TRUE(report.first_failure.has_value());
  const loom::memory::replay_failure& f = *report.first_failure;
  EXPECT_EQ(f.event, first);
  EXPECT_EQ(f.seq, r.seq);
  EXPECT_EQ(f.line, lines[first]);
  EXPECT_EQ(f.bytes, r.bytes);
  EXPECT_EQ(f.alignment, r.alignment);
  EXPECT_EQ(f.thread, r.thread);
  EXPECT_EQ(f.tag, r.tag);
  EXPECT_EQ(f.refused_by, "test budget");
  ASSERT_TRUE(f.stats.has_value());
  EXPECT_EQ(f.stats->bytes_in_use, in_use[first - 1]);
  EXPECT_EQ(f.describe(), "event " + std::to_string(r.seq) + " (line " +
                              std::to_string(lines[first]) + "): allocate " +
                              std::to_string(r.bytes) + " bytes, alignment " +
                              std::to_string(r.alignment) + ", tag '" + r.tag +
                              "': out of memory: test budget: no room");
  ASSERT_FALSE(report.samples.empty());
  EXPECT_EQ(report.samples.back().event, first);
}

TEST(Replay, KeepGoingCountsEveryFailureAndSkipsTheirDeallocates) {
  std::mt19937_64 rng(8);
  const std::vector<log_record> records = random_log(rng, {});
  const std::size_t budget = 300'000;
  std::size_t failures = 0;
  const std::vector<std::size_t> in_use = shadow_in_use(records, budget, &failures);
  ASSERT_GT(failures, 1u);

  recording_resource resource(budget);
  replay_options options;
  options.keep_going = true;
  const replay_report report = replay(parse(records), resource, options);
  EXPECT_EQ(report.failures, failures);
  EXPECT_EQ(report.events_replayed, records.size());
  EXPECT_EQ(report.peak_bytes_in_use, *std::max_element(in_use.begin(), in_use.end()));
  // Every call the resource saw was for a block it handed out: a successful allocate and
  // one deallocate for it (in the log or at the end).
  const auto allocates =
      std::count_if(resource.calls.begin(), resource.calls.end(),
                    [](const auto& c) { return c.action == log_action::allocate; });
  EXPECT_EQ(static_cast<std::size_t>(allocates) * 2, resource.calls.size());
  EXPECT_EQ(
      static_cast<std::size_t>(allocates) + failures,
      static_cast<std::size_t>(std::count_if(records.begin(), records.end(), [](const auto& r) {
        return r.action == "allocate" && r.outcome == "ok";
      })));
}

TEST(Replay, CountsLoggedFailuresThatNowSucceedAndFreesThemAtTheEnd) {
  std::vector<log_record> records(3);
  records[0] = {0, 0, 1, "allocate", 0x0, 100, 64, 0, "big", "out_of_memory"};
  records[1] = {1, 0, 2, "allocate", 0x0, 8, 3, 0, "odd", "invalid_argument"};
  records[2] = {2, 0, 3, "allocate", 0x100, 50, 64, 0, "ok", "ok"};
  recording_resource resource;
  std::size_t live_at_stop = 0;
  replay_options options;
  options.on_stop = [&] { live_at_stop = resource.in_use; };
  const replay_report report = replay(parse(records), resource, options);
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.unexpected_successes, 1u);
  EXPECT_EQ(report.expected_failures, 1u);
  EXPECT_EQ(report.peak_bytes_in_use, 150u);
  EXPECT_EQ(live_at_stop, 150u);
  EXPECT_EQ(resource.in_use, 0u);
  EXPECT_EQ(resource.calls.size(), 4u);  // two allocates, two deallocates at the end
}

TEST(Replay, ReportsProgressEveryIntervalAndAtTheEnd) {
  std::mt19937_64 rng(12);
  random_log_options o;
  o.events = 1000;
  const std::vector<log_record> records = random_log(rng, o);
  recording_resource resource;
  replay_options options;
  options.progress_interval = 300;
  std::vector<std::pair<std::size_t, std::size_t>> calls;
  options.on_progress = [&](std::size_t done, std::size_t total) { calls.emplace_back(done, total); };
  const replay_report report = replay(parse(records), resource, options);
  const std::size_t n = records.size();
  ASSERT_EQ(report.events_replayed, n);
  std::vector<std::pair<std::size_t, std::size_t>> want;
  for (std::size_t k = 300; k <= n; k += 300) want.emplace_back(k, n);
  want.emplace_back(n, n);  // the end, always
  EXPECT_EQ(calls, want);
  EXPECT_GE(want.size(), 4U);
}

TEST(Replay, StopsAfterAnEventAndShowsTheBlocksItHolds) {
  std::mt19937_64 rng(13);
  random_log_options o;
  o.events = 600;
  const std::vector<log_record> records = random_log(rng, o);
  const allocation_log log = parse(records);
  const std::vector<std::size_t> in_use = shadow_in_use(records, SIZE_MAX);
  for (const std::size_t stop : {std::size_t{0}, std::size_t{137}, records.size() - 1}) {
    recording_resource resource;
    replay_options options;
    options.stop_after = stop;
    std::vector<loom::memory::replay_block> held;
    std::size_t stopped_calls = 0;
    options.on_stop = [&] { stopped_calls = resource.calls.size(); };
    options.on_stop_blocks = [&](const std::vector<loom::memory::replay_block>& b) { held = b; };
    const replay_report report = replay(log, resource, options);
    EXPECT_EQ(report.events_replayed, stop + 1);
    EXPECT_EQ(stopped_calls, stop + 1);  // one call per event, none of the final frees
    std::size_t bytes = 0;
    for (const auto& b : held) {
      bytes += b.bytes;
      EXPECT_LE(b.event, stop);
      EXPECT_EQ(b.tag, log.tag_of(b.event));
      EXPECT_EQ(log.events()[b.event].action, loom::memory::log_action::allocate);
    }
    EXPECT_EQ(bytes, in_use[stop]) << "stop " << stop;
  }
}

TEST(Replay, SamplesEvenlyAndAtEveryGrowthPoint) {
  std::mt19937_64 rng(11);
  random_log_options o;
  o.events = 5000;
  const std::vector<log_record> records = random_log(rng, o);
  const std::vector<std::size_t> in_use = shadow_in_use(records, SIZE_MAX);
  recording_resource resource(loom::memory::max_allocation_size, 1 << 18);
  replay_options options;
  options.samples = 50;
  const replay_report report = replay(parse(records), resource, options);

  // Growth points: the events whose allocate made the resource grow.
  std::vector<std::size_t> growth_events;
  {
    std::size_t call = 0;
    std::size_t g = 0;
    for (std::size_t i = 0; i < records.size() && g < resource.growth_calls.size(); ++i) {
      if (call == resource.growth_calls[g]) {
        growth_events.push_back(i);
        ++g;
      }
      ++call;  // random_log without failures: one call per event
    }
  }
  ASSERT_FALSE(growth_events.empty());
  std::size_t evenly_spaced = 0;
  std::size_t previous = 0;
  for (std::size_t k = 0; k < report.samples.size(); ++k) {
    const loom::memory::replay_sample& s = report.samples[k];
    if (k > 0) {
      EXPECT_GT(s.event, previous);
    }
    previous = s.event;
    EXPECT_EQ(s.bytes_in_use, in_use[s.event]) << "event " << s.event;
    if ((s.event + 1) % (records.size() / options.samples) == 0) ++evenly_spaced;
  }
  EXPECT_EQ(evenly_spaced, options.samples);
  for (const std::size_t g : growth_events) {
    EXPECT_TRUE(std::any_of(report.samples.begin(), report.samples.end(),
                            [g](const auto& s) { return s.event == g; }))
        << "no sample at the growth point " << g;
  }
  EXPECT_EQ(report.samples.back().event, records.size() - 1);
  EXPECT_EQ(report.peak_bytes_reserved, resource.reserved);
  EXPECT_EQ(report.peak_reserved_event, std::optional<std::size_t>(growth_events.back()));
  // Statistics are read at the samples only (and once before the replay, once after).
  EXPECT_EQ(resource.stats_calls, report.samples.size() + 2);
}

TEST(Replay, StopsLookingForGrowthWhenTheResourceReportsNoReservation) {
  std::mt19937_64 rng(12);
  const std::vector<log_record> records = random_log(rng, {});
  recording_resource resource;  // reports 0 reserved
  replay_options options;
  options.samples = 20;
  const replay_report report = replay(parse(records), resource, options);
  EXPECT_LE(resource.stats_calls, options.samples + 4);
  EXPECT_EQ(report.peak_bytes_reserved, 0u);
}

TEST(Replay, GivesEverythingBackWhenTheResourceThrowsSomethingElse) {
  std::mt19937_64 rng(13);
  recording_resource resource;
  resource.throw_on_call = 300;
  EXPECT_THROW((void)replay(parse(random_log(rng, {})), resource, {}), loom::error);
  EXPECT_EQ(resource.in_use, 0u);
}

// The report, timings aside, depends only on the log and the configuration.
TEST(Replay, IsDeterministicOverABfcPool) {
  std::mt19937_64 rng(14);
  random_log_options o;
  o.events = 4000;
  o.failed_fraction = 0.02;
  const allocation_log log = parse(random_log(rng, o));
  const auto run = [&log] {
    loom::memory::bfc_pool_options p;
    p.growth_step = 1 << 20;
    loom::memory::bfc_pool pool(loom::memory::host_resource::instance(), p);
    nlohmann::json j = nlohmann::json::parse(replay(log, pool, {}).to_json());
    pool.check_invariants();
    EXPECT_EQ(pool.get_stats().bytes_in_use, 0u);
    j.erase("timing");
    return j;
  };
  const nlohmann::json first = run();
  EXPECT_EQ(first, run());
  EXPECT_TRUE(first["ok"].get<bool>());
  EXPECT_GT(first["peak_bytes_reserved"].get<std::size_t>(), 0u);
}

TEST(Replay, ReportsAsTextAndJson) {
  std::mt19937_64 rng(15);
  const std::vector<log_record> records = random_log(rng, {});
  recording_resource resource(150'000);
  const replay_report report = replay(parse(records), resource, {});
  ASSERT_FALSE(report.ok());

  const nlohmann::json j = nlohmann::json::parse(report.to_json());
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["events_replayed"].get<std::size_t>(), report.events_replayed);
  EXPECT_EQ(j["peak_bytes_in_use"].get<std::size_t>(), report.peak_bytes_in_use);
  EXPECT_EQ(j["samples"].size(), report.samples.size());
  EXPECT_EQ(j["first_failure"]["description"].get<std::string>(), report.first_failure->describe());
  EXPECT_EQ(j["first_failure"]["stats"]["bytes_in_use"].get<std::size_t>(),
            report.first_failure->stats->bytes_in_use);
  EXPECT_EQ(j["final_stats"]["bytes_in_use"].get<std::size_t>(), 0u);
  EXPECT_TRUE(j["timing"].contains("ns_per_event"));

  const std::string text = report.to_text();
  EXPECT_NE(text.find("FAILED"), std::string::npos) << text;
  EXPECT_NE(text.find(report.first_failure->describe()), std::string::npos) << text;
  EXPECT_NE(text.find(loom::format_bytes(report.peak_bytes_in_use)), std::string::npos) << text;
}

// A run recorded by logging_adaptor, replayed against a pool configured as the one it ran
// on, meets the same outcomes and the same peak.
TEST(Replay, ReproducesALoggedRunOnTheSameConfiguration) {
  loom::memory::bfc_pool_options o;
  o.growth_step = 1 << 20;
  o.max_size = 3 << 20;
  std::ostringstream out;
  std::size_t refused = 0;
  loom::memory_stats original;
  {
    loom::memory::bfc_pool pool(loom::memory::host_resource::instance(), o);
    loom::memory::logging_adaptor logger(pool, out);
    std::mt19937_64 rng(21);
    std::vector<std::pair<void*, std::size_t>> live;
    for (int i = 0; i < 3000; ++i) {
      if (live.empty() || rng() % 2 == 0) {
        const std::size_t bytes = rng() % 200'000;
        try {
          live.emplace_back(logger.allocate(bytes), bytes);
        } catch (const loom::out_of_memory&) {
          ++refused;
        }
      } else {
        const std::size_t k = rng() % live.size();
        logger.deallocate(live[k].first, live[k].second);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    original = pool.get_stats();
    for (const auto& [p, bytes] : live) logger.deallocate(p, bytes);
  }
  ASSERT_GT(refused, 0u);
  std::istringstream in(out.str());
  const allocation_log log = loom::memory::parse_allocation_log(in);
  loom::memory::bfc_pool pool(loom::memory::host_resource::instance(), o);
  const replay_report report = replay(log, pool, {});
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.expected_failures, refused);
  EXPECT_EQ(report.unexpected_successes, 0u);
  EXPECT_EQ(report.peak_bytes_in_use, original.peak_bytes_in_use);
  EXPECT_EQ(report.peak_bytes_reserved, original.peak_bytes_reserved);
  ASSERT_TRUE(report.final_stats.has_value());
  EXPECT_EQ(report.final_stats->num_failed_allocs, original.num_failed_allocs);
}

// The bundled log of an MLP's training fits a growing pool and a fixed one of 64 MiB, and
// not one of 4 MiB.
TEST(Replay, BundledTrainingLogFitsTheConfigurationsMakeRunUses) {
  const std::filesystem::path path =
      std::filesystem::path(__FILE__).parent_path() / "../../data/mlp_training.alloc.csv";
  const allocation_log log = loom::memory::parse_allocation_log(path);
  ASSERT_GT(log.size(), 1000u);
  std::size_t in_use = 0;
  std::size_t peak = 0;
  for (const auto& e : log.events()) {
    in_use = e.action == log_action::allocate ? in_use + e.bytes : in_use - e.bytes;
    peak = std::max(peak, in_use);
  }
  const auto replay_with = [&log](std::size_t initial_size, std::size_t growth_step) {
    loom::memory::bfc_pool_options o;
    o.initial_size = initial_size;
    o.growth_step = growth_step;
    loom::memory::bfc_pool pool(loom::memory::host_resource::instance(), o);
    return replay(log, pool, {});
  };
  const replay_report growing = replay_with(0, std::size_t{64} << 20);
  EXPECT_TRUE(growing.ok());
  EXPECT_EQ(growing.peak_bytes_in_use, peak);
  const replay_report fixed = replay_with(std::size_t{64} << 20, 0);
  EXPECT_TRUE(fixed.ok());
  EXPECT_EQ(fixed.peak_bytes_reserved, std::size_t{64} << 20);
  EXPECT_FALSE(fixed.peak_reserved_event.has_value());  // held before the first event
  const replay_report small = replay_with(std::size_t{4} << 20, 0);
  EXPECT_FALSE(small.ok());
  ASSERT_TRUE(small.first_failure.has_value());
  EXPECT_EQ(small.first_failure->refused_by.find("bfc_pool"), 0u)
      << small.first_failure->refused_by;
}

}  // namespace
