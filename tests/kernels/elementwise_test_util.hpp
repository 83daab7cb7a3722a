// Helpers for the element-wise kernel tests (header-only, shared by elementwise_*_test.cpp):
// an independent broadcasting reference, integer wrapping as the dtype stores it, and a way
// to run a kernel by hand so that a test controls who holds the input buffers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::testing::ew {

/// The elements of x (row-major) broadcast to `out`, by NumPy's rules, computed naively.
inline std::vector<double> broadcast_values(const tensor& x, const shape& out) {
  const auto v = values(x);
  const shape& xs = x.shape();
  const std::size_t lead = out.rank() - xs.rank();
  std::vector<double> result(static_cast<std::size_t>(out.num_elements()));
  for (std::int64_t i = 0; i < out.num_elements(); ++i) {
    std::int64_t rem = i;
    std::int64_t j = 0;
    std::int64_t stride = 1;
    for (std::size_t d = out.rank(); d-- > 0;) {
      const std::int64_t idx = rem % out[d];
      rem /= out[d];
      if (d >= lead) {
        const std::int64_t n = xs[d - lead];
        j += (n == 1 ? 0 : idx) * stride;
        stride *= n;
      }
    }
    result[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>(j)];
  }
  return result;
}

/// v as the integer dtype t stores it (two's complement wrapping); other dtypes unchanged.
inline double wrap_to(dtype t, double v) {
  const auto i = static_cast<std::int64_t>(v);
  switch (t) {
    case dtype::i32:
      return static_cast<double>(static_cast<std::int32_t>(i));
    case dtype::i64:
      return static_cast<double>(i);
    case dtype::i8:
      return static_cast<double>(static_cast<std::int8_t>(i));
    case dtype::u8:
      return static_cast<double>(static_cast<std::uint8_t>(i));
    default:
      return v;
  }
}

/// One op node ("under_test") fed by placeholders of the given types, with its CPU kernel,
/// run by hand: the test owns the input slots, so it decides whether a buffer is shared.
class manual_run {
 public:
  manual_run(const std::string& op, const std::vector<std::pair<dtype, shape>>& inputs,
             attr_map attrs = {}) {
    node_spec spec;
    spec.name = "under_test";
    spec.op = op;
    spec.attrs = std::move(attrs);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      node_spec p;
      p.name = "input_" + std::to_string(i);
      p.op = "placeholder";
      p.attrs = {{"dtype", inputs[i].first}, {"shape", inputs[i].second}};
      spec.inputs.push_back({g_.add_node(std::move(p)).id, 0});
    }
    node_ = &g_.add_node(std::move(spec));
    const kernel_def& def = kernel_registry::global().get(*node_, device_type::cpu);
    kernel_ = def.create(kernel_construction(*node_, test_device(), &g_));
  }

  /// Runs the kernel once on `d` with `inputs` as the node's input slots (moved in, so a
  /// freshly made tensor's buffer is held by the slot alone); returns the outputs.
  std::vector<tensor> run(std::vector<tensor> inputs, device& d = test_device()) {
    std::vector<tensor> outputs(node_->outputs.size());
    variable_store variables;
    kernel_context ctx(*node_, d, inputs, outputs, &variables, nullptr);
    kernel_->compute(ctx);
    return outputs;
  }

  [[nodiscard]] const node& n() const { return *node_; }

 private:
  graph g_;
  const node* node_ = nullptr;
  std::unique_ptr<op_kernel> kernel_;
};

/// A vector of input tensors built by moving (or copying lvalues): unlike a braced list,
/// which copies its elements, this leaves a moved-in buffer held by the vector alone.
template <class... Ts>
std::vector<tensor> inputs(Ts&&... ts) {
  std::vector<tensor> v;
  v.reserve(sizeof...(ts));
  (v.push_back(std::forward<Ts>(ts)), ...);
  return v;
}

/// The float types, the numeric types, and every dtype.
inline std::vector<dtype> float_dtypes() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
}
inline std::vector<dtype> numeric_dtypes() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
          dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
}
inline std::vector<dtype> all_dtypes() {
  auto t = numeric_dtypes();
  t.push_back(dtype::boolean);
  return t;
}

/// Runs the unary `op` on x and expects x's dtype and shape and, element by element, `ref`
/// of x's element (stored as x's dtype holds it: integers wrap) within x's dtype's
/// tolerances.
template <class Ref>
void expect_unary_matches(const std::string& op, const tensor& x, const attr_map& attrs,
                          const Ref& ref) {
  const tensor y = run_op1(op, {x}, attrs);
  std::vector<double> expected;
  for (double v : values(x)) expected.push_back(wrap_to(x.type(), ref(v)));
  EXPECT_EQ(y.type(), x.type());
  expect_close(y, x.shape(), expected, rtol_for(x.type()), atol_for(x.type()));
}

/// Expects `f` to throw E whose what() contains every one of `needles`.
template <class E, class F>
void expect_throw_naming(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string what = e.what();
    for (const auto& n : needles) {
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
    }
  }
}

}  // namespace loom::testing::ew
