// Datasets for `loom train`: an embedded synthetic one and users' CSV files.
//
// The default dataset, "digits", draws the ten digits as seven-segment glyphs on a 28×28
// canvas, each with its own offset, scale, slant, stroke width, brightness, a segment
// sometimes faded, and pixel noise: deterministic for a seed, no download, and hard enough
// that a linear model does not solve it. Images are row-major float32 in [0, 1].
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/core/shape.hpp"

namespace loom::train {

struct dataset {
  std::string name;
  /// num_examples × num_features, row-major.
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  std::int64_t num_features = 0;
  std::int32_t num_classes = 0;
  /// The shape of one example ([784], or [1, 28, 28] for images).
  shape example_shape;
  /// Where the examples came from, for messages: the file (empty for generated data) and,
  /// per example, its 1-based line in that file (empty for generated data).
  std::string source;
  std::vector<std::size_t> source_lines;

  [[nodiscard]] std::int64_t size() const noexcept {
    return static_cast<std::int64_t>(labels.size());
  }
};

/// `n` synthetic digit images (1×28×28, 10 classes, balanced), the same for the same seed.
dataset make_digits(std::int64_t n, std::uint64_t seed);

/// What load_csv accepts.
struct csv_options {
  /// The number of classes, when the caller knows it: every label must be below it. 0: the
  /// largest label + 1, which may not exceed max_classes.
  std::int32_t classes = 0;
  /// The most classes the labels may imply when `classes` is 0: a stray label such as
  /// 1000000 would otherwise build a model with a million outputs.
  std::int32_t max_classes = 10000;
};

/// A CSV file of `label,feature_1,...,feature_F` rows. The first row (the first line that is
/// not blank) is a header when its first field is not a number; blank lines are ignored; a
/// UTF-8 byte order mark is skipped. Labels are class numbers: integers >= 0 (written "3" or
/// "3.0"); num_classes is options.classes, or the largest label + 1. Features are float32
/// values; NaN and Inf are read as such (the trainer refuses them: check_dataset). Features
/// of 784 = 28×28 values get the image shape [1, 28, 28] (so the CNN can train on them);
/// others [F]. Throws loom::parse_error naming the file, the line and what is wrong: a
/// label or feature that is not a number (naming its column), a negative or fractional
/// label, a label at or above options.classes or implying more than options.max_classes
/// classes, a row with another number of columns than the header or the first row, a row
/// without features, a file with no data rows. Throws as open_input_file for a file that
/// cannot be read.
dataset load_csv(const std::filesystem::path& path, const csv_options& options = {});

/// Checks that `d` can be trained on: features hold size() × num_features values, at least
/// one class, every label in [0, num_classes), and (unless allow_nonfinite) every feature
/// finite. Throws loom::invalid_argument naming the first fault: the file, line and column
/// for a dataset read from a file (source_lines), the example and feature otherwise.
void check_dataset(const dataset& d, bool allow_nonfinite = false);

/// Splits off the last `test_fraction` of the examples (after a seeded shuffle) as a test
/// set. Returns {train, test}.
std::pair<dataset, dataset> split(const dataset& d, double test_fraction, std::uint64_t seed);

}  // namespace loom::train
