// Gradients through ops whose output shape is known only at run time (dynamic_reshape,
// expand, expand_grad): the gradient graph is built with a seed whose shape is unknown too,
// run through a session, and checked two ways: against the adjoint identity
// sum(y(x) * w) == sum(x * dx(w)) (these ops are linear), and against the expected values
// written in float64 here.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/graph/gradients.hpp"
#include "graph/array_test_support.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using doubles = std::vector<double>;

using array_test::random_values;

doubles dense_values(const tensor& t) {
  doubles v(static_cast<std::size_t>(t.num_elements()));
  copy_to_dense(t, v.data());
  return v;
}

struct adjoint_result {
  shape y_shape;
  doubles w;   // the seed fed
  doubles dx;  // the gradient fetched
};

// y = op(x, shape constant `target`); dx = gradients(y, {x}, w) with w a placeholder of y's
// (partly unknown) type, fed with random values of y's run-time shape `y_shape`.
adjoint_result run_adjoint(const shape& x_shape, const std::vector<std::int64_t>& target,
                           const shape& y_shape, const std::function<output(output, output)>& op) {
  graph g;
  graph_builder b(g);
  const output x = ops::placeholder(b, "x", dtype::f64, x_shape);
  const output t = ops::constant(b, memory::host_tensor<std::int64_t>(
                                        shape{static_cast<std::int64_t>(target.size())}, target));
  const output y = op(x, t);
  EXPECT_FALSE(y.type().shape && y.type().shape->is_fully_defined());
  EXPECT_TRUE(y.type().shape.has_value());
  const output w = ops::placeholder(b, "w", y.type().type, *y.type().shape);
  const output dx = gradients(y, {x}, w)[0];
  const std::vector<std::string> fetches{y.name(), dx.name()};
  session s(std::move(g));
  const doubles xv = random_values(x_shape.num_elements(), 1);
  adjoint_result r;
  r.y_shape = y_shape;
  r.w = random_values(y_shape.num_elements(), 2);
  const auto out = s.run({{"x", memory::host_tensor<double>(x_shape, xv)},
                          {"w", memory::host_tensor<double>(y_shape, r.w)}},
                         fetches);
  EXPECT_EQ(out[0].shape(), y_shape);
  EXPECT_EQ(out[1].shape(), x_shape);
  const doubles yv = dense_values(out[0]);
  r.dx = dense_values(out[1]);
  double lhs = 0.0;
  double rhs = 0.0;
  for (std::size_t i = 0; i < yv.size(); ++i) lhs += yv[i] * r.w[i];
  for (std::size_t i = 0; i < xv.size(); ++i) rhs += xv[i] * r.dx[i];
  EXPECT_NEAR(lhs, rhs, 1e-12);
  return r;
}

TEST(DynamicGradients, DynamicReshapeReshapesBack) {
  const auto r = run_adjoint(shape{2, 3, 4}, {4, 0, -1}, shape{4, 3, 2},
                             [](output x, output t) { return ops::dynamic_reshape(x, t); });
  EXPECT_EQ(r.dx, r.w);  // the same elements in the same order
}

TEST(DynamicGradients, ExpandSumsTheBroadcastDimensions) {
  const auto r = run_adjoint(shape{3, 1}, {2, 1, 4}, shape{2, 3, 4},
                             [](output x, output t) { return ops::expand(x, t); });
  doubles want(3, 0.0);
  for (std::size_t a = 0; a < 2; ++a) {
    for (std::size_t i = 0; i < 3; ++i) {
      for (std::size_t c = 0; c < 4; ++c) want[i] += r.w[(a * 3 + i) * 4 + c];
    }
  }
  ASSERT_EQ(r.dx.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(r.dx[i], want[i], 1e-12) << i;
}

TEST(DynamicGradients, ExpandGradExpandsBack) {
  const auto r = run_adjoint(shape{2, 3, 4}, {3, 1}, shape{3, 1},
                             [](output dy, output t) { return ops::expand_grad(dy, t); });
  for (std::size_t f = 0; f < 24; ++f) EXPECT_EQ(r.dx[f], r.w[(f / 4) % 3]) << f;
}

TEST(DynamicGradients, ShapeOfAndConstantOfShapeAreNotDifferentiable) {
  EXPECT_EQ(gradient_registry::global().find("shape_of"), nullptr);
  EXPECT_EQ(gradient_registry::global().find("constant_of_shape"), nullptr);
}

}  // namespace
}  // namespace loom
