// Batch normalisation in training, and synchronized across the ranks of a communicator: the
// ops batch_norm_train and batch_norm_train_grad (one node each way), and the pieces that
// sync_batch_norm is made of (batch_norm_stats, all_gather, sync_batch_norm;
// batch_norm_grad_reduce, all_reduce, batch_norm_grad_elemt): definitions, inference
// (rules in loom/graph/ops/normalization_rules.hpp) and builders (loom/graph/ops/normalization.hpp).
//
// Note [batch norm dtypes]
// x, y, dy and dx are T (any float type); the per-channel parameters scale and bias, the
// running statistics and the gradients dscale and dbias are U, which is T, or float32 for
// 16-bit T (float32 master weights, as PyTorch allows); the batch statistics (mean, invstd)
// and the packed statistics sync_batch_norm exchanges are S, the statistics type: float64 for
// float64 x, else float32, so 16-bit inputs keep their statistics in float32.
#include <fmt/format.h>

#include <array>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/collective.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;
namespace rules = normalization_rules;

// The statistics type S of x's dtype T (Note [batch norm dtypes]).
dtype stats_type(dtype t) { return t == dtype::f64 ? dtype::f64 : dtype::f32; }

bool is_16bit(dtype t) { return t == dtype::f16 || t == dtype::bf16; }

// U must be T, or float32 for 16-bit T; S, where the op reads statistics, must be S(T).
void check_types(inference_context& c, bool reads_stats) {
  const dtype t = c.attr<dtype>("T");
  const dtype u = c.attr<dtype>("U");
  if (u != t && !(is_16bit(t) && u == dtype::f32)) {
    c.fail(fmt::format("the per-channel parameters are {} and x is {}: they must be x's dtype, "
                       "or float32 for a 16-bit x",
                       to_string(u), to_string(t)));
  }
  if (reads_stats && c.attr<dtype>("S") != stats_type(t)) {
    c.fail(fmt::format("the batch statistics are {}; for x of {} they are {}",
                       to_string(c.attr<dtype>("S")), to_string(t), to_string(stats_type(t))));
  }
}

// x's geometry (input `xi`) with the per-channel vectors at `params` (input indices, -1 for
// none), named `names`; nullopt while x's rank is unknown.
std::optional<rules::batch_norm_geometry> geometry(inference_context& c, std::size_t xi,
                                                   const std::array<int, 4>& params,
                                                   const std::array<const char*, 4>& names) {
  const auto& x = c.input(xi).shape;
  if (!x) return std::nullopt;
  std::array<const shape*, 4> p{};
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (params[i] < 0) continue;
    const auto& s = c.input(static_cast<std::size_t>(params[i])).shape;
    p[i] = s ? &*s : nullptr;
  }
  return rules::batch_norm_geometry_of(
      *x, p, rules::batch_norm_channel_axis(c.attr<std::string>("data_format"), x->rank()),
      names);
}

std::int64_t channels_of(const std::optional<rules::batch_norm_geometry>& g) {
  return g ? g->channels : -1;
}

// Sets output i to S[C] (C unknown while x's rank is).
void set_per_channel(inference_context& c, std::size_t i, dtype t,
                     const std::optional<rules::batch_norm_geometry>& g) {
  c.set_output(i, t, shape{channels_of(g)});
}

constexpr std::array<const char*, 4> train_params = {"scale", "bias", "running_mean",
                                                     "running_var"};
constexpr std::array<const char*, 4> grad_params = {"scale", "mean", "invstd", ""};

// batch_norm_train and sync_batch_norm: y, mean, invstd.
void infer_train(inference_context& c, bool sync) {
  check_types(c, sync);
  const auto g = geometry(c, 0, {1, 2, 3, 4}, train_params);
  if (sync && g && c.input(5).shape) {
    rules::check_batch_norm_packed(*c.input(5).shape, g->channels, true, "the gathered statistics");
  }
  c.set_output(0, c.input(0));
  const dtype s = stats_type(c.attr<dtype>("T"));
  set_per_channel(c, 1, s, g);
  set_per_channel(c, 2, s, g);
}

// batch_norm_train_grad, batch_norm_grad_reduce and batch_norm_grad_elemt read
// (dy, x, scale, mean, invstd, ...): checks dy against x and the vectors against x's channels.
std::optional<rules::batch_norm_geometry> infer_grad_inputs(inference_context& c) {
  check_types(c, true);
  if (c.input(0).shape && c.input(1).shape) {
    rules::check_batch_norm_dy(*c.input(0).shape, *c.input(1).shape);
  }
  return geometry(c, 1, {2, 3, 4, -1}, grad_params);
}

attr_def momentum_attr() {
  attr_def a = attr("momentum", attr_type::real, attr_value(0.1));
  a.validate = [](const attr_value& v) {
    const double m = v.as<double>();
    if (!(m >= 0.0 && m <= 1.0)) throw invalid_argument("momentum must be in [0, 1]");
  };
  return a;
}

std::vector<attr_def> train_attrs(bool stats) {
  std::vector<attr_def> a = {type_attr("T", float_types()), type_attr("U", float_types()),
                             nonnegative_real_attr("epsilon", 1e-5), momentum_attr(),
                             data_format_attr("NCHW")};
  if (stats) a.push_back(type_attr("S", {dtype::f32, dtype::f64}));
  return a;
}

std::vector<attr_def> grad_attrs() {
  return {type_attr("T", float_types()), type_attr("U", float_types()),
          type_attr("S", {dtype::f32, dtype::f64}), data_format_attr("NCHW")};
}

// batch_norm_train, and sync_batch_norm (`sync`: a sixth input, the gathered statistics,
// and the group its gradient's all_reduce uses, which the kernel does not read).
op_def train_op_def(std::string name, std::string summary, bool sync) {
  op_def d;
  d.name = std::move(name);
  d.summary = std::move(summary);
  d.inputs = {typed("x"), typed("scale", "U"), typed("bias", "U"), typed("running_mean", "U"),
              typed("running_var", "U")};
  d.outputs = {typed("y"), typed("mean", "U"), typed("invstd", "U")};
  d.attrs = train_attrs(sync);
  if (sync) {
    d.inputs.push_back(typed("gathered", "S"));
    d.attrs.push_back(attr("group", attr_type::string, attr_value(std::string("world"))));
  }
  d.infer = [sync](inference_context& c) { infer_train(c, sync); };
  d.is_stateful = true;  // it updates the running statistics
  d.colocate_with_input = 3;
  return d;
}

}  // namespace

void register_batch_norm_train_ops(op_registry& r) {
  r.add(train_op_def(
      "batch_norm_train",
      "training batch normalisation: the batch's statistics per channel, and the running "
      "statistics (inputs 3 and 4, variables) updated in place",
      false));
  {
    op_def d;
    d.name = "batch_norm_train_grad";
    d.summary = "batch_norm_train's gradient: dx, dscale, dbias from dy, x, scale, mean, invstd";
    d.inputs = {typed("dy"), typed("x"), typed("scale", "U"), typed("mean", "S"),
                typed("invstd", "S")};
    d.outputs = {typed("dx"), typed("dscale", "U"), typed("dbias", "U")};
    d.attrs = grad_attrs();
    d.infer = [](inference_context& c) {
      const auto g = infer_grad_inputs(c);
      c.set_output(0, c.input(1));
      set_per_channel(c, 1, c.attr<dtype>("U"), g);
      set_per_channel(c, 2, c.attr<dtype>("U"), g);
    };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "batch_norm_stats";
    d.summary = "this rank's packed batch statistics [1, 2C + 1]: (count, mean, m2)";
    d.inputs = {typed("x")};
    d.outputs = {typed("stats")};
    d.attrs = {type_attr("T", float_types()), data_format_attr("NCHW")};
    d.infer = [](inference_context& c) {
      const auto g = geometry(c, 0, {-1, -1, -1, -1}, train_params);
      c.set_output(0, stats_type(c.attr<dtype>("T")),
                   shape{1, rules::batch_norm_packed_width(channels_of(g))});
    };
    r.add(std::move(d));
  }
  r.add(train_op_def(
      "sync_batch_norm",
      "batch normalisation with the statistics of every rank's batch (input 5: the ranks' "
      "batch_norm_stats, all-gathered); the running statistics updated in place",
      true));
  {
    op_def d;
    d.name = "batch_norm_grad_reduce";
    d.summary =
        "this rank's packed gradient sums [2C + 1] (sum dy, sum dy (x - mean), count), and "
        "its dscale and dbias";
    d.inputs = {typed("dy"), typed("x"), typed("scale", "U"), typed("mean", "S"),
                typed("invstd", "S")};
    d.outputs = {typed("sums", "S"), typed("dscale", "U"), typed("dbias", "U")};
    d.attrs = grad_attrs();
    d.infer = [](inference_context& c) {
      const auto g = infer_grad_inputs(c);
      c.set_output(0, c.attr<dtype>("S"), shape{rules::batch_norm_packed_width(channels_of(g))});
      set_per_channel(c, 1, c.attr<dtype>("U"), g);
      set_per_channel(c, 2, c.attr<dtype>("U"), g);
    };
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "batch_norm_grad_elemt";
    d.summary = "dx of a batch normalisation from the packed gradient sums of every rank";
    d.inputs = {typed("dy"),        typed("x"),          typed("scale", "U"),
                typed("mean", "S"), typed("invstd", "S"), typed("sums", "S")};
    d.outputs = {typed("dx")};
    d.attrs = grad_attrs();
    d.infer = [](inference_context& c) {
      const auto g = infer_grad_inputs(c);
      if (g && c.input(5).shape) {
        rules::check_batch_norm_packed(*c.input(5).shape, g->channels, false, "sums");
      }
      c.set_output(0, c.input(1));
    };
    r.add(std::move(d));
  }
}

namespace ops {
namespace {

attr_map train_attr_map(const batch_norm_options& b) {
  return {{"epsilon", b.epsilon}, {"momentum", b.momentum}, {"data_format", b.data_format}};
}

}  // namespace

batch_norm_train_outputs batch_norm_train(output x, output scale, output bias,
                                          output running_mean, output running_var,
                                          const batch_norm_options& b, const node_options& o) {
  auto outs = x.builder().add("batch_norm_train", {x, scale, bias, running_mean, running_var},
                              train_attr_map(b), o);
  return {outs.at(0), outs.at(1), outs.at(2)};
}

batch_norm_train_outputs sync_batch_norm(output x, output scale, output bias,
                                         output running_mean, output running_var,
                                         const std::string& group, const batch_norm_options& b,
                                         const node_options& o) {
  graph_builder& gb = x.builder();
  const std::string base = o.name.empty() ? gb.g().unique_name("sync_batch_norm") : o.name;
  const output local = gb.add1("batch_norm_stats", {x}, {{"data_format", b.data_format}},
                               {.name = base + "/stats", .device = o.device});
  const output gathered =
      all_gather(local, 0, group, {.name = base + "/gather", .device = o.device});
  attr_map a = train_attr_map(b);
  a.emplace("group", group);
  node_options named = o;
  named.name = base;
  auto outs = gb.add("sync_batch_norm", {x, scale, bias, running_mean, running_var, gathered},
                     std::move(a), named);
  return {outs.at(0), outs.at(1), outs.at(2)};
}

}  // namespace ops
}  // namespace loom
