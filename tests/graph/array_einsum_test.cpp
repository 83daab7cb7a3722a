// ops::einsum against numpy.einsum's definition written as a float64 loop over every
// assignment of the labels: matmuls, batches, transposes, sums, outer products, three
// operands, ellipses, implicit outputs, diagonals, float32 as well as float64, and the
// equation errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "graph/array_test_support.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using doubles = std::vector<double>;

// out[output labels] = sum over the other labels of prod_i x_i[labels_i]. terms are explicit
// (letters only, no "...").
doubles einsum_ref(const std::vector<std::string>& terms, const std::string& out,
                   const std::vector<doubles>& xs, const std::vector<shape>& shapes) {
  std::map<char, std::int64_t> size;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    for (std::size_t d = 0; d < terms[i].size(); ++d) size[terms[i][d]] = shapes[i][d];
  }
  std::string all;
  for (const auto& [c, n] : size) all.push_back(c);
  std::int64_t n_out = 1;
  for (char c : out) n_out *= size[c];
  doubles r(static_cast<std::size_t>(n_out), 0.0);
  for (const auto& [c, n] : size) {
    if (n == 0) return r;  // nothing to sum: zeros (or an empty result)
  }
  std::map<char, std::int64_t> at;
  for (char c : all) at[c] = 0;
  const auto flat = [&](const std::string& labels) {
    std::int64_t f = 0;
    for (char c : labels) f = f * size[c] + at[c];
    return f;
  };
  for (;;) {
    double p = 1.0;
    for (std::size_t i = 0; i < terms.size(); ++i)
      p *= xs[i][static_cast<std::size_t>(flat(terms[i]))];
    r[static_cast<std::size_t>(flat(out))] += p;
    std::size_t k = all.size();
    while (k > 0) {
      --k;
      if (++at[all[k]] < size[all[k]]) break;
      at[all[k]] = 0;
      if (k == 0) return r;
    }
    if (all.empty()) return r;
  }
}

using array_test::random_values;

struct einsum_case {
  std::string equation;            // given to ops::einsum
  std::vector<shape> shapes;       // of the operands
  std::vector<std::string> terms;  // the reference's spelling (no "...", explicit)
  std::string out;
};

void check(const einsum_case& c, dtype t) {
  SCOPED_TRACE(fmt::format("{} {}", c.equation, to_string(t)));
  graph g;
  graph_builder b(g);
  std::vector<output> xs;
  std::vector<doubles> vals;
  std::vector<feed> feeds;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    const std::string name = fmt::format("x{}", i);
    xs.push_back(ops::placeholder(b, name, t, c.shapes[i]));
    vals.push_back(random_values(c.shapes[i].num_elements(), static_cast<std::uint32_t>(i + 1)));
    tensor f64 = memory::host_tensor<double>(c.shapes[i], vals.back());
    feeds.push_back({name, f64});
  }
  if (t == dtype::f32) {
    for (std::size_t i = 0; i < feeds.size(); ++i) {
      std::vector<float> f(vals[i].begin(), vals[i].end());
      feeds[i].second = memory::host_tensor<float>(c.shapes[i], f);
      for (std::size_t k = 0; k < f.size(); ++k) vals[i][k] = static_cast<double>(f[k]);
    }
  }
  const output y = ops::einsum(c.equation, xs);
  const std::string name = y.name();
  session s(std::move(g));
  const tensor got = s.run(feeds, {name})[0];
  const doubles want = einsum_ref(c.terms, c.out, vals, c.shapes);
  ASSERT_EQ(got.num_elements(), static_cast<std::int64_t>(want.size()));
  shape want_shape;
  std::map<char, std::int64_t> size;
  for (std::size_t i = 0; i < c.terms.size(); ++i) {
    for (std::size_t d = 0; d < c.terms[i].size(); ++d) size[c.terms[i][d]] = c.shapes[i][d];
  }
  for (char ch : c.out) want_shape.push_back(size[ch]);
  EXPECT_EQ(got.shape(), want_shape);
  doubles v(want.size());
  if (t == dtype::f32) {
    std::vector<float> f(want.size());
    copy_to_dense(got, f.data());
    for (std::size_t k = 0; k < f.size(); ++k) v[k] = f[k];
  } else {
    copy_to_dense(got, v.data());
  }
  const double tol = t == dtype::f32 ? 1e-5 : 1e-12;
  for (std::size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(v[k], want[k], tol * 10) << k;
}

TEST(Einsum, AgainstTheDefinition) {
  const std::vector<einsum_case> cases = {
      {"ij,jk->ik", {{3, 4}, {4, 5}}, {"ij", "jk"}, "ik"},
      {"ij,jk", {{3, 4}, {4, 5}}, {"ij", "jk"}, "ik"},
      {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}, {"bij", "bjk"}, "bik"},
      {"bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}, {"bhqd", "bhkd"}, "bhqk"},
      {"ij->ji", {{3, 4}}, {"ij"}, "ji"},
      {"ij->", {{3, 4}}, {"ij"}, ""},
      {"ijk->kj", {{2, 3, 4}}, {"ijk"}, "kj"},
      {"i,i->", {{7}, {7}}, {"i", "i"}, ""},
      {"i,j->ij", {{3}, {4}}, {"i", "j"}, "ij"},
      {"ij,k->i", {{3, 4}, {5}}, {"ij", "k"}, "i"},
      {"ijk,jl->kil", {{2, 3, 4}, {3, 5}}, {"ijk", "jl"}, "kil"},
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}, {"ij", "jk", "kl"}, "il"},
      {"ab,bc,ca->", {{2, 3}, {3, 4}, {4, 2}}, {"ab", "bc", "ca"}, ""},
      {"...ij,...jk->...ik", {{2, 3, 4, 5}, {2, 3, 5, 6}}, {"xyij", "xyjk"}, "xyik"},
      {"...ij,jk", {{2, 3, 4}, {4, 5}}, {"xij", "jk"}, "xik"},
      {"b...,b...->b", {{2, 3, 4}, {2, 3, 4}}, {"bxy", "bxy"}, "b"},
      {"ij,jk->ik", {{0, 4}, {4, 5}}, {"ij", "jk"}, "ik"},
      {"ij,jk->ik", {{3, 0}, {0, 5}}, {"ij", "jk"}, "ik"},
      // Diagonals: a letter repeated within a term.
      {"ii->i", {{3, 3}}, {"ii"}, "i"},
      {"ii", {{4, 4}}, {"ii"}, ""},
      {"...ii->...i", {{2, 3, 3}}, {"xii"}, "xi"},
      {"iji->j", {{3, 2, 3}}, {"iji"}, "j"},
      {"iii->i", {{2, 2, 2}}, {"iii"}, "i"},
      {"ijij->ij", {{2, 3, 2, 3}}, {"ijij"}, "ij"},
      {"ij,jj->i", {{3, 4}, {4, 4}}, {"ij", "jj"}, "i"},
      {"bii,bij->bj", {{2, 3, 3}, {2, 3, 4}}, {"bii", "bij"}, "bj"},
  };
  for (const auto& c : cases) {
    check(c, dtype::f64);
    check(c, dtype::f32);
  }
}

TEST(Einsum, EquationErrorsNameTheEquation) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f32, shape{3, 3});
  const output y = ops::placeholder(b, "y", dtype::f32, shape{4, 5});
  const auto message = [&](const std::string& eq, const std::vector<output>& xs) {
    try {
      (void)ops::einsum(eq, xs);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("ij->ii", {x}), "einsum 'ij->ii': output label 'i' repeats");
  EXPECT_EQ(message("ij,jk->ik", {x, y}),
            "einsum 'ij,jk->ik': label 'j' is 4 in operand 1 but 3 before");
  EXPECT_EQ(message("ijk->i", {x}), "einsum 'ijk->i': term 'ijk' does not fit operand 0 of rank 2");
  EXPECT_EQ(message("ij->k", {x}), "einsum 'ij->k': output label 'k' is in no operand");
  EXPECT_EQ(message("ij,jk->ik", {x}), "einsum 'ij,jk->ik': 2 terms for 1 operands");
  const output dyn = ops::placeholder(b, "d", dtype::f32, shape{-1, 3});
  EXPECT_NE(message("ij->j", {dyn}).find("fully known shape"), std::string::npos);
}

}  // namespace
}  // namespace loom
