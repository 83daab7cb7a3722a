// The CPU kernel of fused_elementwise and the op's gradient, against two independent
// checks: the same expression expanded into unfused nodes (bit for bit in every float
// type, Note [fused element-wise semantics]), and a float64 reference computed here element
// by element (for float16 / bfloat16 with every value rounded to the type, as the unfused
// graph stores it). Gradients are checked against central differences and against the
// gradients of the expanded graph.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/graph/fused_expr.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using namespace loom::testing;
using ints = std::vector<std::int64_t>;

// ---- running the two forms -------------------------------------------------------------------

attr_map fused_attrs(const std::string& expr, const ints& results) {
  return {{"M", static_cast<std::int64_t>(results.size())}, {"expr", expr}, {"results", results}};
}

std::vector<tensor> run_fused(const std::string& expr, const ints& results,
                              std::vector<tensor> inputs) {
  return run_op("fused_elementwise", std::move(inputs), fused_attrs(expr, results));
}

// Copies of a session's results in host memory (they live in the session's pools, which go
// with the session).
std::vector<tensor> host_copies(const std::vector<tensor>& ts) {
  std::vector<tensor> out;
  for (const auto& t : ts) {
    out.push_back(memory::contiguous_copy(t, memory::host_resource::instance(), device_id{}));
  }
  return out;
}

session_options no_passes() {
  session_options o;
  o.passes.enabled = false;  // the graphs run as written: the expanded one stays unfused
  return o;
}

// The expression expanded into unfused nodes, run by a session.
std::vector<tensor> run_expanded(const std::string& expr, const ints& results,
                                 const std::vector<tensor>& inputs) {
  graph g;
  graph_builder b(g);
  std::vector<output> xs;
  std::vector<feed> feeds;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = fmt::format("x{}", i);
    xs.push_back(ops::placeholder(b, name, inputs[i].type(), inputs[i].shape()));
    feeds.emplace_back(name, inputs[i]);
  }
  const auto e = fused_expr::parse(expr, static_cast<std::int32_t>(inputs.size()), results);
  std::vector<std::string> fetches;
  for (output o : expand(e, xs)) {
    if (o.producer().op() == "placeholder") o = ops::identity(o);
    fetches.push_back(o.name());
  }
  session s(std::move(g), no_passes());
  return host_copies(s.run(feeds, fetches));
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// Bit for bit (any NaN matching any NaN).
void expect_identical(const tensor& got, const tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(to_string(got.shape()), to_string(want.shape())) << what;
  ASSERT_EQ(got.type(), want.type()) << what;
  const auto a = values(got);
  const auto b = values(want);
  int reported = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_value(a[i], b[i]) && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << ": fused " << a[i] << ", expected " << b[i];
    }
  }
}

// ---- a float64 reference -----------------------------------------------------------------------

double ref_op(ew_op op, double a, double b) {
  switch (op) {
    case ew_op::neg:
      return -a;
    case ew_op::abs:
      return std::fabs(a);
    case ew_op::exp:
      return std::exp(a);
    case ew_op::log:
      return std::log(a);
    case ew_op::sqrt:
      return std::sqrt(a);
    case ew_op::rsqrt:
      return 1.0 / std::sqrt(a);
    case ew_op::tanh:
      return std::tanh(a);
    case ew_op::sigmoid:
      return 1.0 / (1.0 + std::exp(-a));
    case ew_op::relu:
      return std::isnan(a) ? a : std::max(a, 0.0);
    case ew_op::gelu:
      return 0.5 * a * (1.0 + std::erf(a / std::numbers::sqrt2));
    case ew_op::gelu_tanh:
      return 0.5 * a *
             (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (a + 0.044715 * a * a * a)));
    case ew_op::erf:
      return std::erf(a);
    case ew_op::square:
      return a * a;
    case ew_op::reciprocal:
      return 1.0 / a;
    case ew_op::add:
      return a + b;
    case ew_op::sub:
      return a - b;
    case ew_op::mul:
      return a * b;
    case ew_op::div:
      return a / b;
    case ew_op::pow:
      return std::pow(a, b);
    case ew_op::maximum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case ew_op::minimum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case ew_op::relu_grad:
      return b > 0.0 ? a : 0.0;
  }
  return NAN;
}

// v as element type t holds it: float16 / bfloat16 rounded (through float, as a scalar of
// the type is), float32 and float64 kept (the reference computes them in float64).
double as_type(dtype t, double v) {
  if (t == dtype::f16) return static_cast<float>(half(static_cast<float>(v)));
  if (t == dtype::bf16) return static_cast<float>(bfloat16(static_cast<float>(v)));
  return v;
}

// The expression evaluated in float64 over the broadcast shape, one vector per result; for
// float16 / bfloat16 every literal and every instruction's value is rounded to the type.
std::vector<std::vector<double>> reference(const std::string& expr, const ints& results,
                                           const std::vector<tensor>& inputs, shape& out) {
  const dtype t = inputs.at(0).type();
  const auto e = fused_expr::parse(expr, static_cast<std::int32_t>(inputs.size()), results);
  out = shape{};
  for (const auto& x : inputs) out = broadcast_shapes(out, x.shape());
  std::vector<std::vector<double>> in_values;
  for (const auto& x : inputs) in_values.push_back(values(x));
  const std::size_t r = out.rank();
  const auto count = static_cast<std::size_t>(out.num_elements());
  std::vector<std::vector<double>> res(results.size(), std::vector<double>(count));
  std::vector<double> v(static_cast<std::size_t>(e.num_values()));
  for (std::size_t f = 0; f < count; ++f) {
    // f's index along every output dimension, then each input's (broadcast) element.
    std::vector<std::int64_t> idx(r);
    std::size_t rem = f;
    for (std::size_t d = r; d-- > 0;) {
      idx[d] = static_cast<std::int64_t>(rem % static_cast<std::size_t>(out[d]));
      rem /= static_cast<std::size_t>(out[d]);
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const shape& s = inputs[i].shape();
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < s.rank(); ++d) {
        flat = flat * s[d] + (s[d] == 1 ? 0 : idx[r - s.rank() + d]);
      }
      v[i] = in_values[i][static_cast<std::size_t>(flat)];
    }
    for (std::size_t k = 0; k < e.instrs.size(); ++k) {
      const auto& in = e.instrs[k];
      auto arg = [&](int j) {
        const auto& a = in.args[static_cast<std::size_t>(j)];
        return a.is_literal() ? as_type(t, a.literal) : v[static_cast<std::size_t>(a.value)];
      };
      v[inputs.size() + k] =
          as_type(t, ref_op(in.op, arg(0), info(in.op).arity == 2 ? arg(1) : 0.0));
    }
    for (std::size_t j = 0; j < results.size(); ++j)
      res[j][f] = v[static_cast<std::size_t>(results[j])];
  }
  return res;
}

double rtol_of(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-12;
    case dtype::f32:
      return 2e-5;
    case dtype::f16:
      return 2e-3;  // a rounding the reference makes the other way (half ulp 4.9e-4)
    default:
      return 1e-2;  // bfloat16: as float16 (half ulp 3.9e-3)
  }
}
double atol_of(dtype t) {
  return t == dtype::f64 ? 1e-12 : t == dtype::f32 ? 1e-6 : 1e-3;
}

// Runs the fused node and checks it against the float64 reference, and bit for bit against
// the expanded nodes.
void check(const std::string& expr, const ints& results, const std::vector<tensor>& inputs,
           const std::string& what = "") {
  SCOPED_TRACE(fmt::format("{} [{}] {}", expr, fmt::join(results, ", "), what));
  const dtype t = inputs.at(0).type();
  const auto fused = run_fused(expr, results, inputs);
  ASSERT_EQ(fused.size(), results.size());
  shape out;
  const auto ref = reference(expr, results, inputs, out);
  for (std::size_t j = 0; j < results.size(); ++j) {
    expect_close(fused[j], out, ref[j], rtol_of(t), atol_of(t));
  }
  const auto expanded = run_expanded(expr, results, inputs);
  for (std::size_t j = 0; j < results.size(); ++j) {
    expect_identical(fused[j], expanded[j], fmt::format("result {}", j));
  }
}

const std::vector<dtype> float_types{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// ---- every op ----------------------------------------------------------------------------------

// Inputs an op is defined on (positive where log, sqrt, pow's base need it).
tensor op_input(ew_op op, dtype t, const shape& s, std::uint64_t seed) {
  const bool positive =
      op == ew_op::log || op == ew_op::sqrt || op == ew_op::rsqrt || op == ew_op::pow;
  return random(t, s, seed, positive ? 0.1 : -3.0, 3.0);
}

TEST(FusedElementwise, EveryOpAgreesWithItsUnfusedKernelAndTheReference) {
  for (dtype t : float_types) {
    for (int i = 0; i < num_ew_ops; ++i) {
      const auto op = static_cast<ew_op>(i);
      const std::string name(info(op).name);
      const std::string what = fmt::format("{} {}", name, to_string(t));
      const tensor x = op_input(op, t, {37, 29}, 1 + static_cast<std::uint64_t>(i));
      if (info(op).arity == 1) {
        check(fmt::format("{}(%0)", name), {1}, {x}, what);
        // Chained after another op, so the operand is a tile buffer, not memory.
        check(fmt::format("mul(%0, 0.75); {}(%1)", name), {2}, {x}, what);
      } else {
        const tensor y =
            op == ew_op::pow ? random(t, {29}, 99, -2.0, 2.0) : op_input(op, t, {29}, 99);
        check(fmt::format("{}(%0, %1)", name), {2}, {x, y}, what);
        check(fmt::format("{}(%1, %0)", name), {2}, {x, y}, what + " (swapped)");
        // Literal operands on either side.
        check(fmt::format("{}(%0, 0.75)", name), {1}, {x}, what + " (literal right)");
        check(fmt::format("{}(1.5, %0)", name), {1}, {x}, what + " (literal left)");
      }
    }
  }
}

TEST(FusedElementwise, SpecialValuesBehaveAsTheUnfusedKernels) {
  // NaN, infinities, signed zeros, values where exp overflows and underflows, subnormals.
  const std::vector<double> specials = {NAN,   INFINITY, -INFINITY, 0.0,    -0.0,  1.0,    -1.0,
                                        100.0, -100.0,   88.0,      -104.5, 1e-40, -1e-40, 0.5,
                                        -0.5,  3.0,      -3.0,      1e30,   -1e30, 2.0,    7.5};
  const auto n = static_cast<std::int64_t>(specials.size());
  for (dtype t : float_types) {
    const tensor x = make(t, {n}, specials);
    std::vector<double> swapped(specials.rbegin(), specials.rend());
    const tensor y = make(t, {n}, swapped);
    for (int i = 0; i < num_ew_ops; ++i) {
      const auto op = static_cast<ew_op>(i);
      const std::string name(info(op).name);
      const std::string expr =
          info(op).arity == 1 ? fmt::format("{}(%0)", name) : fmt::format("{}(%0, %1)", name);
      const auto fused = run_fused(expr, {info(op).arity == 1 ? 1 : 2}, {x, y});
      const auto expanded = run_expanded(expr, {info(op).arity == 1 ? 1 : 2}, {x, y});
      expect_identical(fused[0], expanded[0], fmt::format("{} {}", name, to_string(t)));
    }
  }
}

// ---- broadcasting, strides, sizes --------------------------------------------------------------

const char* const chain = "mul(%0, %1); add(%2, 0.5); tanh(%3); sub(%4, %1); maximum(%5, -0.25)";

TEST(FusedElementwise, BroadcastInputsOfEveryKind) {
  const std::vector<std::pair<shape, shape>> shapes = {{{5, 7}, {}},
                                                       {{5, 7}, {1}},
                                                       {{}, {5, 7}},
                                                       {{5, 7}, {7}},
                                                       {{5, 7}, {5, 1}},
                                                       {{5, 1}, {1, 7}},
                                                       {{4, 1, 3}, {2, 3}},
                                                       {{3, 1, 5}, {1, 4, 1}},
                                                       {{2, 3, 4, 5}, {4, 1}},
                                                       {{1, 1, 9}, {9}},
                                                       {{}, {}},
                                                       {{1}, {}}};
  for (dtype t : float_types) {
    for (const auto& [sa, sb] : shapes) {
      const std::string what = fmt::format("{} {} {}", to_string(t), to_string(sa), to_string(sb));
      check(chain, {6}, {random(t, sa, 1), random(t, sb, 2)}, what);
    }
  }
}

TEST(FusedElementwise, StridedAndBroadcastViews) {
  for (dtype t : float_types) {
    const tensor a = random(t, {33, 65}, 3);
    const tensor b = random(t, {33, 65}, 4);
    const tensor row = random(t, {65}, 5);
    const std::string ts(to_string(t));
    check(chain, {6}, {non_contiguous(a), b}, ts + " transposed view");
    check(chain, {6}, {a, non_contiguous(b)}, ts + " transposed view second");
    check(chain, {6}, {non_contiguous(a), non_contiguous(b)}, ts + " both transposed");
    check(chain, {6}, {a, broadcast_view(row, {33, 65})}, ts + " stride-0 view");
    check(chain, {6}, {non_contiguous(a), row}, ts + " transposed and row");
    // A view with an offset: the second half of a buffer.
    const tensor big = random(t, {2, 33, 65}, 6);
    const tensor half_view = tensor::strided(big.buf(), t, {33, 65}, {65, 1}, 33 * 65);
    check(chain, {6}, {half_view, row}, ts + " offset view");
  }
}

TEST(FusedElementwise, SizesAroundTheTileAndAcrossThreads) {
  for (dtype t : float_types) {
    for (std::int64_t n : {1, 2, 15, 16, 17, 255, 1023, 1024, 1025, 4099, 100003}) {
      const std::string what = fmt::format("{} n={}", to_string(t), n);
      check(chain, {6}, {random(t, {n}, 7), random(t, {n}, 8)}, what);
      check(chain, {6}, {random(t, {n, 1}, 7), random(t, {3}, 8)}, what + " column x row");
    }
  }
}

TEST(FusedElementwise, EmptyAndZeroDimensional) {
  for (dtype t : float_types) {
    const auto empty = run_fused(chain, {6, 3}, {random(t, {0, 3}, 1), random(t, {3}, 2)});
    ASSERT_EQ(empty.size(), 2u);
    for (const auto& o : empty) {
      EXPECT_EQ(o.shape(), (shape{0, 3}));
      EXPECT_EQ(o.type(), t);
    }
    const auto empty2 = run_fused("exp(%0)", {1}, {random(t, {2, 0}, 1), random(t, {}, 2)});
    EXPECT_EQ(empty2[0].shape(), (shape{2, 0}));
    check(chain, {6, 3}, {make(t, {}, {0.75}), make(t, {}, {-1.5})}, "0-d");
  }
}

// ---- results, literals, constants --------------------------------------------------------------

TEST(FusedElementwise, MultipleResultsOfEveryKind) {
  for (dtype t : float_types) {
    const tensor x = random(t, {6, 40}, 11);
    const tensor row = random(t, {40}, 12);
    // An instruction result, an input (copied), one result twice, a value of the row's
    // smaller shape (broadcast), and the last value.
    const std::string expr = "exp(%1); mul(%2, %0); add(%3, 1); sigmoid(%4)";
    check(expr, {3, 0, 4, 4, 2, 5, 1}, {x, row}, std::string(to_string(t)));
  }
}

TEST(FusedElementwise, LiteralsAndConstantsFold) {
  for (dtype t : float_types) {
    const tensor x = random(t, {9, 11}, 13);
    const std::string ts(to_string(t));
    // Only literals: the result is one value everywhere.
    check("add(1, 2); exp(%1); mul(%2, 0.1)", {3, 1}, {x}, ts + " literal only");
    // A one-element input is a constant too, and so is everything computed from it alone.
    check("exp(%1); mul(%2, -1e-3); add(%0, %3); pow(%1, 2)", {4, 3, 5},
          {x, make(t, {1, 1}, {0.625})}, ts + " one-element input");
    check("sub(0.1, %0); div(%1, 3); mul(-1e-300, %2); add(%3, %2)", {4}, {x}, ts + " literals");
  }
}

TEST(FusedElementwise, UnreadInputsStillBroadcast) {
  // %1 is read by no instruction, but its shape widens the output.
  for (dtype t : float_types) {
    const auto outs = run_fused("exp(%0)", {2}, {random(t, {4}, 1), random(t, {3, 1}, 2)});
    shape out;
    const auto ref = reference("exp(%0)", {2}, {random(t, {4}, 1), random(t, {3, 1}, 2)}, out);
    EXPECT_EQ(out, (shape{3, 4}));
    expect_close(outs[0], out, ref[0], rtol_of(t), atol_of(t));
  }
}

// ---- in place -----------------------------------------------------------------------------------

// Runs with inputs whose buffers the node alone holds, so outputs may take them; returns
// the outputs and, per output, the input whose buffer it took (-1: none).
std::pair<std::vector<tensor>, std::vector<int>> run_owning(const std::string& expr,
                                                            const ints& results,
                                                            std::vector<tensor> inputs) {
  std::vector<const void*> in_ptrs;
  for (const auto& x : inputs) in_ptrs.push_back(x.raw_data());
  auto outs = run_op("fused_elementwise", std::move(inputs), fused_attrs(expr, results));
  std::vector<int> took;
  for (const auto& o : outs) {
    int k = -1;
    for (std::size_t i = 0; i < in_ptrs.size(); ++i) {
      if (o.raw_data() == in_ptrs[i]) k = static_cast<int>(i);
    }
    took.push_back(k);
  }
  return {std::move(outs), took};
}

TEST(FusedElementwise, OutputsTakeInputBuffersOnlyWhenThatIsSafe) {
  for (dtype t : float_types) {
    const std::string ts(to_string(t));
    const tensor x = random(t, {3000}, 21);
    const tensor y = random(t, {3000}, 22);
    auto expect_ok = [&](const std::string& expr, const ints& results,
                         const std::vector<tensor>& originals, const std::vector<int>& took_want) {
      SCOPED_TRACE(ts + " " + expr);
      std::vector<tensor> fresh;  // copies the node alone will hold
      for (const auto& o : originals) fresh.push_back(make(t, o.shape(), values(o)));
      auto [outs, took] = run_owning(expr, results, std::move(fresh));
      EXPECT_EQ(took, took_want);
      shape out;
      const auto ref = reference(expr, results, originals, out);
      for (std::size_t j = 0; j < outs.size(); ++j) {
        expect_close(outs[j], out, ref[j], rtol_of(t), atol_of(t));
      }
    };
    // The result is written after x's last read: in place.
    expect_ok("neg(%0); exp(%1); add(%2, %0)", {3}, {x}, {0});
    // Output 0 takes x's buffer although x is read after %1 is computed: %1 is then stored
    // at the end of each tile, after that read.
    expect_ok("exp(%0); add(%1, %0)", {1, 2}, {x}, {0, -1});
    // Two inputs, two results: each output takes one. Where results are written directly
    // (float32, float64), each takes the input whose last read comes no later than its own
    // instruction (y is last read by %3's, x by %4's); the half types store at the end.
    const bool direct = t == dtype::f32 || t == dtype::f64;
    expect_ok("mul(%0, %1); sub(%2, %1); add(%0, %3)", {3, 4}, {x, y},
              direct ? std::vector<int>{1, 0} : std::vector<int>{0, 1});
    // An input that is a result is never overwritten.
    expect_ok("exp(%0)", {0, 1}, {x}, {-1, -1});
    expect_ok("mul(%0, %1)", {2, 0}, {x, y}, {1, -1});
    // Inputs of another shape than the output's are not taken.
    expect_ok("add(%0, %1)", {2}, {random(t, {30, 100}, 1), random(t, {100}, 2)}, {0});
    expect_ok("add(%0, %1)", {2}, {random(t, {100}, 1), random(t, {30, 100}, 2)}, {1});
    expect_ok("add(%0, %1)", {2}, {random(t, {100}, 1), random(t, {30, 1}, 2)}, {-1});
  }
}

// ---- threads ------------------------------------------------------------------------------------

// The node's kernel run on `device` (as run_op does on the shared 2-thread device).
std::vector<tensor> run_on(cpu_device& device, const std::string& expr, const ints& results,
                           const std::vector<tensor>& inputs) {
  graph g;
  node_spec spec{.name = "fused", .op = "fused_elementwise", .attrs = fused_attrs(expr, results)};
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    spec.inputs.push_back(
        {g.add_node({.name = fmt::format("x{}", i),
                     .op = "placeholder",
                     .attrs = {{"dtype", inputs[i].type()}, {"shape", inputs[i].shape()}}})
             .id,
         0});
  }
  const node& n = g.add_node(std::move(spec));
  auto kernel =
      kernel_registry::global().get(n, device_type::cpu).create(kernel_construction(n, device, &g));
  std::vector<tensor> ins = inputs;
  std::vector<tensor> outs(n.outputs.size());
  variable_store variables;
  kernel_context ctx(n, device, ins, outs, &variables, nullptr);
  kernel->compute(ctx);
  return outs;
}

TEST(FusedElementwise, ResultsDoNotDependOnTheThreadCount) {
  cpu_device one(0, 1, 0, "one thread");
  cpu_device three(0, 3, 0, "three threads");
  for (dtype t : float_types) {
    const std::vector<tensor> in = {random(t, {700, 301}, 31), random(t, {301}, 32)};
    const auto a = run_on(one, chain, {6, 4}, in);
    const auto b = run_on(three, chain, {6, 4}, in);
    for (std::size_t j = 0; j < a.size(); ++j)
      expect_identical(b[j], a[j], std::string(to_string(t)));
  }
}

// ---- random expressions -------------------------------------------------------------------------

struct random_case {
  std::string expr;
  ints results;
  std::vector<shape> shapes;
};

random_case random_program(std::mt19937_64& rng) {
  const std::vector<shape> pool = {{6, 37}, {37}, {6, 1}, {}, {1, 37}, {6, 37}};
  random_case c;
  const int n_in = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n_in; ++i) c.shapes.push_back(pool[rng() % pool.size()]);
  const int n = 1 + static_cast<int>(rng() % 30);
  fused_expr e;
  e.num_inputs = n_in;
  for (int k = 0; k < n; ++k) {
    fused_instr in;
    in.op = static_cast<ew_op>(rng() % num_ew_ops);
    for (int j = 0; j < info(in.op).arity; ++j) {
      if (rng() % 6 == 0) {
        in.args[static_cast<std::size_t>(j)] = {-1,
                                                std::uniform_real_distribution<double>(-3, 3)(rng)};
      } else {
        // Mostly recent values, so chains get deep.
        const int defined = n_in + k;
        const int back = static_cast<int>(rng() % static_cast<std::uint64_t>(std::min(defined, 4)));
        const int v = rng() % 3 == 0 ? static_cast<int>(rng() % static_cast<std::uint64_t>(defined))
                                     : defined - 1 - back;
        in.args[static_cast<std::size_t>(j)] = {v, 0.0};
      }
    }
    e.instrs.push_back(in);
  }
  c.expr = e.to_string();
  c.results.push_back(e.num_values() - 1);
  const int extra = static_cast<int>(rng() % 3);
  for (int j = 0; j < extra; ++j)
    c.results.push_back(
        static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(e.num_values())));
  return c;
}

TEST(FusedElementwise, RandomExpressionsMatchTheExpandedGraphBitForBit) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const random_case c = random_program(rng);
    for (dtype t : float_types) {
      SCOPED_TRACE(fmt::format("trial {} {}: {} [{}]", trial, to_string(t), c.expr,
                               fmt::join(c.results, ", ")));
      std::vector<tensor> in;
      for (std::size_t i = 0; i < c.shapes.size(); ++i) {
        in.push_back(
            random(t, c.shapes[i], 1000 * static_cast<std::uint64_t>(trial) + i, -2.0, 2.0));
      }
      const auto fused = run_fused(c.expr, c.results, in);
      const auto expanded = run_expanded(c.expr, c.results, in);
      for (std::size_t j = 0; j < fused.size(); ++j) {
        expect_identical(fused[j], expanded[j], fmt::format("result {}", j));
      }
    }
  }
}

TEST(FusedElementwise, HalfTypesRoundEveryValueAsTheUnfusedChain) {
  // Each op's value is rounded to the type, as each unfused node stores it: bit for bit
  // the expanded chain, where keeping float intermediates would not be (x * x overflows
  // float16 above 256, x * 1e-3 * 1e3 loses bits below its subnormals).
  for (dtype t : {dtype::f16, dtype::bf16}) {
    const std::vector<tensor> in = {random(t, {17, 23}, 41), random(t, {23}, 42)};
    const auto fused = run_fused(chain, {6, 2}, in);
    const auto expanded = run_expanded(chain, {6, 2}, in);
    for (std::size_t j = 0; j < fused.size(); ++j) {
      expect_identical(fused[j], expanded[j], fmt::format("{} result {}", to_string(t), j));
    }
    const tensor big = make(t, {4}, {300.0, -300.0, 1e-4, 60000.0});
    for (const char* expr : {"mul(%0, %0); sqrt(%1)", "mul(%0, 0.001); mul(%1, 1000)",
                             "mul(%0, 2); sub(%1, %1)"}) {
      const auto f = run_fused(expr, {2}, {big});
      const auto e = run_expanded(expr, {2}, {big});
      expect_identical(f[0], e[0], fmt::format("{} {}", to_string(t), expr));
    }
  }
}

// ---- errors -------------------------------------------------------------------------------------

TEST(FusedElementwise, InputsThatDoNotBroadcastFailTheNode) {
  try {
    (void)run_op_declared("fused_elementwise",
                          {random(dtype::f32, {2, 3}, 1), random(dtype::f32, {4}, 2)},
                          {shape{-1, 3}, shape{-1}}, fused_attrs("add(%0, %1)", {2}));
    ADD_FAILURE() << "expected a node_error";
  } catch (const node_error& e) {
    const std::string m = e.what();
    for (const char* part :
         {"under_test", "fused_elementwise", "[2, 3]", "[4]", "do not broadcast"}) {
      EXPECT_NE(m.find(part), std::string::npos) << m << " lacks " << part;
    }
  }
}

TEST(FusedElementwise, BadNodesFailWhenAdded) {
  const tensor x = random(dtype::f32, {3}, 1);
  expect_invalid_argument([&] { (void)run_fused("neg(%0); frob(%1)", {2}, {x}); },
                          {"under_test", "unknown op 'frob'", "position 9"});
  expect_invalid_argument([&] { (void)run_fused("neg(%0)", {1}, {random(dtype::i32, {3}, 1)}); },
                          {"under_test", "T = int32 is not supported"});
  expect_invalid_argument(
      [&] {
        (void)run_fused("add(%0, %1)", {2}, {x, random(dtype::f32, {4}, 1)});
      },
      {"under_test", "[3]", "[4]", "do not broadcast"});
}

// ---- gradients ----------------------------------------------------------------------------------

struct grad_case {
  std::string expr;
  ints results;
  std::vector<shape> shapes;
  std::vector<bool> positive;  // inputs that must be > 0 (log, sqrt, pow's base)
  std::vector<bool> in_loss;   // results the loss reads
};

// Values in ±[0.2, 1.5] (away from the kinks of abs, relu, maximum).
tensor grad_input(const shape& s, std::mt19937& rng, bool positive) {
  std::uniform_real_distribution<double> mag(0.2, 1.5);
  std::vector<double> v(static_cast<std::size_t>(s.num_elements()));
  for (auto& x : v) {
    x = mag(rng);
    if (!positive && rng() % 2 == 0) x = -x;
  }
  return memory::host_tensor<double>(s, v);
}

// loss = sum_j sum(result_j * w_j) over the results in the loss; returns the graph, the
// placeholders' names and the fetches (loss, then one gradient per input).
struct grad_graph {
  graph g;
  std::vector<std::string> fetches;
};

grad_graph build_grad_graph(const grad_case& c, bool fused, std::mt19937& rng) {
  grad_graph gg;
  graph_builder b(gg.g);
  std::vector<output> xs;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    xs.push_back(ops::placeholder(b, fmt::format("x{}", i), dtype::f64, c.shapes[i]));
  }
  const auto e = fused_expr::parse(c.expr, static_cast<std::int32_t>(xs.size()), c.results);
  const auto ys = fused ? ops::fused_elementwise(xs, e, {.name = "fused"}) : expand(e, xs);
  std::optional<output> loss;
  for (std::size_t j = 0; j < ys.size(); ++j) {
    if (!c.in_loss[j]) continue;
    const shape s = *ys[j].type().shape;
    std::uniform_real_distribution<double> wd(0.5, 1.0);
    std::vector<double> w(static_cast<std::size_t>(s.num_elements()));
    for (auto& v : w) v = wd(rng);
    const output term =
        ops::reduce_sum(ys[j] * ops::constant(b, memory::host_tensor<double>(s, w)));
    loss = loss ? *loss + term : term;
  }
  const auto grads = gradients(*loss, xs);
  gg.fetches.push_back(loss->name());
  for (const auto& d : grads) gg.fetches.push_back(d.name());
  return gg;
}

void check_gradients(const grad_case& c) {
  SCOPED_TRACE(fmt::format("{} [{}]", c.expr, fmt::join(c.results, ", ")));
  std::mt19937 rng(99);
  std::vector<tensor> inputs;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    inputs.push_back(grad_input(c.shapes[i], rng, c.positive.at(i)));
  }
  std::mt19937 wrng_a(5);
  std::mt19937 wrng_b(5);  // the same weights for both graphs
  grad_graph fused = build_grad_graph(c, true, wrng_a);
  grad_graph unfused = build_grad_graph(c, false, wrng_b);
  // The fused node is on the gradient path of the first graph.
  ASSERT_NE(fused.g.find("fused"), nullptr);
  session sf(std::move(fused.g), no_passes());
  session su(std::move(unfused.g), no_passes());
  auto feeds_of = [&](const std::vector<tensor>& f) {
    std::vector<feed> fs;
    for (std::size_t i = 0; i < f.size(); ++i) fs.emplace_back(fmt::format("x{}", i), f[i]);
    return fs;
  };
  const auto got = sf.run(feeds_of(inputs), fused.fetches);
  const auto want = su.run(feeds_of(inputs), unfused.fetches);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    const auto w = values(want[k]);
    expect_close(got[k], want[k].shape(), w, 1e-12, 1e-12);
  }
  // Central differences of the fused graph's loss.
  auto loss_at = [&](const std::vector<tensor>& f) {
    return values(sf.run(feeds_of(f), {fused.fetches[0]})[0])[0];
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto analytic = values(got[i + 1]);
    ASSERT_EQ(got[i + 1].shape(), c.shapes[i]);
    for (std::size_t j = 0; j < analytic.size();
         j += std::max<std::size_t>(1, analytic.size() / 16)) {
      std::vector<tensor> f = inputs;
      f[i] = make(dtype::f64, c.shapes[i], values(inputs[i]));
      double* p = f[i].data<double>();
      const double x0 = p[j];
      const double h = 1e-6 * std::max(1.0, std::fabs(x0));
      p[j] = x0 + h;
      const double up = loss_at(f);
      p[j] = x0 - h;
      const double down = loss_at(f);
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[j], numeric, 1e-6 + 1e-6 * std::fabs(numeric))
          << "input " << i << " element " << j;
    }
  }
}

TEST(FusedElementwiseGradient, MatchesCentralDifferencesAndTheExpandedGraph) {
  const std::vector<grad_case> cases = {
      // A chain over a matrix and a broadcast row.
      {"mul(%0, %1); add(%2, 0.5); tanh(%3); mul(%4, %0)",
       {5},
       {{3, 4}, {4}},
       {false, false},
       {true}},
      // Two results, both in the loss, with a column input.
      {"exp(%0); mul(%2, %1); sigmoid(%3); sub(%4, %2)",
       {3, 5},
       {{2, 3}, {2, 1}},
       {false, false},
       {true, true}},
      // Two results, only the second in the loss.
      {"exp(%0); mul(%2, %1); sigmoid(%3); sub(%4, %2)",
       {3, 5},
       {{2, 3}, {2, 1}},
       {false, false},
       {false, true}},
      // A scalar input, and ops with kinks away from the values.
      {"div(%0, %1); square(%2); gelu(%3); maximum(%4, %1); abs(%0); minimum(%5, %6)",
       {7},
       {{3, 4}, {}},
       {false, true},
       {true}},
      // A result that is an input, and one of a smaller shape than the output.
      {"neg(%0); exp(%1); mul(%3, %0)",
       {2, 0, 3, 4},
       {{3, 4}, {4}},
       {false, false},
       {true, true, true, true}},
      // Positive-only ops, literals on either side, rank differences.
      {"log(%0); sqrt(%1); rsqrt(%0); reciprocal(%1); pow(%0, %1); pow(%1, 1.5); sub(2, %2); "
       "mul(%4, %5); add(%6, %7); add(%8, %9); gelu_tanh(%10); erf(%11); relu(%12)",
       {13, 14},
       {{2, 1, 3}, {4, 3}},
       {true, true},
       {true, true}},
      // An input read by several instructions (fan-out inside the expression).
      {"mul(%0, %0); mul(%1, %0); add(%2, %1); sub(%3, %0)", {4}, {{5}}, {false}, {true}},
  };
  for (const auto& c : cases) check_gradients(c);
}

TEST(FusedElementwiseGradient, AnOpWithoutAGradientFailsOnlyOnThePath) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f64, {3});
  auto y = ops::placeholder(b, "y", dtype::f64, {3});
  const auto outs = ops::fused_elementwise(
      {x, y}, fused_expr::parse("relu_grad(%0, %1); exp(%0)", 2, {2, 3}), {.name = "fused"});
  // Only exp(x) reaches this loss: relu_grad is never differentiated.
  const auto ok = gradients(ops::reduce_sum(outs[1]), {x, y});
  EXPECT_EQ(ok.size(), 2u);
  if (!gradient_registry::global().knows("relu_grad")) {
    expect_invalid_argument(
        [&] {
          (void)gradients(ops::reduce_sum(outs[0]), {x, y});
        },
        {"'fused' (fused_elementwise)", "relu_grad", "has no gradient"});
  }
}

}  // namespace
}  // namespace loom
