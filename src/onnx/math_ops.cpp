// ONNX's element-wise ops, reductions and softmax as loom ops.
#include <fmt/format.h>

#include "importer.hpp"
#include "loom/core/error.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "model_file.hpp"

namespace loom::onnx::detail {
namespace {

// An ONNX op that is one loom op of the same inputs, with attributes copied as given:
// (ONNX attribute, loom attribute, default).
struct float_attr {
  const char* onnx;
  const char* loom;
  float fallback;
};

void direct(op_table& t, const char* onnx_op, const char* loom_op, std::vector<float_attr> attrs = {}) {
  t[onnx_op] = {[loom_op, attrs](node_context& c) {
                  std::vector<output> inputs;
                  for (std::size_t i = 0; i < c.num_inputs(); ++i) inputs.push_back(c.in(i));
                  attr_map a;
                  for (const auto& f : attrs) a[f.loom] = static_cast<double>(c.attr_float(f.onnx, f.fallback));
                  c.set(0, c.b().add1(loom_op, inputs, a, c.opts()));
                },
                {loom_op}};
}

// Sum / Mean / Max / Min over any number of inputs, folded left to right.
void variadic(op_table& t, const char* onnx_op, const char* loom_op, bool mean) {
  t[onnx_op] = {[loom_op, mean](node_context& c) {
                  if (c.num_inputs() == 0) c.fail("needs at least one input");
                  output acc = c.in(0);
                  const std::size_t n = c.num_inputs();
                  for (std::size_t i = 1; i < n; ++i) {
                    const bool last = i + 1 == n && !mean;
                    acc = c.b().add1(loom_op, {acc, c.in(i)}, {},
                                     last ? c.opts() : c.aux(fmt::format("{}", i)));
                  }
                  if (mean) {
                    acc = ops::div(acc, c.scalar(static_cast<double>(n), acc.dtype_of(), "count"), c.opts());
                  } else if (n == 1) {
                    acc = ops::identity(acc, c.opts());
                  }
                  c.set(0, acc);
                },
                {loom_op}};
}

// Integer results of +, -, *, / on partly known integer vectors (shape arithmetic).
bool fold_ints(node_context& c, const char* op) {
  auto a = c.elements(0);
  auto b = c.elements(1);
  if (!a || !b) return false;
  if (a->values.size() != b->values.size() && a->values.size() != 1 && b->values.size() != 1) return false;
  known_ints r;
  r.scalar = a->scalar && b->scalar;
  const std::size_t n = std::max(a->values.size(), b->values.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto& x = a->values[a->values.size() == 1 ? 0 : i];
    const auto& y = b->values[b->values.size() == 1 ? 0 : i];
    if (!x || !y) {
      r.values.emplace_back();
      continue;
    }
    const std::string_view o(op);
    if (o == "add") r.values.emplace_back(*x + *y);
    else if (o == "sub") r.values.emplace_back(*x - *y);
    else if (o == "mul") r.values.emplace_back(*x * *y);
    else if (*y == 0) return false;  // the kernel reports it
    else r.values.emplace_back(*x / *y);  // ONNX integer Div truncates, as loom's
  }
  return c.set_ints(0, r, c.type(0).type);
}

void arithmetic(op_table& t, const char* onnx_op, const char* loom_op) {
  t[onnx_op] = {[loom_op](node_context& c) {
                  const dtype ta = c.type(0).type;
                  const bool ints = ta == dtype::i64 || ta == dtype::i32;
                  if (ints && fold_ints(c, loom_op)) return;
                  c.set(0, c.b().add1(loom_op, {c.in(0), c.in(1)}, {}, c.opts()));
                },
                {loom_op}};
}

// Reductions: axes from the attribute (or, from opset 13 for ReduceSum, the second input),
// keepdims (default 1), noop_with_empty_axes.
void reduction(op_table& t, const char* onnx_op, const char* loom_op) {
  t[onnx_op] = {[loom_op, onnx_op](node_context& c) {
                  std::vector<std::int64_t> axes = c.attr_ints("axes");
                  const bool axes_input = std::string_view(onnx_op) == "ReduceSum" && c.opset() >= 13;
                  if (axes_input && c.has(1)) axes = c.ints(1, "axes");
                  const bool keepdims = c.attr_int("keepdims", 1) != 0;
                  if (axes.empty() && c.attr_int("noop_with_empty_axes", 0) != 0) {
                    c.set(0, ops::identity(c.in(0), c.opts()));
                    return;
                  }
                  c.set(0, c.b().add1(loom_op, {c.in(0)}, {{"axes", axes}, {"keepdims", keepdims}},
                                      c.opts()));
                },
                {loom_op}};
}

// Softmax / LogSoftmax: one axis from opset 13 (default -1); before, the input is seen as
// 2-D [prod(shape[:axis]), prod(shape[axis:])] (default axis 1).
void softmax(op_table& t, const char* onnx_op, const char* loom_op) {
  t[onnx_op] = {[loom_op](node_context& c) {
                  const output x = c.in(0);
                  const auto rank = static_cast<std::int64_t>(c.rank(0));
                  if (c.opset() >= 13) {
                    c.set(0, c.b().add1(loom_op, {x}, {{"axis", c.attr_int("axis", -1)}}, c.opts()));
                    return;
                  }
                  const std::int64_t axis = normalize_axis(c, c.attr_int("axis", 1), rank);
                  if (axis == rank - 1) {
                    c.set(0, c.b().add1(loom_op, {x}, {{"axis", std::int64_t{-1}}}, c.opts()));
                    return;
                  }
                  const shape& s = *x.type().shape;
                  if (!s.is_fully_defined()) {
                    c.unsupported("a softmax over several dimensions (opset < 13) needs the input's "
                                  "shape known at import");
                  }
                  std::int64_t inner = 1;
                  for (std::int64_t i = axis; i < rank; ++i) inner *= s[static_cast<std::size_t>(i)];
                  const output flat = ops::reshape(x, {-1, inner}, c.aux("flat"));
                  const output y = c.b().add1(loom_op, {flat}, {{"axis", std::int64_t{-1}}}, c.aux("2d"));
                  std::vector<std::int64_t> dims(s.begin(), s.end());
                  c.set(0, ops::reshape(y, dims, c.opts()));
                },
                {loom_op}};
}

void arg_reduction(op_table& t, const char* onnx_op, const char* loom_op) {
  t[onnx_op] = {[loom_op](node_context& c) {
                  const std::int64_t axis = c.attr_int("axis", 0);
                  const bool keepdims = c.attr_int("keepdims", 1) != 0;
                  attr_map a{{"axis", axis}, {"output_type", dtype::i64}};
                  if (c.attr_int("select_last_index", 0) != 0) {
                    if (!has_loom_attr(loom_op, "select_last_index")) {
                      c.unsupported("select_last_index = 1 is not supported");
                    }
                    a["select_last_index"] = true;
                  }
                  if (has_loom_attr(loom_op, "keepdims")) {
                    a["keepdims"] = keepdims;
                    c.set(0, c.b().add1(loom_op, {c.in(0)}, a, c.opts()));
                    return;
                  }
                  const output r = c.b().add1(loom_op, {c.in(0)}, a, keepdims ? c.aux("reduce") : c.opts());
                  if (!keepdims) {
                    c.set(0, r);
                    return;
                  }
                  const auto rank = static_cast<std::int64_t>(c.rank(0));
                  c.set(0, ops::expand_dims(r, normalize_axis(c, axis, rank), c.opts()));
                },
                {loom_op}};
}

tensor constant_tensor(const node_context& c) {
  if (const auto* a = c.attribute("value")) return tensor_of(a->t(), {});
  auto ints = [](const std::vector<std::int64_t>& v, bool scalar) {
    shape s;
    if (!scalar) s.push_back(static_cast<std::int64_t>(v.size()));
    tensor out = memory::host_tensor(dtype::i64, s);
    std::copy(v.begin(), v.end(), out.data<std::int64_t>());
    return out;
  };
  auto floats = [](const std::vector<float>& v, bool scalar) {
    shape s;
    if (!scalar) s.push_back(static_cast<std::int64_t>(v.size()));
    tensor out = memory::host_tensor(dtype::f32, s);
    std::copy(v.begin(), v.end(), out.data<float>());
    return out;
  };
  if (const auto* a = c.attribute("value_int")) return ints({a->i()}, true);
  if (c.has_attr("value_ints")) return ints(c.attr_ints("value_ints"), false);
  if (const auto* a = c.attribute("value_float")) return floats({a->f()}, true);
  if (c.has_attr("value_floats")) return floats(c.attr_floats("value_floats"), false);
  c.unsupported("only the attributes value, value_int(s) and value_float(s) are imported");
}

}  // namespace

void add_math_ops(op_table& t) {
  // Element-wise, one to one.
  for (auto [onnx_op, loom_op] : std::initializer_list<std::pair<const char*, const char*>>{
           {"Abs", "abs"},         {"Neg", "neg"},           {"Exp", "exp"},
           {"Log", "log"},         {"Sqrt", "sqrt"},         {"Reciprocal", "reciprocal"},
           {"Tanh", "tanh"},       {"Sigmoid", "sigmoid"},   {"Relu", "relu"},
           {"Erf", "erf"},         {"Sin", "sin"},           {"Cos", "cos"},
           {"Tan", "tan"},         {"Asin", "asin"},         {"Acos", "acos"},
           {"Atan", "atan"},       {"Sinh", "sinh"},         {"Cosh", "cosh"},
           {"Asinh", "asinh"},     {"Acosh", "acosh"},       {"Atanh", "atanh"},
           {"Floor", "floor"},     {"Ceil", "ceil"},         {"Round", "round"},
           {"Sign", "sign"},       {"Softplus", "softplus"}, {"Softsign", "softsign"},
           {"IsNaN", "isnan"},     {"HardSwish", "hard_swish"}, {"Mish", "mish"},
           {"Not", "logical_not"}, {"Equal", "equal"},       {"Less", "less"},
           {"Greater", "greater"}, {"LessOrEqual", "less_equal"},
           {"GreaterOrEqual", "greater_equal"}, {"And", "logical_and"},
           {"Or", "logical_or"},   {"Xor", "not_equal"},     {"Where", "where"}}) {
    direct(t, onnx_op, loom_op);
  }
  for (auto [onnx_op, loom_op] : std::initializer_list<std::pair<const char*, const char*>>{
           {"Sum", "add"}, {"Max", "maximum"}, {"Min", "minimum"}}) {
    variadic(t, onnx_op, loom_op, false);
  }
  variadic(t, "Mean", "add", true);
  direct(t, "Elu", "elu", {{"alpha", "alpha", 1.0F}});
  direct(t, "Celu", "celu", {{"alpha", "alpha", 1.0F}});
  direct(t, "Selu", "selu", {{"alpha", "alpha", 1.67326319217681884765625F},
                              {"gamma", "gamma", 1.05070102214813232421875F}});
  direct(t, "LeakyRelu", "leaky_relu", {{"alpha", "alpha", 0.01F}});
  direct(t, "ThresholdedRelu", "thresholded_relu", {{"alpha", "alpha", 1.0F}});
  direct(t, "HardSigmoid", "hard_sigmoid", {{"alpha", "alpha", 0.2F}, {"beta", "beta", 0.5F}});

  arithmetic(t, "Add", "add");
  arithmetic(t, "Sub", "sub");
  arithmetic(t, "Mul", "mul");
  arithmetic(t, "Div", "div");

  t["Pow"] = {[](node_context& c) {
                // x ^ 2 is x * x, bit for bit: square, which layer_norm_fusion recognises in
                // LayerNorm written out.
                if (const tensor* e = c.constant(1); e != nullptr && e->num_elements() == 1 &&
                                                     (e->type() == dtype::f32 || e->type() == dtype::f64) &&
                                                     c.number(1, "exponent") == 2.0 &&
                                                     is_floating(c.type(0).type)) {
                  c.set(0, ops::square(c.in(0), c.opts()));
                  return;
                }
                const dtype type = c.type(0).type;
                if (!is_floating(type)) {
                  // Integer powers, computed in double (exact below 2^53) and truncated back.
                  const output base = ops::cast(c.in(0), dtype::f64, c.aux("base"));
                  const output e = ops::cast(c.in(1), dtype::f64, c.aux("exponent"));
                  c.set(0, ops::cast(ops::pow(base, e, c.aux("pow")), type, c.opts()));
                  return;
                }
                output y = c.in(1);
                if (y.dtype_of() != type) y = ops::cast(y, type, c.aux("exponent"));
                c.set(0, ops::pow(c.in(0), y, c.opts()));
              },
              {"pow"}};
  t["Mod"] = {[](node_context& c) {
                c.set(0, c.b().add1("mod", {c.in(0), c.in(1)}, {{"fmod", c.attr_int("fmod", 0) != 0}},
                                    c.opts()));
              },
              {"mod"}};
  t["Gelu"] = {[](node_context& c) {
                 const std::string approximate = c.attr_string("approximate", "none");
                 if (approximate != "none" && approximate != "tanh") {
                   c.fail(fmt::format("approximate '{}' is not none or tanh", approximate));
                 }
                 c.set(0, ops::gelu(c.in(0), approximate, c.opts()));
               },
               {"gelu"}};
  t["Shrink"] = {[](node_context& c) {
                  const output x = c.in(0);
                  const dtype ty = x.dtype_of();
                  const double lambd = c.attr_float("lambd", 0.5F);
                  const double bias = c.attr_float("bias", 0.0F);
                  const output below = ops::less(x, c.scalar(-lambd, ty, "minus_lambd"), c.aux("below"));
                  const output above = ops::greater(x, c.scalar(lambd, ty, "lambd"), c.aux("above"));
                  const output up = ops::add(x, c.scalar(bias, ty, "bias"), c.aux("up"));
                  const output down = ops::sub(x, c.scalar(bias, ty, "bias2"), c.aux("down"));
                  const output upper = ops::where(above, down, c.scalar(0, ty, "zero"), c.aux("upper"));
                  c.set(0, ops::where(below, up, upper, c.opts()));
                },
                {"where"}};
  t["Hardmax"] = {[](node_context& c) {
                   const auto rank = static_cast<std::int64_t>(c.rank(0));
                   const shape& s = *c.type(0).shape;
                   const dtype ty = c.type(0).type;
                   std::int64_t axis = c.attr_int("axis", c.opset() >= 13 ? -1 : 1);
                   axis = normalize_axis(c, axis, rank);
                   output x = c.in(0);
                   if (c.opset() < 13 && axis != rank - 1) {
                     // Before opset 13: the input seen as 2-D [prod(:axis), prod(axis:)].
                     if (!s.is_fully_defined()) c.unsupported("Hardmax over several dimensions needs the shape known");
                     std::int64_t inner = 1;
                     for (std::int64_t i = axis; i < rank; ++i) inner *= s[static_cast<std::size_t>(i)];
                     x = ops::reshape(x, {-1, inner}, c.aux("flat"));
                     const output h = ops::one_hot(ops::argmax(x, -1, dtype::i64, c.aux("argmax")), inner, ty, 1, 0, -1,
                                                   c.aux("2d"));
                     c.set(0, ops::reshape(h, std::vector<std::int64_t>(s.begin(), s.end()), c.opts()));
                     return;
                   }
                   const std::int64_t depth = s[static_cast<std::size_t>(axis)];
                   if (depth < 0) c.unsupported("Hardmax needs the size of its axis known at import");
                   c.set(0, ops::one_hot(ops::argmax(x, axis, dtype::i64, c.aux("argmax")), depth, ty, 1, 0, axis,
                                         c.opts()));
                 },
                 {"argmax", "one_hot"}};
  t["IsInf"] = {[](node_context& c) {
                  c.set(0, c.b().add1("isinf", {c.in(0)},
                                      {{"detect_positive", c.attr_int("detect_positive", 1) != 0},
                                       {"detect_negative", c.attr_int("detect_negative", 1) != 0}},
                                      c.opts()));
                },
                {"isinf"}};
  t["PRelu"] = {[](node_context& c) {
                  const output x = c.in(0);
                  const output negative = ops::less(x, c.scalar(0.0, x.dtype_of(), "zero"), c.aux("negative"));
                  const output scaled = ops::mul(x, c.in(1), c.aux("scaled"));
                  c.set(0, ops::where(negative, scaled, x, c.opts()));
                },
                {"where"}};
  t["Clip"] = {[](node_context& c) {
                 output x = c.in(0);
                 const bool has_min = c.has(1);
                 const bool has_max = c.has(2);
                 if (has_min) x = ops::maximum(x, c.in(1), has_max ? c.aux("lower") : c.opts());
                 if (has_max) x = ops::minimum(x, c.in(2), c.opts());
                 if (!has_min && !has_max) x = ops::identity(x, c.opts());
                 c.set(0, x);
               },
               {"maximum", "minimum"}};
  t["Cast"] = {[](node_context& c) {
                 const dtype to = dtype_of(static_cast<std::int32_t>(c.attr_int("to", 0)), "Cast's 'to'");
                 const auto k = c.elements(0);
                 if (k && (to == dtype::i64 || to == dtype::i32) && c.set_ints(0, *k, to)) return;
                 c.set(0, ops::cast(c.in(0), to, c.opts()));
               },
               {"cast"}};
  t["CastLike"] = {[](node_context& c) { c.set(0, ops::cast(c.in(0), c.type(1).type, c.opts())); },
                   {"cast"}};

  for (auto [onnx_op, loom_op] : std::initializer_list<std::pair<const char*, const char*>>{
           {"ReduceSum", "reduce_sum"},
           {"ReduceMean", "reduce_mean"},
           {"ReduceMax", "reduce_max"},
           {"ReduceMin", "reduce_min"},
           {"ReduceProd", "reduce_prod"},
           {"ReduceL1", "reduce_l1"},
           {"ReduceL2", "reduce_l2"},
           {"ReduceSumSquare", "reduce_sum_square"},
           {"ReduceLogSum", "reduce_log_sum"},
           {"ReduceLogSumExp", "reduce_log_sum_exp"}}) {
    reduction(t, onnx_op, loom_op);
  }
  softmax(t, "Softmax", "softmax");
  softmax(t, "LogSoftmax", "log_softmax");
  arg_reduction(t, "ArgMax", "argmax");
  arg_reduction(t, "ArgMin", "argmin");

  t["Identity"] = {[](node_context& c) {
                     const auto k = c.elements(0);
                     if (k && c.set_ints(0, *k, c.type(0).type)) return;
                     c.set(0, ops::identity(c.in(0), c.opts()));
                   },
                   {"identity"}};
  t["Dropout"] = {[](node_context& c) {
                    // In training mode with a ratio above 0 elements are dropped at random,
                    // a new mask on every run (ops::dropout, seeded by the seed attribute,
                    // else 0); a ratio of 0 drops none, in either mode.
                    const bool training = c.has(2) && c.number(2, "training_mode") != 0;
                    const double ratio = c.has(1) ? c.number(1, "ratio") : 0.5;
                    if (training && ratio != 0) {
                      const auto& s = c.type(0).shape;
                      if (!s || !s->is_fully_defined()) {
                        c.unsupported("training_mode = true needs the input's shape known at import (input_shapes)");
                      }
                      if (!(ratio > 0 && ratio < 1)) c.fail(fmt::format("ratio {} is outside [0, 1)", ratio));
                      const auto [y, mask] = ops::dropout_with_mask(c.in(0), ratio, c.attr_int("seed", 0), c.opts());
                      c.set(0, y);
                      if (c.wants(1)) c.set(1, mask);
                      return;
                    }
                    c.set(0, ops::identity(c.in(0), c.opts()));
                    if (c.wants(1)) {  // nothing dropped: all true, of the input's shape
                      const auto& s = c.type(0).shape;
                      if (s && s->is_fully_defined()) {
                        c.set(1, ops::fill(c.b(), dtype::boolean, *s, 1.0, c.aux("mask")));
                      } else {
                        const output dims = c.b().add1("shape_of", {c.in(0)}, {}, c.aux("shape"));
                        c.set(1, c.b().add1("constant_of_shape", {dims}, {{"dtype", dtype::boolean}, {"value", 1.0}},
                                            c.aux("mask")));
                      }
                    }
                  },
                  {"identity", "random_uniform_per_run"}};
  t["Constant"] = {[](node_context& c) {
                     c.set_constant(0, constant_tensor(c));
                   },
                   {"const"}};
}

}  // namespace loom::onnx::detail
