// The files of `--html` (loom memreplay) and `--memory-report` (loom train).
#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "memory_report_files.hpp"
#include "loom/core/error.hpp"

namespace loom::tools {

std::ofstream open_report(const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw invalid_argument(
        fmt::format("cannot write the memory report to '{}': {}", path, std::strerror(errno)));
  }
  return out;
}

void write_report(std::ofstream& out, const std::string& path,
                  const memory::memory_picture& picture) {
  out << memory::to_html(picture);
  out.flush();
  if (!out) throw error(fmt::format("writing the memory report '{}' failed", path));
  fmt::print(stderr, "memory report: {}\n", path);
}

}  // namespace loom::tools
