// fold_batch_norms (loom/passes/batch_norm_folding.hpp). Like convert_sync_batch_norm, it
// rebuilds the graph node by node (Note [sync batch norm conversion]): once over the graph to
// find the batch norms that fold, once to re-add every node, the folded layers in their batch
// norm's place.
#include "loom/passes/batch_norm_folding.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "loom/memory/tensor_allocation.hpp"

namespace loom::passes {
namespace {

// The constant `e` holds, when its node is a const; else an undefined tensor.
tensor constant_of(const graph& g, endpoint e) {
  const node& n = g.at(e.node);
  return n.op() == "const" ? n.attr<tensor>("value") : tensor();
}

std::vector<double> doubles(const tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.num_elements()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = t.type() == dtype::f64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
  }
  return v;
}

tensor tensor_of(dtype t, const shape& s, const std::vector<double>& v) {
  if (t == dtype::f64) return memory::host_tensor<double>(s, v);
  return memory::host_tensor<float>(s, std::vector<float>(v.begin(), v.end()));
}

// Readers of each node's outputs and control edges (data and control).
std::vector<int> readers_of(const graph& g) {
  std::vector<int> n(g.num_nodes(), 0);
  for (const node& x : g.nodes()) {
    for (endpoint e : x.inputs) ++n[static_cast<std::size_t>(e.node)];
    for (node_id c : x.control_inputs) ++n[static_cast<std::size_t>(c)];
  }
  return n;
}

// Why batch_norm `bn` does not fold into its input's layer; nullopt when it does.
std::optional<std::string> refusal(const graph& g, const node& bn, const std::vector<int>& readers) {
  const endpoint y = bn.inputs[0];
  const node& l = g.at(y.node);
  const dtype t = g.type_of(y).type;
  if (t != dtype::f32 && t != dtype::f64) {
    return fmt::format("'{}' is {}: only float32 and float64 fold", l.name, to_string(t));
  }
  if (readers[static_cast<std::size_t>(l.id)] != 1) {
    return fmt::format("'{}' is also read elsewhere", l.name);
  }
  if (l.requested_device != bn.requested_device) {
    return fmt::format("'{}' asks for device '{}' and '{}' for '{}'", bn.name,
                       bn.requested_device, l.name, l.requested_device);
  }
  if (!bn.control_inputs.empty() || !l.control_inputs.empty()) {
    return std::string("a control input waits on the layer or the batch norm");
  }
  if (l.op() == "conv2d" &&
      l.attr<std::string>("data_format") != bn.attr<std::string>("data_format")) {
    return fmt::format("'{}' is {} and '{}' {}", l.name, l.attr<std::string>("data_format"),
                       bn.name, bn.attr<std::string>("data_format"));
  }
  if (l.op() == "matmul") {
    const auto& ys = g.type_of(y).shape;
    const auto& ws = g.type_of(l.inputs[1]).shape;
    if (!ys || ys->rank() != 2 || !ws || ws->rank() != 2 || l.attr<bool>("transpose_a")) {
      return fmt::format("'{}' is not a product [M, K] x [K, N]", l.name);
    }
  }
  const tensor w = constant_of(g, l.inputs[1]);
  if (!w.defined() || !w.is_contiguous() || w.type() != t) {
    return fmt::format("the weights of '{}' are not a dense {} constant", l.name, to_string(t));
  }
  static constexpr const char* names[] = {"scale", "bias", "mean", "var"};
  for (std::size_t i = 1; i <= 4; ++i) {
    const tensor v = constant_of(g, bn.inputs[i]);
    if (!v.defined()) {
      return fmt::format("the {} of '{}' is not a constant (running statistics in variables "
                         "change as a model trains: freeze them first)",
                         names[i - 1], bn.name);
    }
    if (v.type() != t || !v.is_contiguous()) {
      return fmt::format("the {} of '{}' is not a dense {} constant", names[i - 1], bn.name,
                         to_string(t));
    }
    for (const double e : doubles(v)) {
      if (!std::isfinite(e)) return fmt::format("the {} of '{}' holds {}", names[i - 1], bn.name, e);
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<pass_record> fold_batch_norms(graph& g) {
  std::vector<pass_record> log;
  const std::vector<int> readers = readers_of(g);
  std::map<node_id, node_id> folds;  // layer -> its batch_norm
  for (const node& n : g.nodes()) {
    if (n.op() != "batch_norm") continue;
    const node& l = g.at(n.inputs[0].node);
    if (l.op() != "conv2d" && l.op() != "matmul") continue;
    if (auto why = refusal(g, n, readers)) {
      log.push_back({"batch_norm_folding", pass_record::kind::refused, {n.name, l.name}, {}, *why});
      continue;
    }
    folds.emplace(l.id, n.id);
  }
  if (folds.empty()) return log;
  std::map<node_id, node_id> folded_of;  // batch_norm -> its layer
  for (const auto& [l, b] : folds) folded_of.emplace(b, l);
  graph rebuilt(g.ops());
  std::vector<node_id> new_id(g.num_nodes(), -1);
  const auto map = [&](endpoint e) {
    return endpoint{new_id[static_cast<std::size_t>(e.node)], e.index};
  };
  for (const node& n : g.nodes()) {
    if (folds.contains(n.id)) continue;  // re-added, folded, in its batch_norm's place
    node_spec spec{.name = n.name, .op = n.op(), .inputs = {}, .attrs = n.attrs,
                   .device = n.requested_device, .control_inputs = {}};
    for (endpoint e : n.inputs) spec.inputs.push_back(map(e));
    for (node_id c : n.control_inputs) spec.control_inputs.push_back(new_id[static_cast<std::size_t>(c)]);
    const auto f = folded_of.find(n.id);
    if (f == folded_of.end()) {
      new_id[static_cast<std::size_t>(n.id)] = rebuilt.add_node(std::move(spec)).id;
      continue;
    }
    const node& l = g.at(f->second);
    const tensor wt = constant_of(g, l.inputs[1]);
    const auto stat = [&](std::size_t i) { return doubles(constant_of(g, n.inputs[i])); };
    const std::vector<double> scale = stat(1), bias = stat(2), mean = stat(3), var = stat(4);
    const double eps = n.attr<double>("epsilon");
    std::vector<double> a(scale.size()), shift(scale.size());
    for (std::size_t c = 0; c < a.size(); ++c) {
      a[c] = scale[c] / std::sqrt(var[c] + eps);
      shift[c] = bias[c] - mean[c] * a[c];
    }
    // The output channel of each weight: conv2d's OIHW dim 0, matmul's last dim of w (its
    // first with transpose_b).
    const bool conv = l.op() == "conv2d";
    const bool by_rows = conv || l.attr<bool>("transpose_b");
    std::vector<double> w = doubles(wt);
    const auto channels = static_cast<std::int64_t>(a.size());
    const std::int64_t per = static_cast<std::int64_t>(w.size()) / channels;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const auto k = static_cast<std::int64_t>(i);
      w[i] *= a[static_cast<std::size_t>(by_rows ? k / per : k % channels)];
    }
    const auto constant = [&](const std::string& name, const tensor& v) {
      return rebuilt.add_node({.name = rebuilt.unique_name(name), .op = "const", .inputs = {},
                               .attrs = {{"value", v}}, .device = n.requested_device,
                               .control_inputs = {}})
          .id;
    };
    const node_id nw = constant(l.name + "/folded_w", tensor_of(wt.type(), wt.shape(), w));
    const node_id nb = constant(n.name + "/folded_b", tensor_of(wt.type(), shape{channels}, shift));
    const node& layer = rebuilt.add_node({.name = rebuilt.unique_name(l.name + "/folded"),
                                          .op = l.op(),
                                          .inputs = {map(l.inputs[0]), {nw, 0}},
                                          .attrs = l.attrs,
                                          .device = l.requested_device,
                                          .control_inputs = {}});
    const node_id layer_id = layer.id;
    const std::string layer_name = layer.name;
    spec.op = "bias_add";
    spec.inputs = {{layer_id, 0}, {nb, 0}};
    spec.attrs = {{"data_format", conv ? n.attr<std::string>("data_format") : std::string("NHWC")}};
    new_id[static_cast<std::size_t>(n.id)] = rebuilt.add_node(std::move(spec)).id;
    log.push_back({"batch_norm_folding", pass_record::kind::rewrite, {n.name, l.name},
                   fmt::format("{} '{}' with weights scaled per channel, bias_add '{}'", l.op(),
                               layer_name, n.name),
                   {}});
  }
  g = std::move(rebuilt);
  return log;
}

}  // namespace loom::passes
