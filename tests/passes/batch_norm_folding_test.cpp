// fold_batch_norms (src/passes/batch_norm_folding.cpp): an inference batch_norm with constant
// statistics folds into the conv2d or matmul before it, and the graph gives the unfolded
// graph's answers within float32 rounding (float64: 1e-12); statistics that are variables,
// and layers read elsewhere, are refused with the reason and left as they are.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/passes/batch_norm_folding.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

template <class T>
tensor values(const shape& s, double lo, double hi, unsigned seed) {
  std::vector<T> v(static_cast<std::size_t>(s.num_elements()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double u = 0.5 + 0.5 * std::sin(static_cast<double>(i) * 1.7 + seed);
    v[i] = static_cast<T>(lo + (hi - lo) * u);
  }
  return memory::host_tensor<T>(s, v);
}

std::vector<double> doubles(const tensor& t) {
  const tensor h = memory::contiguous_copy(t, memory::host_resource::instance(), device_id{});
  std::vector<double> out;
  if (h.type() == dtype::f64) {
    for (double v : h.span<double>()) out.push_back(v);
  } else {
    for (float v : h.span<float>()) out.push_back(v);
  }
  return out;
}

// conv2d (or matmul) then batch_norm with constant statistics; `fetch` names y.
template <class T>
graph model(bool conv, const std::string& format, bool variable_stats, std::string& fetch,
            std::string& x_name, shape& xs) {
  graph g;
  graph_builder b(g);
  const dtype t = std::is_same_v<T, double> ? dtype::f64 : dtype::f32;
  std::int64_t c = 0;
  output y;
  if (conv) {
    xs = format == "NCHW" ? shape{2, 3, 9, 8} : shape{2, 9, 8, 3};
    const output x = ops::placeholder(b, "x", t, xs);
    ops::conv2d_options o;
    o.padding = {1, 1, 1, 1};
    o.data_format = format;
    y = ops::conv2d(x, ops::constant(b, values<T>({4, 3, 3, 3}, -0.5, 0.5, 1)), o);
    c = 4;
  } else {
    xs = shape{5, 6};
    const output x = ops::placeholder(b, "x", t, xs);
    y = ops::matmul(x, ops::constant(b, values<T>({7, 6}, -0.5, 0.5, 2)), false, true);
    c = 7;
  }
  const auto stat = [&](double lo, double hi, unsigned seed, const char* name) {
    return variable_stats ? ops::variable(b, name, values<T>({c}, lo, hi, seed))
                          : ops::constant(b, values<T>({c}, lo, hi, seed));
  };
  ops::batch_norm_options bn;
  bn.epsilon = 1e-3;
  bn.data_format = conv ? format : "NCHW";
  const output out = ops::batch_norm(y, stat(0.5, 2.0, 3, "scale"), stat(-1, 1, 4, "bias"),
                                     stat(-1, 1, 5, "mean"), stat(0.1, 3, 6, "var"), bn,
                                     {.name = "bn"});
  fetch = ops::relu(out).name();
  x_name = "x";
  return g;
}

template <class T>
void expect_folds(bool conv, const std::string& format) {
  SCOPED_TRACE(::testing::Message() << (conv ? "conv2d " : "matmul ") << format);
  std::string fetch, x;
  shape xs;
  const tensor in = values<T>(conv ? (format == "NCHW" ? shape{2, 3, 9, 8} : shape{2, 9, 8, 3})
                                   : shape{5, 6},
                              -2, 2, 9);
  session plain(model<T>(conv, format, false, fetch, x, xs));
  const auto want = doubles(plain.run({{x, in}}, {fetch})[0]);
  graph g = model<T>(conv, format, false, fetch, x, xs);
  const auto log = passes::fold_batch_norms(g);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].what, passes::pass_record::kind::rewrite) << log[0].reason;
  EXPECT_EQ(log[0].nodes.front(), "bn");
  EXPECT_EQ(g.find("bn")->op(), "bias_add");  // the batch norm's name, now its shift
  session folded(std::move(g));
  const auto got = doubles(folded.run({{x, in}}, {fetch})[0]);
  ASSERT_EQ(got.size(), want.size());
  const double tol = std::is_same_v<T, double> ? 1e-12 : 2e-6;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << i;
  }
}

TEST(BatchNormFolding, FoldsIntoConvAndMatmulWithinRounding) {
  expect_folds<float>(true, "NCHW");
  expect_folds<float>(true, "NHWC");
  expect_folds<float>(false, "NCHW");
  expect_folds<double>(true, "NCHW");
  expect_folds<double>(false, "NCHW");
}

TEST(BatchNormFolding, VariableStatisticsAreRefusedWithTheReason) {
  std::string fetch, x;
  shape xs;
  graph g = model<float>(true, "NCHW", true, fetch, x, xs);
  const std::size_t nodes = g.num_nodes();
  const auto log = passes::fold_batch_norms(g);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].what, passes::pass_record::kind::refused);
  EXPECT_NE(log[0].reason.find("not a constant"), std::string::npos) << log[0].reason;
  EXPECT_EQ(g.num_nodes(), nodes);
  EXPECT_EQ(g.find("bn")->op(), "batch_norm");
}

}  // namespace
}  // namespace loom
