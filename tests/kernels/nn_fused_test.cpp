// fused_matmul and fused_conv2d against a float64 reference written here (the core as an
// explicit sum, then the bias, the residual and the activation) and, bit for bit, against
// the unfused graph (matmul / conv2d, bias_add, add, the activation op) run by a session
// without passes (Note [fused epilogue]): every activation, with and without bias and
// residual, transposes, batched and broadcast matmuls, conv2d with strides, padding,
// dilation and groups (oneDNN's blocked layouts included), every float dtype, odd and empty
// sizes, non-contiguous inputs, residuals no one else may write; gradients against central
// differences; bad input at construction and at run time.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using ints = std::vector<std::int64_t>;
using ops::conv2d_options;
using ops::epilogue;

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
const std::vector<std::string> activations{"none", "relu", "gelu", "gelu_tanh", "tanh", "sigmoid"};

// ---- the float64 reference ----------------------------------------------------------------

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// NumPy's maximum / minimum: NaN on either side gives NaN, a tie the second operand.
double max_ref(double a, double b) {
  return (a > b || std::isnan(a)) ? a : b;
}
double min_ref(double a, double b) {
  return (a < b || std::isnan(a)) ? a : b;
}

// `lo`, `hi`: activation clip's bounds, already rounded to the dtype.
double act_ref(const std::string& act, double x, double lo = -inf, double hi = inf) {
  if (act == "clip") return min_ref(max_ref(x, lo), hi);
  if (act == "relu") return x > 0 ? x : 0.0;
  if (act == "gelu") return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
  if (act == "gelu_tanh") {
    const double k = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
  }
  if (act == "tanh") return std::tanh(x);
  if (act == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  return x;
}

// Values and, per element, the scale the rounding errors of the core and the epilogue's
// additions grow with (Σ|a·b| + |bias| + |residual|).
struct expected {
  shape s;
  std::vector<double> v;
  std::vector<double> scale;
};

// Row-major index of the element of `xs`'s batch that broadcasts to output batch `idx`.
std::int64_t batch_offset(const shape& xs, const shape& out_batch, std::int64_t idx) {
  const std::size_t xb = xs.rank() - 2;
  std::int64_t off = 0;
  std::int64_t stride = 1;
  for (std::size_t i = out_batch.rank(); i-- > 0;) {
    const std::int64_t d = idx % out_batch[i];
    idx /= out_batch[i];
    const std::size_t lead = out_batch.rank() - xb;
    if (i >= lead) {
      const std::int64_t xd = xs[i - lead];
      off += (xd == 1 ? 0 : d) * stride;
      stride *= xd;
    }
  }
  return off;
}

// NumPy's matmul of the values a and b hold.
expected matmul_ref(const tensor& a, const tensor& b, bool ta, bool tb) {
  const shape& as = a.shape();
  const shape& bs = b.shape();
  const std::size_t ra = as.rank();
  const std::size_t rb = bs.rank();
  const std::int64_t m = ta ? as[ra - 1] : as[ra - 2];
  const std::int64_t k = ta ? as[ra - 2] : as[ra - 1];
  const std::int64_t n = tb ? bs[rb - 2] : bs[rb - 1];
  const shape batch =
      broadcast_shapes(shape(as.dims().first(ra - 2)), shape(bs.dims().first(rb - 2)));
  const auto av = values(a);
  const auto bv = values(b);
  expected p;
  p.s = batch;
  p.s.push_back(m);
  p.s.push_back(n);
  p.v.assign(static_cast<std::size_t>(p.s.num_elements()), 0.0);
  p.scale.assign(p.v.size(), 0.0);
  for (std::int64_t bi = 0; bi < batch.num_elements(); ++bi) {
    const std::int64_t ao = batch_offset(as, batch, bi) * m * k;
    const std::int64_t bo = batch_offset(bs, batch, bi) * k * n;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0;
        double mag = 0;
        for (std::int64_t kk = 0; kk < k; ++kk) {
          const double x = av[static_cast<std::size_t>(ao + (ta ? kk * m + i : i * k + kk))];
          const double y = bv[static_cast<std::size_t>(bo + (tb ? j * k + kk : kk * n + j))];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        const auto o = static_cast<std::size_t>((bi * m + i) * n + j);
        p.v[o] = sum;
        p.scale[o] = mag;
      }
    }
  }
  return p;
}

struct conv_case {
  shape x;  // N, C, H, W
  shape w;  // O, C / groups, KH, KW
  ints strides{1, 1};
  ints padding{0, 0, 0, 0};
  ints dilations{1, 1};
  std::int64_t groups = 1;

  [[nodiscard]] ints pad4() const {
    return padding.size() == 2 ? ints{padding[0], padding[0], padding[1], padding[1]} : padding;
  }
  [[nodiscard]] shape y() const {
    const ints p = pad4();
    return {x[0], w[0], (x[2] + p[0] + p[1] - dilations[0] * (w[2] - 1) - 1) / strides[0] + 1,
            (x[3] + p[2] + p[3] - dilations[1] * (w[3] - 1) - 1) / strides[1] + 1};
  }
  [[nodiscard]] conv2d_options options() const {
    return {.strides = strides, .padding = padding, .dilations = dilations, .groups = groups};
  }
  [[nodiscard]] attr_map attrs() const {
    return {
        {"strides", strides}, {"padding", padding}, {"dilations", dilations}, {"groups", groups}};
  }
};

// The convolution (cross-correlation) as an explicit sum over each output's window.
expected conv_ref(const conv_case& c, const tensor& x, const tensor& w) {
  const auto xv = values(x);
  const auto wv = values(w);
  const ints p = c.pad4();
  expected e;
  e.s = c.y();
  e.v.assign(static_cast<std::size_t>(e.s.num_elements()), 0.0);
  e.scale.assign(e.v.size(), 0.0);
  const std::int64_t ch = c.x[1], h = c.x[2], wd = c.x[3];
  const std::int64_t o = c.w[0], cg = c.w[1], kh = c.w[2], kw = c.w[3];
  const std::int64_t per_group = o / c.groups;
  for (std::int64_t b = 0; b < e.s[0]; ++b) {
    for (std::int64_t fo = 0; fo < o; ++fo) {
      for (std::int64_t oy = 0; oy < e.s[2]; ++oy) {
        for (std::int64_t ox = 0; ox < e.s[3]; ++ox) {
          const auto yi = static_cast<std::size_t>(((b * o + fo) * e.s[2] + oy) * e.s[3] + ox);
          for (std::int64_t ci = 0; ci < cg; ++ci) {
            for (std::int64_t i = 0; i < kh; ++i) {
              for (std::int64_t j = 0; j < kw; ++j) {
                const std::int64_t iy = oy * c.strides[0] - p[0] + i * c.dilations[0];
                const std::int64_t ix = ox * c.strides[1] - p[2] + j * c.dilations[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                const std::int64_t xc = (fo / per_group) * cg + ci;
                const double t = xv[static_cast<std::size_t>(((b * ch + xc) * h + iy) * wd + ix)] *
                                 wv[static_cast<std::size_t>(((fo * cg + ci) * kh + i) * kw + j)];
                e.v[yi] += t;
                e.scale[yi] += std::fabs(t);
              }
            }
          }
        }
      }
    }
  }
  return e;
}

// act(core + bias + residual) in place; the bias runs along dimension `channel`; `lo`,
// `hi`: clip's bounds (rounded to the dtype).
void apply_epilogue(expected& e, const std::optional<tensor>& bias,
                    const std::optional<tensor>& residual, const std::string& act,
                    std::size_t channel, double lo = -inf, double hi = inf) {
  std::int64_t inner = 1;
  for (std::size_t d = channel + 1; d < e.s.rank(); ++d) inner *= e.s[d];
  const std::int64_t channels = e.s.rank() > 0 ? e.s[channel] : 1;
  const auto bv = bias ? values(*bias) : std::vector<double>{};
  const auto rv = residual ? values(*residual) : std::vector<double>{};
  for (std::size_t i = 0; i < e.v.size(); ++i) {
    double z = e.v[i];
    if (bias) {
      const double b =
          bv[static_cast<std::size_t>((static_cast<std::int64_t>(i) / inner) % channels)];
      z += b;
      e.scale[i] += std::fabs(b);
    }
    if (residual) {
      z += rv[i];
      e.scale[i] += std::fabs(rv[i]);
    }
    e.v[i] = act_ref(act, z, lo, hi);
    // An infinite input clipped to a finite bound: exactly the bound.
    if (!std::isfinite(e.scale[i]) && std::isfinite(e.v[i])) e.scale[i] = 0;
  }
}

// Relative error allowed against the scale (the core accumulates in float for f32, f16
// and bf16; the output is rounded to the dtype at least once).
double tolerance(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-13;
    case dtype::f32:
      return 1e-5;
    case dtype::f16:
      return 2e-3;
    default:
      return 1e-2;  // bfloat16
  }
}

// |got - want| <= tol (1.2 scale + |want|) + a floor: an error d in the activation's input
// becomes at most 1.13 d in its output (gelu's steepest slope); the output is rounded once
// more, and the float32 fast exp / tanh are good to a few ulp.
void expect_matches(const tensor& got, const expected& want, dtype t) {
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(to_string(got.shape()), to_string(want.s));
  EXPECT_EQ(got.type(), t);
  const auto g = values(got);
  int reported = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = tolerance(t) * (1.2 * want.scale[i] + std::fabs(want.v[i]) + 0.01);
    // NaN and infinities (clip's inputs) exactly.
    const bool ok = std::isfinite(want.v[i])
                        ? std::fabs(g[i] - want.v[i]) <= tol
                        : (std::isnan(want.v[i]) ? std::isnan(g[i]) : g[i] == want.v[i]);
    if (!ok && reported++ < 8) {
      ADD_FAILURE() << "element " << i << ": got " << g[i] << ", expected " << want.v[i]
                    << " (tolerance " << tol << ", " << got.describe() << ")";
    }
  }
}

// ---- running the ops ---------------------------------------------------------------------

struct epilogue_case {
  bool bias = false;
  bool residual = false;
  std::string act = "none";
  double lo = -inf;  // clip's bounds
  double hi = inf;
  [[nodiscard]] std::string describe() const {
    if (act == "clip") {
      return fmt::format("bias {} residual {} act clip [{}, {}]", bias, residual, lo, hi);
    }
    return fmt::format("bias {} residual {} act {}", bias, residual, act);
  }
};

attr_map epilogue_attrs(const epilogue_case& e) {
  attr_map a{{"has_bias", e.bias}, {"has_residual", e.residual}, {"activation", e.act}};
  if (e.act == "clip") {
    a.emplace("clip_min", e.lo);
    a.emplace("clip_max", e.hi);
  }
  return a;
}

// `v` as a scalar constant of `t` holds it (ops::scalar's conversion).
double in_dtype(dtype t, double v) {
  return values(make(t, {}, {v}))[0];
}

std::vector<tensor> with_args(std::vector<tensor> in, const std::optional<tensor>& bias,
                              const std::optional<tensor>& residual) {
  if (bias) in.push_back(*bias);
  if (residual) in.push_back(*residual);
  return in;
}

// fused_matmul through run_op against the reference.
void check_matmul(const tensor& a, const tensor& b, bool ta, bool tb, const epilogue_case& e,
                  std::uint64_t seed = 7) {
  const dtype t = a.type();
  SCOPED_TRACE(fmt::format("{} a {}{} b {}{} {}", to_string(t), a.describe(), ta ? " (T)" : "",
                           b.describe(), tb ? " (T)" : "", e.describe()));
  expected want = matmul_ref(a, b, ta, tb);
  std::optional<tensor> bias;
  std::optional<tensor> residual;
  if (e.bias) bias = random(t, {want.s[want.s.rank() - 1]}, seed);
  if (e.residual) residual = random(t, want.s, seed + 1);
  attr_map attrs = epilogue_attrs(e);
  attrs.emplace("transpose_a", ta);
  attrs.emplace("transpose_b", tb);
  const tensor got = run_op1("fused_matmul", with_args({a, b}, bias, residual), attrs);
  apply_epilogue(want, bias, residual, e.act, want.s.rank() - 1, in_dtype(t, e.lo),
                 in_dtype(t, e.hi));
  expect_matches(got, want, t);
}

void check_conv(const conv_case& c, dtype t, const epilogue_case& e, std::uint64_t seed = 3) {
  SCOPED_TRACE(fmt::format("{} x {} w {} strides {} padding {} dilations {} groups {} {}",
                           to_string(t), to_string(c.x), to_string(c.w),
                           to_string(shape(c.strides)), to_string(shape(c.padding)),
                           to_string(shape(c.dilations)), c.groups, e.describe()));
  const tensor x = random(t, c.x, seed);
  const tensor w = random(t, c.w, seed + 1);
  expected want = conv_ref(c, x, w);
  std::optional<tensor> bias;
  std::optional<tensor> residual;
  if (e.bias) bias = random(t, {c.w[0]}, seed + 2);
  if (e.residual) residual = random(t, want.s, seed + 3);
  attr_map attrs = epilogue_attrs(e);
  attrs.merge(c.attrs());
  const tensor got = run_op1("fused_conv2d", with_args({x, w}, bias, residual), attrs);
  apply_epilogue(want, bias, residual, e.act, 1, in_dtype(t, e.lo), in_dtype(t, e.hi));
  expect_matches(got, want, t);
}

session_options no_passes() {
  session_options o;
  o.passes.enabled = false;  // the graphs run as written: the unfused chain stays unfused
  return o;
}

// Activation clip as ONNX's Clip lowers it: maximum(z, lo) then minimum(., hi) with scalar
// constants of z's dtype; with `all_nodes` false, no node for an infinite bound.
output clip_nodes(output z, double lo, double hi, bool all_nodes) {
  const dtype t = z.dtype_of();
  if (all_nodes || lo != -inf) z = ops::maximum(z, ops::scalar(z.builder(), lo, t));
  if (all_nodes || hi != inf) z = ops::minimum(z, ops::scalar(z.builder(), hi, t));
  return z;
}

output activate(output z, const std::string& act) {
  if (act == "relu") return ops::relu(z);
  if (act == "gelu") return ops::gelu(z);
  if (act == "gelu_tanh") return ops::gelu(z, "tanh");
  if (act == "tanh") return ops::tanh(z);
  if (act == "sigmoid") return ops::sigmoid(z);
  return z;
}

// The fused node and the unfused chain in one graph, run by a session: both against the
// reference, and against each other.
void check_against_unfused(const std::function<output(graph_builder&, output, output)>& core,
                           const std::function<output(output, output, const epilogue&)>& fused,
                           const tensor& x, const tensor& w, const expected& core_ref,
                           const epilogue_case& e, bool nchw, std::uint64_t seed) {
  const dtype t = x.type();
  SCOPED_TRACE(fmt::format("{} {} {} {}", to_string(t), x.describe(), w.describe(), e.describe()));
  const std::size_t channel = nchw ? 1 : core_ref.s.rank() - 1;
  std::optional<tensor> bias;
  std::optional<tensor> residual;
  if (e.bias) bias = random(t, {core_ref.s[channel]}, seed);
  if (e.residual) residual = random(t, core_ref.s, seed + 1);
  graph g;
  graph_builder b(g);
  const output px = ops::placeholder(b, "x", t, x.shape());
  const output pw = ops::placeholder(b, "w", t, w.shape());
  std::vector<feed> feeds{{"x", x}, {"w", w}};
  epilogue ep;
  ep.activation = e.act;
  if (e.act == "clip") {
    ep.clip_min = e.lo;
    ep.clip_max = e.hi;
  }
  output z = core(b, px, pw);
  if (bias) {
    ep.bias = ops::placeholder(b, "bias", t, bias->shape());
    feeds.emplace_back("bias", *bias);
    z = ops::bias_add(z, *ep.bias, nchw ? "NCHW" : "NHWC");
  }
  if (residual) {
    ep.residual = ops::placeholder(b, "residual", t, residual->shape());
    feeds.emplace_back("residual", *residual);
    z = z + *ep.residual;
  }
  const bool clip = e.act == "clip";
  const output unfused = ops::identity(clip ? clip_nodes(z, e.lo, e.hi, true) : activate(z, e.act),
                                       {.name = "unfused"});
  const output f = fused(px, pw, ep);
  EXPECT_EQ(to_string(f.type()), to_string(unfused.type()));
  std::vector<std::string> fetches{f.name(), unfused.name()};
  // Clip: also the chain without the nodes of infinite bounds (an infinite bound is no node).
  if (clip) {
    fetches.push_back(
        ops::identity(clip_nodes(z, e.lo, e.hi, false), {.name = "unfused_finite"}).name());
  }
  session s(std::move(g), no_passes());
  const auto out = s.run(feeds, fetches);
  expected want = core_ref;
  apply_epilogue(want, bias, residual, e.act, channel, in_dtype(t, e.lo), in_dtype(t, e.hi));
  {
    SCOPED_TRACE("fused");
    expect_matches(out[0], want, t);
  }
  {
    SCOPED_TRACE("unfused");
    expect_matches(out[1], want, t);
  }
  // The fused node is the unfused graph's computation: bit for bit (Note [fused epilogue]).
  const auto fv = values(out[0]);
  const auto uv = values(out[1]);
  ASSERT_EQ(fv.size(), uv.size());
  int reported = 0;
  for (std::size_t i = 0; i < fv.size(); ++i) {
    const bool same = std::isnan(fv[i]) ? std::isnan(uv[i])
                                        : std::bit_cast<std::uint64_t>(fv[i]) ==
                                              std::bit_cast<std::uint64_t>(uv[i]);
    if (!same && reported++ < 8) {
      ADD_FAILURE() << "element " << i << ": fused " << fv[i] << ", unfused " << uv[i];
    }
  }
  // Clip: the very bits, NaN payloads and signed zeros included, against both chains.
  for (std::size_t k = 1; clip && k < out.size(); ++k) {
    ASSERT_EQ(out[0].nbytes(), out[k].nbytes());
    ASSERT_TRUE(out[0].is_contiguous() && out[k].is_contiguous());
    EXPECT_EQ(std::memcmp(out[0].raw_data(), out[k].raw_data(), out[0].nbytes()), 0)
        << "the bits differ from " << fetches[k];
  }
  // The residual fed by the caller is the caller's: never written.
  if (residual) expect_close(*residual, residual->shape(), values(*residual), 0, 0);
}

std::vector<epilogue_case> every_epilogue() {
  std::vector<epilogue_case> cases;
  for (const auto& act : activations) {
    for (const bool bias : {false, true}) {
      for (const bool residual : {false, true}) cases.push_back({bias, residual, act});
    }
  }
  for (const bool bias : {false, true}) {
    for (const bool residual : {false, true}) cases.push_back({bias, residual, "clip", -0.5, 0.5});
  }
  return cases;
}

// ---- activation clip: the inputs ---------------------------------------------------------

// Activation inputs with NaN, infinities, signed zeros, the bounds' values (bound_cases'),
// and values between and past them: a column of these times a row of clip_scales with
// K = 1 (every product exact), or their 1x1 convolution.
const std::vector<double> clip_specials{nan, inf, -inf, -0.0, 0.0, 6.0,  -6.0, 0.1,
                                        0.3, 3.0, -3.0, 7.0,  1e4, -1e4, 1e-3, 0.5};
const std::vector<double> clip_scales{1.0, -1.0, 0.5, 2.0};

// Bounds: ReLU6's, signed zeros (a tie gives the bound), one or both infinite (the lone
// maximum / minimum), NaN, lo > hi, and values no 16-bit float holds (rounded to it).
std::vector<std::pair<double, double>> clip_bound_cases() {
  return {{0.0, 6.0}, {-0.0, 6.0}, {0.0, inf}, {-0.0, inf}, {-inf, 6.0}, {-inf, -0.0},
          {nan, 6.0}, {0.0, nan},  {6.0, 0.0}, {0.1, 0.3},  {-inf, inf}};
}

// ---- fused_matmul ------------------------------------------------------------------------

TEST(NnFusedMatmul, EveryEpilogueAgainstUnfused) {
  for (const dtype t : float_types) {
    const tensor a = random(t, {7, 129}, 1);
    const tensor w = random(t, {129, 33}, 2);
    const expected core = matmul_ref(a, w, false, false);
    for (const auto& e : every_epilogue()) {
      check_against_unfused(
          [](graph_builder&, output x, output y) { return ops::matmul(x, y); },
          [](output x, output y, const epilogue& ep) { return ops::fused_matmul(x, y, ep); }, a, w,
          core, e, false, 11);
    }
  }
}

TEST(NnFusedMatmul, BatchedAndTransposedAgainstUnfused) {
  for (const dtype t : float_types) {
    const tensor a = random(t, {3, 33, 7}, 1);  // transposed: [3, 7, 33]
    const tensor w = random(t, {5, 33}, 2);     // transposed: [33, 5]
    const expected core = matmul_ref(a, w, true, true);
    for (const auto& act : {"relu", "gelu"}) {
      check_against_unfused(
          [](graph_builder&, output x, output y) { return ops::matmul(x, y, true, true); },
          [](output x, output y, const epilogue& ep) {
            return ops::fused_matmul(x, y, ep, true, true);
          },
          a, w, core, {true, true, act}, false, 5);
    }
  }
}

TEST(NnFusedMatmul, OddSizes) {
  struct mkn {
    std::int64_t m, k, n;
  };
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& s : {mkn{1, 1, 1}, mkn{1, 7, 129}, mkn{129, 1, 7}, mkn{7, 129, 1},
                          mkn{129, 129, 129}, mkn{64, 32, 48}}) {
      const tensor a = random(t, {s.m, s.k}, seed++);
      const tensor b = random(t, {s.k, s.n}, seed++);
      check_matmul(a, b, false, false, {true, true, "gelu"});
      check_matmul(a, b, false, false, {true, false, "relu"});
    }
  }
}

TEST(NnFusedMatmul, Transposes) {
  for (const dtype t : float_types) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const shape as = ta ? shape{13, 7} : shape{7, 13};
        const shape bs = tb ? shape{5, 13} : shape{13, 5};
        check_matmul(random(t, as, 3), random(t, bs, 4), ta, tb, {true, true, "sigmoid"});
        const shape as2 = ta ? shape{2, 40, 33} : shape{2, 33, 40};
        const shape bs2 = tb ? shape{17, 40} : shape{40, 17};
        check_matmul(random(t, as2, 5), random(t, bs2, 6), ta, tb, {true, true, "tanh"});
      }
    }
  }
}

TEST(NnFusedMatmul, BatchedBroadcast) {
  for (const dtype t : float_types) {
    const epilogue_case e{true, true, "gelu_tanh"};
    check_matmul(random(t, {3, 4, 5}, 1), random(t, {5, 6}, 2), false, false, e);
    check_matmul(random(t, {4, 5}, 1), random(t, {3, 5, 6}, 2), false, false, e);
    check_matmul(random(t, {3, 4, 5}, 1), random(t, {3, 5, 6}, 2), false, false, e);
    check_matmul(random(t, {2, 1, 4, 5}, 1), random(t, {1, 3, 5, 6}, 2), false, false, e);
    check_matmul(random(t, {2, 3, 4, 5}, 1), random(t, {3, 6, 5}, 2), false, true, e);
    check_matmul(random(t, {2, 1, 5, 4}, 1), random(t, {2, 5, 6}, 2), true, false,
                 {false, true, "relu"});
  }
}

TEST(NnFusedMatmul, EmptyOperands) {
  for (const dtype t : float_types) {
    // K = 0: the product is zeros, the output act(bias + residual).
    check_matmul(random(t, {3, 0}, 1), random(t, {0, 4}, 2), false, false, {true, true, "relu"});
    check_matmul(random(t, {2, 3, 0}, 1), random(t, {0, 4}, 2), false, false,
                 {true, false, "sigmoid"});
    // Empty outputs: no rows, no columns (a bias of [0]), an empty batch.
    check_matmul(random(t, {0, 5}, 1), random(t, {5, 3}, 2), false, false, {true, true, "gelu"});
    check_matmul(random(t, {4, 5}, 1), random(t, {5, 0}, 2), false, false, {true, true, "gelu"});
    check_matmul(random(t, {0, 4, 5}, 1), random(t, {5, 3}, 2), false, false, {true, true, "tanh"});
  }
}

TEST(NnFusedMatmul, NonContiguousInputs) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    const tensor a = random(t, {9, 11}, 1);
    const tensor b = random(t, {11, 6}, 2);
    const tensor bias_storage = random(t, {12}, 3);
    const tensor bias = tensor::strided(bias_storage.buf(), t, {6}, {2}, 1);  // every other one
    const tensor residual = random(t, {9, 6}, 4);
    attr_map attrs = epilogue_attrs({true, true, "relu"});
    const tensor got =
        run_op1("fused_matmul",
                {non_contiguous(a), non_contiguous(b), bias, non_contiguous(residual)}, attrs);
    expected want = matmul_ref(a, b, false, false);
    apply_epilogue(want, bias, residual, "relu", 1);
    expect_matches(got, want, t);
  }
}

// The residual's buffer is read, never written, whoever holds it (a product read by the
// fused node alone, a value also fetched, a feed).
TEST(NnFusedMatmul, ResidualBuffersAreNotWritten) {
  for (const dtype t : {dtype::f32, dtype::bf16, dtype::f64}) {
    SCOPED_TRACE(to_string(t));
    const tensor a = random(t, {16, 24}, 1);
    const tensor w = random(t, {24, 20}, 2);
    const tensor bias = random(t, {20}, 3);
    const tensor r = random(t, {16, 20}, 4);
    graph g;
    graph_builder b(g);
    const output pa = ops::placeholder(b, "a", t, a.shape());
    const output pw = ops::placeholder(b, "w", t, w.shape());
    const output pb = ops::placeholder(b, "bias", t, bias.shape());
    const output pr = ops::placeholder(b, "r", t, r.shape());
    const output doubled = pr * 2.0;  // read by the fused node alone
    const output shared = pr * 3.0;   // read by the fused node and fetched
    const output y1 =
        ops::fused_matmul(pa, pw, {.bias = pb, .residual = doubled, .activation = "tanh"});
    const output y2 =
        ops::fused_matmul(pa, pw, {.bias = pb, .residual = shared, .activation = "tanh"});
    const output y3 = ops::fused_matmul(pa, pw, {.bias = pb, .residual = pr, .activation = "tanh"});
    const std::vector<std::string> fetches{y1.name(), y2.name(), y3.name(), shared.name()};
    session s(std::move(g), no_passes());
    const auto rv = values(r);
    const auto out = s.run({{"a", a}, {"w", w}, {"bias", bias}, {"r", r}}, fetches);
    for (const auto& [k, factor] :
         std::vector<std::pair<std::size_t, double>>{{0, 2}, {1, 3}, {2, 1}}) {
      std::vector<double> scaled(rv.size());
      for (std::size_t i = 0; i < rv.size(); ++i) scaled[i] = rv[i] * factor;
      const tensor residual = make(t, r.shape(), scaled);
      expected want = matmul_ref(a, w, false, false);
      apply_epilogue(want, bias, residual, "tanh", 1);
      expect_matches(out[k], want, t);
    }
    // The fetched residual and the fed one are unchanged.
    std::vector<double> tripled(rv.size());
    for (std::size_t i = 0; i < rv.size(); ++i) tripled[i] = values(make(t, {1}, {rv[i] * 3}))[0];
    expect_close(out[3], r.shape(), tripled, 0, 0);
    expect_close(r, r.shape(), rv, 0, 0);
  }
}

// One kernel across shapes and threads: the plain kernel's primitive cache tells shapes
// apart, and float16 goes to matmul's own loop (oneDNN 2.6 has no float16 matmul).
TEST(NnFusedMatmul, KernelReusedAcrossShapesAndThreads) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    graph g;
    graph_builder b(g);
    const auto x = ops::placeholder(b, "x", t, {-1, -1});
    const auto y = ops::placeholder(b, "y", t, {-1, -1});
    const auto bias = ops::placeholder(b, "bias", t, {-1});
    const auto res = ops::placeholder(b, "res", t, {-1, -1});
    const node& n =
        g.get(ops::fused_matmul(x, y, {.bias = bias, .residual = res, .activation = "gelu"}, false,
                                false, {.name = "under_test"})
                  .producer()
                  .name);
    auto kernel = kernel_registry::global()
                      .get(n, device_type::cpu)
                      .create(kernel_construction(n, test_device(), &g));
    const auto run = [&](std::int64_t m, std::int64_t k, std::int64_t nn, std::uint64_t seed) {
      const tensor a = random(t, {m, k}, seed);
      const tensor bm = random(t, {k, nn}, seed + 1);
      const tensor bv = random(t, {nn}, seed + 2);
      const tensor rv = random(t, {m, nn}, seed + 3);
      std::vector<tensor> in{a, bm, bv, rv};
      std::vector<tensor> out(1);
      variable_store vars;
      kernel_context ctx(n, test_device(), in, out, &vars, nullptr);
      kernel->compute(ctx);
      expected want = matmul_ref(a, bm, false, false);
      apply_epilogue(want, bv, rv, "gelu", 1);
      const auto got = values(out[0]);
      int bad = 0;
      for (std::size_t j = 0; j < got.size(); ++j) {
        const double tol = tolerance(t) * (1.2 * want.scale[j] + std::fabs(want.v[j]) + 0.01);
        if (!(std::fabs(got[j] - want.v[j]) <= tol)) ++bad;
      }
      return bad;
    };
    for (int round = 0; round < 2; ++round) {
      EXPECT_EQ(run(4, 5, 6, 1), 0);
      EXPECT_EQ(run(8, 3, 2, 2), 0);
      EXPECT_EQ(run(33, 17, 9, 3), 0);
    }
    std::vector<std::thread> threads;
    std::vector<int> failures(4, 0);
    for (int th = 0; th < 4; ++th) {
      threads.emplace_back([&, th] {
        for (int i = 0; i < 5; ++i)
          failures[static_cast<std::size_t>(th)] += run(16 + th, 24, 20, 100);
      });
    }
    for (auto& th : threads) th.join();
    for (int th = 0; th < 4; ++th) EXPECT_EQ(failures[static_cast<std::size_t>(th)], 0) << th;
  }
}

TEST(NnFusedClip, MatmulSpecialValuesAgainstUnfused) {
  for (const dtype t : float_types) {
    const auto m = static_cast<std::int64_t>(clip_specials.size());
    const tensor a = make(t, {m, 1}, clip_specials);
    const tensor w = make(t, {1, 4}, clip_scales);
    const expected core = matmul_ref(a, w, false, false);
    for (const auto& [lo, hi] : clip_bound_cases()) {
      for (const bool bias : {false, true}) {
        for (const bool residual : {false, true}) {
          check_against_unfused(
              [](graph_builder&, output x, output y) { return ops::matmul(x, y); },
              [](output x, output y, const epilogue& ep) { return ops::fused_matmul(x, y, ep); }, a,
              w, core, {bias, residual, "clip", lo, hi}, false, 21);
        }
      }
    }
  }
}

TEST(NnFusedClip, KernelOnItsOwn) {
  for (const dtype t : float_types) {
    check_matmul(random(t, {9, 17}, 1), random(t, {6, 17}, 2), false, true,
                 {true, true, "clip", -1.0, 0.75});
    check_matmul(random(t, {2, 9, 17}, 1), random(t, {17, 6}, 2), false, false,
                 {false, true, "clip", 0.0, inf});
    check_conv({.x = {2, 3, 7, 5}, .w = {4, 3, 3, 3}, .strides = {2, 1}, .padding = {1, 1}}, t,
               {true, false, "clip", -inf, 0.25});
    check_conv({.x = {1, 4, 6, 6}, .w = {4, 1, 3, 3}, .padding = {1, 1}, .groups = 4}, t,
               {true, true, "clip", 0.0, 6.0});
  }
}

// ---- fused_conv2d ------------------------------------------------------------------------

TEST(NnFusedClip, Conv2dSpecialValuesAgainstUnfused) {
  const conv_case c{.x = {1, 1, 4, 4}, .w = {4, 1, 1, 1}};
  for (const dtype t : float_types) {
    // conv2d's bfloat16 kernel (oneDNN's) makes an infinite input NaN (the matmul test has
    // bfloat16 infinities): here finite values instead.
    std::vector<double> specials = clip_specials;
    if (t == dtype::bf16) std::replace(specials.begin(), specials.end(), inf, 60.0);
    if (t == dtype::bf16) std::replace(specials.begin(), specials.end(), -inf, -60.0);
    const tensor x = make(t, c.x, specials);
    const tensor w = make(t, c.w, clip_scales);
    const expected core = conv_ref(c, x, w);
    for (const auto& [lo, hi] : clip_bound_cases()) {
      for (const bool bias : {false, true}) {
        for (const bool residual : {false, true}) {
          check_against_unfused([&c](graph_builder&, output xi,
                                     output wi) { return ops::conv2d(xi, wi, c.options()); },
                                [&c](output xi, output wi, const epilogue& ep) {
                                  return ops::fused_conv2d(xi, wi, ep, c.options());
                                },
                                x, w, core, {bias, residual, "clip", lo, hi}, true, 23);
        }
      }
    }
  }
}

TEST(NnFusedConv2d, EveryEpilogueAgainstUnfused) {
  const conv_case c{.x = {2, 3, 7, 9}, .w = {4, 3, 3, 3}, .padding = {1, 1}};
  for (const dtype t : float_types) {
    const tensor x = random(t, c.x, 1);
    const tensor w = random(t, c.w, 2);
    const expected core = conv_ref(c, x, w);
    for (const auto& e : every_epilogue()) {
      check_against_unfused(
          [&c](graph_builder&, output xi, output wi) { return ops::conv2d(xi, wi, c.options()); },
          [&c](output xi, output wi, const epilogue& ep) {
            return ops::fused_conv2d(xi, wi, ep, c.options());
          },
          x, w, core, e, true, 13);
    }
  }
}

// Sizes where oneDNN computes float32 and bfloat16 in its own layouts (conv2d's kernel
// reorders the output back before the epilogue reads it).
TEST(NnFusedConv2d, BlockedLayoutsAgainstUnfused) {
  const conv_case c{.x = {2, 16, 14, 14}, .w = {32, 16, 3, 3}, .padding = {1, 1}};
  for (const dtype t : float_types) {
    const tensor x = random(t, c.x, 1);
    const tensor w = random(t, c.w, 2);
    const expected core = conv_ref(c, x, w);
    for (const epilogue_case& e : std::vector<epilogue_case>{{true, true, "relu"},
                                                             {true, false, "gelu"},
                                                             {false, true, "none"},
                                                             {true, true, "clip", 0.0, 6.0}}) {
      check_against_unfused(
          [&c](graph_builder&, output xi, output wi) { return ops::conv2d(xi, wi, c.options()); },
          [&c](output xi, output wi, const epilogue& ep) {
            return ops::fused_conv2d(xi, wi, ep, c.options());
          },
          x, w, core, e, true, 17);
    }
  }
}

TEST(NnFusedConv2d, StridesPaddingDilationGroups) {
  const std::vector<conv_case> cases{
      {.x = {2, 3, 9, 8}, .w = {4, 3, 3, 3}, .strides = {2, 2}, .padding = {1, 1}},
      {.x = {1, 2, 9, 8}, .w = {3, 2, 3, 2}, .strides = {2, 3}, .padding = {1, 0, 2, 1}},
      {.x = {2, 3, 12, 9},
       .w = {4, 3, 3, 2},
       .strides = {2, 1},
       .padding = {2, 1, 0, 3},
       .dilations = {3, 2}},
      {.x = {2, 4, 6, 6}, .w = {6, 2, 3, 3}, .padding = {1, 1}, .groups = 2},
      {.x = {2, 8, 7, 7}, .w = {8, 1, 3, 3}, .padding = {1, 1}, .groups = 8},
      {.x = {1, 4, 7, 7}, .w = {8, 1, 3, 3}, .strides = {2, 2}, .groups = 4},
      {.x = {2, 32, 8, 8}, .w = {32, 1, 3, 3}, .padding = {1, 1}, .groups = 32},
      {.x = {1, 16, 14, 14}, .w = {32, 16, 3, 3}, .strides = {2, 2}, .padding = {1, 1}},
  };
  for (const dtype t : float_types) {
    for (const auto& c : cases) {
      check_conv(c, t, {true, true, "relu"});
      check_conv(c, t, {true, false, "gelu_tanh"});
    }
  }
}

TEST(NnFusedConv2d, OddSizes) {
  for (const dtype t : float_types) {
    check_conv({.x = {1, 1, 1, 1}, .w = {1, 1, 1, 1}}, t, {true, true, "sigmoid"});
    check_conv({.x = {1, 7, 1, 7}, .w = {7, 7, 1, 1}}, t, {true, true, "tanh"});
    check_conv({.x = {3, 5, 7, 3}, .w = {7, 5, 1, 3}, .strides = {1, 2}, .padding = {0, 1, 1, 0}},
               t, {true, true, "gelu"});
    check_conv({.x = {1, 3, 129, 7}, .w = {2, 3, 3, 3}, .padding = {1, 1}}, t,
               {true, true, "relu"});
  }
}

// Padding as large as the filter: whole output rows and columns of bias + residual (which
// oneDNN 2.6's brgconv gets wrong with sum and eltwise post-ops, which loom does not use).
TEST(NnFusedConv2d, PaddingAsLargeAsTheFilter) {
  for (const dtype t : float_types) {
    for (const auto& act : {"relu", "gelu", "none"}) {
      check_conv({.x = {3, 5, 7, 3}, .w = {7, 5, 1, 3}, .strides = {1, 2}, .padding = {0, 1, 1, 0}},
                 t, {true, true, act});
      check_conv({.x = {2, 4, 5, 5}, .w = {3, 4, 1, 1}, .padding = {1, 1}}, t, {true, true, act});
      check_conv({.x = {1, 16, 6, 6}, .w = {16, 16, 2, 2}, .padding = {2, 0, 0, 2}}, t,
                 {false, true, act});
      check_conv({.x = {2, 16, 6, 6}, .w = {16, 16, 2, 2}, .padding = {2, 0, 0, 2}}, t,
                 {true, false, act});
      check_conv({.x = {3, 5, 7, 3}, .w = {7, 5, 1, 3}, .strides = {1, 2}, .padding = {0, 1, 1, 0}},
                 t, {true, false, act});
    }
  }
}

TEST(NnFusedConv2d, EmptyBatchAndEmptyImage) {
  for (const dtype t : float_types) {
    check_conv({.x = {0, 3, 5, 5}, .w = {4, 3, 3, 3}, .padding = {1, 1}}, t, {true, true, "relu"});
    check_conv({.x = {2, 3, 5, 5}, .w = {0, 3, 3, 3}}, t, {true, true, "relu"});
    // Every window in the padding: the core is zeros, the output act(bias + residual).
    check_conv({.x = {1, 2, 0, 0}, .w = {3, 2, 1, 1}, .padding = {1, 1}}, t, {true, true, "gelu"});
  }
}

TEST(NnFusedConv2d, NonContiguousInputs) {
  const conv_case c{.x = {2, 3, 6, 5}, .w = {4, 3, 3, 3}, .padding = {1, 1}};
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, c.x, 1);
    const tensor w = random(t, c.w, 2);
    const tensor bias = random(t, {4}, 3);
    const tensor residual = random(t, c.y(), 4);
    attr_map attrs = epilogue_attrs({true, true, "sigmoid"});
    attrs.merge(c.attrs());
    const tensor got =
        run_op1("fused_conv2d",
                {non_contiguous(x), non_contiguous(w), bias, non_contiguous(residual)}, attrs);
    expected want = conv_ref(c, x, w);
    apply_epilogue(want, bias, residual, "sigmoid", 1);
    expect_matches(got, want, t);
  }
}

// ---- gradients ---------------------------------------------------------------------------

// Central differences of L = sum(f(x...) * c), c a fixed random tensor, in float64, against
// gradients() run by a session; at most `max_checked` elements per input.
void check_gradients(const std::string& what, const std::vector<shape>& shapes,
                     const std::function<output(const std::vector<output>&)>& build,
                     std::size_t max_checked = 24) {
  SCOPED_TRACE(what);
  graph g;
  graph_builder b(g);
  std::vector<output> xs;
  std::vector<tensor> feeds;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    xs.push_back(ops::placeholder(b, fmt::format("x{}", i), dtype::f64, shapes[i]));
    feeds.push_back(random(dtype::f64, shapes[i], 100 + i, -1.5, 1.5));
  }
  const output y = build(xs);
  ASSERT_TRUE(y.type().shape.has_value());
  const output loss =
      ops::reduce_sum(y * ops::constant(b, random(dtype::f64, *y.type().shape, 99, 0.5, 1.0)));
  const std::vector<output> grads = gradients(loss, xs);
  std::vector<std::string> fetches{loss.name()};
  for (const output& d : grads) fetches.push_back(d.name());
  session s(std::move(g), no_passes());
  const auto feed_list = [](const std::vector<tensor>& f) {
    std::vector<feed> fs;
    for (std::size_t i = 0; i < f.size(); ++i) fs.emplace_back(fmt::format("x{}", i), f[i]);
    return fs;
  };
  const auto out = s.run(feed_list(feeds), fetches);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    ASSERT_EQ(to_string(out[i + 1].shape()), to_string(shapes[i])) << "input " << i;
    const auto analytic = values(out[i + 1]);
    const std::size_t step = std::max<std::size_t>(1, analytic.size() / max_checked);
    for (std::size_t j = 0; j < analytic.size(); j += step) {
      std::vector<tensor> f = feeds;
      f[i] = memory::contiguous_copy(feeds[i], memory::host_resource::instance(), device_id{});
      double* p = f[i].data<double>();
      const double x0 = p[j];
      const double h = 1e-6;
      p[j] = x0 + h;
      const double up = s.run(feed_list(f), {fetches[0]})[0].data<double>()[0];
      p[j] = x0 - h;
      const double down = s.run(feed_list(f), {fetches[0]})[0].data<double>()[0];
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[j], numeric, 1e-6 + 1e-6 * std::fabs(numeric))
          << "input " << i << " element " << j;
    }
  }
}

TEST(NnFusedGradients, MatmulEveryActivation) {
  for (const auto& act : activations) {
    check_gradients("matmul bias residual " + act, {{5, 7}, {7, 4}, {4}, {5, 4}},
                    [&act](const std::vector<output>& x) {
                      return ops::fused_matmul(x[0], x[1],
                                               {.bias = x[2], .residual = x[3], .activation = act});
                    });
  }
  check_gradients("matmul bias only", {{5, 7}, {7, 4}, {4}}, [](const std::vector<output>& x) {
    return ops::fused_matmul(x[0], x[1], {.bias = x[2], .activation = "gelu"});
  });
  check_gradients("matmul residual only", {{5, 7}, {7, 4}, {5, 4}},
                  [](const std::vector<output>& x) {
                    return ops::fused_matmul(x[0], x[1], {.residual = x[2], .activation = "tanh"});
                  });
}

TEST(NnFusedGradients, MatmulTransposedAndBatched) {
  check_gradients("transposed", {{7, 5}, {4, 7}, {4}, {5, 4}}, [](const std::vector<output>& x) {
    return ops::fused_matmul(x[0], x[1], {.bias = x[2], .residual = x[3], .activation = "sigmoid"},
                             true, true);
  });
  // b broadcast over the batch: its gradient sums over it.
  check_gradients("batched", {{3, 5, 7}, {7, 4}, {4}, {3, 5, 4}}, [](const std::vector<output>& x) {
    return ops::fused_matmul(x[0], x[1],
                             {.bias = x[2], .residual = x[3], .activation = "gelu_tanh"});
  });
}

TEST(NnFusedGradients, Conv2d) {
  const conv_case c{
      .x = {2, 4, 6, 5}, .w = {6, 2, 3, 3}, .strides = {2, 1}, .padding = {1, 1}, .groups = 2};
  for (const auto& act : activations) {
    check_gradients("conv " + act, {c.x, c.w, {6}, c.y()}, [&](const std::vector<output>& x) {
      return ops::fused_conv2d(x[0], x[1], {.bias = x[2], .residual = x[3], .activation = act},
                               c.options());
    });
  }
  check_gradients("conv no epilogue inputs", {c.x, c.w}, [&](const std::vector<output>& x) {
    return ops::fused_conv2d(x[0], x[1], {.activation = "relu"}, c.options());
  });
}

TEST(NnFusedGradients, Clip) {
  for (const auto& [lo, hi] :
       std::vector<std::pair<double, double>>{{-0.6, 0.8}, {-inf, 0.5}, {0.2, inf}, {-inf, inf}}) {
    check_gradients(fmt::format("matmul clip [{}, {}]", lo, hi), {{5, 7}, {7, 4}, {4}, {5, 4}},
                    [lo, hi](const std::vector<output>& x) {
                      return ops::fused_matmul(x[0], x[1],
                                               {.bias = x[2],
                                                .residual = x[3],
                                                .activation = "clip",
                                                .clip_min = lo,
                                                .clip_max = hi});
                    });
  }
  const conv_case c{.x = {2, 4, 6, 5}, .w = {6, 2, 3, 3}, .padding = {1, 1}, .groups = 2};
  check_gradients("conv clip", {c.x, c.w, {6}, c.y()}, [&](const std::vector<output>& x) {
    return ops::fused_conv2d(
        x[0], x[1],
        {.bias = x[2], .residual = x[3], .activation = "clip", .clip_min = -0.5, .clip_max = 0.4},
        c.options());
  });
}

// At the kinks, central differences say nothing: there the gradient is what the unfused
// maximum and minimum nodes' gradients give (the first operand takes dy on a tie), NaN
// and infinities included. Bit for bit, for every input.
TEST(NnFusedGradients, ClipAgainstUnfusedAtTies) {
  const auto m = static_cast<std::int64_t>(clip_specials.size());
  for (const dtype t : float_types) {
    for (const auto& [lo, hi] : clip_bound_cases()) {
      SCOPED_TRACE(fmt::format("{} clip [{}, {}]", to_string(t), lo, hi));
      graph g;
      graph_builder b(g);
      const output pa = ops::placeholder(b, "a", t, {m, 1});
      const output pw = ops::placeholder(b, "w", t, {1, 4});
      const output pb = ops::placeholder(b, "bias", t, {4});
      const output pr = ops::placeholder(b, "r", t, {m, 4});
      const std::vector<output> xs{pa, pw, pb, pr};
      // Zeros for the bias and the residual: the products reach the bounds as they are.
      const std::vector<feed> feeds{{"a", make(t, {m, 1}, clip_specials)},
                                    {"w", make(t, {1, 4}, clip_scales)},
                                    {"bias", make(t, {4}, std::vector<double>(4, 0.0))},
                                    {"r", make(t, {m, 4}, std::vector<double>(m * 4, 0.0))}};
      const output weights = ops::constant(b, random(t, {m, 4}, 5, 0.5, 1.0));
      const output fused = ops::fused_matmul(
          pa, pw,
          {.bias = pb, .residual = pr, .activation = "clip", .clip_min = lo, .clip_max = hi});
      const output unfused = clip_nodes(ops::bias_add(ops::matmul(pa, pw), pb) + pr, lo, hi, false);
      std::vector<std::string> fetches{fused.name(), unfused.name()};
      for (const output& loss :
           {ops::reduce_sum(fused * weights), ops::reduce_sum(unfused * weights)}) {
        for (const output& d : gradients(loss, xs)) fetches.push_back(d.name());
      }
      session s(std::move(g), no_passes());
      const auto out = s.run(feeds, fetches);
      for (std::size_t k = 0; k < 5; ++k) {
        const tensor& f = out[k == 0 ? 0 : 1 + k];
        const tensor& u = out[k == 0 ? 1 : 5 + k];
        SCOPED_TRACE(k == 0 ? std::string("forward") : fmt::format("gradient of input {}", k - 1));
        ASSERT_EQ(f.nbytes(), u.nbytes());
        ASSERT_TRUE(f.is_contiguous() && u.is_contiguous());
        EXPECT_EQ(std::memcmp(f.raw_data(), u.raw_data(), f.nbytes()), 0)
            << "fused " << fmt::format("{}", values(f)) << "\nunfused "
            << fmt::format("{}", values(u));
      }
    }
  }
}

// ---- inference and bad input -------------------------------------------------------------

TEST(NnFusedOps, InferredTypes) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {-1, 784});
  const auto w = ops::placeholder(b, "w", dtype::f32, {784, 10});
  const auto bias = ops::placeholder(b, "bias", dtype::f32, {10});
  const auto y = ops::fused_matmul(x, w, {.bias = bias, .activation = "relu"});
  EXPECT_EQ(to_string(y.type()), "float32[?, 10]");
  EXPECT_EQ(y.producer().attr<std::int64_t>("num_args"), 1);
  const auto img = ops::placeholder(b, "img", dtype::bf16, {-1, 3, 32, 32});
  const auto filt = ops::placeholder(b, "filt", dtype::bf16, {16, 3, 3, 3});
  const auto cb = ops::placeholder(b, "cb", dtype::bf16, {16});
  const auto c = ops::fused_conv2d(img, filt, {.bias = cb}, {.strides = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(to_string(c.type()), "bfloat16[?, 16, 16, 16]");
  const auto r = ops::placeholder(b, "r", dtype::bf16, {-1, 16, 16, 16});
  EXPECT_EQ(to_string(ops::fused_conv2d(img, filt, {.residual = r},
                                        {.strides = {2, 2}, .padding = {1, 1}})
                          .type()),
            "bfloat16[?, 16, 16, 16]");
}

TEST(NnFusedOps, BadInputAtConstruction) {
  const auto f32 = [](shape s, std::uint64_t seed = 1) { return random(dtype::f32, s, seed); };
  const attr_map plain = epilogue_attrs({true, true, "relu"});
  // Bias and residual shapes.
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({6}), f32({3, 5})}, plain);
      },
      {"under_test", "fused_matmul", "bias [6]", "[3, 5]"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({1, 5}), f32({3, 5})}, plain);
      },
      {"under_test", "bias", "rank 1", "[1, 5]"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({5}), f32({5})}, plain);
      },
      {"under_test", "residual [5]", "[3, 5]"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({5}), f32({1, 5})}, plain);
      },
      {"under_test", "residual [1, 5]", "[3, 5]"});
  attr_map conv = plain;
  conv.merge(conv_case{.x = {1, 2, 5, 5}, .w = {3, 2, 3, 3}}.attrs());
  expect_invalid_argument(
      [&] {
        run_op1("fused_conv2d", {f32({1, 2, 5, 5}), f32({3, 2, 3, 3}), f32({2}), f32({1, 3, 3, 3})},
                conv);
      },
      {"under_test", "fused_conv2d", "bias [2]", "3 channels", "[1, 3, 3, 3]"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_conv2d", {f32({1, 2, 5, 5}), f32({3, 2, 3, 3}), f32({3}), f32({1, 3, 5, 5})},
                conv);
      },
      {"under_test", "residual [1, 3, 5, 5]", "[1, 3, 3, 3]"});
  // num_args against has_bias + has_residual.
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({5})}, plain);
      },
      {"under_test", "num_args = 1", "has_bias = true", "has_residual = true", "need 2"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({5})}, {});
      },
      {"under_test", "num_args = 1", "has_bias = false", "need 0"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({5}), f32({3, 5}), f32({3, 5})},
                plain);
      },
      {"under_test", "num_args", "3", "0, 1 or 2"});
  // The activation.
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5})}, {{"activation", std::string("swish")}});
      },
      {"under_test", "activation", "swish", "gelu_tanh", "clip"});
  // Clip bounds belong to activation clip alone (any values there: see the clip tests).
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5})},
                {{"activation", std::string("relu")}, {"clip_min", 0.0}});
      },
      {"under_test", "fused_matmul", "clip_min = 0", "\"relu\"", "only \"clip\""});
  expect_invalid_argument(
      [&] {
        run_op1("fused_conv2d", {f32({1, 2, 5, 5}), f32({3, 2, 3, 3})}, [] {
          attr_map a = conv_case{.x = {}, .w = {}}.attrs();
          a.emplace("clip_max", 6.0);
          return a;
        }());
      },
      {"under_test", "fused_conv2d", "clip_max = 6", "\"none\""});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5})}, {{"clip_min", nan}});
      },
      {"under_test", "clip_min = nan"});
  {
    graph g;
    graph_builder b(g);
    const auto x = ops::placeholder(b, "x", dtype::f32, {3, 4});
    const auto w = ops::placeholder(b, "w", dtype::f32, {4, 5});
    expect_invalid_argument(
        [&] {
          ops::fused_matmul(x, w, {.activation = "tanh", .clip_max = 6.0}, false, false,
                            {.name = "built"});
        },
        {"built", "clip_max = 6", "\"tanh\""});
  }
  // What matmul and conv2d reject, with their messages; dtypes.
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({2, 3}), f32({4, 5})});
      },
      {"under_test", "[2, 3]", "[4, 5]", "inner"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_conv2d", {f32({1, 3, 5, 5}), f32({4, 2, 3, 3})},
                conv_case{.x = {}, .w = {}}.attrs());
      },
      {"under_test", "input channels", "[1, 3, 5, 5]"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {f32({3, 4}), f32({4, 5}), random(dtype::f64, {5}, 3)},
                {{"has_bias", true}});
      },
      {"under_test", "float64", "float32"});
  expect_invalid_argument(
      [&] {
        run_op1("fused_matmul", {random(dtype::i32, {2, 2}, 1), random(dtype::i32, {2, 2}, 2)});
      },
      {"under_test", "int32"});
}

// Shapes inference could not check (declared unknown) fail in the kernel, naming them.
TEST(NnFusedOps, BadInputAtRunTime) {
  const auto f32 = [](shape s, std::uint64_t seed = 1) { return random(dtype::f32, s, seed); };
  const auto expect_node_error = [](const std::function<void()>& f,
                                    const std::vector<std::string>& parts) {
    try {
      f();
      ADD_FAILURE() << "expected loom::node_error";
    } catch (const node_error& e) {
      for (const auto& p : parts) {
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
      }
    }
  };
  const attr_map plain = epilogue_attrs({true, true, "relu"});
  const std::vector<shape> unknown2{{-1, -1}, {-1, -1}, {-1}, {-1, -1}};
  expect_node_error(
      [&] {
        run_op_declared("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({6}), f32({3, 5})}, unknown2,
                        plain);
      },
      {"under_test", "fused_matmul", "bias", "[6]", "[3, 5]"});
  expect_node_error(
      [&] {
        run_op_declared("fused_matmul", {f32({3, 4}), f32({4, 5}), f32({5}), f32({5, 3})}, unknown2,
                        plain);
      },
      {"under_test", "residual", "[5, 3]", "[3, 5]"});
  expect_node_error(
      [&] {
        run_op_declared("fused_matmul", {f32({3, 4}), f32({3, 5}), f32({5}), f32({3, 5})}, unknown2,
                        plain);
      },
      {"under_test", "inner", "[3, 4]", "[3, 5]"});
  attr_map conv = plain;
  conv.merge(conv_case{.x = {}, .w = {}, .padding = {1, 1}}.attrs());
  const std::vector<shape> unknown4{{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1}, {-1, -1, -1, -1}};
  expect_node_error(
      [&] {
        run_op_declared("fused_conv2d",
                        {f32({1, 2, 5, 5}), f32({3, 2, 3, 3}), f32({3}), f32({1, 3, 4, 5})},
                        unknown4, conv);
      },
      {"under_test", "residual", "[1, 3, 4, 5]", "[1, 3, 5, 5]"});
  expect_node_error(
      [&] {
        run_op_declared("fused_conv2d",
                        {f32({1, 2, 5, 5}), f32({3, 2, 3, 3}), f32({4}), f32({1, 3, 5, 5})},
                        unknown4, conv);
      },
      {"under_test", "bias", "[4]", "[1, 3, 5, 5]"});
}

}  // namespace
}  // namespace loom::testing
