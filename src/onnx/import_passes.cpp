// Rewrites of the ONNX graph before it is lowered, for what exporters write in pieces:
//   - BatchNormalization (inference) after a Conv or Gemm with constant weights is folded
//     into those weights and bias (computed in double), as ONNX Runtime and PyTorch's
//     exporter do; the folded weights differ from the unfolded product in rounding only.
//   - GELU written as x * 0.5 * (1 + erf(x / sqrt(2))) becomes one Gelu node (loom's gelu).
// Each applies only where the intermediate values are read by nothing else (no other node,
// not a graph output). import_options::fuse_patterns switches them off.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "import_passes.hpp"
#include "loom/core/error.hpp"
#include "model_file.hpp"

namespace loom::onnx::detail {
namespace {

class graph_index {
 public:
  explicit graph_index(const ::onnx::GraphProto& g) : g_(g) {
    for (const auto& t : g.initializer()) initializers_[t.name()] = &t;
    for (int i = 0; i < g.node_size(); ++i) {
      const auto& n = g.node(i);
      for (const auto& in : n.input()) ++uses_[in];
      for (const auto& out : n.output()) producer_[out] = i;
      if (n.op_type() == "Constant" && n.output_size() == 1) {
        for (const auto& a : n.attribute()) {
          if (a.name() == "value" && a.has_t()) constants_[n.output(0)] = &a.t();
        }
      }
    }
    for (const auto& o : g.output()) ++uses_[o.name()];
  }

  // The node producing `value` (-1: none).
  [[nodiscard]] int producer(const std::string& value) const {
    auto it = producer_.find(value);
    return it == producer_.end() ? -1 : it->second;
  }
  [[nodiscard]] int uses(const std::string& value) const {
    auto it = uses_.find(value);
    return it == uses_.end() ? 0 : it->second;
  }
  [[nodiscard]] const ::onnx::TensorProto* initializer(const std::string& value) const {
    auto it = initializers_.find(value);
    return it == initializers_.end() ? nullptr : it->second;
  }
  // A one-element float constant (initializer or Constant node).
  [[nodiscard]] std::optional<double> scalar(const std::string& value) const {
    const ::onnx::TensorProto* t = initializer(value);
    if (t == nullptr) {
      auto it = constants_.find(value);
      if (it == constants_.end()) return std::nullopt;
      t = it->second;
    }
    if (t->data_type() != ::onnx::TensorProto::FLOAT || t->data_location() == ::onnx::TensorProto::EXTERNAL) {
      return std::nullopt;
    }
    try {
      const tensor v = tensor_of(*t, {});
      if (v.num_elements() != 1) return std::nullopt;
      return static_cast<double>(v.data<float>()[0]);
    } catch (const error&) {
      return std::nullopt;
    }
  }
  [[nodiscard]] const ::onnx::GraphProto& g() const { return g_; }

 private:
  const ::onnx::GraphProto& g_;
  std::unordered_map<std::string, const ::onnx::TensorProto*> initializers_;
  std::unordered_map<std::string, const ::onnx::TensorProto*> constants_;
  std::unordered_map<std::string, int> producer_;
  std::unordered_map<std::string, int> uses_;
};

std::int64_t int_attr(const ::onnx::NodeProto& n, std::string_view name, std::int64_t fallback) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.i();
  }
  return fallback;
}

float float_attr(const ::onnx::NodeProto& n, std::string_view name, float fallback) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.f();
  }
  return fallback;
}

std::vector<double> doubles_of(const tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.num_elements()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = t.data<float>()[i];
  return v;
}

::onnx::TensorProto float_tensor(const std::string& name, const std::vector<std::int64_t>& dims,
                                 const std::vector<double>& v) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(::onnx::TensorProto::FLOAT);
  for (auto d : dims) t.add_dims(d);
  std::string raw(v.size() * sizeof(float), '\0');
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto f = static_cast<float>(v[i]);
    std::memcpy(raw.data() + i * sizeof(float), &f, sizeof(float));
  }
  t.set_raw_data(raw);
  return t;
}

// Folds BatchNormalization nodes into the Conv or Gemm before them. Returns the count.
int fold_batch_norms(::onnx::GraphProto& g, const std::filesystem::path& dir,
                     std::vector<std::string>& log) {
  graph_index ix(g);
  std::unordered_set<int> removed;
  std::vector<::onnx::TensorProto> added;
  std::map<int, std::pair<std::string, std::string>> new_inputs;  // layer -> (W, B) names
  std::map<int, std::string> new_output;
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& bn = g.node(i);
    if (bn.op_type() != "BatchNormalization" || !bn.domain().empty() || bn.input_size() != 5) continue;
    if (int_attr(bn, "training_mode", 0) != 0 || bn.output_size() > 1) continue;
    const int p = ix.producer(bn.input(0));
    if (p < 0 || removed.contains(p) || new_inputs.contains(p) || ix.uses(bn.input(0)) != 1) continue;
    const auto& layer = g.node(p);
    const bool conv = layer.op_type() == "Conv";
    const bool gemm = layer.op_type() == "Gemm";
    if ((!conv && !gemm) || !layer.domain().empty() || layer.input_size() < 2) continue;
    if (gemm && (int_attr(layer, "transA", 0) != 0 || float_attr(layer, "alpha", 1) != 1.0F ||
                 float_attr(layer, "beta", 1) != 1.0F)) {
      continue;
    }
    const auto* w = ix.initializer(layer.input(1));
    const auto* b = layer.input_size() > 2 && !layer.input(2).empty() ? ix.initializer(layer.input(2)) : nullptr;
    if (w == nullptr || (layer.input_size() > 2 && !layer.input(2).empty() && b == nullptr)) continue;
    if (ix.uses(layer.input(1)) != 1 || (b != nullptr && ix.uses(layer.input(2)) != 1)) continue;
    const ::onnx::TensorProto* params[4];
    bool ok = true;
    for (int k = 0; k < 4; ++k) {
      params[k] = ix.initializer(bn.input(k + 1));
      ok = ok && params[k] != nullptr && params[k]->data_type() == ::onnx::TensorProto::FLOAT;
    }
    if (!ok || w->data_type() != ::onnx::TensorProto::FLOAT ||
        (b != nullptr && b->data_type() != ::onnx::TensorProto::FLOAT)) {
      continue;
    }
    const tensor wt = tensor_of(*w, dir);
    const auto scale = doubles_of(tensor_of(*params[0], dir));
    const auto beta = doubles_of(tensor_of(*params[1], dir));
    const auto mean = doubles_of(tensor_of(*params[2], dir));
    const auto var = doubles_of(tensor_of(*params[3], dir));
    const std::size_t channels = scale.size();
    // Output channels: Conv's W is [M, C/g, k...]; Gemm's B is [N, K] (transB) or [K, N].
    const bool trans_b = gemm && int_attr(layer, "transB", 0) != 0;
    const std::size_t out_axis = conv || trans_b ? 0 : 1;
    if (wt.rank() < 2 || static_cast<std::size_t>(wt.dim(out_axis)) != channels ||
        beta.size() != channels || mean.size() != channels || var.size() != channels) {
      continue;
    }
    std::vector<double> bias(channels, 0.0);
    if (b != nullptr) {
      bias = doubles_of(tensor_of(*b, dir));
      if (bias.size() != channels) continue;
    }
    const double eps = float_attr(bn, "epsilon", 1e-5F);
    std::vector<double> a(channels);
    for (std::size_t c = 0; c < channels; ++c) a[c] = scale[c] / std::sqrt(var[c] + eps);
    auto wv = doubles_of(wt);
    const std::size_t inner = wv.size() / static_cast<std::size_t>(wt.dim(0));
    for (std::size_t k = 0; k < wv.size(); ++k) {
      const std::size_t c = out_axis == 0 ? k / inner : k % channels;
      wv[k] *= a[c];
    }
    for (std::size_t c = 0; c < channels; ++c) bias[c] = (bias[c] - mean[c]) * a[c] + beta[c];
    const std::string base = layer.name().empty() ? bn.output(0) : layer.name();
    std::vector<std::int64_t> wdims(wt.shape().begin(), wt.shape().end());
    added.push_back(float_tensor(base + "/folded_weight", wdims, wv));
    added.push_back(float_tensor(base + "/folded_bias", {static_cast<std::int64_t>(channels)}, bias));
    new_inputs[p] = {base + "/folded_weight", base + "/folded_bias"};
    new_output[p] = bn.output(0);
    removed.insert(i);
    log.push_back(fmt::format("folded BatchNormalization '{}' into {} '{}'", bn.name(), layer.op_type(),
                              layer.name()));
  }
  if (removed.empty()) return 0;
  ::onnx::GraphProto out = g;
  out.clear_node();
  for (int i = 0; i < g.node_size(); ++i) {
    if (removed.contains(i)) continue;
    ::onnx::NodeProto n = g.node(i);
    if (auto it = new_inputs.find(i); it != new_inputs.end()) {
      n.set_input(1, it->second.first);
      if (n.input_size() > 2) n.set_input(2, it->second.second);
      else n.add_input(it->second.second);
      n.set_output(0, new_output.at(i));
    }
    *out.add_node() = std::move(n);
  }
  for (auto& t : added) *out.add_initializer() = std::move(t);
  g = std::move(out);
  return static_cast<int>(removed.size());
}

// x * 0.5 * (1 + erf(x / sqrt(2))), in the exporters' order: Div(x, √2) -> Erf -> Add 1
// -> Mul x -> Mul 0.5 (operands of Add and Mul in either order).
int fuse_gelu(::onnx::GraphProto& g, std::vector<std::string>& log) {
  graph_index ix(g);
  std::unordered_set<int> removed;
  std::map<int, ::onnx::NodeProto> replaced;
  auto near = [](std::optional<double> v, double want) { return v && std::fabs(*v - want) <= 1e-6 * want; };
  // The operand of binary node n that is not `other`, when the other one is a scalar
  // constant near `value`.
  auto other_operand = [&](const ::onnx::NodeProto& n, double value) -> std::optional<std::string> {
    if (n.input_size() != 2) return std::nullopt;
    if (near(ix.scalar(n.input(1)), value)) return n.input(0);
    if (near(ix.scalar(n.input(0)), value)) return n.input(1);
    return std::nullopt;
  };
  auto single = [&](const std::string& v) { return ix.uses(v) == 1; };
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& div = g.node(i);
    if (div.op_type() != "Div" || !div.domain().empty() || div.input_size() != 2) continue;
    if (!near(ix.scalar(div.input(1)), std::sqrt(2.0)) || !single(div.output(0))) continue;
    const std::string x = div.input(0);
    // Follow the single reader of each value.
    auto reader = [&](const std::string& v, std::string_view op) -> int {
      for (int k = i + 1; k < g.node_size(); ++k) {
        const auto& n = g.node(k);
        if (n.op_type() != op || !n.domain().empty()) continue;
        for (const auto& in : n.input()) {
          if (in == v) return k;
        }
      }
      return -1;
    };
    const int erf = reader(div.output(0), "Erf");
    if (erf < 0 || !single(g.node(erf).output(0))) continue;
    const int add = reader(g.node(erf).output(0), "Add");
    if (add < 0 || other_operand(g.node(add), 1.0) != g.node(erf).output(0) || !single(g.node(add).output(0))) {
      continue;
    }
    const int mul = reader(g.node(add).output(0), "Mul");
    if (mul < 0) continue;
    const auto& m = g.node(mul);
    const std::string other = m.input(0) == g.node(add).output(0) ? m.input(1) : m.input(0);
    if (other != x || !single(m.output(0))) continue;
    const int half = reader(m.output(0), "Mul");
    if (half < 0 || other_operand(g.node(half), 0.5) != m.output(0)) continue;
    ::onnx::NodeProto gelu;
    gelu.set_op_type("Gelu");
    gelu.set_name(g.node(half).name());
    gelu.add_input(x);
    gelu.add_output(g.node(half).output(0));
    for (int k : {i, erf, add, mul}) removed.insert(k);
    replaced[half] = gelu;
    log.push_back(fmt::format("recognised GELU ending in '{}'", g.node(half).name()));
  }
  if (replaced.empty()) return 0;
  ::onnx::GraphProto out = g;
  out.clear_node();
  for (int i = 0; i < g.node_size(); ++i) {
    if (removed.contains(i)) continue;
    auto it = replaced.find(i);
    *out.add_node() = it == replaced.end() ? g.node(i) : it->second;
  }
  g = std::move(out);
  return static_cast<int>(replaced.size());
}

}  // namespace

std::vector<std::string> rewrite_patterns(::onnx::GraphProto& g, const std::filesystem::path& dir) {
  std::vector<std::string> log;
  fold_batch_norms(g, dir, log);
  fuse_gelu(g, log);
  return log;
}

}  // namespace loom::onnx::detail
