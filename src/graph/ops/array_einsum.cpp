// ops::einsum (loom/graph/ops/array.hpp): an Einstein-summation equation lowered, when the
// graph is built, onto reduce_sum, transpose, reshape, strided_slice (diagonals) and matmul. Operands are contracted
// left to right; each pair becomes one batched matmul over [batch, left, contracted] x
// [batch, contracted, right], after the labels only one side has and nothing later needs are
// summed away. No new op: gradients, placement and both devices come from those ops.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::ops {
namespace {

using ints = std::vector<std::int64_t>;

// Ellipsis dimensions become these labels (one per dimension, right-aligned across operands).
constexpr char ellipsis_first = '0';
constexpr std::size_t max_ellipsis = 10;

[[noreturn]] void bad(const std::string& equation, const std::string& why) {
  throw invalid_argument(fmt::format("einsum '{}': {}", equation, why));
}

// A tensor with one label per dimension.
struct labelled {
  output x;
  std::string labels;
};

const shape& known_shape(const output& x, const std::string& equation) {
  const auto& s = x.type().shape;
  if (!s || !s->is_fully_defined()) {
    bad(equation, fmt::format("operand {} must have a fully known shape", to_string(x.type())));
  }
  return *s;
}

// `term` with "..." replaced by the labels of its `n` ellipsis dimensions (the last n of
// max_ellipsis).
std::string expand_ellipsis(const std::string& term, std::size_t n, std::size_t widest) {
  const auto at = term.find("...");
  if (at == std::string::npos) return term;
  std::string dims;
  for (std::size_t k = widest - n; k < widest; ++k)
    dims.push_back(static_cast<char>(ellipsis_first + k));
  return term.substr(0, at) + dims + term.substr(at + 3);
}

bool is_label(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// x summed over its labels that `keep` does not hold.
labelled sum_away(const labelled& t, const std::string& keep) {
  ints axes;
  std::string rest;
  for (std::size_t d = 0; d < t.labels.size(); ++d) {
    if (keep.find(t.labels[d]) == std::string::npos) {
      axes.push_back(static_cast<std::int64_t>(d));
    } else {
      rest.push_back(t.labels[d]);
    }
  }
  if (axes.empty()) return t;
  return {reduce_sum(t.x, axes, false), rest};
}

// x with its dimensions in the order of `labels` (a permutation of t.labels).
output arrange(const labelled& t, const std::string& labels) {
  ints perm;
  bool identity = true;
  for (std::size_t d = 0; d < labels.size(); ++d) {
    const auto p = static_cast<std::int64_t>(t.labels.find(labels[d]));
    identity = identity && p == static_cast<std::int64_t>(d);
    perm.push_back(p);
  }
  return identity ? t.x : transpose(t.x, perm);
}

std::int64_t product(const std::string& labels, const std::map<char, std::int64_t>& size) {
  std::int64_t n = 1;
  for (char c : labels) n *= size.at(c);
  return n;
}

// t with every label that repeats within it taken once: the diagonal over its dimensions
// (numpy.einsum's 'ii->i'). The two dimensions move last, merge into one of n * n, and a
// slice with step n + 1 keeps the entries (k, k).
labelled diagonals(labelled t, const std::map<char, std::int64_t>& size) {
  for (std::size_t d = 0; d < t.labels.size(); ++d) {
    const char c = t.labels[d];
    const auto again = t.labels.find(c, d + 1);
    if (again == std::string::npos) continue;
    std::string rest;
    ints perm;
    ints dims;
    for (std::size_t k = 0; k < t.labels.size(); ++k) {
      if (k == d || k == again) continue;
      rest.push_back(t.labels[k]);
      perm.push_back(static_cast<std::int64_t>(k));
      dims.push_back(size.at(t.labels[k]));
    }
    perm.push_back(static_cast<std::int64_t>(d));
    perm.push_back(static_cast<std::int64_t>(again));
    const std::int64_t n = size.at(c);
    dims.push_back(n * n);
    const output merged = reshape(transpose(t.x, perm), dims);
    const auto last = static_cast<std::int64_t>(dims.size() - 1);
    t = {strided_slice(merged, {0}, {n * n}, {last}, {n + 1}), rest + c};
    d = static_cast<std::size_t>(-1);  // look again from the start: labels moved
  }
  return t;
}

// a and b contracted, keeping the labels in `keep` (the output's and later operands').
labelled contract(labelled a, labelled b, const std::string& keep,
                  const std::map<char, std::int64_t>& size) {
  a = sum_away(a, keep + b.labels);
  b = sum_away(b, keep + a.labels);
  std::string batch;
  std::string left;
  std::string inner;
  std::string right;
  for (char c : a.labels) {
    const bool in_b = b.labels.find(c) != std::string::npos;
    const bool kept = keep.find(c) != std::string::npos;
    (in_b ? (kept ? batch : inner) : left).push_back(c);
  }
  for (char c : b.labels) {
    if (a.labels.find(c) == std::string::npos) right.push_back(c);
  }
  const std::int64_t nb = product(batch, size);
  const std::int64_t nl = product(left, size);
  const std::int64_t ni = product(inner, size);
  const std::int64_t nr = product(right, size);
  const output a3 = reshape(arrange(a, batch + left + inner), {nb, nl, ni});
  const output b3 = reshape(arrange(b, batch + inner + right), {nb, ni, nr});
  ints dims;
  for (char c : batch + left + right) dims.push_back(size.at(c));
  return {reshape(matmul(a3, b3), dims), batch + left + right};
}

}  // namespace

output einsum(const std::string& equation, const std::vector<output>& operands,
              const node_options& o) {
  std::string eq;
  for (char c : equation) {
    if (c != ' ') eq.push_back(c);
  }
  if (operands.empty()) bad(equation, "needs at least one operand");
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (std::size_t start = 0;;) {
    const auto comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != operands.size()) {
    bad(equation, fmt::format("{} terms for {} operands", terms.size(), operands.size()));
  }
  // Ellipsis widths, then every term spelled with labels only.
  std::vector<std::size_t> widths(terms.size(), 0);
  std::size_t widest = 0;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    const std::string& t = terms[i];
    const std::size_t rank = known_shape(operands[i], equation).rank();
    const auto at = t.find("...");
    const std::size_t named = t.size() - (at == std::string::npos ? 0 : 3);
    if (named > rank || (at == std::string::npos && named != rank)) {
      bad(equation, fmt::format("term '{}' does not fit operand {} of rank {}", t, i, rank));
    }
    widths[i] = rank - named;
    widest = std::max(widest, widths[i]);
  }
  if (widest > max_ellipsis) bad(equation, "'...' stands for too many dimensions");
  std::vector<labelled> ts;
  std::map<char, std::int64_t> size;
  std::map<char, int> uses;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    const std::string labels = expand_ellipsis(terms[i], widths[i], widest);
    const shape& s = *operands[i].type().shape;
    for (std::size_t d = 0; d < labels.size(); ++d) {
      const char c = labels[d];
      if (!is_label(c) &&
          !(c >= ellipsis_first && c < ellipsis_first + static_cast<char>(max_ellipsis))) {
        bad(equation, fmt::format("'{}' is not a label (a-z, A-Z) or '...'", c));
      }
      const auto [it, fresh] = size.emplace(c, s[d]);
      if (!fresh && it->second != s[d]) {
        bad(equation,
            fmt::format("label '{}' is {} in operand {} but {} before", c, s[d], i, it->second));
      }
      ++uses[c];
    }
    ts.push_back({operands[i], labels});
  }
  // A label repeated within a term is that term's diagonal (its dimensions are equal: the
  // sizes were checked above).
  for (auto& t : ts) t = diagonals(t, size);
  // The output: as given, or NumPy's implicit one (ellipsis, then the labels used once, in
  // alphabetical order).
  std::string out;
  if (arrow != std::string::npos) {
    const std::string rhs = eq.substr(arrow + 2);
    const auto at = rhs.find("...");
    // Ellipsis dimensions the output leaves out are summed.
    out = expand_ellipsis(rhs, at == std::string::npos ? 0 : widest, widest);
  } else {
    for (std::size_t k = 0; k < widest; ++k) out.push_back(static_cast<char>(ellipsis_first + k));
    std::string once;
    for (const auto& [c, n] : uses) {
      if (n == 1 && is_label(c)) once.push_back(c);
    }
    std::sort(once.begin(), once.end());
    out += once;
  }
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (!size.contains(out[d]))
      bad(equation, fmt::format("output label '{}' is in no operand", out[d]));
    if (out.find(out[d]) != d) bad(equation, fmt::format("output label '{}' repeats", out[d]));
  }
  labelled acc = ts[0];
  for (std::size_t i = 1; i < ts.size(); ++i) {
    std::string keep = out;
    for (std::size_t j = i + 1; j < ts.size(); ++j) keep += ts[j].labels;
    acc = contract(acc, ts[i], keep, size);
  }
  acc = sum_away(acc, out);
  const output r = arrange(acc, out);
  // A named result: the last node carries the caller's options.
  return o.name.empty() ? r : ops::identity(r, o);
}

}  // namespace loom::ops
