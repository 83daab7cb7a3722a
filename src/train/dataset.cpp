#include "loom/train/dataset.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
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

// A field as written (trimmed), for messages: at most 40 characters.
std::string shown(std::string_view cell) {
  constexpr std::size_t most = 40;
  return cell.size() > most ? fmt::format("{}...", cell.substr(0, most)) : std::string(cell);
}

// The fields of a CSV line, trimmed of spaces and tabs (no quoting: the fields are numbers).
void split_fields(std::string_view text, std::vector<std::string_view>& cells) {
  cells.clear();
  std::size_t pos = 0;
  for (;;) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    std::string_view cell = text.substr(pos, end - pos);
    while (!cell.empty() && (cell.front() == ' ' || cell.front() == '\t')) cell.remove_prefix(1);
    while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t')) cell.remove_suffix(1);
    cells.push_back(cell);
    if (end == text.size()) break;
    pos = end + 1;
  }
}

// Whether `cell` is a number as loom reads one (so that a header can be told from data).
bool is_number(std::string_view cell) {
  try {
    (void)parse_number<double>(cell, "field");
    return true;
  } catch (const parse_error&) {
    return false;
  }
}

// The label of a row: a class number, an integer >= 0, below `classes` when that is known.
std::int32_t parse_label(std::string_view cell, const std::filesystem::path& path, std::size_t line,
                         const csv_options& o) {
  double v = 0;
  try {
    v = parse_number<double>(cell, "label");
  } catch (const parse_error&) {
    csv_error(path, line,
              cell.empty() ? std::string("the label (column 1) is empty")
                           : fmt::format("the label '{}' (column 1) is not a number", shown(cell)));
  }
  if (!std::isfinite(v)) {
    csv_error(path, line, fmt::format("the label '{}' is not a class number", shown(cell)));
  }
  if (v < 0) {
    csv_error(path, line,
              fmt::format("the label {} is negative; labels are class numbers 0, 1, 2, ...",
                          shown(cell)));
  }
  if (v != std::floor(v)) {
    csv_error(path, line,
              fmt::format("the label {} is not an integer; labels are class numbers 0, 1, 2, ...",
                          shown(cell)));
  }
  if (o.classes > 0 && v >= o.classes) {
    csv_error(path, line,
              fmt::format("the label {} is not below the declared class count {} (labels 0 to {})",
                          shown(cell), o.classes, o.classes - 1));
  }
  if (o.classes == 0 && v >= o.max_classes) {
    csv_error(path, line,
              fmt::format("the label {} would make {} classes, more than {} (a label column "
                          "with another meaning? Declare the class count to allow more: "
                          "loom train --classes N, csv_options::classes)",
                          shown(cell),
                          v + 1 > 1e15 ? std::string("too many") : fmt::format("{:.0f}", v + 1),
                          o.max_classes));
  }
  return static_cast<std::int32_t>(v);
}

// A feature: any float32 value, NaN and Inf included (check_dataset judges those).
float parse_feature(std::string_view cell, const std::filesystem::path& path, std::size_t line,
                    std::size_t column) {
  try {
    return parse_number<float>(cell, "feature");
  } catch (const parse_error&) {
    if (cell.empty()) csv_error(path, line, fmt::format("column {} is empty", column));
    if (is_number(cell)) {
      csv_error(path, line,
                fmt::format("column {} ('{}') is out of float32's range", column, shown(cell)));
    }
    csv_error(path, line, fmt::format("column {} ('{}') is not a number", column, shown(cell)));
  }
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

dataset load_csv(const std::filesystem::path& path, const csv_options& options) {
  if (options.classes < 0 || options.max_classes < 1) {
    throw invalid_argument(fmt::format("load_csv: classes {} must be >= 0 and max_classes {} >= 1",
                                       options.classes, options.max_classes));
  }
  std::ifstream in = open_input_file(path, "dataset");
  dataset d;
  d.name = path.filename().string();
  d.source = path.string();
  std::string text;
  std::size_t line_no = 0;
  std::int32_t max_label = -1;
  // The row that sets the width: the header, or else the first data row.
  std::size_t width = 0;
  std::size_t width_line = 0;
  bool header = false;
  std::vector<std::string_view> cells;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    std::string_view line = text;
    if (line_no == 1 && line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);  // a BOM
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    split_fields(line, cells);
    if (width == 0) {
      // The first row: a header when its first field is not a number (only here).
      header = !is_number(cells[0]);
      width = cells.size();
      width_line = line_no;
      if (width < 2) {
        csv_error(path, line_no,
                  fmt::format("{} has {} column; a row needs a label and at least one feature",
                              header ? "the header" : "the row", width));
      }
      d.num_features = static_cast<std::int64_t>(width - 1);
      if (header) continue;
    } else if (cells.size() != width) {
      csv_error(path, line_no,
                fmt::format("the row has {} column{}, but {} (line {}) has {}", cells.size(),
                            cells.size() == 1 ? "" : "s", header ? "the header" : "the first row",
                            width_line, width));
    }
    d.labels.push_back(parse_label(cells[0], path, line_no, options));
    max_label = std::max(max_label, d.labels.back());
    for (std::size_t c = 1; c < cells.size(); ++c) {
      d.features.push_back(parse_feature(cells[c], path, line_no, c + 1));
    }
    d.source_lines.push_back(line_no);
  }
  if (in.bad()) throw error(fmt::format("dataset '{}': reading failed", path.string()));
  if (d.labels.empty()) {
    if (header) csv_error(path, width_line, "a header but no data rows");
    throw parse_error(fmt::format("{}: no data rows ({})", path.string(),
                                  line_no == 0 ? "the file is empty" : "only blank lines"),
                      0);
  }
  d.num_classes = options.classes > 0 ? options.classes : max_label + 1;
  d.example_shape = d.num_features == side * side ? shape{1, side, side} : shape{d.num_features};
  return d;
}

void check_dataset(const dataset& d, bool allow_nonfinite) {
  const auto n = static_cast<std::size_t>(d.size());
  const auto f = static_cast<std::size_t>(std::max<std::int64_t>(d.num_features, 0));
  const std::string name = d.source.empty() ? fmt::format("dataset '{}'", d.name)
                                            : fmt::format("dataset '{}'", d.source);
  if (d.num_features < 1 || d.features.size() != n * f) {
    throw invalid_argument(fmt::format("{}: {} features for {} examples of {} features", name,
                                       d.features.size(), n, d.num_features));
  }
  if (!d.source_lines.empty() && d.source_lines.size() != n) {
    throw invalid_argument(
        fmt::format("{}: {} source lines for {} examples", name, d.source_lines.size(), n));
  }
  if (d.num_classes < 1) {
    throw invalid_argument(
        fmt::format("{}: {} classes; a classifier needs at least one", name, d.num_classes));
  }
  // Where example i came from, for messages.
  const auto where = [&](std::size_t i) {
    return d.source_lines.empty() ? fmt::format("{}, example {}", name, i)
                                  : fmt::format("{}:{}", d.source, d.source_lines[i]);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t label = d.labels[i];
    if (label < 0 || label >= d.num_classes) {
      throw invalid_argument(fmt::format("{}: label {} is outside the {} classes (0 to {})",
                                         where(i), label, d.num_classes, d.num_classes - 1));
    }
  }
  if (allow_nonfinite) return;
  constexpr float largest = std::numeric_limits<float>::max();
  for (std::size_t i = 0; i < n; ++i) {
    const float* row = d.features.data() + i * f;
    bool finite = true;
    for (std::size_t k = 0; k < f; ++k) finite &= std::abs(row[k]) <= largest;  // NaN: false
    if (finite) continue;
    std::size_t k = 0;
    while (std::abs(row[k]) <= largest) ++k;
    const std::string feature = d.source_lines.empty()
                                    ? fmt::format("feature {}", k)
                                    : fmt::format("column {} (feature {})", k + 2, k);
    throw invalid_argument(
        fmt::format("{}: {} is {}; loom does not train on NaN or Inf (allow them with "
                    "train_options::allow_nonfinite, loom train --allow-nonfinite)",
                    where(i), feature, row[k]));
  }
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
    part->source = d.source;
  }
  const std::int64_t n_train = d.size() - n_test;
  for (std::int64_t k = 0; k < d.size(); ++k) {
    dataset& to = k < n_train ? out.first : out.second;
    const std::int64_t i = order[static_cast<std::size_t>(k)];
    to.labels.push_back(d.labels[static_cast<std::size_t>(i)]);
    if (!d.source_lines.empty())
      to.source_lines.push_back(d.source_lines[static_cast<std::size_t>(i)]);
    const auto* f = d.features.data() + i * d.num_features;
    to.features.insert(to.features.end(), f, f + d.num_features);
  }
  return out;
}

}  // namespace loom::train
