// Graph passes never change answers. Every pass and every fused kernel, on graphs built to
// trigger it, run once with the passes off (the graph as written, each op its own kernel)
// and once with them on, over inputs that mix ordinary values with NaN, +-inf, -0.0,
// subnormals, the largest finite magnitudes and the smallest normal ones:
//   - NaN exactly where the unfused graph has NaN (payload and sign of a NaN not compared);
//   - every other element bitwise equal (so the sign of a zero or an infinity too), except
//     where a fused kernel reassociates a sum (layer_norm's statistics), which is held to a
//     tolerance named with its reason (docs/passes.md, "Passes never change an answer");
//   - each case also checks that its pass fired (the log's rewrites, the planned graph's
//     fused nodes), so that no case passes by running the same graph twice.
// And the unfused ops themselves against NumPy's and PyTorch's rules on special values. The
// fused element-wise and layer_norm kernels pick their instruction set per process;
// tests/CMakeLists.txt runs this test again under LOOM_MAX_CPU_ISA=baseline and avx2.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <map>
#include <set>

#include "loom/graph/fused_expr.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "passes/pattern_test_support.hpp"

namespace loom {
namespace {

using namespace testing;

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

const dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// ---- values ------------------------------------------------------------------------------

// The values every input mixes in: NaN, the infinities, both zeros, ordinary values, values
// where exp / tanh / sigmoid saturate, and per dtype its subnormals, smallest normals and
// largest finite magnitudes.
std::vector<double> specials(dtype t) {
  std::vector<double> v{nan,  inf,  -inf, 0.0,  -0.0,  1.0,   -1.0,  0.5,   -1.5,
                        2.25, 6.0,  -3.0, 20.0, -20.0, 100.0, -100.0, 1e-3, 0.044715};
  switch (t) {
    case dtype::f64:
      v.insert(v.end(), {1e-310, -1e-310, 2.3e-308, -2.3e-308, 1.7e308, -1.7e308, 3e38, -3e38});
      break;
    case dtype::f16:
      v.insert(v.end(), {1e-7, -1e-7, 6.2e-5, -6.2e-5, 6e4, -6e4, 300.0, -300.0});
      break;
    default:  // f32, bf16: the same exponent range
      v.insert(v.end(), {1e-40, -1e-40, 1.2e-38, -1.2e-38, 3e38, -3e38, 2e19, -2e19});
      break;
  }
  return v;
}

// `count` ordinary values in [-3, 3).
std::vector<double> ordinary(std::mt19937& rng, std::int64_t count) {
  return uniform(rng, count, -3.0, 3.0);
}

// specials(t) followed by ordinary values, `count` in all (count >= specials(t).size()).
std::vector<double> mixed(dtype t, std::mt19937& rng, std::int64_t count) {
  std::vector<double> v = specials(t);
  const auto rest = ordinary(rng, count - static_cast<std::int64_t>(v.size()));
  v.insert(v.end(), rest.begin(), rest.end());
  return v;
}

/// A host tensor of float type t holding `v` (make_tensor, pattern_test_support.hpp).
tensor make(dtype t, const shape& s, const std::vector<double>& v) { return make_tensor(t, s, v); }

// Element i of a dense host tensor of a float type, as a double, and its bits.
double value_at(const tensor& x, std::size_t i) {
  switch (x.type()) {
    case dtype::f32:
      return x.data<float>()[i];
    case dtype::f64:
      return x.data<double>()[i];
    case dtype::f16:
      return static_cast<float>(x.data<half>()[i]);
    case dtype::bf16:
      return static_cast<float>(x.data<bfloat16>()[i]);
    default:
      ADD_FAILURE() << "value_at: unsupported dtype " << to_string(x.type());
      return 0.0;
  }
}
std::uint64_t bits_at(const tensor& x, std::size_t i) {
  const std::size_t size = size_of(x.type());
  std::uint64_t b = 0;
  std::memcpy(&b, static_cast<const char*>(x.raw_data()) + i * size, size);
  return b;
}

std::string show(const tensor& x, std::size_t i) {
  return fmt::format("{} (0x{:x})", value_at(x, i), bits_at(x, i));
}

// How the passes-on result must match the passes-off one. Bitwise unless a tolerance is
// given: then |on - off| <= atol + rtol |off| for finite values, infinities equal.
struct tolerance {
  double rtol = 0.0;
  double atol = 0.0;
  [[nodiscard]] bool bitwise() const { return rtol == 0.0 && atol == 0.0; }
};
constexpr tolerance bitwise{};

// Expects `on` to match `off` element by element: NaN in the same places, the rest bitwise
// or within `tol`. `inputs` (dense, of the same element count, or empty) are printed beside
// the first elements that differ.
void expect_same(const tensor& off, const tensor& on, tolerance tol, const std::string& what,
                 const std::vector<tensor>& inputs = {}) {
  ASSERT_EQ(off.type(), on.type()) << what;
  ASSERT_EQ(off.shape(), on.shape()) << what;
  const auto n = static_cast<std::size_t>(off.num_elements());
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = value_at(off, i);
    const double b = value_at(on, i);
    bool ok = false;
    if (std::isnan(a) || std::isnan(b)) {
      ok = std::isnan(a) && std::isnan(b);
    } else if (tol.bitwise()) {
      ok = bits_at(off, i) == bits_at(on, i);
    } else if (std::isinf(a) || std::isinf(b)) {
      ok = a == b;
    } else {
      ok = std::abs(a - b) <= tol.atol + tol.rtol * std::abs(a);
    }
    if (ok) continue;
    if (++bad <= 6) {
      first += fmt::format("\n  [{}] passes off {}, on {}", i, show(off, i), show(on, i));
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (static_cast<std::size_t>(inputs[k].num_elements()) == n) {
          first += fmt::format("; input {} = {}", k, show(inputs[k], i));
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << " (" << to_string(off.type()) << to_string(off.shape())
                     << "): " << bad << " of " << n << " elements differ"
                     << (tol.bitwise() ? " bitwise" : fmt::format(" beyond rtol {} atol {}",
                                                                  tol.rtol, tol.atol))
                     << first;
}

// The graph run with every pass off, then with every pass on.
struct off_on {
  std::vector<tensor> off;
  std::vector<tensor> on;
  std::vector<passes::pass_record> log;  // of the run with the passes on
  std::vector<planned_node> planned;     // the graph that run's plan ran
};

off_on run_off_on(const graph& g, const std::vector<feed>& feeds,
                  const std::vector<std::string>& fetches,
                  const std::vector<std::string>& targets = {}) {
  std::vector<std::string> names;
  for (const auto& f : feeds) names.push_back(f.first);
  off_on r;
  session_options o;
  o.devices.cpu_threads = 2;
  o.passes.enabled = false;
  {
    session off(g, o);
    r.off = detach(off.run(feeds, fetches, targets));
  }
  o.passes.enabled = true;
  session on(g, o);
  r.on = detach(on.run(feeds, fetches, targets));
  r.log = on.explain_passes(names, fetches, targets);
  r.planned = describe(on.planned_graph(names, fetches, targets));
  return r;
}

// Every fetch of `r` compared, named by `fetches`.
void expect_all_same(const off_on& r, const std::vector<std::string>& fetches, tolerance tol,
                     const std::string& what, const std::vector<tensor>& inputs = {}) {
  ASSERT_EQ(r.off.size(), fetches.size());
  ASSERT_EQ(r.on.size(), fetches.size());
  for (std::size_t k = 0; k < fetches.size(); ++k) {
    expect_same(r.off[k], r.on[k], tol, what + " " + fetches[k], inputs);
  }
}

// ---- the unfused ops themselves: NumPy's and PyTorch's rules --------------------------------

// np.maximum / np.minimum over float32 arrays: NaN if either operand is NaN, else the
// larger / smaller; a tie (-0 against +0) gives the second operand (np.maximum(-0.0, 0.0)
// is 0.0 and np.maximum(0.0, -0.0) is -0.0; NumPy's scalar path picks the other way, so
// loom picks this one: Note [NaN rules]).
double np_maximum(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return nan;
  return a > b ? a : b;
}
double np_minimum(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return nan;
  return a < b ? a : b;
}
// torch.relu: NaN stays NaN, -0.0 stays -0.0, -inf is 0.
double torch_relu(double x) {
  return x < 0.0 ? 0.0 : x;
}

// The unfused ops follow NumPy and PyTorch on special values (so a fused kernel that
// matches them does too): maximum, minimum, relu, and the clamp spelled with them (np.clip
// keeps NaN, as torch.clamp(NaN, 0, 6) does), run with the passes off and on, against the
// rules written above, bitwise.
TEST(PassDifferential, UnfusedAndFusedOpsFollowNumPyOnSpecialValues) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    const auto sp = specials(t);
    std::vector<double> a;
    std::vector<double> bv;
    for (double u : sp) {
      for (double v : sp) {
        a.push_back(u);
        bv.push_back(v);
      }
    }
    const auto n = static_cast<std::int64_t>(a.size());
    const tensor x = make(t, {n}, a);
    const tensor y = make(t, {n}, bv);
    // The inputs as t holds them.
    std::vector<double> xa(a.size());
    std::vector<double> ya(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      xa[i] = value_at(x, i);
      ya[i] = value_at(y, i);
    }
    graph g;
    graph_builder b(g);
    auto px = ops::placeholder(b, "x", t, {n});
    auto py = ops::placeholder(b, "y", t, {n});
    ops::identity(ops::maximum(px, py), {.name = "max_xy"});
    ops::identity(ops::minimum(px, py), {.name = "min_xy"});
    ops::identity(ops::relu(px), {.name = "relu_x"});
    ops::identity(ops::minimum(ops::maximum(px, ops::scalar(b, 0.0, t)), ops::scalar(b, 6.0, t)),
                  {.name = "clip_x_0_6"});
    const std::vector<std::string> fetches{"max_xy", "min_xy", "relu_x", "clip_x_0_6"};
    const auto r = run_off_on(g, {{"x", x}, {"y", y}}, fetches);
    EXPECT_GE(count_op(r.planned, "fused_elementwise"), 1u) << log_text(r.log);
    std::vector<std::vector<double>> want(4, std::vector<double>(a.size()));
    for (std::size_t i = 0; i < a.size(); ++i) {
      want[0][i] = np_maximum(xa[i], ya[i]);
      want[1][i] = np_minimum(xa[i], ya[i]);
      want[2][i] = torch_relu(xa[i]);
      want[3][i] = np_minimum(np_maximum(xa[i], 0.0), 6.0);
    }
    for (std::size_t k = 0; k < fetches.size(); ++k) {
      const tensor reference = make(t, {n}, want[k]);
      expect_same(reference, r.off[k], bitwise, "unfused " + fetches[k], {x, y});
      expect_same(reference, r.on[k], bitwise, "fused " + fetches[k], {x, y});
    }
  }
}

// ---- remove_identities, constant_folding, common_subexpressions ---------------------------

TEST(PassDifferential, RemoveIdentitiesKeepsEveryBit) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(1);
    const std::int64_t n = 64;
    const tensor xv = make(t, {n}, mixed(t, rng, n));
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, {n});
    auto one = [&] { return ops::scalar(b, 1.0, t); };
    auto zero = [&](double z) { return ops::scalar(b, z, t); };
    // Each wrapped in neg so that the fetch is a computed value either way.
    ops::neg(x * one(), {.name = "x_times_1"});
    ops::neg(one() * x, {.name = "1_times_x"});
    ops::neg(x / one(), {.name = "x_over_1"});
    ops::neg(x - zero(0.0), {.name = "x_minus_0"});
    ops::neg(x + zero(-0.0), {.name = "x_plus_minus_0"});
    ops::neg(ops::add(x, zero(0.0), {.name = "add_0"}), {.name = "x_plus_0"});  // -0 + 0 is +0
    ops::neg(ops::cast(x, t), {.name = "cast_same"});
    ops::neg(ops::identity(x), {.name = "via_identity"});
    ops::neg(ops::reshape(x, {n}), {.name = "reshape_same"});
    ops::neg(ops::transpose(x, {0}), {.name = "transpose_identity"});
    const std::vector<std::string> fetches{
        "x_times_1", "1_times_x", "x_over_1",     "x_minus_0",          "x_plus_minus_0",
        "x_plus_0",  "cast_same", "via_identity", "reshape_same", "transpose_identity"};
    const auto r = run_off_on(g, {{"x", xv}}, fetches);
    EXPECT_GE(rewrites(r.log, "remove_identities"), 9u) << log_text(r.log);
    for (const auto& rec : records(r.log, "remove_identities", passes::pass_record::kind::rewrite)) {
      EXPECT_NE(rec.nodes.at(0), "add_0") << "x + 0 turns -0 into +0: not a no-op";
    }
    expect_all_same(r, fetches, bitwise, "remove_identities", {xv});
  }
}

// Unary ops of the element-wise family, by name, for graphs written by hand.
output unary(const std::string& op, output x) {
  if (op == "neg") return ops::neg(x);
  if (op == "abs") return ops::abs(x);
  if (op == "exp") return ops::exp(x);
  if (op == "log") return ops::log(x);
  if (op == "sqrt") return ops::sqrt(x);
  if (op == "rsqrt") return ops::rsqrt(x);
  if (op == "tanh") return ops::tanh(x);
  if (op == "sigmoid") return ops::sigmoid(x);
  if (op == "relu") return ops::relu(x);
  if (op == "gelu") return ops::gelu(x, "none");
  if (op == "gelu_tanh") return ops::gelu(x, "tanh");
  if (op == "erf") return ops::erf(x);
  if (op == "square") return ops::square(x);
  if (op == "reciprocal") return ops::reciprocal(x);
  ADD_FAILURE() << "no unary op " << op;
  return x;
}

const char* const unary_ops[] = {"neg",  "abs",     "exp",  "log",       "sqrt",
                                 "rsqrt", "tanh",   "sigmoid", "relu",   "gelu",
                                 "gelu_tanh", "erf", "square", "reciprocal"};

TEST(PassDifferential, ConstantFoldingKeepsEveryBit) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(2);
    const std::int64_t n = 48;
    const auto cv = mixed(t, rng, n);
    const tensor xv = make(t, {n}, ordinary(rng, n));
    graph g;
    graph_builder b(g);
    auto c = ops::constant(b, make(t, {n}, cv));
    auto c2 = ops::constant(b, make(t, {n}, std::vector<double>(cv.rbegin(), cv.rend())));
    auto x = ops::placeholder(b, "x", t, {n});
    std::vector<std::string> fetches;
    for (const char* op : unary_ops) {
      // Folded whole; and folded, then a value the rest of the graph reads.
      ops::identity(unary(op, c), {.name = fmt::format("folded_{}", op)});
      fetches.push_back(fmt::format("folded_{}", op));
    }
    ops::identity(ops::maximum(c, c2), {.name = "folded_maximum"});
    ops::identity(ops::minimum(c, c2), {.name = "folded_minimum"});
    ops::identity(ops::pow(c, c2), {.name = "folded_pow"});
    ops::identity(ops::relu(c) * x + ops::sigmoid(c2), {.name = "folded_then_fused"});
    fetches.insert(fetches.end(),
                   {"folded_maximum", "folded_minimum", "folded_pow", "folded_then_fused"});
    // One-element constants folded into literals of a fused expression, NaN and infinities
    // included (those stay inputs: a literal is finite).
    const double scalars[] = {0.5, -0.0, nan, inf, -inf, 1e-40, 100.0};
    for (std::size_t k = 0; k < std::size(scalars); ++k) {
      auto s = ops::exp(ops::scalar(b, scalars[k], t));
      ops::identity(ops::maximum(x, s) * ops::scalar(b, 2.0, t) - s,
                    {.name = fmt::format("literal_{}", k)});
      fetches.push_back(fmt::format("literal_{}", k));
    }
    const auto r = run_off_on(g, {{"x", xv}}, fetches);
    EXPECT_GE(rewrites(r.log, "constant_folding"), 1u) << log_text(r.log);
    for (const char* op : {"exp", "sqrt", "maximum", "pow", "sigmoid"}) {
      EXPECT_EQ(count_op(r.planned, op), 0u) << op << " left unfolded\n" << log_text(r.log);
    }
    expect_all_same(r, fetches, bitwise, "constant_folding");
  }
}

TEST(PassDifferential, CommonSubexpressionsKeepEveryBit) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(3);
    const std::int64_t n = 64;
    const tensor xv = make(t, {n}, mixed(t, rng, n));
    const tensor yv = make(t, {n}, ordinary(rng, n));
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, {n});
    auto y = ops::placeholder(b, "y", t, {n});
    ops::identity(ops::relu(x) + ops::relu(x), {.name = "relu_twice"});
    ops::identity(ops::exp(x * y) - ops::exp(x * y), {.name = "exp_twice"});
    ops::identity(ops::maximum(x, ops::scalar(b, 0.0, t)) * ops::maximum(x, ops::scalar(b, 0.0, t)),
                  {.name = "max_twice"});
    const std::vector<std::string> fetches{"relu_twice", "exp_twice", "max_twice"};
    const auto r = run_off_on(g, {{"x", xv}, {"y", yv}}, fetches);
    EXPECT_GE(rewrites(r.log, "common_subexpressions"), 3u) << log_text(r.log);
    expect_all_same(r, fetches, bitwise, "common_subexpressions", {xv, yv});
  }
}

// ---- elementwise_fusion -------------------------------------------------------------------

// One fused group per case: the expression over its inputs, expanded into primitive ops by
// loom::expand (literals become scalar constants of the dtype), which the pass fuses back.
struct ew_case {
  std::string name;
  std::string expr;
  std::vector<std::string> inputs;  // placeholder names
  std::vector<std::int64_t> results;
};

// Runs every case in one graph over the feeds, expects one fused_elementwise node per case
// and no primitive op left, and every result bitwise equal.
void check_fused(dtype t, const std::vector<ew_case>& cases, const std::vector<feed>& feeds,
                 const std::string& what) {
  graph g;
  graph_builder b(g);
  std::map<std::string, tensor> values;
  for (const auto& [name, value] : feeds) values.emplace(name, value);
  // Each case reads placeholders of its own, so that common_subexpressions cannot merge
  // parts of different cases (which would leave shared values, and groups of one op).
  std::vector<feed> case_feeds;
  std::vector<std::string> fetches;
  std::set<std::string> primitive_ops;
  for (const auto& c : cases) {
    std::vector<output> inputs;
    std::map<std::string, output> own;
    for (const auto& name : c.inputs) {
      if (!own.contains(name)) {
        const tensor& v = values.at(name);
        const std::string p = c.name + "/" + name;
        own.emplace(name, ops::placeholder(b, p, v.type(), v.shape()));
        case_feeds.emplace_back(p, v);
      }
      inputs.push_back(own.at(name));
    }
    const fused_expr e = fused_expr::parse(c.expr, static_cast<std::int32_t>(c.inputs.size()),
                                           c.results);
    for (const auto& instr : e.instrs) {
      const std::string_view op = info(instr.op).name;
      primitive_ops.insert(op == "gelu_tanh" ? "gelu" : std::string(op));
    }
    const auto outs = expand(e, inputs, {.name = c.name});
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const std::string name = fmt::format("{}/out{}", c.name, j);
      ops::identity(outs[j], {.name = name});
      fetches.push_back(name);
    }
  }
  const auto r = run_off_on(g, case_feeds, fetches);
  // remove_identities takes the ops that return an input unchanged (x * 1, x - 0, ...),
  // leaving the neg alone, unfused: every other case is one fused node or more (a value
  // read by two groups), and no primitive op is left.
  std::size_t removed = 0;
  for (const auto& rec : records(r.log, "remove_identities", passes::pass_record::kind::rewrite)) {
    removed += rec.nodes.at(0).find("/out") == std::string::npos;
  }
  std::string others;
  for (const auto& pn : r.planned) {
    if (pn.op != "fused_elementwise" && pn.op != "_arg") others += " " + pn.name + ":" + pn.op;
  }
  EXPECT_GE(count_op(r.planned, "fused_elementwise"), cases.size() - removed)
      << "other nodes:" << others << "\n"
      << log_text(r.log);
  for (const auto& op : primitive_ops) {
    if (op == "neg" && removed > 0) continue;
    EXPECT_EQ(count_op(r.planned, op), 0u) << op << " left unfused\n" << log_text(r.log);
  }
  std::vector<tensor> inputs;
  for (const auto& f : feeds) inputs.push_back(f.second);
  expect_all_same(r, fetches, bitwise, what + " " + to_string(t), inputs);
}

std::vector<std::string> binary_ops() {
  return {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "relu_grad"};
}

// Every op of fused_expr, alone in a group with a neg after it (exact, so the op's own
// result is what is compared): unary ops over every special value; binary ops over every
// pair of special values, dense and broadcast, with literal operands on either side, and
// with one-element inputs (the kernel's constants).
TEST(PassDifferential, ElementwiseFusionEveryOpOverSpecialValues) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(4);
    const auto sp = specials(t);
    const auto ns = static_cast<std::int64_t>(sp.size());
    // Pairs: a runs slowly, b quickly; then ordinary pairs, so that vector loops and their
    // tails both see special values.
    std::vector<double> a;
    std::vector<double> bv;
    for (double u : sp) {
      for (double v : sp) {
        a.push_back(u);
        bv.push_back(v);
      }
    }
    const std::int64_t extra = 77;
    for (double v : ordinary(rng, extra)) a.push_back(v);
    for (double v : ordinary(rng, extra)) bv.push_back(v);
    const std::int64_t np = ns * ns + extra;
    const std::vector<feed> feeds{
        {"x", make(t, {np}, a)},
        {"y", make(t, {np}, bv)},
        {"col", make(t, {ns, 1}, sp)},
        {"row", make(t, {1, ns}, sp)},
        {"s0", make(t, {1}, {nan})},
        {"s1", make(t, {1}, {-0.0})},
        {"s2", make(t, {1}, {inf})},
        {"s3", make(t, {1}, {-inf})},
        {"s4", make(t, {1}, {1.5})},
    };
    std::vector<ew_case> cases;
    for (const char* op : unary_ops) {
      cases.push_back({fmt::format("{}_x", op), fmt::format("{}(%0); neg(%1)", op), {"x"}, {2}});
    }
    const double subnormal = sp[18];  // the dtype's
    const double literals[] = {0.0, -0.0, 1.0, 6.0, -1.5, subnormal};
    for (const auto& op : binary_ops()) {
      cases.push_back({op + "_xy", fmt::format("{}(%0, %1); neg(%2)", op), {"x", "y"}, {3}});
      cases.push_back(
          {op + "_broadcast", fmt::format("{}(%0, %1); neg(%2)", op), {"col", "row"}, {3}});
      for (std::size_t k = 0; k < std::size(literals); ++k) {
        const std::string lit = fmt::format("{}", literals[k]);
        cases.push_back(
            {fmt::format("{}_x_lit{}", op, k), fmt::format("{}(%0, {}); neg(%1)", op, lit), {"x"},
             {2}});
        cases.push_back(
            {fmt::format("{}_lit{}_x", op, k), fmt::format("{}({}, %0); neg(%1)", op, lit), {"x"},
             {2}});
      }
      for (int s = 0; s < 5; ++s) {
        const std::string sn = fmt::format("s{}", s);
        cases.push_back({fmt::format("{}_{}_x", op, sn), fmt::format("{}(%0, %1); neg(%2)", op),
                         {sn, "x"}, {3}});
        cases.push_back({fmt::format("{}_x_{}", op, sn), fmt::format("{}(%0, %1); neg(%2)", op),
                         {"x", sn}, {3}});
        // Both one-element: computed once per call.
        const std::string sm = fmt::format("s{}", (s + 1) % 5);
        cases.push_back({fmt::format("{}_{}_{}", op, sn, sm),
                         fmt::format("{}(%0, %1); neg(%2)", op), {sn, sm}, {3}});
      }
    }
    check_fused(t, cases, feeds, "every op");
  }
}

// The activations and clamps that are written with several ops (relu6, clamp, leaky relu,
// hard sigmoid / swish, SiLU, softplus, mish, ...), chains where a 16-bit intermediate
// overflows or underflows, multi-output groups and relu's gradient.
TEST(PassDifferential, ElementwiseFusionActivationsAndChains) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(5);
    const std::int64_t n = 300;
    const std::vector<feed> feeds{{"x", make(t, {n}, mixed(t, rng, n))},
                                  {"y", make(t, {n}, ordinary(rng, n))},
                                  {"z", make(t, {n}, mixed(t, rng, n))}};
    const std::vector<ew_case> cases{
        {"relu6", "maximum(%0, 0); minimum(%1, 6)", {"x"}, {2}},
        {"relu6_swapped", "minimum(6, %0); maximum(0, %1)", {"x"}, {2}},
        {"clamp", "minimum(%0, 1); maximum(%1, -1)", {"x"}, {2}},
        {"clamp_xz", "maximum(%0, %1); minimum(%2, 2.5)", {"x", "z"}, {3}},
        {"leaky_relu", "mul(%0, 0.01); maximum(%0, %1)", {"x"}, {2}},
        {"hard_sigmoid", "add(%0, 3); maximum(%1, 0); minimum(%2, 6); div(%3, 6)", {"x"}, {4}},
        {"hard_swish", "add(%0, 3); maximum(%1, 0); minimum(%2, 6); mul(%0, %3); div(%4, 6)",
         {"z"}, {5}},
        {"silu", "sigmoid(%0); mul(%0, %1)", {"x"}, {2}},
        {"softplus", "exp(%0); add(%1, 1); log(%2)", {"x"}, {3}},
        {"mish", "exp(%0); add(%1, 1); log(%2); tanh(%3); mul(%0, %4)", {"x"}, {5}},
        {"abs_sqrt", "abs(%0); sqrt(%1); rsqrt(%1); add(%2, %3)", {"x"}, {4}},
        {"relu_then_grad", "relu(%0); relu_grad(%1, %2)", {"y", "x"}, {3}},
        {"grad_of_nan", "mul(%0, %1); relu_grad(%2, %1)", {"x", "z"}, {3}},
        {"square_sqrt", "square(%0); sqrt(%1)", {"x"}, {2}},
        {"scale_down_up", "mul(%0, 1e-3); mul(%1, 1000)", {"x"}, {2}},
        {"difference_of_squares", "mul(%0, %0); mul(%1, %1); sub(%2, %3)", {"x", "z"}, {4}},
        {"gelu_chain", "gelu(%0); gelu_tanh(%1); sub(%2, %3)", {"x", "z"}, {4}},
        {"multi_output", "mul(%0, %1); relu(%2); sigmoid(%3); tanh(%2)", {"x", "z"}, {3, 4, 5}},
        {"erf_exp", "erf(%0); exp(%0); mul(%1, %2); reciprocal(%3)", {"x"}, {4}},
        {"pow_chain", "abs(%0); pow(%2, %1); minimum(%3, %0)", {"x", "z"}, {4}},
    };
    check_fused(t, cases, feeds, "chains");
  }
}

// Random straight-line programs over special values: each instruction an op of the family
// applied to earlier values or literals.
TEST(PassDifferential, ElementwiseFusionRandomPrograms) {
  const auto ops_of = [] {
    std::vector<std::pair<std::string, int>> v;
    for (int k = 0; k < num_ew_ops; ++k) {
      const auto& i = info(static_cast<ew_op>(k));
      v.emplace_back(std::string(i.name), i.arity);
    }
    return v;
  }();
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(6);
    const std::int64_t n = 200;
    const std::vector<feed> feeds{{"x", make(t, {n}, mixed(t, rng, n))},
                                  {"y", make(t, {n}, ordinary(rng, n))},
                                  {"z", make(t, {n}, mixed(t, rng, n))}};
    std::vector<ew_case> cases;
    for (int p = 0; p < 24; ++p) {
      std::string text;
      const int len = 3 + static_cast<int>(rng() % 8);
      for (int k = 0; k < len; ++k) {
        const auto& [name, arity] = ops_of[rng() % ops_of.size()];
        const int values = 3 + k;
        auto operand = [&] {
          if (rng() % 6 == 0) return std::string(rng() % 2 ? "0.5" : "-2");
          // Mostly the latest values, so the program is a chain rather than a fan.
          const int v = std::max(0, values - 1 - static_cast<int>(rng() % 3));
          return fmt::format("%{}", v);
        };
        std::string a = operand();
        if (a[0] != '%' && arity == 1) a = fmt::format("%{}", values - 1);
        text += fmt::format("{}{}({}{})", k > 0 ? "; " : "", name, a,
                            arity == 2 ? ", " + fmt::format("%{}", values - 1) : "");
      }
      cases.push_back({fmt::format("random_{}", p), text, {"x", "y", "z"}, {2 + len}});
    }
    check_fused(t, cases, feeds, "random programs");
  }
}

// A training step's element-wise work (forward and backward of a small network) fused by
// the pass as it fuses every training graph: multi-output groups, gradients of gelu,
// sigmoid, tanh and relu.
TEST(PassDifferential, ElementwiseFusionTrainingGraph) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    std::mt19937 rng(7);
    const std::int64_t n = 150;
    const tensor xv = make(t, {n}, mixed(t, rng, n));
    const tensor wv = make(t, {n}, ordinary(rng, n));
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, {n});
    auto w = ops::placeholder(b, "w", t, {n});
    auto h = ops::relu(x * w + ops::scalar(b, 0.5, t));
    auto u = ops::sigmoid(h) * ops::tanh(x) + ops::gelu(h - w, "tanh") - ops::gelu(x, "none");
    auto loss = ops::reduce_sum(u * u);
    const auto grads = gradients({loss}, {x, w});
    ops::identity(u, {.name = "u"});
    ops::identity(grads[0], {.name = "dx"});
    ops::identity(grads[1], {.name = "dw"});
    const std::vector<std::string> fetches{"u", "dx", "dw"};
    const auto r = run_off_on(g, {{"x", xv}, {"w", wv}}, fetches);
    EXPECT_GE(rewrites(r.log, "elementwise_fusion"), 1u) << log_text(r.log);
    EXPECT_EQ(count_op(r.planned, "relu"), 0u) << log_text(r.log);
    expect_all_same(r, fetches, bitwise, "training graph", {xv, wv});
  }
}

// ---- epilogue_fusion ------------------------------------------------------------------------

const char* const activations[] = {"none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};

output activate(const std::string& a, output x) {
  if (a == "none") return x;
  return unary(a, x);
}

// Spreads specials(t) over a [rows, cols] matrix of ordinary values: `every`-th element.
std::vector<double> sprinkled(dtype t, std::mt19937& rng, std::int64_t count, std::int64_t every,
                              std::int64_t offset) {
  auto v = ordinary(rng, count);
  const auto sp = specials(t);
  std::size_t k = 0;
  for (std::int64_t i = offset; i < count; i += every) v[static_cast<std::size_t>(i)] = sp[k++ % sp.size()];
  return v;
}

TEST(PassDifferential, EpilogueFusionMatmulEveryActivation) {
  for (const dtype t : float_types) {
    for (const char* act : activations) {
      for (const bool residual : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} residual {}", to_string(t), act, residual));
        std::mt19937 rng(8);
        const auto ns = static_cast<std::int64_t>(specials(t).size());
        const std::int64_t m = 9;
        const std::int64_t k = 12;
        const std::int64_t n = ns + 5;
        // a: ordinary but for row 0 (a NaN), row 1 (an inf), row 2 (zeros), row 3 (a huge
        // value); b: ordinary but for column 1 (a -inf); the bias: every special value
        // once; the residual: special values sprinkled.
        auto av = ordinary(rng, m * k);
        av[3] = nan;
        av[k + 5] = inf;
        for (std::int64_t j = 0; j < k; ++j) av[static_cast<std::size_t>(2 * k + j)] = 0.0;
        av[3 * k + 1] = specials(t)[specials(t).size() - 4];  // a largest finite magnitude
        auto bv = ordinary(rng, k * n);
        bv[static_cast<std::size_t>(4 * n + 1)] = -inf;
        auto biasv = ordinary(rng, n);
        const auto sp = specials(t);
        for (std::size_t j = 0; j < sp.size(); ++j) biasv[j] = sp[j];
        const auto rv = sprinkled(t, rng, m * n, 7, 2);
        graph g;
        graph_builder b(g);
        auto a = ops::placeholder(b, "a", t, {m, k});
        auto w = ops::placeholder(b, "b", t, {k, n});
        auto bias = ops::placeholder(b, "bias", t, {n});
        output y = ops::bias_add(ops::matmul(a, w), bias);
        std::vector<feed> feeds{
            {"a", make(t, {m, k}, av)}, {"b", make(t, {k, n}, bv)}, {"bias", make(t, {n}, biasv)}};
        if (residual) {
          auto res = ops::placeholder(b, "r", t, {m, n});
          y = y + res;
          feeds.emplace_back("r", make(t, {m, n}, rv));
        }
        ops::identity(activate(act, y), {.name = "y"});
        // Without a bias: the core and the activation alone (another input for b, which
        // common_subexpressions would otherwise merge with the first product).
        auto w2 = ops::placeholder(b, "b2", t, {k, n});
        feeds.emplace_back("b2", make(t, {k, n}, bv));
        ops::identity(activate(act, ops::matmul(a, w2)), {.name = "y_nobias"});
        const auto r = run_off_on(g, feeds, {"y", "y_nobias"});
        EXPECT_EQ(count_op(r.planned, "fused_matmul"), std::string(act) == "none" ? 1u : 2u)
            << log_text(r.log);
        EXPECT_EQ(count_op(r.planned, "matmul"), std::string(act) == "none" ? 1u : 0u);
        // Bitwise in every type: the plain matmul's kernel, then the unfused ops' functions
        // and roundings (Note [fused epilogue]).
        expect_all_same(r, {"y", "y_nobias"}, bitwise, "fused_matmul");
      }
    }
  }
}

TEST(PassDifferential, EpilogueFusionConv2dEveryActivation) {
  for (const dtype t : float_types) {
    for (const char* act : activations) {
      for (const bool residual : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} residual {}", to_string(t), act, residual));
        std::mt19937 rng(9);
        const auto ns = static_cast<std::int64_t>(specials(t).size());
        const shape xs{2, 3, 6, 5};
        const shape ws{ns, 3, 3, 3};
        const shape os{2, ns, 6, 5};  // padding 1
        auto xv = ordinary(rng, xs.num_elements());
        xv[7] = nan;
        xv[40] = inf;
        xv[95] = -inf;
        xv[100] = specials(t)[specials(t).size() - 4];
        auto wv = ordinary(rng, ws.num_elements());
        auto biasv = specials(t);
        const auto rv = sprinkled(t, rng, os.num_elements(), 11, 3);
        graph g;
        graph_builder b(g);
        auto x = ops::placeholder(b, "x", t, xs);
        auto w = ops::placeholder(b, "w", t, ws);
        auto bias = ops::placeholder(b, "bias", t, {ns});
        ops::conv2d_options co;
        co.padding = {1, 1};
        output y = ops::bias_add(ops::conv2d(x, w, co), bias, "NCHW");
        std::vector<feed> feeds{
            {"x", make(t, xs, xv)}, {"w", make(t, ws, wv)}, {"bias", make(t, {ns}, biasv)}};
        if (residual) {
          auto res = ops::placeholder(b, "r", t, os);
          y = y + res;
          feeds.emplace_back("r", make(t, os, rv));
        }
        ops::identity(activate(act, y), {.name = "y"});
        const auto r = run_off_on(g, feeds, {"y"});
        EXPECT_EQ(count_op(r.planned, "fused_conv2d"), 1u) << log_text(r.log);
        EXPECT_EQ(count_op(r.planned, "conv2d"), 0u);
        expect_all_same(r, {"y"}, bitwise, "fused_conv2d");
      }
    }
  }
}

// ---- conv_layout -----------------------------------------------------------------------------

// A chain of convolutions (a ReLU6 written as maximum / minimum between them, a residual add,
// a depthwise convolution, a value read by two convolutions) computes in NHWC with one
// transpose in and one out; the answers are the NCHW graph's, bit for bit, special values
// included. The batch is unknown to the graph in the second case (the pass needs rank 4 only).
TEST(PassDifferential, ConvLayoutChainsComputeInNhwc) {
  for (const dtype t : float_types) {
    for (const bool dynamic_batch : {false, true}) {
      SCOPED_TRACE(fmt::format("{} dynamic batch {}", to_string(t), dynamic_batch));
      std::mt19937 rng(10);
      const shape xs{2, 4, 7, 6};
      auto xv = sprinkled(t, rng, xs.num_elements(), 13, 1);
      graph g;
      graph_builder b(g);
      auto x = ops::placeholder(b, "x", t, {dynamic_batch ? -1 : 2, 4, 7, 6});
      std::vector<feed> feeds{{"x", make(t, xs, xv)}};
      const auto filter = [&](const std::string& name, const shape& s) {
        feeds.emplace_back(name, make(t, s, ordinary(rng, s.num_elements())));
        return ops::placeholder(b, name, t, s);
      };
      ops::conv2d_options same;
      same.padding = {1, 1};
      ops::conv2d_options depthwise = same;
      depthwise.groups = 8;
      auto c1 = ops::bias_add(ops::conv2d(x, filter("w1", {8, 4, 3, 3}), same),
                              filter("b1", {8}), "NCHW");
      auto six = ops::constant(b, make(t, {}, {6.0}));
      auto zero = ops::constant(b, make(t, {}, {0.0}));
      auto r6 = ops::minimum(ops::maximum(c1, zero), six);
      auto c2 = ops::conv2d(r6, filter("w2", {8, 1, 3, 3}), depthwise);
      auto c3 = ops::conv2d(ops::relu(c2), filter("w3", {8, 8, 1, 1}));
      auto sum = c3 + r6;  // the residual
      auto c4 = ops::conv2d(sum, filter("w4", {3, 8, 1, 1}));
      auto c5 = ops::conv2d(sum, filter("w5", {3, 8, 3, 3}), same);
      ops::identity(ops::reduce_mean(c4 * c5, {2, 3}), {.name = "y"});
      ops::identity(c5, {.name = "y5"});
      const auto r = run_off_on(g, feeds, {"y", "y5"});
      const bool onednn = t == dtype::f32 || t == dtype::bf16;
      const std::string log = log_text(r.log);
      EXPECT_EQ(log.find("conv_layout") != std::string::npos, onednn) << log;
      // In: x; out: c4 * c5 (the product sank below the transposes) and y5.
      EXPECT_EQ(count_op(r.planned, "transpose"), onednn ? 3u : 0u) << log;
      expect_all_same(r, {"y", "y5"}, bitwise, "conv_layout");
    }
  }
}

// A chain of float32 convolutions of 16 channels or more (20 and 24: a part-filled last
// block), depthwise, 1x1 and 3x3, a residual, a sigmoid epilogue (which makes a zero channel
// 0.5: the blocks' spare channels must be zeroed again), special values in the input: where
// the CPU computes such convolutions in channel blocks (Note [channel blocks]) the chain runs
// in NCHW16c with one conversion in and one out, bit for bit the NCHW graph's answers; else
// in NHWC.
TEST(PassDifferential, ConvLayoutChainsComputeInChannelBlocks) {
  const dtype t = dtype::f32;
  std::mt19937 rng(12);
  const shape xs{2, 20, 9, 7};
  auto xv = sprinkled(t, rng, xs.num_elements(), 29, 1);
  graph g;
  graph_builder b(g);
  auto image = ops::placeholder(b, "image", t, {2, 3, 9, 7});
  std::vector<feed> feeds{{"image", make(t, {2, 3, 9, 7}, sprinkled(t, rng, 2 * 3 * 9 * 7, 11, 1))}};
  const auto value = [&](const std::string& name, const shape& s) {
    feeds.emplace_back(name, make(t, s, ordinary(rng, s.num_elements())));
    return ops::placeholder(b, name, t, s);
  };
  ops::conv2d_options same;
  same.padding = {1, 1};
  ops::conv2d_options depthwise = same;
  depthwise.groups = 24;
  // A first layer of 3 channels (NCHW in, blocks out), then x joins: the chain's residual.
  auto c0 = ops::relu(ops::conv2d(image, value("w0", {20, 3, 3, 3}), same));
  auto x = ops::placeholder(b, "x", t, xs);
  feeds.emplace_back("x", make(t, xs, xv));
  auto c1 = ops::sigmoid(ops::bias_add(ops::conv2d(c0 + x, value("w1", {24, 20, 1, 1})), value("b1", {24}), "NCHW"));
  auto c2 = ops::relu(ops::conv2d(c1, value("w2", {24, 1, 3, 3}), depthwise));
  auto c3 = ops::conv2d(c2, value("w3", {24, 24, 3, 3}), same) + c1;  // the residual
  auto c4 = ops::conv2d(ops::relu(c3), value("w4", {20, 24, 1, 1}));
  ops::identity(c4, {.name = "y"});
  const auto r = run_off_on(g, feeds, {"y"});
  const std::string log = log_text(r.log);
  if (nn_rules::cpu_computes_in_channel_blocks()) {
    // In: x (c0 + x is not a convolution: c0 leaves its blocks for the add); out: y.
    EXPECT_EQ(count_op(r.planned, "to_channel_blocks"), 1u) << log;
    EXPECT_EQ(count_op(r.planned, "from_channel_blocks"), 2u) << log;
    EXPECT_EQ(count_op(r.planned, "transpose"), 0u) << log;
    EXPECT_NE(log.find("computes in NCHW16c"), std::string::npos) << log;
  } else {
    EXPECT_EQ(count_op(r.planned, "transpose"), 4u) << log;
  }
  expect_all_same(r, {"y"}, bitwise, "conv_layout");
}

// Pools between convolutions in channel blocks: max and average pooling (padding counted and
// not, ceil_mode) over 20 channels (a part-filled last block) holding NaN, infinities and
// windows of -inf alone; each pool reads and feeds a depthwise 1x1 convolution of ones (its
// input passes through, special values included). Where the CPU's rule says the blocks give
// the same bits (nn_rules::cpu_pools_in_channel_blocks) the pools run in them; a tiled 2x2
// max pool (loom's own loop, not oneDNN's) and a dilated one stay NCHW. Bit for bit the NCHW
// graph's answers either way.
TEST(PassDifferential, ConvLayoutPoolsInChannelBlocks) {
  const dtype t = dtype::f32;
  std::mt19937 rng(14);
  const shape xs{2, 20, 11, 9};
  auto xv = sprinkled(t, rng, xs.num_elements(), 17, 3);
  for (std::int64_t y = 4; y < 8; ++y) {  // windows of -inf alone, in channel 5 of image 1
    for (std::int64_t x = 2; x < 6; ++x) xv[static_cast<std::size_t>(((20 + 5) * 11 + y) * 9 + x)] = -inf;
  }
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", t, {-1, 20, 11, 9});  // an unknown batch
  std::vector<feed> feeds{{"x", make(t, xs, xv)}};
  const auto ones = ops::constant(b, make(t, {20, 1, 1, 1}, std::vector<double>(20, 1.0)));
  ops::conv2d_options depthwise;
  depthwise.groups = 20;
  const auto pass_through = [&](output v) { return ops::conv2d(v, ones, depthwise); };
  auto c0 = pass_through(x);
  struct pool_case {
    const char* name;
    bool max;
    ops::pool_options o;
    bool in_blocks;  // where the CPU computes convolutions in blocks
  };
  const std::vector<pool_case> cases{
      {"max_3x3_s2_p1", true, {.kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1, 1, 1}}, true},
      {"max_3x3_s2_ceil", true, {.kernel = {3, 3}, .strides = {2, 2}, .padding = {0, 0, 0, 0}, .ceil_mode = true}, true},
      {"avg_3x3_s1_p1", false, {.kernel = {3, 3}, .strides = {1, 1}, .padding = {1, 1, 1, 1}}, true},
      {"avg_3x3_s2_p1_include_pad", false,
       {.kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1, 1, 1}, .count_include_pad = true}, true},
      {"avg_2x2_s2_ceil", false, {.kernel = {2, 2}, .strides = {2, 2}, .ceil_mode = true}, true},
      {"max_2x2_tiles", true, {.kernel = {2, 2}, .strides = {2, 2}}, false},
      {"max_3x3_dilated", true, {.kernel = {3, 3}, .strides = {1, 1}, .dilations = {2, 2}}, false},
  };
  std::vector<std::string> fetches;
  std::size_t moved = 0;
  for (const auto& c : cases) {
    auto pooled = c.max ? ops::max_pool2d(c0, c.o, {.name = c.name}) : ops::avg_pool2d(c0, c.o, {.name = c.name});
    ops::identity(pass_through(pooled), {.name = std::string("y_") + c.name});
    fetches.push_back(std::string("y_") + c.name);
    moved += c.in_blocks ? 1 : 0;
  }
  const auto r = run_off_on(g, feeds, fetches);
  const std::string log = log_text(r.log);
  std::size_t in_blocks = 0;
  for (const auto& n : r.planned) {
    if ((n.op == "max_pool2d" || n.op == "avg_pool2d") && n.name.ends_with("/blocks")) ++in_blocks;
  }
  EXPECT_EQ(in_blocks, nn_rules::cpu_computes_in_channel_blocks() ? moved : 0u) << log;
  if (nn_rules::cpu_computes_in_channel_blocks()) {
    EXPECT_NE(log.find("'max_3x3_s2_p1/blocks' pools in channel blocks"), std::string::npos) << log;
    // In: x; out: the two pools that stay NCHW and the seven results.
    EXPECT_EQ(count_op(r.planned, "to_channel_blocks"), 3u) << log;
  }
  expect_all_same(r, fetches, bitwise, "conv_layout");
}

// Sums and means over the pixels after convolutions in channel blocks (a global average pool):
// where they keep the pixels (keepdims) of float32 they sum the blocks, the conversion moving
// below them (Note [sums in any layout] in reduction_reduce.cpp); 20 channels (a part-filled
// last block) of 17x9 = 153 pixels (past one block of 128) holding NaN, infinities and zeros
// of both signs. A mean that drops the pixel dims, or also reduces the channels, stays NCHW.
// Bit for bit the NCHW graph's answers either way.
TEST(PassDifferential, ConvLayoutSumsPixelsInChannelBlocks) {
  const dtype t = dtype::f32;
  std::mt19937 rng(15);
  const shape xs{2, 20, 17, 9};
  std::vector<feed> feeds{{"x", make(t, xs, sprinkled(t, rng, xs.num_elements(), 13, 4))}};
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", t, {-1, 20, 17, 9});
  const auto ones = ops::constant(b, make(t, {20, 1, 1, 1}, std::vector<double>(20, 1.0)));
  ops::conv2d_options depthwise;
  depthwise.groups = 20;
  auto c0 = ops::conv2d(x, ones, depthwise);  // passes x through, special values included
  ops::identity(ops::global_avg_pool(c0, {.name = "gap"}), {.name = "y_gap"});
  ops::identity(ops::reduce_sum(c0, {2, 3}, true, {.name = "sum"}), {.name = "y_sum"});
  ops::identity(ops::reduce_mean(c0, {-1, -2}, true, {.name = "mean_negative_axes"}), {.name = "y_negative"});
  ops::identity(ops::reduce_mean(c0, {2, 3}, false, {.name = "mean_dropped"}), {.name = "y_dropped"});
  ops::identity(ops::reduce_mean(c0, {1, 2, 3}, true, {.name = "mean_all"}), {.name = "y_all"});
  const std::vector<std::string> fetches{"y_gap", "y_sum", "y_negative", "y_dropped", "y_all"};
  const auto r = run_off_on(g, feeds, fetches);
  const std::string log = log_text(r.log);
  std::size_t in_blocks = 0;
  for (const auto& n : r.planned) {
    if ((n.op == "reduce_mean" || n.op == "reduce_sum") && n.name.ends_with("/blocks")) ++in_blocks;
  }
  if (nn_rules::cpu_computes_in_channel_blocks()) {
    EXPECT_EQ(in_blocks, 3u) << log;
    EXPECT_NE(log.find("'gap/blocks' sums the pixels in channel blocks"), std::string::npos) << log;
  } else {
    EXPECT_EQ(in_blocks, 0u) << log;
  }
  expect_all_same(r, fetches, bitwise, "conv_layout");
}

// ---- layer_norm_fusion ---------------------------------------------------------------------

// Rows of one kind of special value each, over n columns: ordinary; one NaN; one +inf; one
// -inf; zeros of both signs; a constant row; one largest finite magnitude among ordinary
// values (its square overflows: the variance is inf); two of opposite signs; subnormals;
// smallest normals; a NaN and an inf together.
std::vector<double> layer_norm_rows(dtype t, std::mt19937& rng, std::int64_t n,
                                    std::int64_t& rows) {
  const auto sp = specials(t);
  const double huge = sp[sp.size() - 4];
  const double sub = sp[18];
  const double tiny = sp[20];
  std::vector<std::vector<double>> r;
  auto row = [&] { return ordinary(rng, n); };
  r.push_back(row());
  r.push_back(row());
  r.back()[2] = nan;
  r.push_back(row());
  r.back()[n - 1] = inf;
  r.push_back(row());
  r.back()[0] = -inf;
  r.emplace_back(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t j = 0; j < n; j += 2) r.back()[static_cast<std::size_t>(j)] = -0.0;
  r.emplace_back(static_cast<std::size_t>(n), 1.5);
  r.push_back(row());
  r.back()[3] = huge;
  r.push_back(row());
  r.back()[1] = huge;
  r.back()[4] = -huge;
  r.emplace_back(static_cast<std::size_t>(n), sub);
  r.back()[1] = -sub;
  r.emplace_back(static_cast<std::size_t>(n), tiny);
  r.back()[0] = 2 * tiny;
  r.push_back(row());
  r.back()[0] = nan;
  r.back()[5] = -inf;
  rows = static_cast<std::int64_t>(r.size());
  std::vector<double> v;
  for (const auto& x : r) v.insert(v.end(), x.begin(), x.end());
  return v;
}

// The tolerance of layer_norm against the primitives (float32 and float64; 16-bit forms
// are not fused): the kernel sums the statistics in another order (centred sums, Note
// [layer_norm row kernels]) than reduce_mean, sub, square, reduce_mean do.
tolerance layer_norm_tolerance(dtype t) {
  return t == dtype::f64 ? tolerance{1e-12, 1e-12} : tolerance{2e-5, 2e-5};
}

TEST(PassDifferential, LayerNormFusionOverSpecialRows) {
  for (const dtype t : float_types) {
    for (const bool special_affine : {false, true}) {
      SCOPED_TRACE(fmt::format("{} special gamma/beta {}", to_string(t), special_affine));
      std::mt19937 rng(10);
      const std::int64_t n = 37;
      std::int64_t rows = 0;
      const auto xv = layer_norm_rows(t, rng, n, rows);
      auto gv = uniform(rng, n, 0.5, 1.5);
      auto bv = ordinary(rng, n);
      if (special_affine) {
        gv[3] = nan;
        gv[6] = -0.0;
        gv[7] = inf;
        bv[9] = -inf;
        bv[10] = -0.0;
      }
      graph g;
      graph_builder b(g);
      auto x = ops::placeholder(b, "x", t, {rows, n});
      auto gamma = ops::placeholder(b, "gamma", t, {n});
      auto beta = ops::placeholder(b, "beta", t, {n});
      const output mean = ops::reduce_mean(x, {-1}, true);
      const output d = x - mean;
      const output var = ops::reduce_mean(ops::square(d), {-1}, true);
      const output y = d * ops::rsqrt(var + ops::scalar(b, 1e-5, t)) * gamma + beta;
      ops::identity(y, {.name = "y"});
      const auto r = run_off_on(
          g, {{"x", make(t, {rows, n}, xv)}, {"gamma", make(t, {n}, gv)}, {"beta", make(t, {n}, bv)}},
          {"y"});
      if (t == dtype::f16 || t == dtype::bf16) {
        // Refused (Note [layer_norm in 16 bits]): the element-wise parts fuse, bit for bit.
        EXPECT_TRUE(refused_with(r.log, "layer_norm_fusion", {"keeps the statistics in float32"}))
            << log_text(r.log);
        EXPECT_EQ(count_op(r.planned, "layer_norm"), 0u) << log_text(r.log);
        EXPECT_GE(count_op(r.planned, "fused_elementwise"), 1u) << log_text(r.log);
        expect_all_same(r, {"y"}, bitwise, "layer_norm primitives");
        continue;
      }
      EXPECT_EQ(count_op(r.planned, "layer_norm"), 1u) << log_text(r.log);
      EXPECT_EQ(count_op(r.planned, "reduce_mean"), 0u) << log_text(r.log);
      expect_all_same(r, {"y"}, layer_norm_tolerance(t), "layer_norm");
    }
  }
}

// ---- softmax_xent_fusion --------------------------------------------------------------------

enum class xent_spelling { neg_of_sum, sum_of_neg, neg_inside };

output xent_loss(output logits, output labels, std::int64_t classes, xent_spelling f) {
  const output ls = ops::log_softmax(logits, -1);
  const output oh = ops::one_hot(labels, classes, logits.dtype_of());
  switch (f) {
    case xent_spelling::neg_of_sum:
      return -ops::reduce_sum(oh * ls, {-1});
    case xent_spelling::sum_of_neg:
      return ops::reduce_sum(-(oh * ls), {-1});
    case xent_spelling::neg_inside:
      return ops::reduce_sum(oh * -ls, {-1});
  }
  return ls;
}

// Logits rows with special values at the label and elsewhere: NaN, +inf, -inf (elsewhere:
// log_softmax is -inf there, and one_hot's 0 times -inf is NaN in the unfused sum), the
// largest finite magnitudes of both signs (x - max overflows to -inf), one dominant logit
// (a loss of exactly 0), equal logits, subnormals.
TEST(PassDifferential, SoftmaxXentFusionOverSpecialLogits) {
  for (const dtype t : float_types) {
    for (const auto f :
         {xent_spelling::neg_of_sum, xent_spelling::sum_of_neg, xent_spelling::neg_inside}) {
      SCOPED_TRACE(fmt::format("{} spelling {}", to_string(t), static_cast<int>(f)));
      std::mt19937 rng(11);
      const std::int64_t c = 6;
      const auto sp = specials(t);
      const double huge = sp[sp.size() - 4];
      std::vector<std::vector<double>> rows;
      std::vector<double> labels;
      auto add = [&](std::vector<double> row, double label) {
        rows.push_back(std::move(row));
        labels.push_back(label);
      };
      auto row = [&] { return ordinary(rng, c); };
      add(row(), 2);
      for (const double v : {nan, inf, -inf, huge, -huge, 1e4, -1e4, 0.0, -0.0}) {
        auto at_label = row();
        at_label[1] = v;
        add(at_label, 1);
        auto elsewhere = row();
        elsewhere[4] = v;
        add(elsewhere, 1);
      }
      auto both = row();
      both[0] = huge;
      both[5] = -huge;
      add(both, 0);
      add(both, 5);
      add(std::vector<double>(static_cast<std::size_t>(c), 0.25), 3);
      add({200.0, -200.0, -150.0, 0.0, -300.0, -250.0}, 0);  // exp underflows: loss 0
      add({sp[18], -sp[18], sp[18], 0.0, -0.0, sp[19]}, 4);
      const auto n = static_cast<std::int64_t>(rows.size());
      std::vector<double> lv;
      for (const auto& r : rows) lv.insert(lv.end(), r.begin(), r.end());
      graph g;
      graph_builder b(g);
      auto logits = ops::placeholder(b, "logits", t, {n, c});
      auto lab = ops::placeholder(b, "labels", dtype::i64, {n});
      ops::identity(xent_loss(logits, lab, c, f), {.name = "loss"});
      const tensor logits_value = make(t, {n, c}, lv);
      const auto r =
          run_off_on(g, {{"logits", logits_value}, {"labels", make(dtype::i64, {n}, labels)}},
                     {"loss"});
      EXPECT_EQ(count_op(r.planned, "softmax_cross_entropy"), 1u) << log_text(r.log);
      EXPECT_EQ(count_op(r.planned, "log_softmax"), 0u) << log_text(r.log);
      expect_all_same(r, {"loss"}, bitwise, "softmax_cross_entropy");
    }
  }
}

// ---- optimizer_fusion -----------------------------------------------------------------------

// Variables of every parameter dtype updated by per-tensor Adam, AdamW and SGD over steps
// whose gradients hold special values, fused and unfused: every variable bitwise equal.
TEST(PassDifferential, OptimizerFusionOverSpecialGradients) {
  for (const std::string kind : {"adam", "adamw", "sgd"}) {
    SCOPED_TRACE(kind);
    const dtype param_types[] = {dtype::f32, dtype::bf16, dtype::f16, dtype::f32};
    const std::int64_t n = 40;
    graph g;
    graph_builder b(g);
    auto lr = ops::scalar(b, 0.01);
    auto step = ops::placeholder(b, "step", dtype::i64, {});
    std::vector<std::string> updates;
    std::vector<std::string> names;
    std::vector<std::pair<std::string, dtype>> grads;
    for (std::size_t k = 0; k < std::size(param_types); ++k) {
      const dtype pt = param_types[k];
      const std::string name = fmt::format("w{}", k);
      std::mt19937 rng(static_cast<unsigned>(20 + k));
      auto init = mixed(pt, rng, n);
      for (auto& v : init) {
        if (std::isnan(v) || std::isinf(v)) v = 0.5;  // parameters start finite
      }
      if (k == 3) init = ordinary(rng, n);
      auto w = ops::variable(b, name, make(pt, {n}, init));
      const dtype gt = k == 3 ? dtype::bf16 : pt;  // a gradient of another dtype
      auto gr = ops::placeholder(b, "g" + name, gt, {n});
      grads.emplace_back("g" + name, gt);
      names.push_back(name);
      if (kind == "sgd") {
        ops::sgd_options o;
        o.momentum = 0.9;
        o.nesterov = true;
        o.weight_decay = 0.01;
        updates.push_back(ops::apply_sgd(w, gr, lr, o));
      } else {
        ops::adam_options o;
        o.weight_decay = 0.05;
        updates.push_back(kind == "adam" ? ops::apply_adam(w, gr, lr, step, o)
                                         : ops::apply_adamw(w, gr, lr, step, o));
      }
    }
    auto run = [&](bool passes) {
      session_options o;
      o.devices.cpu_threads = 2;
      o.passes.enabled = passes;
      session s(g, o);
      for (int k = 0; k < 3; ++k) {
        std::vector<feed> feeds;
        for (std::size_t i = 0; i < grads.size(); ++i) {
          std::mt19937 rng(static_cast<unsigned>(100 * k + i));
          auto gv = k == 0 ? ordinary(rng, n) : mixed(grads[i].second, rng, n);
          std::shuffle(gv.begin(), gv.end(), rng);
          feeds.emplace_back(grads[i].first, make(grads[i].second, {n}, gv));
        }
        if (kind != "sgd") feeds.emplace_back("step", make(dtype::i64, {}, {k + 1.0}));
        std::vector<std::string> targets = updates;
        (void)s.run(feeds, {}, targets);
      }
      off_on r;
      r.on = detach(s.run({}, names));
      if (passes) {
        std::vector<std::string> feed_names;
        for (const auto& [gn, gt] : grads) feed_names.push_back(gn);
        if (kind != "sgd") feed_names.push_back("step");
        r.log = s.explain_passes(feed_names, {}, updates);
        r.planned = describe(s.planned_graph(feed_names, {}, updates));
      }
      return r;
    };
    const auto on = run(true);
    const auto off = run(false);
    EXPECT_EQ(count_op(on.planned, "fused_" + kind), 1u) << log_text(on.log);
    EXPECT_EQ(count_op(on.planned, "apply_" + kind), 0u) << log_text(on.log);
    for (std::size_t k = 0; k < names.size(); ++k) {
      expect_same(off.on[k], on.on[k], bitwise, kind + " " + names[k]);
    }
  }
}

}  // namespace
}  // namespace loom
