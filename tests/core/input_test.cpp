// Outside input: opening files a user names and parsing numbers from text.
#include "loom/core/input.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

namespace {

namespace fs = std::filesystem;

class InputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_input_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return {};
}

TEST_F(InputFiles, ReadsAFileWhole) {
  const auto path = dir_ / "a.txt";
  std::ofstream(path, std::ios::binary) << "one\0two";
  EXPECT_EQ(loom::read_input_file(path, "text"), std::string("one"));
  std::ofstream(path, std::ios::binary).write("x\0y", 3);
  EXPECT_EQ(loom::read_input_file(path, "text"), std::string("x\0y", 3));
}

TEST_F(InputFiles, MissingFileIsNotFoundNamingPathAndPurpose) {
  const auto msg = message_of<loom::not_found>(
      [&] { (void)loom::open_input_file(dir_ / "nope.json", "graph file"); });
  EXPECT_NE(msg.find("graph file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nope.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

TEST_F(InputFiles, DirectoryWhereAFileIsExpectedSaysSo) {
  const auto msg =
      message_of<loom::invalid_argument>([&] { (void)loom::read_input_file(dir_, "dataset"); });
  EXPECT_NE(msg.find("is a directory; expected a file"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir_.string()), std::string::npos) << msg;
}

TEST_F(InputFiles, UnreadableFileGivesTheSystemsReason) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const auto path = dir_ / "secret";
  std::ofstream(path) << "x";
  fs::permissions(path, fs::perms::none);
  const auto msg = message_of<loom::error>([&] { (void)loom::open_input_file(path, "log"); });
  EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
}

TEST_F(InputFiles, RequireDirectory) {
  EXPECT_NO_THROW(loom::require_input_directory(dir_, "checkpoint"));
  const auto file = dir_ / "f";
  std::ofstream(file) << "x";
  EXPECT_THROW(loom::require_input_directory(file, "checkpoint"), loom::invalid_argument);
  EXPECT_THROW(loom::require_input_directory(dir_ / "none", "checkpoint"), loom::not_found);
}

TEST(ParseNumber, AcceptsWholeNumbersInRange) {
  EXPECT_EQ(loom::parse_number<int>("42", "n"), 42);
  EXPECT_EQ(loom::parse_number<int>("+42", "n"), 42);
  EXPECT_EQ(loom::parse_number<int>("-7", "n"), -7);
  EXPECT_EQ(loom::parse_number<std::int64_t>("9223372036854775807", "n"),
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(loom::parse_number<std::uint8_t>("255", "n"), 255);
  EXPECT_DOUBLE_EQ(loom::parse_number<double>("1.5e3", "x"), 1500.0);
  EXPECT_DOUBLE_EQ(loom::parse_number<double>("+0.25", "x"), 0.25);
}

TEST(ParseNumber, RefusesWhatIsNotExactlyANumberOfTheType) {
  for (const char* bad : {"", "+", "-", "abc", "12abc", " 12", "12 ", "1.5", "+-3", "++3",
                          "2147483648", "-2147483649", "0x10"}) {
    try {
      (void)loom::parse_number<int>(bad, "epoch in 'meta.json'");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const loom::parse_error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("epoch in 'meta.json'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("an integer"), std::string::npos) << msg;
    }
  }
  EXPECT_THROW((void)loom::parse_number<unsigned>("-1", "n"), loom::parse_error);
  EXPECT_THROW((void)loom::parse_number<std::uint8_t>("256", "n"), loom::parse_error);
  EXPECT_THROW((void)loom::parse_number<double>("1e999", "x"), loom::parse_error);
  EXPECT_THROW((void)loom::parse_number<double>("1.0.0", "x"), loom::parse_error);
}

}  // namespace
