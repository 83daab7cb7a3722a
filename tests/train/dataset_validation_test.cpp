// What load_csv and check_dataset refuse, and how they say it: a header only as the first
// row, labels that are class numbers (integers >= 0, below the declared class count, not
// implying more classes than max_classes), rows of one width, features that are numbers,
// NaN and Inf named by file, line and column.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "loom/core/error.hpp"
#include "loom/train/dataset.hpp"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

class DatasetValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom_dataset_validation_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& text, const std::string& name = "data.csv") const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  // The parse_error load_csv throws for `text`: its message and line.
  std::pair<std::string, std::size_t> failure(const std::string& text,
                                              const csv_options& o = {}) const {
    const fs::path p = write(text);
    try {
      (void)load_csv(p, o);
    } catch (const parse_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p.string(), 0), 0u) << "the message starts with the file: " << msg;
      return {msg, e.line()};
    }
    ADD_FAILURE() << "no error for:\n" << text;
    return {"", 0};
  }

  fs::path dir_;
};

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST_F(DatasetValidation, AHeaderIsRecognisedOnlyAsTheFirstRow) {
  const dataset d = load_csv(write("label,a,b\n1,2,3\n0,4,5\n"));
  EXPECT_EQ(d.labels, (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(d.source_lines, (std::vector<std::size_t>{2, 3}));

  // A second non-numeric row is not a header: before, it was skipped as one.
  auto [msg, line] = failure("label,a,b\nlabel,a,b\n1,2,3\n");
  EXPECT_EQ(line, 2u);
  expect_has(msg, "data.csv:2: the label 'label' (column 1) is not a number");
  std::tie(msg, line) = failure("1,2,3\nx,4,5\n0,6,7\n");
  EXPECT_EQ(line, 2u);
  expect_has(msg, "the label 'x' (column 1) is not a number");
  std::tie(msg, line) = failure("1,2,3\n0,4,5\nlabel,a,b\n");
  EXPECT_EQ(line, 3u);

  // Blank lines before the header are not rows; a byte order mark is not part of the text.
  EXPECT_EQ(load_csv(write("\n  \nlabel,a\n1,2\n")).labels, (std::vector<std::int32_t>{1}));
  const dataset bom =
      load_csv(write("\xEF\xBB\xBF"
                     "1,2\n0,3\n"));
  EXPECT_EQ(bom.labels, (std::vector<std::int32_t>{1, 0}));  // the first row is data
  EXPECT_EQ(load_csv(write("\xEF\xBB\xBFlabel,x\n1,2\n")).labels, (std::vector<std::int32_t>{1}));
}

TEST_F(DatasetValidation, EmptyAndHeaderOnlyFilesAreErrors) {
  auto [msg, line] = failure("");
  expect_has(msg, "data.csv: no data rows (the file is empty)");
  EXPECT_EQ(line, 0u);
  std::tie(msg, line) = failure("\n \n\t\n");
  expect_has(msg, "data.csv: no data rows (only blank lines)");
  std::tie(msg, line) = failure("label,a,b\n");
  expect_has(msg, "data.csv:1: a header but no data rows");
  EXPECT_EQ(line, 1u);
  std::tie(msg, line) = failure("\nlabel,a,b\n\n\n");
  expect_has(msg, "data.csv:2: a header but no data rows");
  EXPECT_EQ(line, 2u);
}

TEST_F(DatasetValidation, EveryRowHasTheWidthOfTheHeaderOrTheFirstRow) {
  auto [msg, line] = failure("label,a,b\n1,2,3\n0,4\n");
  EXPECT_EQ(line, 3u);
  expect_has(msg, "the row has 2 columns, but the header (line 1) has 3");
  std::tie(msg, line) = failure("label,a\n1,2,3\n");
  EXPECT_EQ(line, 2u);
  expect_has(msg, "the row has 3 columns, but the header (line 1) has 2");
  std::tie(msg, line) = failure("1,2\n0,3\n1,4,5\n");
  EXPECT_EQ(line, 3u);
  expect_has(msg, "the row has 3 columns, but the first row (line 1) has 2");
  std::tie(msg, line) = failure("label\n1\n");
  expect_has(msg, "the header has 1 column; a row needs a label and at least one feature");
}

TEST_F(DatasetValidation, LabelsAreClassNumbers) {
  // Integers, written as integers or integral numbers.
  EXPECT_EQ(load_csv(write("1.0,2\n+2,3\n0,4\n")).labels, (std::vector<std::int32_t>{1, 2, 0}));
  const struct {
    std::string text;
    std::string part;
    std::size_t line;
  } cases[] = {
      {"1,2\n-1,3\n", "the label -1 is negative", 2},
      {"1,2\n-0.5,3\n", "the label -0.5 is negative", 2},
      {"1,2\n2.5,3\n", "the label 2.5 is not an integer", 2},
      {"1,2\nnan,3\n", "the label 'nan' is not a class number", 2},
      {"1,2\ninf,3\n", "the label 'inf' is not a class number", 2},
      {"1,2\n,3\n", "the label (column 1) is empty", 2},
      {"1,2\n0x10,3\n", "the label '0x10' (column 1) is not a number", 2},
      {"1,2\n3 4,3\n", "the label '3 4' (column 1) is not a number", 2},
  };
  for (const auto& c : cases) {
    const auto [msg, line] = failure(c.text);
    expect_has(msg, c.part);
    EXPECT_EQ(line, c.line) << msg;
  }
}

TEST_F(DatasetValidation, AHugeLabelIsAnErrorUnlessTheClassesAreDeclared) {
  // Before, one label of 999999 built a model of a million classes without a word.
  auto [msg, line] = failure("1,2\n0,3\n999999,4\n");
  EXPECT_EQ(line, 3u);
  expect_has(msg, "the label 999999 would make 1000000 classes, more than 10000");
  expect_has(msg, "--classes N");
  std::tie(msg, line) = failure("1,2\n1e300,4\n");
  expect_has(msg, "would make too many classes");
  // The largest label the default allows: 10000 classes.
  EXPECT_EQ(load_csv(write("9999,1\n0,2\n")).num_classes, 10000);
  std::tie(msg, line) = failure("10000,1\n");
  expect_has(msg, "would make 10001 classes, more than 10000");
  // A caller may raise (or lower) the bound.
  csv_options wide;
  wide.max_classes = 20000;
  EXPECT_EQ(load_csv(write("10000,1\n"), wide).num_classes, 10001);
  csv_options narrow;
  narrow.max_classes = 3;
  std::tie(msg, line) = failure("3,1\n", narrow);
  expect_has(msg, "would make 4 classes, more than 3");
}

TEST_F(DatasetValidation, DeclaredClassesBoundTheLabelsAndSetTheCount) {
  csv_options o;
  o.classes = 5;
  const dataset d = load_csv(write("1,2\n0,3\n"), o);
  EXPECT_EQ(d.num_classes, 5);  // not the largest label + 1
  auto [msg, line] = failure("1,2\n0,3\n5,4\n", o);
  EXPECT_EQ(line, 3u);
  expect_has(msg, "the label 5 is not below the declared class count 5 (labels 0 to 4)");
  // A declared count may exceed max_classes: the caller asked for it.
  o.classes = 50000;
  EXPECT_EQ(load_csv(write("20000,1\n"), o).num_classes, 50000);
  o.classes = -1;
  EXPECT_THROW((void)load_csv(write("1,2\n"), o), invalid_argument);
}

TEST_F(DatasetValidation, FeaturesAreNumbersNamedByLineAndColumn) {
  const struct {
    std::string text;
    std::string part;
    std::size_t line;
  } cases[] = {
      {"1,2,3\n0,4,abc\n", "data.csv:2: column 3 ('abc') is not a number", 2},
      {"1,2,3\n0,,5\n", "data.csv:2: column 2 is empty", 2},
      {"1,2,3\n0,1e50,5\n", "column 2 ('1e50') is out of float32's range", 2},
      {"1,2,3\n0,4,5 6\n", "column 3 ('5 6') is not a number", 2},
      {"1,2,3\n0,4,\"5\"\n", "column 3 ('\"5\"') is not a number", 2},
  };
  for (const auto& c : cases) {
    const auto [msg, line] = failure(c.text);
    expect_has(msg, c.part);
    EXPECT_EQ(line, c.line) << msg;
  }
}

TEST_F(DatasetValidation, NonFiniteFeaturesAreReadAndRefusedByCheckDataset) {
  const fs::path p = write("label,a,b\n1,0.5,1\n\n0,nan,2\n1,3,-inf\n");
  const dataset d = load_csv(p);  // read as written
  ASSERT_EQ(d.size(), 3);
  EXPECT_TRUE(std::isnan(d.features[2]));
  EXPECT_TRUE(std::isinf(d.features[5]));
  try {
    check_dataset(d);
    FAIL() << "NaN accepted";
  } catch (const invalid_argument& e) {
    expect_has(e.what(), p.string() + ":4: column 2 (feature 0) is nan");
    expect_has(e.what(), "--allow-nonfinite");
  }
  EXPECT_NO_THROW(check_dataset(d, /*allow_nonfinite=*/true));

  // After a split, the lines still name the rows of the file.
  const auto [train_part, test_part] = split(d, 0.0, 3);
  ASSERT_EQ(train_part.source_lines.size(), 3u);
  try {
    dataset only_inf = train_part;
    for (std::size_t i = 0; i < only_inf.features.size(); ++i) {
      if (std::isnan(only_inf.features[i])) only_inf.features[i] = 0;
    }
    check_dataset(only_inf);
    FAIL() << "Inf accepted";
  } catch (const invalid_argument& e) {
    expect_has(e.what(), p.string() + ":5: column 3 (feature 1) is -inf");
  }
}

TEST_F(DatasetValidation, CheckDatasetNamesExamplesOfGeneratedData) {
  dataset d = make_digits(30, 2);
  EXPECT_NO_THROW(check_dataset(d));
  d.features[3 * 784 + 5] = std::numeric_limits<float>::infinity();
  try {
    check_dataset(d);
    FAIL() << "Inf accepted";
  } catch (const invalid_argument& e) {
    expect_has(e.what(), "dataset 'digits', example 3: feature 5 is inf");
  }
  d = make_digits(30, 2);
  d.labels[7] = 10;
  try {
    check_dataset(d);
    FAIL() << "label 10 of 10 classes accepted";
  } catch (const invalid_argument& e) {
    expect_has(e.what(), "example 7: label 10 is outside the 10 classes (0 to 9)");
  }
  d = make_digits(30, 2);
  d.features.pop_back();
  EXPECT_THROW(check_dataset(d), invalid_argument);
}

}  // namespace
}  // namespace loom::train
