// libFuzzer target: the allocation-log parser and replay on arbitrary input.
//
// Any input must either parse, or be refused with loom::parse_error naming a line that
// exists in the input. A log that parses must describe a consistent history: every
// deallocate names a block live at that point with the size and alignment it was
// allocated with (the parser promises this), so replaying it against a small growing pool
// must leave the pool with nothing in use and its invariants intact, whatever fails for
// lack of memory along the way.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "loom/core/error.hpp"
#include "loom/memory/allocation_log.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/replay.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "allocation_log_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace loom::memory;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  allocation_log log;
  try {
    log = parse_allocation_log(in);
  } catch (const loom::parse_error& e) {
    const auto lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
    if (e.line() == 0 || e.line() > lines) fail("parse_error names a line outside the input");
    return 0;
  }
  if (log.origins().size() != log.size()) fail("one origin per event");

  bfc_pool_options options;
  options.name = "fuzz replay";
  options.growth_step = std::size_t{1} << 20;
  options.max_size = std::size_t{8} << 20;
  bfc_pool pool(host_resource::instance(), options);
  replay_options ro;
  ro.keep_going = true;
  ro.samples = 4;
  const replay_report report = replay(log, pool, ro);
  if (report.events_replayed != log.size()) fail("keep_going replays every event");
  pool.check_invariants();
  if (pool.get_stats().bytes_in_use != 0) fail("replay left blocks in use");
  return 0;
}
