// Outside input: files a user names and numbers read from text. Every place that opens such a
// file or turns its text into a number goes through here, so a missing file, a directory
// where a file was expected, an unreadable file or a number that does not parse gets one
// typed error that names the file (and what it was for) in every part of loom.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "loom/core/error.hpp"

namespace loom {

/// Checks that `path` names a file that can be opened for reading: not_found when nothing is
/// there, invalid_argument when it is a directory or not a regular file (a FIFO or a
/// character device such as /dev/stdin passes). For readers that open files their own way
/// (mmap, pread); open_input_file calls it.
void check_input_file(const std::filesystem::path& path, std::string_view what);

/// Opens `path` for reading in binary mode. `what` says what the file is for ("graph",
/// "allocation log", "dataset", ...) and starts every message. Throws not_found when nothing
/// is there, invalid_argument when it is a directory or not a regular file, error (with the
/// system's reason) when it cannot be opened.
[[nodiscard]] std::ifstream open_input_file(const std::filesystem::path& path,
                                            std::string_view what);

/// The whole of `path`, read through open_input_file; error when reading fails midway.
[[nodiscard]] std::string read_input_file(const std::filesystem::path& path,
                                          std::string_view what);

/// Checks that `path` names something that can be read as a directory (a checkpoint, a data
/// folder): not_found when nothing is there, invalid_argument when it is a file.
void require_input_directory(const std::filesystem::path& path, std::string_view what);

/// Makes `path` a directory that loom can write into (a checkpoint or output directory),
/// creating it and any missing parents; `what` names it in every message ("checkpoint
/// directory", "--output-dir"). Throws invalid_argument when `path`, or the nearest of its
/// parents that exists, is not a directory (naming which), and error with the system's
/// reason when it cannot be created or a file cannot be created in it (a read-only file
/// system, /proc, permissions). Call it before any work whose result goes there.
void create_output_directory(const std::filesystem::path& path, std::string_view what);

/// Checks, before any work, that a file can be written at `path` (a trace, a report): an
/// existing file is opened for writing and left as it is; an absent one is created and
/// removed again. Throws invalid_argument when `path` is a directory or its parent is not a
/// directory, not_found when its directory does not exist, error with the system's reason
/// otherwise.
void check_output_file(const std::filesystem::path& path, std::string_view what);

namespace detail {
[[noreturn]] void throw_bad_number(std::string_view text, std::string_view what,
                                   std::string_view expected);
}  // namespace detail

/// Parses the whole of `text` (no sign for unsigned types, no spaces, nothing after the
/// number) as a T. `what` names the value for the message ("epoch in checkpoint 'c/meta.json'",
/// "output index of 'y:x'"). Throws parse_error (line 0) naming the text, `what` and the type
/// expected, for empty text, trailing characters and values out of T's range.
template <typename T>
  requires(std::integral<T> || std::floating_point<T>) && (!std::same_as<T, bool>)
[[nodiscard]] T parse_number(std::string_view text, std::string_view what) {
  T value{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  // from_chars refuses a leading '+', which text written by people and tools may carry.
  if (last - first > 1 && first[0] == '+' && first[1] != '-' && first[1] != '+') ++first;
  const auto [end, ec] = std::from_chars(first, last, value);
  if (first == last || ec != std::errc{} || end != last) {
    if constexpr (std::is_floating_point_v<T>) {
      detail::throw_bad_number(text, what, "a number");
    } else if constexpr (std::is_unsigned_v<T>) {
      detail::throw_bad_number(text, what, "a non-negative integer");
    } else {
      detail::throw_bad_number(text, what, "an integer");
    }
  }
  return value;
}

}  // namespace loom
