// fused_expr: the text form and its parser (round trips, every error), validation, the ops
// table and fusable_op, expand, and the fused_elementwise op's inference and errors.
#include "loom/graph/fused_expr.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "loom/graph/ops.hpp"
#include "loom/graph/serialization.hpp"

namespace loom {
namespace {

// The message of the loom::invalid_argument f throws ("no error" when it does not throw).
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

void expect_message(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const std::string m = message_of(f);
  EXPECT_NE(m, "no error");
  for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m << "\n  lacks: " << p;
}

// ---- the ops table ---------------------------------------------------------------------------

TEST(FusedExpr, EveryOpHasANameAndArityThatReadBack) {
  const std::vector<std::pair<std::string, int>> expected = {
      {"neg", 1},       {"abs", 1},      {"exp", 1},     {"log", 1},        {"sqrt", 1},
      {"rsqrt", 1},     {"tanh", 1},     {"sigmoid", 1}, {"relu", 1},       {"gelu", 1},
      {"gelu_tanh", 1}, {"erf", 1},      {"square", 1},  {"reciprocal", 1}, {"add", 2},
      {"sub", 2},       {"mul", 2},      {"div", 2},     {"pow", 2},        {"maximum", 2},
      {"minimum", 2},   {"relu_grad", 2}};
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(num_ew_ops));
  for (int i = 0; i < num_ew_ops; ++i) {
    const auto op = static_cast<ew_op>(i);
    EXPECT_EQ(info(op).name, expected[static_cast<std::size_t>(i)].first);
    EXPECT_EQ(info(op).arity, expected[static_cast<std::size_t>(i)].second);
    EXPECT_EQ(ew_op_from_name(info(op).name), op);
  }
  EXPECT_EQ(info(static_cast<ew_op>(200)).name, "?");
  EXPECT_EQ(info(static_cast<ew_op>(200)).arity, 0);
  EXPECT_FALSE(ew_op_from_name("matmul"));
  EXPECT_FALSE(ew_op_from_name(""));
}

TEST(FusedExpr, FusableOpNamesTheOpOfEveryElementWiseNode) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, 3});
  auto y = ops::placeholder(b, "y", dtype::f32, {3});
  for (int i = 0; i < num_ew_ops; ++i) {
    const auto op = static_cast<ew_op>(i);
    output o;
    if (op == ew_op::gelu_tanh) {
      o = ops::gelu(x, "tanh");
    } else if (info(op).arity == 1) {
      o = b.add1(info(op).name, {x});
    } else {
      o = b.add1(info(op).name, {x, y});
    }
    EXPECT_EQ(fusable_op(o.producer()), op) << info(op).name;
  }
  EXPECT_EQ(fusable_op(ops::gelu(x).producer()), ew_op::gelu);
  EXPECT_EQ(fusable_op(ops::gelu(x, "none").producer()), ew_op::gelu);
  // Not element-wise ops of the expression: comparisons, where, cast, shapes, sources.
  EXPECT_FALSE(fusable_op(x.producer()));
  EXPECT_FALSE(fusable_op(ops::greater(x, y).producer()));
  EXPECT_FALSE(fusable_op(ops::where(ops::greater(x, y), x, y).producer()));
  EXPECT_FALSE(fusable_op(ops::cast(x, dtype::f64).producer()));
  EXPECT_FALSE(fusable_op(ops::identity(x).producer()));
  EXPECT_FALSE(fusable_op(ops::reshape(x, {3, 2}).producer()));
  EXPECT_FALSE(fusable_op(ops::scalar(b, 1.0).producer()));
  EXPECT_FALSE(fusable_op(ops::reduce_sum(x, {0}).producer()));
}

// ---- text form -------------------------------------------------------------------------------

fused_operand value(std::int32_t v) {
  return {v, 0.0};
}
fused_operand literal(double x) {
  return {-1, x};
}

TEST(FusedExpr, PrintsTheDocumentedTextForm) {
  fused_expr e;
  e.num_inputs = 2;
  e.instrs = {{ew_op::mul, {value(0), value(1)}},
              {ew_op::add, {value(2), literal(0.5)}},
              {ew_op::relu, {value(3), {}}}};
  e.results = {4};
  EXPECT_EQ(e.to_string(), "mul(%0, %1); add(%2, 0.5); relu(%3)");
  EXPECT_EQ(fused_expr::parse("mul(%0, %1); add(%2, 0.5); relu(%3)", 2, {4}), e);
  // Spaces anywhere between tokens, none needed.
  EXPECT_EQ(fused_expr::parse("  mul ( %0 ,%1 )\t;add(%2,0.5);\n relu(%3)  ", 2, {4}), e);
  EXPECT_EQ(fused_expr::parse("mul(%0,%1);add(%2,5e-1);relu(%3)", 2, {4}), e);
}

TEST(FusedExpr, LiteralsRoundTripExactly) {
  const std::vector<double> lits = {0.1,
                                    -1e-300,
                                    3.0,
                                    -0.0,
                                    0.0,
                                    1.0 / 3.0,
                                    5e-324,  // the smallest subnormal
                                    2.2250738585072014e-308,
                                    std::numeric_limits<double>::max(),
                                    -std::numeric_limits<double>::max(),
                                    1e20,
                                    123456789.125,
                                    0.044715,
                                    static_cast<double>(0.1f)};
  for (double x : lits) {
    fused_expr e;
    e.num_inputs = 1;
    e.instrs = {{ew_op::mul, {value(0), literal(x)}}, {ew_op::add, {literal(x), value(1)}}};
    e.results = {2};
    const std::string text = e.to_string();
    const fused_expr back = fused_expr::parse(text, 1, {2});
    for (const auto& in : back.instrs) {
      const double got = in.args[0].is_literal() ? in.args[0].literal : in.args[1].literal;
      EXPECT_EQ(std::bit_cast<std::uint64_t>(got), std::bit_cast<std::uint64_t>(x)) << text;
    }
    EXPECT_EQ(back.to_string(), text);
  }
  EXPECT_EQ(fused_expr::parse("add(%0, 3)", 1, {1}).instrs[0].args[1].literal, 3.0);
  EXPECT_EQ(fused_expr::parse("add(%0, 0.1)", 1, {1}).instrs[0].args[1].literal, 0.1);
  EXPECT_EQ(fused_expr::parse("add(%0, -1e-300)", 1, {1}).instrs[0].args[1].literal, -1e-300);
}

// A random valid expression of `n` instructions over `inputs` inputs.
fused_expr random_expr(std::mt19937_64& rng, std::int32_t inputs, int n) {
  fused_expr e;
  e.num_inputs = inputs;
  auto pick_literal = [&]() -> double {
    switch (rng() % 4) {
      case 0:
        return static_cast<double>(static_cast<int>(rng() % 21) - 10);
      case 1:
        return std::uniform_real_distribution<double>(-5.0, 5.0)(rng);
      case 2: {
        // Any finite double, bit patterns drawn at random.
        for (;;) {
          const double d = std::bit_cast<double>(rng());
          if (std::isfinite(d)) return d;
        }
      }
      default:
        return std::ldexp(1.0, static_cast<int>(rng() % 200) - 100);
    }
  };
  for (int k = 0; k < n; ++k) {
    fused_instr in;
    in.op = static_cast<ew_op>(rng() % num_ew_ops);
    for (int j = 0; j < info(in.op).arity; ++j) {
      const std::int32_t defined = inputs + k;
      if (defined == 0 || rng() % 5 == 0) {
        in.args[static_cast<std::size_t>(j)] = literal(pick_literal());
      } else {
        in.args[static_cast<std::size_t>(j)] =
            value(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(defined)));
      }
    }
    e.instrs.push_back(in);
  }
  const int m = 1 + static_cast<int>(rng() % 3);
  for (int j = 0; j < m; ++j) {
    e.results.push_back(
        static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(e.num_values())));
  }
  return e;
}

TEST(FusedExpr, RandomExpressionsRoundTrip) {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 500; ++trial) {
    const auto inputs = static_cast<std::int32_t>(1 + rng() % 4);
    const fused_expr e = random_expr(rng, inputs, static_cast<int>(rng() % 31));
    ASSERT_NO_THROW(e.validate());
    const std::string text = e.to_string();
    const std::vector<std::int64_t> results(e.results.begin(), e.results.end());
    const fused_expr back = fused_expr::parse(text, inputs, results);
    ASSERT_EQ(back, e) << text;
    ASSERT_EQ(back.to_string(), text);
  }
}

TEST(FusedExpr, EmptyProgramIsInputsOnly) {
  const fused_expr e = fused_expr::parse("", 2, {1, 0});
  EXPECT_TRUE(e.instrs.empty());
  EXPECT_EQ(e.results, (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(e.to_string(), "");
  EXPECT_EQ(fused_expr::parse("   ", 1, {0}).instrs.size(), 0u);
}

TEST(FusedExpr, ParseErrorsNameThePositionAndTheProblem) {
  auto parse = [](std::string text, std::int32_t n, std::vector<std::int64_t> results) {
    return [=] { (void)fused_expr::parse(text, n, results); };
  };
  expect_message(parse("foo(%0)", 1, {1}), {"position 0", "unknown op 'foo'"});
  expect_message(parse("neg(%0); Exp(%1)", 1, {2}), {"position 9", "unknown op 'Exp'"});
  expect_message(parse("add(%0)", 1, {1}), {"position 0", "add takes 2 operands, got 1"});
  expect_message(parse("exp(%0, %0)", 1, {1}), {"exp takes 1 operand, got 2"});
  expect_message(parse("neg()", 1, {1}), {"neg takes 1 operand, got 0"});
  expect_message(parse("add(%0, %0, %0)", 1, {1}), {"add takes 2 operands, got 3"});
  expect_message(parse("neg(%1)", 1, {1}),
                 {"position 4", "%1 is used before it is defined", "%0 .. %0"});
  expect_message(parse("neg(%0); add(%2, %0)", 1, {2}),
                 {"position 13", "%2 is used before it is defined"});
  expect_message(parse("neg(%0)", 0, {0}), {"%0 is used before it is defined", "no values"});
  expect_message(parse("add(%0, inf)", 1, {1}), {"position 8", "literal 'inf' is not finite"});
  expect_message(parse("add(%0, -inf)", 1, {1}), {"not finite"});
  expect_message(parse("add(%0, nan)", 1, {1}), {"literal 'nan' is not finite"});
  expect_message(parse("add(%0, 1e999)", 1, {1}),
                 {"position 8", "1e999", "out of a double's range"});
  expect_message(parse("add(%0, x)", 1, {1}), {"position 8", "expected a value (%k) or a number"});
  expect_message(parse("add(%0, +1)", 1, {1}), {"expected a value (%k) or a number"});
  expect_message(parse("add(%, 1)", 1, {1}), {"position 4", "expected a value number after '%'"});
  expect_message(parse("add(%-1, 1)", 1, {1}), {"expected a value number after '%'"});
  expect_message(parse("neg(%99999999999999999999)", 1, {1}), {"value number out of range"});
  expect_message(parse("neg %0", 1, {1}), {"position 4", "expected '('"});
  expect_message(parse("neg(%0", 1, {1}), {"position 6", "expected ')', got the end"});
  expect_message(parse("add(%0 %0)", 1, {1}), {"position 7", "expected ')'"});
  expect_message(parse("neg(%0) neg(%1)", 1, {2}), {"position 8", "expected ';' or the end"});
  expect_message(parse("neg(%0);", 1, {1}), {"position 8", "expected an instruction after ';'"});
  expect_message(parse("(%0)", 1, {1}), {"position 0", "expected an op name"});
  expect_message(parse("neg(%0)", 1, {2}), {"result 0 is %2", "%0 .. %1"});
  expect_message(parse("neg(%0)", 1, {1, -1}), {"result 1 is %-1"});
  expect_message(parse("neg(%0)", 1, {}), {"there are no results"});
  expect_message(parse("", -1, {0}), {"num_inputs -1 is negative"});
  // The text is quoted in the message.
  expect_message(parse("neg(%0); bad(%1)", 1, {1}), {"\"neg(%0); bad(%1)\""});
}

TEST(FusedExpr, ValidateChecksEveryInvariant) {
  auto valid = [] {
    fused_expr e;
    e.num_inputs = 1;
    e.instrs = {{ew_op::exp, {value(0), {}}}, {ew_op::add, {value(1), literal(1.0)}}};
    e.results = {2};
    return e;
  };
  EXPECT_NO_THROW(valid().validate());
  {
    auto e = valid();
    e.num_inputs = -1;
    expect_message([&] { e.validate(); }, {"num_inputs -1 is negative"});
  }
  {
    auto e = valid();
    e.instrs[1].op = static_cast<ew_op>(99);
    expect_message([&] { e.validate(); }, {"instruction 1 has an unknown op (99)"});
  }
  {
    auto e = valid();
    e.instrs[0].args[0] = value(1);  // itself
    expect_message([&] { e.validate(); },
                   {"instruction 0 (exp)", "operand 0 is %1", "not defined before it"});
  }
  {
    auto e = valid();
    e.instrs[1].args[1] = literal(std::numeric_limits<double>::quiet_NaN());
    expect_message([&] { e.validate(); }, {"instruction 1 (add)", "not finite"});
  }
  {
    auto e = valid();
    e.instrs[1].args[1] = {-7, 1.0};
    expect_message([&] { e.validate(); }, {"operand 1 has value number -7"});
  }
  {
    auto e = valid();
    e.results = {3};
    expect_message([&] { e.validate(); }, {"result 0 is %3", "%0 .. %2"});
  }
  {
    auto e = valid();
    e.results.clear();
    expect_message([&] { e.validate(); }, {"there are no results"});
  }
  {
    // A unary op's unused second operand is not looked at.
    auto e = valid();
    e.instrs[0].args[1] = value(50);
    EXPECT_NO_THROW(e.validate());
  }
}

// ---- expand ----------------------------------------------------------------------------------

TEST(FusedExpr, ExpandAddsThePrimitiveOps) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f64, {2, 3});
  auto y = ops::placeholder(b, "y", dtype::f64, {3});
  const fused_expr e = fused_expr::parse(
      "mul(%0, %1); add(%2, 0.5); gelu_tanh(%3); relu_grad(%4, %0); exp(%1)", 2, {5, 2, 6, 1});
  const std::size_t before = g.num_nodes();
  const auto outs = expand(e, {x, y}, {.name = "f", .device = "cpu:0"});
  ASSERT_EQ(outs.size(), 4u);
  // mul, scalar, add, gelu, relu_grad, exp, and broadcast_to for the [3] results.
  const std::vector<std::string> ops_added = {"mul",       "const", "add",          "gelu",
                                              "relu_grad", "exp",   "broadcast_to", "broadcast_to"};
  ASSERT_EQ(g.num_nodes() - before, ops_added.size());
  for (std::size_t k = 0; k < ops_added.size(); ++k) {
    const node& n = g.at(static_cast<node_id>(before + k));
    EXPECT_EQ(n.op(), ops_added[k]);
    EXPECT_EQ(n.name.rfind("f/", 0), 0u) << n.name;
    EXPECT_EQ(n.requested_device, "cpu:0");
  }
  const node& lit = g.at(static_cast<node_id>(before + 1));
  EXPECT_EQ(lit.outputs[0].type, dtype::f64);
  EXPECT_EQ(lit.attr<tensor>("value").data<double>()[0], 0.5);
  EXPECT_EQ(g.at(static_cast<node_id>(before + 3)).attr<std::string>("approximate"), "tanh");
  // Results in order, each of the fused node's output type.
  EXPECT_EQ(outs[0].producer().op(), "relu_grad");
  EXPECT_EQ(outs[1].producer().op(), "mul");
  EXPECT_EQ(outs[2].producer().op(), "broadcast_to");
  EXPECT_EQ(outs[3].producer().op(), "broadcast_to");
  EXPECT_EQ(outs[3].producer().inputs[0], y.ep());
  for (const auto& o : outs) EXPECT_EQ(o.type(), (tensor_type{dtype::f64, shape{2, 3}}));
  // relu_grad reads (dy, y) in the expression's order.
  const node& rg = outs[0].producer();
  EXPECT_EQ(g.at(rg.inputs[0].node).op(), "gelu");
  EXPECT_EQ(rg.inputs[1], x.ep());

  // expand_values: every value, the inputs first, no broadcast.
  const auto values = expand_values(e, {x, y});
  ASSERT_EQ(values.size(), 7u);
  EXPECT_EQ(values[0].ep(), x.ep());
  EXPECT_EQ(values[6].producer().op(), "exp");
  EXPECT_EQ(values[6].type().shape, (shape{3}));
}

TEST(FusedExpr, ExpandRejectsBadArguments) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2});
  auto i = ops::placeholder(b, "i", dtype::f64, {2});
  const fused_expr e = fused_expr::parse("add(%0, %1)", 2, {2});
  expect_message([&] { (void)expand(e, {x}); }, {"takes 2 inputs, got 1"});
  expect_message([&] { (void)expand(e, {}); }, {"needs an input"});
  expect_message([&] { (void)expand(e, {x, i}); }, {"input 1 is float64 but input 0 is float32"});
  fused_expr bad = e;
  bad.results = {7};
  expect_message([&] { (void)expand(bad, {x, x}); }, {"result 0 is %7"});
}

// ---- the op ------------------------------------------------------------------------------------

TEST(FusedElementwiseOp, InfersTheBroadcastShapeForEveryResult) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f16, {4, 1, 3});
  auto y = ops::placeholder(b, "y", dtype::f16, {2, 1});
  auto s = ops::placeholder(b, "s", dtype::f16, {});
  const fused_expr e = fused_expr::parse("mul(%0, %2); exp(%3)", 3, {4, 3, 1});
  const auto outs = ops::fused_elementwise({x, y, s}, e, {.name = "fused"});
  ASSERT_EQ(outs.size(), 3u);
  for (const auto& o : outs) EXPECT_EQ(o.type(), (tensor_type{dtype::f16, shape{4, 2, 3}}));
  const node& n = g.get("fused");
  EXPECT_EQ(n.attr<std::int64_t>("N"), 3);
  EXPECT_EQ(n.attr<std::int64_t>("M"), 3);
  EXPECT_EQ(n.attr<std::string>("expr"), "mul(%0, %2); exp(%3)");
  EXPECT_EQ(n.attr<std::vector<std::int64_t>>("results"), (std::vector<std::int64_t>{4, 3, 1}));
  EXPECT_EQ(n.attr<dtype>("T"), dtype::f16);

  // Unknown dimensions stay unknown.
  auto u = ops::placeholder(b, "u", dtype::f16, {-1, 3});
  const auto o2 = ops::fused_elementwise({u, s}, fused_expr::parse("add(%0, %1)", 2, {2}));
  EXPECT_EQ(o2[0].type().shape, (shape{-1, 3}));
  const node_id r = g.add_node({.name = "unknown_dim",
                                .op = "fused_elementwise",
                                .inputs = {x.ep(), u.ep()},
                                .attrs = {{"M", 1}, {"expr", "add(%0, %1)"}, {"results", {2}}}})
                        .id;
  EXPECT_EQ(g.at(r).outputs[0].shape, (shape{4, -1, 3}));

  // Survives serialization.
  const graph back = graph_from_json(graph_to_json(g));
  EXPECT_EQ(back.get("fused").attrs, n.attrs);
  EXPECT_EQ(back.get("fused").outputs, n.outputs);
}

TEST(FusedElementwiseOp, BadNodesAreRefusedNamingTheNodeAndTheProblem) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {2, 3});
  auto z = ops::placeholder(b, "z", dtype::f32, {4});
  auto i = ops::placeholder(b, "i", dtype::i32, {2, 3});
  auto d = ops::placeholder(b, "d", dtype::f64, {2, 3});
  auto add = [&](const std::string& name, std::vector<endpoint> inputs, attr_map attrs) {
    return [&g, name, inputs, attrs] {
      (void)g.add_node({.name = name, .op = "fused_elementwise", .inputs = inputs, .attrs = attrs});
    };
  };
  const attr_map ok{{"M", 1}, {"expr", "neg(%0)"}, {"results", {1}}};
  expect_message(
      add("bad_expr", {x.ep()}, {{"M", 1}, {"expr", "neg(%0); frob(%1)"}, {"results", {2}}}),
      {"node 'bad_expr' (fused_elementwise)", "position 9", "unknown op 'frob'"});
  expect_message(add("late", {x.ep()}, {{"M", 1}, {"expr", "neg(%1)"}, {"results", {1}}}),
                 {"node 'late'", "%1 is used before it is defined"});
  expect_message(add("count", {x.ep()}, {{"M", 2}, {"expr", "neg(%0)"}, {"results", {1}}}),
                 {"node 'count'", "'results' has 1 entries but M is 2"});
  expect_message(add("range", {x.ep()}, {{"M", 1}, {"expr", "neg(%0)"}, {"results", {5}}}),
                 {"node 'range'", "result 0 is %5"});
  expect_message(
      add("shapes", {x.ep(), z.ep()}, {{"M", 1}, {"expr", "add(%0, %1)"}, {"results", {2}}}),
      {"node 'shapes'", "[2, 3]", "[4]", "do not broadcast"});
  expect_message(add("ints", {i.ep()}, ok), {"node 'ints'", "T = int32 is not supported"});
  expect_message(
      add("mixed", {x.ep(), d.ep()}, {{"M", 1}, {"expr", "add(%0, %1)"}, {"results", {2}}}),
      {"node 'mixed'", "float64"});
  attr_map typed_ok = ok;
  typed_ok.emplace("T", dtype::f32);  // with no input, T is not inferred
  expect_message(add("none", {}, typed_ok), {"node 'none'", "attribute 'N' = 0: must be >= 1"});
  expect_message(add("no_m", {x.ep()},
                     {{"M", 0}, {"expr", "neg(%0)"}, {"results", std::vector<std::int64_t>{}}}),
                 {"node 'no_m'", "attribute 'M' = 0: must be >= 1"});
  expect_message(add("no_expr", {x.ep()}, {{"M", 1}, {"results", {1}}}),
                 {"node 'no_expr'", "missing required attribute 'expr'"});
  expect_message(
      add("wrong_n", {x.ep()}, {{"N", 2}, {"M", 1}, {"expr", "neg(%0)"}, {"results", {1}}}),
      {"node 'wrong_n'", "'N' = 2 asks for more inputs"});
  // The builder checks before adding.
  const fused_expr two = fused_expr::parse("add(%0, %1)", 2, {2});
  expect_message([&] { (void)ops::fused_elementwise({x}, two); }, {"takes 2 inputs, got 1"});
  expect_message([&] { (void)ops::fused_elementwise({}, two); }, {"needs at least one input"});
  fused_expr broken = two;
  broken.results.clear();
  expect_message([&] { (void)ops::fused_elementwise({x, x}, broken); }, {"no results"});
  // Nothing was added by the failures.
  EXPECT_EQ(g.num_nodes(), 4u);
}

}  // namespace
}  // namespace loom
