// `loom memreplay LOG [options]`: replays an allocation log against a pool configuration
// and reports whether the run's allocations would have fit, and how well.
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "memory_report_files.hpp"
#include "loom/core/error.hpp"
#include "loom/core/progress.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/limiting_adaptor.hpp"
#include "loom/memory/memory_report.hpp"
#include "loom/memory/replay.hpp"

namespace loom::tools {
namespace {

// "512", "64KiB", "256MiB", "1.5GiB", "2g": bytes, with an optional binary unit (K, KB and
// KiB all mean 1024, case aside). A fraction is rounded to the nearest byte.
std::size_t parse_size(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [unit_begin, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || !std::isfinite(value) || value < 0) {
    throw invalid_argument(fmt::format("'{}' is not a size (e.g. 512, 64KiB, 1.5GiB)", text));
  }
  std::string unit(unit_begin, end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!unit.empty() && unit != "b") {
    const std::size_t prefix = std::string_view("kmgt").find(unit[0]);
    const std::string_view rest = std::string_view(unit).substr(1);
    if (prefix == std::string_view::npos ||
        !(rest.empty() || rest == "b" || rest == "i" || rest == "ib")) {
      throw invalid_argument(fmt::format("'{}': unknown unit (use B, KiB, MiB, GiB or TiB)", text));
    }
    shift = 10 * static_cast<int>(prefix + 1);
  }
  const double bytes = std::round(std::ldexp(value, shift));
  if (bytes > static_cast<double>(memory::max_allocation_size)) {
    throw invalid_argument(fmt::format("'{}' is larger than any allocation can be", text));
  }
  return static_cast<std::size_t>(bytes);
}

// Rewrites a size option's text to its byte count before CLI11 converts it.
CLI::Validator byte_size() {
  return {[](std::string& text) -> std::string {
            try {
              text = std::to_string(parse_size(text));
              return {};
            } catch (const invalid_argument& e) {
              return e.what();
            }
          },
          "SIZE", "byte size"};
}

struct memreplay_flags {
  std::string log;
  std::string pool = "growing";
  std::size_t initial_size = 0;
  std::size_t growth_step = memory::bfc_pool_options{}.growth_step;
  std::size_t max_size = memory::max_allocation_size;
  std::size_t granularity = memory::bfc_pool_options{}.granularity;
  std::size_t limit = 0;
  std::size_t samples = 100;
  bool keep_going = false;
  bool json = false;
  bool dump = false;
  bool quiet = false;
  std::string html;  // --html: the memory report page
  // Which options were given: checked against --pool once parsing is done.
  CLI::Option* initial_size_option = nullptr;
  CLI::Option* growth_step_option = nullptr;
  CLI::Option* max_size_option = nullptr;
  CLI::Option* granularity_option = nullptr;
  CLI::Option* limit_option = nullptr;
};

// The resources a replay runs against, top first: the budget (with --limit), the pool
// (unless --pool none), the host.
class replay_target {
 public:
  explicit replay_target(const memreplay_flags& f) {
    memory::memory_resource* top = &memory::host_resource::instance();
    if (f.pool != "none") {
      memory::bfc_pool_options o;
      o.name = "memreplay";
      o.initial_size = f.initial_size;
      o.granularity = f.granularity;
      o.growth_step = f.pool == "fixed" ? 0 : f.growth_step;
      o.max_size = f.pool == "fixed" ? f.initial_size : f.max_size;
      pool_ = std::make_unique<memory::bfc_pool>(*top, std::move(o));
      top = pool_.get();
    }
    if (f.limit_option->count() > 0) {
      budget_ = std::make_unique<memory::limiting_adaptor>(*top, f.limit, "replay budget");
      top = budget_.get();
    }
    top_ = top;
  }

  [[nodiscard]] memory::memory_resource& resource() const noexcept { return *top_; }
  [[nodiscard]] memory::bfc_pool* pool() const noexcept { return pool_.get(); }

  // One line for people, one object for machines.
  [[nodiscard]] std::string describe() const {
    std::string text = "host memory";
    if (pool_) {
      const memory::bfc_pool_options& o = pool_->options();
      text =
          o.growth_step == 0
              ? fmt::format("fixed bfc_pool of {}", format_bytes(o.initial_size))
              : fmt::format("growing bfc_pool (initial {}, growth step {}, max {})",
                            format_bytes(o.initial_size), format_bytes(o.growth_step),
                            o.max_size == memory::max_allocation_size ? std::string("unlimited")
                                                                      : format_bytes(o.max_size));
      text += fmt::format(", granularity {}, over host memory", format_bytes(o.granularity));
    }
    if (budget_) {
      text = fmt::format("budget '{}' of {} over {}", budget_->name(),
                         format_bytes(budget_->limit()), text);
    }
    return text;
  }

  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json j = {{"description", describe()}, {"pool", nullptr}, {"limit", nullptr}};
    if (pool_) {
      const memory::bfc_pool_options& o = pool_->options();
      j["pool"] = {{"kind", o.growth_step == 0 ? "fixed" : "growing"},
                   {"initial_size", o.initial_size},
                   {"growth_step", o.growth_step},
                   {"max_size", o.max_size},
                   {"granularity", o.granularity}};
    }
    if (budget_) j["limit"] = budget_->limit();
    return j;
  }

 private:
  std::unique_ptr<memory::bfc_pool> pool_;
  std::unique_ptr<memory::limiting_adaptor> budget_;
  memory::memory_resource* top_ = nullptr;
};

// Rejects options that do not apply to the chosen --pool.
void check_pool_options(const memreplay_flags& f) {
  const auto reject = [&f](const CLI::Option* o, std::string_view why) {
    if (o->count() > 0) {
      throw CLI::ValidationError(o->get_name(),
                                 fmt::format("does not apply to --pool {}: {}", f.pool, why));
    }
  };
  if (f.pool == "none") {
    for (const CLI::Option* o :
         {f.initial_size_option, f.growth_step_option, f.max_size_option, f.granularity_option}) {
      reject(o, "there is no pool");
    }
    if (f.dump) throw CLI::ValidationError("--dump", "needs a pool (--pool growing or fixed)");
  } else if (f.pool == "fixed") {
    reject(f.growth_step_option, "a fixed pool does not grow");
    reject(f.max_size_option, "a fixed pool holds --initial-size bytes");
    if (f.initial_size_option->count() == 0) {
      throw CLI::ValidationError("--initial-size", "--pool fixed needs the pool's size");
    }
  }
}

void run_memreplay(const memreplay_flags& f) {
  check_pool_options(f);
  // Before reading the log: a configuration the pool refuses is a usage error, now.
  const replay_target target = [&f] {
    try {
      return replay_target(f);
    } catch (const invalid_argument& e) {
      throw CLI::ValidationError("--pool", e.what());
    }
  }();
  // And before any work: a report that cannot be written is an error now, not at the end.
  std::ofstream html;
  if (!f.html.empty()) {
    try {
      html = open_report(f.html);
    } catch (const error& e) {
      throw CLI::ValidationError("--html", e.what());
    }
  }
  const auto parse_start = std::chrono::steady_clock::now();
  const memory::allocation_log log = memory::parse_allocation_log(std::filesystem::path(f.log));
  const std::chrono::duration<double, std::milli> parse_ms =
      std::chrono::steady_clock::now() - parse_start;

  std::string dump;  // the pool at the stop (--dump)
  memory::replay_options options;
  options.keep_going = f.keep_going;
  options.samples = f.samples;
  if (f.dump) {
    options.on_stop = [&dump, &target, &f] {
      if (f.json) {
        dump = target.pool()->dump_json();
      } else {
        std::ostringstream os;
        target.pool()->dump(os);
        dump = os.str();
      }
    };
  }
  // Progress on stderr: a bar on a terminal, else a line every 5 s (loom::progress).
  progress bar("replay", "events", isatty(fileno(stderr)) != 0);
  if (!f.quiet) {
    options.on_progress = [&bar](std::size_t done, std::size_t total) {
      bar.update(static_cast<std::int64_t>(done), static_cast<std::int64_t>(total));
    };
  }
  if (!f.html.empty()) options.samples = std::max(options.samples, report_samples);
  const memory::replay_report report = memory::replay(log, target.resource(), options);
  bar.finish();
  if (!f.html.empty()) {
    write_report(html, f.html, picture_of(log, report, [&f] { return replay_target(f); },
                                         fmt::format("loom memreplay {}", f.log)));
  }

  if (f.json) {
    nlohmann::json out = {{"log", f.log},
                          {"events", log.size()},
                          {"tags", log.tags().size()},
                          {"most_live_blocks", log.slot_count()},
                          {"parse_ms", parse_ms.count()},
                          {"resource", target.to_json()},
                          {"report", nlohmann::json::parse(report.to_json())}};
    if (f.dump) out["dump"] = nlohmann::json::parse(dump);
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print(
        "log         {}: {} events, {} tags, at most {} blocks live at once; parsed in "
        "{:.1f} ms\nresource    {}\n{}",
        f.log, log.size(), log.tags().size(), log.slot_count(), parse_ms.count(), target.describe(),
        report.to_text());
    if (f.dump)
      fmt::print("pool when the replay stopped, before it freed what was live:\n{}", dump);
  }
  if (!report.ok()) {
    fmt::print(stderr, "loom memreplay: {}\n", report.first_failure->describe());
    exit_status() = 1;
  }
}

}  // namespace

void add_memreplay_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "memreplay",
      "Replay an allocation log (written by logging_adaptor) against a pool configuration: "
      "exit status 0 when every allocation that succeeded in the log succeeds, 1 when one "
      "fails (named on stderr), 2 when the log is malformed");
  auto f = std::make_shared<memreplay_flags>();
  cmd->add_option("log", f->log, "The allocation log (CSV)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--pool", f->pool,
                  "growing: a bfc_pool that grows on demand; fixed: one region of "
                  "--initial-size bytes; none: straight to host memory")
      ->check(CLI::IsMember({"growing", "fixed", "none"}))
      ->capture_default_str();
  f->initial_size_option =
      cmd->add_option("--initial-size", f->initial_size, "Bytes the pool takes at once")
          ->transform(byte_size());
  f->growth_step_option =
      cmd->add_option("--growth-step", f->growth_step,
                      fmt::format("Bytes a growing pool adds at a time (default {})",
                                  format_bytes(f->growth_step)))
          ->transform(byte_size());
  f->max_size_option =
      cmd->add_option("--max-size", f->max_size, "The most bytes a growing pool may hold")
          ->transform(byte_size());
  f->granularity_option =
      cmd->add_option(
             "--granularity", f->granularity,
             fmt::format("Chunk granularity of the pool: a power of two, at least 64 (default {})",
                         format_bytes(f->granularity)))
          ->transform(byte_size());
  f->limit_option = cmd->add_option("--limit", f->limit,
                                    "Replay under a budget of this many bytes "
                                    "(a limiting_adaptor named 'replay budget')")
                        ->transform(byte_size());
  cmd->add_flag("--keep-going", f->keep_going,
                "Count every failing allocation instead of stopping at the first");
  cmd->add_flag("--json", f->json, "Print the report as JSON on stdout");
  cmd->add_option("--samples", f->samples,
                  "About how many evenly spaced samples of the pool's figures to take")
      ->check(CLI::Range(std::size_t{0}, std::size_t{100'000'000}))
      ->capture_default_str();
  cmd->add_flag("--dump", f->dump,
                "Print the pool's regions and chunks as they were when the replay stopped "
                "(the end of the log or the first failure), before the live blocks were freed");
  cmd->add_flag("--quiet", f->quiet, "No progress (a bar on a terminal, else a line every 5 s)");
  cmd->add_option("--html", f->html,
                  "Write a memory report here: one self-contained HTML page (docs/memory.md)");
  cmd->callback(guarded("memreplay", [f] { run_memreplay(*f); }));
}

}  // namespace loom::tools
