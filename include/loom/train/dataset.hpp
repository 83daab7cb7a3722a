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

  [[nodiscard]] std::int64_t size() const noexcept {
    return static_cast<std::int64_t>(labels.size());
  }
};

/// `n` synthetic digit images (1×28×28, 10 classes, balanced), the same for the same seed.
dataset make_digits(std::int64_t n, std::uint64_t seed);

/// A CSV file of `label,feature_1,...,feature_F` rows (an optional header row whose first
/// field is not a number is skipped; blank lines are ignored). Labels are integers >= 0;
/// num_classes is the largest label + 1. Features of 784 = 28×28 values get the image
/// shape [1, 28, 28] (so the CNN can train on them); others [F]. Throws loom::parse_error
/// naming the file, the line and what is wrong (a bad number, a row of another width, a
/// negative label, no rows).
dataset load_csv(const std::filesystem::path& path);

/// Splits off the last `test_fraction` of the examples (after a seeded shuffle) as a test
/// set. Returns {train, test}.
std::pair<dataset, dataset> split(const dataset& d, double test_fraction, std::uint64_t seed);

}  // namespace loom::train
