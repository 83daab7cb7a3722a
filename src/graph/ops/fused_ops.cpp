// The fused_elementwise op: element-wise ops fused into one pass over memory (its
// expression type, builder and unfused form are in loom/graph/fused_expr.hpp; its gradient
// in fused_grads.cpp; its CPU kernel in src/backends/cpu/fused_elementwise.cpp).
//
// Note [fused element-wise semantics]
// A fused_elementwise node with inputs x_0 .. x_(N-1) of one float type T computes its
// expression over the broadcast shape S of all the inputs (NumPy's rules; an input no
// instruction reads still takes part). Every value -- inputs, literals, instruction
// results -- is an array of S of T's values, computed in the compute type C (float for
// float16 / bfloat16, T otherwise): inputs are loaded as the element-wise kernels load
// them, literals are converted to T as ops::scalar converts them, and each instruction
// computes exactly what its op's own kernel computes for one element (the same fast exp /
// tanh / sigmoid for float, the same NaN behaviour of maximum, minimum and relu,
// relu_grad(dy, y) = y > 0 ? dy : 0, the same gelu formulas) and rounds it to T, as that
// kernel stores it. So in every float type the fused node gives bit for bit what the
// expanded nodes give, NaN, infinities and signed zeros included: a rewrite never changes
// an answer. (Keeping float16 intermediates in float would be more accurate, but would
// change answers: x * x overflows float16 above 256, and x - x is then NaN, not 0.)
#include <fmt/format.h>

#include "loom/graph/fused_expr.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/math_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

attr_def at_least_one(attr_def a) {
  a.validate = [](const attr_value& v) {
    if (v.as<std::int64_t>() < 1) throw invalid_argument("must be >= 1");
  };
  return a;
}

void infer_fused(inference_context& c) {
  const auto n = c.attr<std::int64_t>("N");
  const auto m = c.attr<std::int64_t>("M");
  const auto results = c.attr<std::vector<std::int64_t>>("results");
  if (static_cast<std::int64_t>(results.size()) != m) {
    c.fail(fmt::format("'results' has {} entries but M is {}", results.size(), m));
  }
  // Throws loom::invalid_argument naming the position and the problem; graph::add_node
  // prefixes the node.
  (void)fused_expr::parse(c.attr<std::string>("expr"), static_cast<std::int32_t>(n), results);
  // Throws loom::invalid_argument naming both shapes.
  std::vector<const std::optional<shape>*> shapes(c.num_inputs());
  for (std::size_t i = 0; i < c.num_inputs(); ++i) shapes[i] = &c.input(i).shape;
  const std::optional<shape> out = math_rules::broadcast_shape(shapes);
  const dtype t = c.attr<dtype>("T");
  for (std::size_t j = 0; j < c.num_outputs(); ++j) c.set_output(j, t, out);
}

}  // namespace

void register_fused_ops(op_registry& r) {
  op_def d;
  d.name = "fused_elementwise";
  d.summary = "element-wise ops fused into one pass: the program in 'expr' over the inputs";
  d.inputs = {typed_list("inputs", "N")};
  d.outputs = {typed_list("outputs", "M")};
  d.attrs.push_back(type_attr("T", float_types()));
  d.attrs.push_back(at_least_one(attr("N", attr_type::integer)));
  d.attrs.push_back(at_least_one(attr("M", attr_type::integer)));
  d.attrs.push_back(attr("expr", attr_type::string));
  d.attrs.push_back(attr("results", attr_type::ints));
  d.infer = infer_fused;
  r.add(std::move(d));
}

}  // namespace loom
