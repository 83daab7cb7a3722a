// Builds y = relu(x @ w + b) with loom's graph API, runs it in a session on whatever devices
// this machine has, and checks the result against the same arithmetic in double. Exits 0
// when they agree.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "loom/graph/builder.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

int main() {
  using namespace loom;
  constexpr int rows = 4, inner = 3, cols = 5;
  std::vector<float> xv(rows * inner), wv(inner * cols), bv(cols);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i % 7) - 3.0f;
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = 0.25f * static_cast<float>(i % 5) - 0.5f;
  for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = 0.1f * static_cast<float>(i);

  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {rows, inner});
  auto w = ops::placeholder(b, "w", dtype::f32, {inner, cols});
  auto bias = ops::placeholder(b, "b", dtype::f32, {cols});
  (void)ops::relu(ops::add(ops::matmul(x, w), bias), {.name = "y"});

  session s(std::move(g));
  const tensor y = s.host_value(s.run({{"x", memory::host_tensor<float>({rows, inner}, xv)},
                                       {"w", memory::host_tensor<float>({inner, cols}, wv)},
                                       {"b", memory::host_tensor<float>({cols}, bv)}},
                                      {"y"})
                                    .at(0));
  const tensor dense =
      y.is_contiguous() ? y
                        : memory::contiguous_copy(y, memory::host_resource::instance(), y.device());
  int wrong = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      double want = bv[static_cast<std::size_t>(c)];
      for (int k = 0; k < inner; ++k) {
        want += static_cast<double>(xv[static_cast<std::size_t>(r * inner + k)]) *
                wv[static_cast<std::size_t>(k * cols + c)];
      }
      want = std::max(want, 0.0);
      const float got = dense.data<float>()[r * cols + c];
      if (std::abs(got - want) > 1e-5 * (1.0 + std::abs(want))) ++wrong;
      std::printf("%8.4f%s", static_cast<double>(got), c + 1 == cols ? "\n" : " ");
    }
  }
  std::printf("loom example: %s (%d of %d values wrong)\n", wrong == 0 ? "ok" : "FAILED", wrong,
              rows * cols);
  return wrong == 0 ? 0 : 1;
}
