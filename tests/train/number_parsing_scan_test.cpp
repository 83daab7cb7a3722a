// Numbers from outside text go through loom::parse_number (loom/core/input.hpp), which
// takes the whole text or names it in a parse_error. The C and C++ library's own parsers
// (std::stoi and kin throw std::invalid_argument / std::out_of_range that name nothing, and
// atoi, strtol and kin return 0 or a prefix without a word) may not appear in loom's sources:
// src/, tools/ and python/src/. This test reads the source tree and names each use by
// file:line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The repository: LOOM_TEST_DATA_DIR is <repository>/tests/data.
fs::path repository() {
  return fs::path(LOOM_TEST_DATA_DIR).parent_path().parent_path();
}


bool identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Whether `line` uses an unchecked parser: std::stoi, stol, stoll, stoul, stoull, stof, stod,
// stold (as a whole name), or one of the C functions called by name (atoi(, ::strtol (, ...).
// (By hand: GCC 12 warns inside <regex> in sanitizer builds, and warnings are errors in CI.)
bool uses_unchecked_parser(std::string_view line) {
  static const std::vector<std::string_view> std_names = {"stoi",   "stol", "stoll", "stoul",
                                                          "stoull", "stof", "stod",  "stold"};
  static const std::vector<std::string_view> c_names = {"atoi",   "atol",    "atoll",   "atof",
                                                        "strtol", "strtoll", "strtoul", "strtoull",
                                                        "strtof", "strtod",  "strtold"};
  const auto ends_name = [&](std::size_t at) {
    return at >= line.size() || !identifier_char(line[at]);
  };
  for (std::size_t at = line.find("std::sto"); at != std::string_view::npos;
       at = line.find("std::sto", at + 1)) {
    const std::size_t name = at + 5;
    for (const auto n : std_names) {
      if (line.substr(name, n.size()) == n && ends_name(name + n.size())) return true;
    }
  }
  for (const auto n : c_names) {
    for (std::size_t at = line.find(n); at != std::string_view::npos; at = line.find(n, at + 1)) {
      if (at > 0 && identifier_char(line[at - 1])) continue;  // my_atoi(
      std::size_t after = at + n.size();
      while (after < line.size() && (line[after] == ' ' || line[after] == '\t')) ++after;
      if (after < line.size() && line[after] == '(') return true;
    }
  }
  return false;
}

bool is_source(const fs::path& p) {
  static const std::vector<std::string> extensions = {".cpp", ".hpp", ".h",  ".c",
                                                      ".cc",  ".cu",  ".cuh"};
  return std::find(extensions.begin(), extensions.end(), p.extension().string()) !=
         extensions.end();
}

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

// file:line: text of every use of an unchecked parser under the given folders.
std::vector<std::string> unchecked_parses(const std::vector<std::string>& folders,
                                          std::size_t* files_read) {
  std::vector<std::string> found;
  const fs::path root = repository();
  for (const auto& folder : folders) {
    if (!fs::exists(root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      ++*files_read;
      const std::string rel = fs::relative(entry.path(), root).generic_string();
      std::ifstream in(entry.path());
      std::string line;
      for (std::size_t number = 1; std::getline(in, line); ++number) {
        if (!uses_unchecked_parser(line)) continue;
        found.push_back(rel + ":" + std::to_string(number) + ": " + trimmed(line));
      }
    }
  }
  return found;
}

TEST(NumberParsing, NoUncheckedParserInLoomsSources) {
  std::size_t files = 0;
  const auto found = unchecked_parses({"src", "tools", "python/src"}, &files);
  EXPECT_GT(files, 100u) << "the source tree was not found at " << repository();
  std::string listing;
  for (const auto& f : found) listing += "\n  " + f;
  EXPECT_TRUE(found.empty()) << "parse outside text with loom::parse_number "
                                "(loom/core/input.hpp) instead of:"
                             << listing;
}

TEST(NumberParsing, TheScanFindsWhatItLooksFor) {
  // The pattern itself: each parser is found, look-alikes are not.
  for (const char* use :
       {"x = std::stoi(s);", "std::stoull(t, nullptr, 16)", "std::stod(v)", "atoi(argv[1])",
        "::strtol(p, &end, 10)", "std::strtod(p, nullptr)", "strtoul (p, 0, 0)", "atof(s)"}) {
    EXPECT_TRUE(uses_unchecked_parser(use)) << use;
  }
  for (const char* fine :
       {"std::stop_token t;", "std::stoppable", "my_atoi(s)", "parse_number<int>(s, \"n\")",
        "std::from_chars(a, b, v)", "std::stoic", "my_strtod (x)", "atoi_table[3]"}) {
    EXPECT_FALSE(uses_unchecked_parser(fine)) << fine;
  }
}

}  // namespace
