// libFuzzer target: graph_from_json on arbitrary bytes, with the standard ops.
//
// Any input must either read, or be refused with a loom::error (or std::bad_alloc); a
// loom::parse_error names a line that exists in the input (or 0). A graph that reads must
// write (graph_to_json), and what it writes must read back and write again to the same
// text: node ids of a graph built by the reader are a topological order, so the second
// round trip changes nothing (Note [graph json format]).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/graph/serialization.hpp"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "graph_json_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string written;
  try {
    const loom::graph g = loom::graph_from_json(text);
    written = loom::graph_to_json(g);
  } catch (const loom::parse_error& e) {
    const auto lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
    if (e.line() > lines) fail("parse_error names a line outside the input", e.what());
    return 0;
  } catch (const loom::error&) {
    return 0;
  } catch (const std::bad_alloc&) {
    return 0;
  }
  // What was written reads back, and writes the same text.
  try {
    const loom::graph again = loom::graph_from_json(written);
    if (loom::graph_to_json(again) != written) fail("second round trip changed the text", written);
  } catch (const loom::error& e) {
    fail("graph_to_json wrote what graph_from_json refuses",
         std::string(e.what()) + "\n" + written);
  }
  return 0;
}
