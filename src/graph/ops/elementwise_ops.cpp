// Element-wise ops: unary math, binary arithmetic with NumPy broadcasting, comparisons,
// logic, where, cast, and the generators fill / zeros / ones / range / random_*.
// (Their builder functions are in elementwise_builders.cpp.)
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/math_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

std::vector<dtype> concat(std::vector<dtype> a, const std::vector<dtype>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<dtype>& signed_types() {
  static const std::vector<dtype> t = concat(float_types(), {dtype::i32, dtype::i64, dtype::i8});
  return t;
}

// The broadcast shape of the inputs' shapes (unknown when any rank is unknown).
// math_rules::broadcast_shape throws loom::invalid_argument naming both shapes, and
// graph::add_node prefixes the node.
std::optional<shape> broadcast_inputs(const inference_context& c) {
  std::vector<const std::optional<shape>*> shapes(c.num_inputs());
  for (std::size_t i = 0; i < c.num_inputs(); ++i) shapes[i] = &c.input(i).shape;
  return math_rules::broadcast_shape(shapes);
}

void add_unary(op_registry& r, const char* name, const std::vector<dtype>& types,
               const char* summary, std::vector<attr_def> extra = {}) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.inputs = {typed("x")};
  d.outputs = {typed("y")};
  d.attrs = {type_attr("T", types)};
  for (auto& a : extra) d.attrs.push_back(std::move(a));
  d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
  r.add(std::move(d));
}

// Binary ops: x and y of type T (any of `types`), broadcast; the output is T, or bool.
void add_binary(op_registry& r, const char* name, const std::vector<dtype>& types, bool bool_out,
                const char* summary) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.inputs = {typed("x"), typed("y")};
  d.outputs = {bool_out ? fixed("z", dtype::boolean) : typed("z")};
  d.attrs = {type_attr("T", types)};
  d.infer = [bool_out](inference_context& c) {
    c.set_output(0, bool_out ? dtype::boolean : c.input(0).type, broadcast_inputs(c));
  };
  r.add(std::move(d));
}

// A shape attribute that must be fully defined (generators allocate it).
attr_def defined_shape_attr() {
  attr_def a = attr("shape", attr_type::shape);
  a.validate = [](const attr_value& v) { math_rules::check_defined_shape(v.as<shape>()); };
  return a;
}

attr_def finite_real_attr(const char* name, std::optional<double> def = std::nullopt) {
  attr_def a = def ? attr(name, attr_type::real, attr_value(*def)) : attr(name, attr_type::real);
  a.validate = [](const attr_value& v) {
    if (!std::isfinite(v.as<double>())) throw invalid_argument("must be finite");
  };
  return a;
}

void add_generator(op_registry& r, const char* name, const std::vector<dtype>& types,
                   std::vector<attr_def> extra, const char* summary) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.outputs = {typed("output", "dtype")};
  d.attrs = {type_attr("dtype", types), defined_shape_attr()};
  for (auto& a : extra) d.attrs.push_back(std::move(a));
  d.infer = [](inference_context& c) {
    c.set_output(0, c.attr<dtype>("dtype"), c.attr<shape>("shape"));
  };
  r.add(std::move(d));
}

}  // namespace

void register_elementwise_ops(op_registry& r) {
  const auto& fl = float_types();
  const auto& sig = signed_types();
  add_unary(r, "neg", sig, "-x");
  add_unary(r, "abs", sig, "|x|");
  add_unary(r, "exp", fl, "e^x");
  add_unary(r, "log", fl, "natural logarithm");
  add_unary(r, "sqrt", fl, "square root");
  add_unary(r, "rsqrt", fl, "1 / sqrt(x)");
  add_unary(r, "tanh", fl, "hyperbolic tangent");
  add_unary(r, "sigmoid", fl, "1 / (1 + e^-x)");
  add_unary(r, "relu", numeric_types(), "max(x, 0)");
  {
    attr_def approximate = attr("approximate", attr_type::string, attr_value("none"));
    approximate.validate = [](const attr_value& v) {
      const auto s = v.as<std::string>();
      if (s != "none" && s != "tanh") throw invalid_argument("must be \"none\" or \"tanh\"");
    };
    add_unary(r, "gelu", fl, "x * Phi(x), exact (erf) or tanh-approximated", {approximate});
  }
  add_unary(r, "erf", fl, "the error function");
  add_unary(r, "square", sig, "x * x");
  add_unary(r, "reciprocal", fl, "1 / x");
  add_unary(r, "sin", fl, "sine");
  add_unary(r, "cos", fl, "cosine");
  add_unary(r, "tan", fl, "tangent");
  add_unary(r, "asin", fl, "inverse sine (NaN outside [-1, 1])");
  add_unary(r, "acos", fl, "inverse cosine (NaN outside [-1, 1])");
  add_unary(r, "atan", fl, "inverse tangent");
  add_unary(r, "sinh", fl, "hyperbolic sine");
  add_unary(r, "cosh", fl, "hyperbolic cosine");
  add_unary(r, "asinh", fl, "inverse hyperbolic sine");
  add_unary(r, "acosh", fl, "inverse hyperbolic cosine (NaN below 1)");
  add_unary(r, "atanh", fl, "inverse hyperbolic tangent (±inf at ±1, NaN beyond)");
  add_unary(r, "log1p", fl, "log(1 + x), accurate near 0");
  add_unary(r, "expm1", fl, "e^x - 1, accurate near 0");
  add_unary(r, "floor", fl, "the largest integer <= x");
  add_unary(r, "ceil", fl, "the smallest integer >= x");
  add_unary(r, "round", fl, "the nearest integer, halves to even");
  add_unary(r, "sign", sig, "-1, 0 or 1 by x's sign (NaN stays NaN)");
  add_unary(r, "softplus", fl, "log(1 + e^x)");
  add_unary(r, "softsign", fl, "x / (1 + |x|)");
  add_unary(r, "silu", fl, "x * sigmoid(x)");
  add_unary(r, "mish", fl, "x * tanh(softplus(x))");
  add_unary(r, "hard_swish", fl, "x * max(0, min(1, x / 6 + 1/2))");
  add_unary(r, "elu", fl, "x > 0 ? x : alpha (e^x - 1)", {finite_real_attr("alpha", 1.0)});
  add_unary(r, "selu", fl, "gamma (x > 0 ? x : alpha (e^x - 1))",
            {finite_real_attr("alpha", 1.67326319217681884765625),
             finite_real_attr("gamma", 1.05070102214813232421875)});
  {
    attr_def alpha = finite_real_attr("alpha", 1.0);
    alpha.validate = [](const attr_value& v) {
      const double a = v.as<double>();
      if (a == 0.0 || !std::isfinite(a)) throw invalid_argument("must be finite and not 0");
    };
    add_unary(r, "celu", fl, "x > 0 ? x : alpha (e^(x / alpha) - 1)", {std::move(alpha)});
  }
  add_unary(r, "leaky_relu", fl, "x < 0 ? alpha x : x", {finite_real_attr("alpha", 0.01)});
  add_unary(r, "hard_sigmoid", fl, "max(0, min(1, alpha x + beta))",
            {finite_real_attr("alpha", 0.2), finite_real_attr("beta", 0.5)});
  add_unary(r, "thresholded_relu", fl, "x > alpha ? x : 0", {finite_real_attr("alpha", 1.0)});
  for (const char* name : {"isnan", "isinf", "isfinite"}) {
    op_def d;
    d.name = name;
    d.summary = std::string_view(name) == "isnan"   ? "x is NaN"
                : std::string_view(name) == "isinf" ? "x is +inf (detect_positive) or -inf "
                                                      "(detect_negative)"
                                                    : "x is neither infinite nor NaN";
    d.inputs = {typed("x")};
    d.outputs = {fixed("y", dtype::boolean)};
    d.attrs = {type_attr("T", fl)};
    if (std::string_view(name) == "isinf") {
      d.attrs.push_back(attr("detect_positive", attr_type::boolean, attr_value(true)));
      d.attrs.push_back(attr("detect_negative", attr_type::boolean, attr_value(true)));
    }
    d.infer = [](inference_context& c) { c.set_output(0, dtype::boolean, c.input(0).shape); };
    r.add(std::move(d));
  }

  const auto& num = numeric_types();
  add_binary(r, "add", num, false, "x + y (broadcasting)");
  add_binary(r, "sub", num, false, "x - y (broadcasting)");
  add_binary(r, "mul", num, false, "x * y (broadcasting)");
  add_binary(r, "div", num, false, "x / y (broadcasting; integers truncate)");
  add_binary(r, "pow", fl, false, "x ^ y (broadcasting)");
  add_binary(r, "maximum", num, false, "max(x, y) (broadcasting; NaN propagates)");
  add_binary(r, "relu_grad", num, false,
             "relu's gradient from its output: x (dy) where y > 0, else 0");
  add_binary(r, "minimum", num, false, "min(x, y) (broadcasting; NaN propagates)");
  {
    op_def d;
    d.name = "mod";
    d.summary = "the remainder of x / y (broadcasting): with y's sign, or x's when fmod (C's fmod)";
    d.inputs = {typed("x"), typed("y")};
    d.outputs = {typed("z")};
    d.attrs = {type_attr("T", num), attr("fmod", attr_type::boolean, attr_value(false))};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(0).type, broadcast_inputs(c)); };
    r.add(std::move(d));
  }
  add_binary(r, "equal", all_types(), true, "x == y (broadcasting)");
  add_binary(r, "not_equal", all_types(), true, "x != y (broadcasting)");
  add_binary(r, "less", num, true, "x < y (broadcasting)");
  add_binary(r, "less_equal", num, true, "x <= y (broadcasting)");
  add_binary(r, "greater", num, true, "x > y (broadcasting)");
  add_binary(r, "greater_equal", num, true, "x >= y (broadcasting)");
  for (const char* name : {"logical_and", "logical_or"}) {
    op_def d;
    d.name = name;
    d.summary =
        std::string_view(name) == "logical_and" ? "x && y (broadcasting)" : "x || y (broadcasting)";
    d.inputs = {fixed("x", dtype::boolean), fixed("y", dtype::boolean)};
    d.outputs = {fixed("z", dtype::boolean)};
    d.infer = [](inference_context& c) { c.set_output(0, dtype::boolean, broadcast_inputs(c)); };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "logical_not";
    d.summary = "!x";
    d.inputs = {fixed("x", dtype::boolean)};
    d.outputs = {fixed("y", dtype::boolean)};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "where";
    d.summary = "condition ? x : y (broadcasting all three)";
    d.inputs = {fixed("condition", dtype::boolean), typed("x"), typed("y")};
    d.outputs = {typed("z")};
    d.attrs = {type_attr("T")};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(1).type, broadcast_inputs(c)); };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "cast";
    d.summary = "x converted to dtype `to`";
    d.inputs = {typed("x")};
    d.outputs = {typed("y", "to")};
    d.attrs = {type_attr("T"), type_attr("to")};
    d.infer = [](inference_context& c) { c.set_output(0, c.attr<dtype>("to"), c.input(0).shape); };
    r.add(std::move(d));
  }

  add_generator(r, "fill", all_types(), {attr("value", attr_type::real)},
                "a tensor whose elements are all `value`");
  add_generator(r, "zeros", all_types(), {}, "a tensor of zeros");
  add_generator(r, "ones", all_types(), {}, "a tensor of ones");
  {
    op_def d;
    d.name = "range";
    d.summary = "start, start + delta, ... below limit (NumPy's arange)";
    d.outputs = {typed("output", "dtype")};
    attr_def t = type_attr("dtype", num);
    t.default_value = attr_value(dtype::f32);
    attr_def delta = finite_real_attr("delta", 1.0);
    delta.validate = [](const attr_value& v) {
      const double x = v.as<double>();
      if (x == 0.0) throw invalid_argument("must not be 0");
      if (!std::isfinite(x)) throw invalid_argument("must be finite");
    };
    d.attrs = {finite_real_attr("start"), finite_real_attr("limit"), std::move(delta), t};
    d.infer = [](inference_context& c) {
      // The kernels read the length from the node's inferred shape.
      const std::int64_t n = math_rules::range_length(
          c.attr<double>("start"), c.attr<double>("limit"), c.attr<double>("delta"));
      c.set_output(0, c.attr<dtype>("dtype"), shape{n});
    };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "dynamic_range";
    d.summary = "range with start, limit and delta from tensors: a length known at run time";
    d.inputs = {typed("start"), typed("limit"), typed("delta")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T", num)};
    d.infer = [](inference_context& c) {
      for (std::size_t i = 0; i < 3; ++i) {
        const auto& s = c.input(i).shape;
        if (s && s->num_elements() != 1 && s->is_fully_defined()) {
          c.fail(fmt::format("{} must be one number, got shape {}", c.def().inputs[i].name,
                             to_string(*s)));
        }
      }
      c.set_output(0, c.attr<dtype>("T"), shape{-1});
    };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "random_uniform";
    d.summary = "uniform random values in [minval, maxval), reproducible from the seed";
    d.outputs = {typed("output", "dtype")};
    d.attrs = {type_attr("dtype", fl), defined_shape_attr(), finite_real_attr("minval", 0.0),
               finite_real_attr("maxval", 1.0), attr("seed", attr_type::integer, attr_value(0))};
    d.infer = [](inference_context& c) {
      if (c.attr<double>("maxval") < c.attr<double>("minval")) {
        c.fail(fmt::format("maxval {} is below minval {}", c.attr<double>("maxval"),
                           c.attr<double>("minval")));
      }
      c.set_output(0, c.attr<dtype>("dtype"), c.attr<shape>("shape"));
    };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "random_normal";
    d.summary = "normal random values, reproducible from the seed";
    d.outputs = {typed("output", "dtype")};
    attr_def stddev = finite_real_attr("stddev", 1.0);
    stddev.validate = [](const attr_value& v) {
      const double x = v.as<double>();
      if (!(x >= 0.0) || !std::isfinite(x)) throw invalid_argument("must be finite and >= 0");
    };
    d.attrs = {type_attr("dtype", fl), defined_shape_attr(), finite_real_attr("mean", 0.0),
               std::move(stddev), attr("seed", attr_type::integer, attr_value(0))};
    d.infer = [](inference_context& c) {
      c.set_output(0, c.attr<dtype>("dtype"), c.attr<shape>("shape"));
    };
    r.add(std::move(d));
  }
  // The same draws, anew on every run (Note [reproducible random numbers]): stateful, so
  // never folded into a constant or merged with a twin.
  for (const char* base : {"random_uniform", "random_normal"}) {
    op_def d = r.get(base);
    d.name = std::string(base) + "_per_run";
    d.summary = d.summary + "; a new draw on every run";
    d.is_stateful = true;
    r.add(std::move(d));
  }
}

}  // namespace loom
