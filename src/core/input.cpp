#include "loom/core/input.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace loom {
namespace {

std::string quoted(const std::filesystem::path& path) { return fmt::format("'{}'", path.string()); }

// What is at `path`: throws for nothing there; returns its status otherwise.
std::filesystem::file_status status_of(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    throw not_found(fmt::format("{} {}: no such file or directory", what, quoted(path)));
  }
  if (ec) throw error(fmt::format("{} {}: {}", what, quoted(path), ec.message()));
  return st;
}

}  // namespace

void check_input_file(const std::filesystem::path& path, std::string_view what) {
  const auto st = status_of(path, what);
  if (std::filesystem::is_directory(st)) {
    throw invalid_argument(
        fmt::format("{} {} is a directory; expected a file", what, quoted(path)));
  }
  if (!std::filesystem::is_regular_file(st) && !std::filesystem::is_fifo(st) &&
      !std::filesystem::is_character_file(st)) {
    throw invalid_argument(fmt::format("{} {} is not a regular file", what, quoted(path)));
  }
}

std::ifstream open_input_file(const std::filesystem::path& path, std::string_view what) {
  check_input_file(path, what);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw error(fmt::format("{} {}: cannot open: {}", what, quoted(path),
                            err != 0 ? std::strerror(err) : "unknown reason"));
  }
  return in;
}

std::string read_input_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in = open_input_file(path, what);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw error(fmt::format("{} {}: reading failed", what, quoted(path)));
  return std::move(text).str();
}

void require_input_directory(const std::filesystem::path& path, std::string_view what) {
  const auto st = status_of(path, what);
  if (!std::filesystem::is_directory(st)) {
    throw invalid_argument(
        fmt::format("{} {} is not a directory", what, quoted(path)));
  }
}

namespace detail {
void throw_bad_number(std::string_view text, std::string_view what, std::string_view expected) {
  constexpr std::size_t shown = 40;
  const std::string excerpt = text.size() > shown
                                  ? fmt::format("{}...", text.substr(0, shown))
                                  : std::string(text);
  throw parse_error(fmt::format("{}: '{}' is not {} in range", what, excerpt, expected), 0);
}
}  // namespace detail

}  // namespace loom
