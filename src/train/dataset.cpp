#include "loom/core/input.hpp"
#include "loom/train/dataset.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <fstream>
#include <random>

#include "loom/core/error.hpp"
#include "random_bits.hpp"

namespace loom::train {
namespace {

// Uniform and roughly normal doubles, reproducible anywhere (random_bits.hpp).
class random_source {
 public:
  explicit random_source(std::uint64_t seed) : rng_(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * unit_uniform(rng_); }
  // Approximately normal (Irwin-Hall of 4), enough for pixel noise.
  double normal(double sigma) {
    double s = 0;
    for (int k = 0; k < 4; ++k) s += uniform(-1.0, 1.0);
    return s * sigma * std::sqrt(3.0 / 4.0);
  }

 private:
  std::mt19937_64 rng_;
};

// Seven segments in a glyph box [0, 1]²: x to the right, y down.
struct segment {
  double x0, y0, x1, y1;
};
constexpr std::array<segment, 7> segments = {{
    {0.2, 0.1, 0.8, 0.1},  // a: top
    {0.8, 0.1, 0.8, 0.5},  // b: upper right
    {0.8, 0.5, 0.8, 0.9},  // c: lower right
    {0.2, 0.9, 0.8, 0.9},  // d: bottom
    {0.2, 0.5, 0.2, 0.9},  // e: lower left
    {0.2, 0.1, 0.2, 0.5},  // f: upper left
    {0.2, 0.5, 0.8, 0.5},  // g: middle
}};
// Segments lit for each digit (bit k = segment k).
constexpr std::array<unsigned, 10> digit_segments = {
    0b0111111, 0b0000110, 0b1011011, 0b1001111, 0b1100110,
    0b1101101, 0b1111101, 0b0000111, 0b1111111, 0b1101111,
};

double distance_to_segment(double px, double py, const segment& s) {
  const double dx = s.x1 - s.x0;
  const double dy = s.y1 - s.y0;
  const double len2 = dx * dx + dy * dy;
  const double t = std::clamp(((px - s.x0) * dx + (py - s.y0) * dy) / len2, 0.0, 1.0);
  const double cx = s.x0 + t * dx - px;
  const double cy = s.y0 + t * dy - py;
  return std::sqrt(cx * cx + cy * cy);
}

constexpr int side = 28;

void draw_digit(int digit, random_source& r, float* out) {
  const double scale = r.uniform(14.0, 20.0);  // glyph box size in pixels
  const double slant = r.uniform(-0.25, 0.25);
  const double cx = 14.0 + r.uniform(-3.0, 3.0);
  const double cy = 14.0 + r.uniform(-2.5, 2.5);
  const double width = r.uniform(1.2, 2.6) / scale;  // stroke width in glyph units
  const double brightness = r.uniform(0.6, 1.0);
  std::array<double, 7> strength{};
  for (std::size_t k = 0; k < 7; ++k) {
    const bool lit = ((digit_segments[static_cast<std::size_t>(digit)] >> k) & 1U) != 0;
    // Now and then a lit segment is faint, or an unlit one leaves a trace.
    const double fade = r.uniform(0.0, 1.0);
    strength[k] = lit ? (fade < 0.08 ? r.uniform(0.2, 0.5) : 1.0) : (fade < 0.05 ? 0.3 : 0.0);
  }
  const double aa = 0.7 / scale;  // anti-aliasing ramp, about a pixel
  for (int y = 0; y < side; ++y) {
    for (int x = 0; x < side; ++x) {
      // Pixel centre to glyph coordinates (inverse of scale, slant, offset).
      const double gy = (y + 0.5 - cy) / scale + 0.5;
      const double gx = (x + 0.5 - cx) / scale + 0.5 + slant * (gy - 0.5);
      double v = 0;
      for (std::size_t k = 0; k < 7; ++k) {
        if (strength[k] == 0.0) continue;
        const double d = distance_to_segment(gx, gy, segments[k]);
        const double cover = std::clamp((width / 2 + aa - d) / aa, 0.0, 1.0);
        v = std::max(v, cover * strength[k]);
      }
      v = v * brightness + r.normal(0.08);
      out[y * side + x] = static_cast<float>(std::clamp(v, 0.0, 1.0));
    }
  }
}

[[noreturn]] void csv_error(const std::filesystem::path& path, std::size_t line,
                            const std::string& what) {
  throw parse_error(fmt::format("{}:{}: {}", path.string(), line, what), line);
}

}  // namespace

dataset make_digits(std::int64_t n, std::uint64_t seed) {
  if (n < 0) throw invalid_argument(fmt::format("make_digits: n = {} must be >= 0", n));
  dataset d;
  d.name = "digits";
  d.num_features = side * side;
  d.num_classes = 10;
  d.example_shape = {1, side, side};
  d.features.resize(static_cast<std::size_t>(n * d.num_features));
  d.labels.resize(static_cast<std::size_t>(n));
  random_source r(seed);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::int32_t>(i % 10);
    d.labels[static_cast<std::size_t>(i)] = label;
    draw_digit(label, r, d.features.data() + i * d.num_features);
  }
  return d;
}

dataset load_csv(const std::filesystem::path& path) {
  std::ifstream in = open_input_file(path, "dataset");
  dataset d;
  d.name = path.filename().string();
  std::string text;
  std::size_t line_no = 0;
  std::int32_t max_label = -1;
  std::vector<float> row;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    row.clear();
    std::size_t pos = 0;
    bool header = false;
    for (std::size_t field = 0;; ++field) {
      const std::size_t end = std::min(text.find(',', pos), text.size());
      std::string_view cell(text.data() + pos, end - pos);
      while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
      while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t')) cell.remove_suffix(1);
      float v = 0;
      const auto [p, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
      if (ec != std::errc() || p != cell.data() + cell.size() || cell.empty()) {
        if (field == 0 && d.labels.empty() && d.num_features == 0) {
          header = true;  // a header row
          break;
        }
        csv_error(path, line_no, fmt::format("field {} ('{}') is not a number", field + 1, cell));
      }
      row.push_back(v);
      if (end == text.size()) break;
      pos = end + 1;
    }
    if (header) continue;
    if (row.size() < 2) csv_error(path, line_no, "a row needs a label and at least one feature");
    const float label = row[0];
    if (label < 0 || label != std::floor(label) || label > 1e6f) {
      csv_error(path, line_no, fmt::format("label {} is not an integer >= 0", label));
    }
    const auto features = static_cast<std::int64_t>(row.size() - 1);
    if (d.num_features == 0) {
      d.num_features = features;
    } else if (features != d.num_features) {
      csv_error(path, line_no,
                fmt::format("{} features, but the first row has {}", features, d.num_features));
    }
    d.labels.push_back(static_cast<std::int32_t>(label));
    max_label = std::max(max_label, d.labels.back());
    d.features.insert(d.features.end(), row.begin() + 1, row.end());
  }
  if (d.labels.empty()) csv_error(path, line_no, "no data rows");
  d.num_classes = max_label + 1;
  d.example_shape = d.num_features == side * side ? shape{1, side, side} : shape{d.num_features};
  return d;
}

std::pair<dataset, dataset> split(const dataset& d, double test_fraction, std::uint64_t seed) {
  if (!(test_fraction >= 0.0 && test_fraction < 1.0)) {
    throw invalid_argument(fmt::format("test fraction {} must be in [0, 1)", test_fraction));
  }
  std::mt19937_64 rng(seed);
  const std::vector<std::int64_t> order = shuffled_indices(static_cast<std::size_t>(d.size()), rng);
  const auto n_test =
      static_cast<std::int64_t>(std::llround(static_cast<double>(d.size()) * test_fraction));
  std::pair<dataset, dataset> out;
  for (auto* part : {&out.first, &out.second}) {
    part->name = d.name;
    part->num_features = d.num_features;
    part->num_classes = d.num_classes;
    part->example_shape = d.example_shape;
  }
  const std::int64_t n_train = d.size() - n_test;
  for (std::int64_t k = 0; k < d.size(); ++k) {
    dataset& to = k < n_train ? out.first : out.second;
    const std::int64_t i = order[static_cast<std::size_t>(k)];
    to.labels.push_back(d.labels[static_cast<std::size_t>(i)]);
    const auto* f = d.features.data() + i * d.num_features;
    to.features.insert(to.features.end(), f, f + d.num_features);
  }
  return out;
}

}  // namespace loom::train
