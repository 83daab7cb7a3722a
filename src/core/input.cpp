#include "loom/core/input.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

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

namespace {

// The nearest of `path` and its parents that exists (empty when none does).
std::filesystem::path nearest_existing(const std::filesystem::path& path) {
  std::error_code ec;
  for (std::filesystem::path p = path; !p.empty(); p = p.parent_path()) {
    if (std::filesystem::exists(std::filesystem::status(p, ec))) return p;
    if (p == p.parent_path()) break;
  }
  return {};
}

// Throws invalid_argument when something in the way of the directory `dir` is not a
// directory; the message names `shown` (the path the caller was given).
void require_directories_on_the_way(const std::filesystem::path& dir,
                                    const std::filesystem::path& shown, std::string_view what) {
  const std::filesystem::path found = nearest_existing(dir);
  std::error_code ec;
  if (!found.empty() && !std::filesystem::is_directory(found, ec)) {
    if (found == shown) {
      throw invalid_argument(fmt::format("{} {} is a file, not a directory", what, quoted(shown)));
    }
    throw invalid_argument(fmt::format("{} {}: {} is a file, not a directory", what,
                                       quoted(shown), quoted(found)));
  }
}

}  // namespace

void create_output_directory(const std::filesystem::path& path, std::string_view what) {
  if (path.empty()) throw invalid_argument(fmt::format("{}: the path is empty", what));
  require_directories_on_the_way(path, path, what);
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    throw error(fmt::format("{} {}: cannot create it: {}", what, quoted(path), ec.message()));
  }
  if (!std::filesystem::is_directory(path, ec)) {
    throw invalid_argument(fmt::format("{} {} is not a directory", what, quoted(path)));
  }
  // Permissions, read-only file systems and pseudo-file systems answer only a real attempt.
  const std::filesystem::path probe =
      path / fmt::format(".loom-write-probe-{}", static_cast<long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err != EEXIST) {
      throw error(fmt::format("{} {}: cannot write in it: {}", what, quoted(path),
                              std::strerror(err)));
    }
    return;  // a probe of this process's, left by a concurrent call: writable
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_output_file(const std::filesystem::path& path, std::string_view what) {
  if (path.empty()) throw invalid_argument(fmt::format("{}: the path is empty", what));
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st)) {
    throw invalid_argument(
        fmt::format("{} {} is a directory; expected a file", what, quoted(path)));
  }
  const bool existed = std::filesystem::exists(st);
  if (!existed) {
    std::filesystem::path dir = path.parent_path();
    if (dir.empty()) dir = ".";
    require_directories_on_the_way(dir, path, what);
    if (!std::filesystem::exists(dir, ec)) {
      throw not_found(fmt::format("{} {}: its directory {} does not exist", what, quoted(path),
                                  quoted(dir)));
    }
  }
  // O_NONBLOCK: a FIFO without a reader is refused (ENXIO) instead of waiting for one.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
  if (fd < 0) {
    const int err = errno;
    throw error(fmt::format("{} {}: cannot write it: {}", what, quoted(path), std::strerror(err)));
  }
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
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
