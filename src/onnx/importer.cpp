// The ONNX import: graph inputs, initializers, nodes (each through its op's lowering, or
// evaluated at import when every input is known) and graph outputs.
#include "importer.hpp"

#include <fmt/format.h>
#include <onnx/defs/schema.h>

#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "loom/core/error.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#include "import_passes.hpp"
#include "model_file.hpp"

namespace loom::onnx::detail {

// ---- known_ints -------------------------------------------------------------------------

bool known_ints::all_known() const {
  for (const auto& v : values) {
    if (!v) return false;
  }
  return true;
}

std::vector<std::int64_t> known_ints::get() const {
  std::vector<std::int64_t> out;
  out.reserve(values.size());
  for (const auto& v : values) out.push_back(v.value());
  return out;
}

namespace {

// A host tensor's elements as int64 (integer dtypes of rank <= 1 only).
std::optional<known_ints> ints_of(const tensor& t) {
  if (!is_integer(t.type()) || t.rank() > 1) return std::nullopt;
  known_ints k;
  k.scalar = t.rank() == 0;
  for (std::int64_t i = 0; i < t.num_elements(); ++i) k.values.emplace_back(int_at(t, i));
  return k;
}

// A dense host copy of `t` from cpu:0's resource (outlives the session that made `t`).
tensor host_copy(const tensor& t) {
  tensor out = memory::host_tensor(t.type(), t.shape());
  if (out.nbytes() > 0) copy_to_dense(t, out.raw_data());
  return out;
}

// A loom node name for an ONNX name: ':' (loom's output separator), white space and control
// characters become '_', a leading '^' too; empty names become `fallback`.
std::string sanitize(std::string_view name, std::string_view fallback) {
  std::string s(name.empty() ? fallback : name);
  for (char& ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == ':' || u <= 0x20 || u == 0x7f) ch = '_';
  }
  if (!s.empty() && s[0] == '^') s[0] = '_';
  return s;
}

}  // namespace

// ---- the importer ---------------------------------------------------------------------

class importer {
 public:
  importer(const import_options& options, std::filesystem::path dir, std::string origin)
      : options_(options), dir_(std::move(dir)), origin_(std::move(origin)) {}

  imported_model run(::onnx::ModelProto& m);

  // A fresh loom node name from `base` (sanitized; "_2", "_3" ... appended when taken).
  std::string unique_name(std::string_view base, std::string_view fallback) {
    std::string s = sanitize(base, fallback);
    if (used_.insert(s).second) return s;
    for (int k = 2;; ++k) {
      std::string t = fmt::format("{}_{}", s, k);
      if (used_.insert(t).second) return t;
    }
  }
  // Reserves an auxiliary name ("<node>/<suffix>").
  std::string aux_name(const std::string& node, std::string_view suffix) {
    return unique_name(fmt::format("{}/{}", node, suffix), "aux");
  }

 private:
  void add_inputs(const ::onnx::GraphProto& g, imported_model& out);
  void add_initializers(const ::onnx::GraphProto& g, imported_model& out);
  void check_supported(const ::onnx::ModelProto& m);
  void lower(const ::onnx::NodeProto& n, std::size_t index, std::int64_t opset);
  // The node's outputs computed now (its inputs all known), as constants; nothing when an
  // output would be larger than max_evaluated_bytes (it is then computed at run time).
  std::optional<std::vector<value>> evaluate(const ::onnx::NodeProto& n, const std::string& name,
                                             std::int64_t opset, const std::vector<const value*>& inputs);
  void add_outputs(const ::onnx::GraphProto& g, imported_model& out);

  const import_options& options_;
  std::filesystem::path dir_;
  std::string origin_;
  graph g_;
  graph_builder b_{g_};
  std::unordered_map<std::string, value> values_;
  std::unordered_set<std::string> used_;
};

namespace {

// Outputs up to this size are evaluated at import (as the session's constant folding keeps
// results up to 1 MiB by default, a little more here: shape computations and masks).
constexpr std::size_t max_evaluated_bytes = std::size_t{16} << 20;

// Ops whose results differ between runs: never evaluated at import.
bool is_random(std::string_view op) {
  return op.starts_with("Random") || op == "Multinomial" || op == "Bernoulli";
}

std::string dims_to_string(const ::onnx::TensorShapeProto& s) {
  std::vector<std::string> d;
  for (const auto& dim : s.dim()) {
    d.push_back(dim.has_dim_value() ? std::to_string(dim.dim_value())
                                    : (dim.has_dim_param() ? dim.dim_param() : "?"));
  }
  return fmt::format("[{}]", fmt::join(d, ", "));
}

}  // namespace

void importer::add_inputs(const ::onnx::GraphProto& g, imported_model& out) {
  std::unordered_set<std::string> initializers;
  for (const auto& t : g.initializer()) initializers.insert(t.name());
  for (const auto& in : g.input()) {
    if (initializers.contains(in.name())) continue;  // an initializer listed as an input
    const std::string what = fmt::format("graph input '{}'", in.name());
    if (!in.type().has_tensor_type()) {
      throw unsupported_error(fmt::format("{}: only tensor inputs are imported", what));
    }
    const auto& tt = in.type().tensor_type();
    model_value v;
    v.onnx_name = in.name();
    v.type = dtype_of(tt.elem_type(), what);
    const auto fixed = options_.input_shapes.find(in.name());
    if (fixed != options_.input_shapes.end()) {
      if (tt.has_shape() && static_cast<std::size_t>(tt.shape().dim_size()) != fixed->second.rank()) {
        throw invalid_argument(fmt::format("{} has shape {}; the shape given for it, {}, has "
                                           "another rank",
                                           what, dims_to_string(tt.shape()),
                                           to_string(fixed->second)));
      }
      v.dims = fixed->second;
      for (std::size_t i = 0; i < v.dims.rank(); ++i) {
        const auto d = v.dims[i];
        if (d < -1) throw invalid_argument(fmt::format("{}: dimension {} given as {}", what, i, d));
        if (tt.has_shape() && tt.shape().dim(static_cast<int>(i)).has_dim_value() && d >= 0 &&
            tt.shape().dim(static_cast<int>(i)).dim_value() != d) {
          throw invalid_argument(fmt::format("{} has shape {}; the shape given for it, {}, "
                                             "differs in dimension {}",
                                             what, dims_to_string(tt.shape()), to_string(v.dims), i));
        }
      }
    } else if (tt.has_shape()) {
      for (const auto& dim : tt.shape().dim()) v.dims.push_back(dim.has_dim_value() ? dim.dim_value() : -1);
    } else {
      throw unsupported_error(fmt::format(
          "{} has no shape (not even a rank); give one in import_options::input_shapes", what));
    }
    if (tt.has_shape()) {
      for (const auto& dim : tt.shape().dim()) v.dim_names.push_back(dim.has_dim_param() ? dim.dim_param() : "");
    } else {
      v.dim_names.assign(v.dims.rank(), "");
    }
    v.node = unique_name(in.name(), "input");
    v.tensor = v.node;
    auto& value = values_[in.name()];
    if (auto given = options_.input_values.find(in.name()); given != options_.input_values.end()) {
      // A value given for the input: a constant, known to everything after it.
      const tensor& t = given->second;
      bool fits = t.type() == v.type && t.rank() == v.dims.rank();
      for (std::size_t i = 0; fits && i < v.dims.rank(); ++i) fits = v.dims[i] < 0 || v.dims[i] == t.dim(i);
      if (!fits) {
        throw invalid_argument(fmt::format("{} is {}{}; the value given for it is {}", what, to_string(v.type),
                                           to_string(v.dims), t.describe()));
      }
      value.constant = host_copy(t);
      value.elements = ints_of(*value.constant);
      value.out = ops::constant(b_, *value.constant, {.name = v.node, .device = {}});
      continue;  // not an input of the imported graph
    }
    value.out = ops::placeholder(b_, v.node, v.type, v.dims);
    value.graph_input = true;
    out.inputs.push_back(std::move(v));
  }
}

void importer::add_initializers(const ::onnx::GraphProto& g, imported_model& out) {
  for (const auto& t : g.initializer()) {
    tensor value = tensor_of(t, dir_);
    const std::string name = unique_name(t.name(), "initializer");
    auto& v = values_[t.name()];
    const bool as_variable =
        options_.initializers_as_variables && (value.type() == dtype::f32 || value.type() == dtype::f64 ||
                                               value.type() == dtype::f16 || value.type() == dtype::bf16);
    if (as_variable) {
      v.out = ops::variable(b_, name, value);
      out.variables.push_back(name);
    } else {
      v.out = ops::constant(b_, value, {.name = name, .device = {}});
      v.elements = ints_of(value);
      v.constant = std::move(value);
    }
  }
}

void importer::check_supported(const ::onnx::ModelProto& m) {
  std::map<std::string, std::int64_t> opsets;
  for (const auto& o : m.opset_import()) opsets[o.domain()] = o.version();
  // (domain, op, opset) -> the nodes that use it.
  std::map<std::tuple<std::string, std::string, std::int64_t>, std::vector<std::string>> missing;
  int index = 0;
  for (const auto& n : m.graph().node()) {
    const bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    const std::string domain = default_domain ? "ai.onnx" : n.domain();
    if (!default_domain || find_lowering(n.op_type()) == nullptr) {
      auto it = opsets.find(n.domain());
      const std::int64_t opset = it == opsets.end() ? 0 : it->second;
      missing[{domain, n.op_type(), opset}].push_back(
          n.name().empty() ? fmt::format("#{}", index) : n.name());
    }
    ++index;
  }
  if (missing.empty()) return;
  std::ostringstream msg;
  msg << "'" << origin_ << "' uses ops loom does not import:";
  for (const auto& [key, nodes] : missing) {
    const auto& [domain, op, opset] = key;
    msg << fmt::format("\n  {} {} (opset {}): {} node{} ", domain, op, opset, nodes.size(),
                       nodes.size() == 1 ? "" : "s");
    const std::size_t shown = std::min<std::size_t>(nodes.size(), 5);
    std::vector<std::string> names(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(shown));
    msg << fmt::format("'{}'", fmt::join(names, "', '"));
    if (shown < nodes.size()) msg << fmt::format(" and {} more", nodes.size() - shown);
  }
  throw unsupported_error(msg.str());
}

std::optional<std::vector<value>> importer::evaluate(const ::onnx::NodeProto& n, const std::string& name,
                                                     std::int64_t opset,
                                                     const std::vector<const value*>& inputs) {
  graph sg;
  graph_builder sb(sg);
  std::vector<value> scratch(inputs.size());
  std::vector<const value*> pointers(inputs.size(), nullptr);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) continue;
    scratch[i] = *inputs[i];
    scratch[i].out = ops::constant(sb, *inputs[i]->constant, {.name = fmt::format("in{}", i), .device = {}});
    pointers[i] = &scratch[i];
  }
  node_context sc(*this, sb, n, name, opset, std::move(pointers));
  find_lowering(n.op_type())->lower(sc);
  std::vector<std::string> fetches;
  for (std::size_t i = 0; i < sc.num_outputs(); ++i) {
    if (!sc.wants(i) || sc.results()[i].constant) continue;
    // A small model may expand to a huge constant (ConstantOfShape, Expand, Range): such
    // outputs are left to run time, where they are made and freed per run.
    const auto& t = sc.results()[i].out.type();
    if (!t.shape || !t.shape->is_fully_defined() ||
        static_cast<std::size_t>(t.shape->num_elements()) * size_of(t.type) > max_evaluated_bytes) {
      return std::nullopt;
    }
    fetches.push_back(sc.results()[i].out.name());
  }
  // Copied out of the session's pool before the session (and its pool) goes.
  std::vector<tensor> results;
  if (!fetches.empty()) {
    session_options so;
    so.devices.cpu_threads = 1;
    so.devices.cuda_device_count = 0;
    so.passes.enabled = false;
    session s(std::move(sg), so);
    for (const tensor& t : s.run({}, fetches)) results.push_back(host_copy(s.host_value(t)));
  }
  std::vector<value> out(sc.num_outputs());
  std::size_t k = 0;
  for (std::size_t i = 0; i < sc.num_outputs(); ++i) {
    if (!sc.wants(i)) continue;
    tensor t = sc.results()[i].constant ? *sc.results()[i].constant : results.at(k++);
    const std::string node_name = i == 0 ? name : aux_name(name, std::to_string(i));
    out[i].out = ops::constant(b_, t, {.name = node_name, .device = {}});
    out[i].elements = ints_of(t);
    out[i].constant = std::move(t);
  }
  return out;
}

void importer::lower(const ::onnx::NodeProto& n, std::size_t index, std::int64_t opset) {
  const std::string name = unique_name(n.name(), fmt::format("{}_{}", n.op_type(), index));
  std::vector<const value*> inputs;
  bool all_known = true;
  for (const auto& in : n.input()) {
    if (in.empty()) {
      inputs.push_back(nullptr);
      continue;
    }
    auto it = values_.find(in);
    if (it == values_.end()) {
      throw invalid_argument(fmt::format("ONNX node '{}' ({}): input '{}' is not produced by any "
                                         "node, initializer or graph input before it",
                                         name, n.op_type(), in));
    }
    inputs.push_back(&it->second);
    all_known = all_known && it->second.constant.has_value();
  }
  std::vector<value> results;
  try {
    std::optional<std::vector<value>> known;
    if (all_known && !inputs.empty() && !is_random(n.op_type())) known = evaluate(n, name, opset, inputs);
    if (known) {
      results = std::move(*known);
    } else {
      node_context c(*this, b_, n, name, opset, inputs);
      find_lowering(n.op_type())->lower(c);
      results = c.results();
    }
  } catch (const value_required&) {
    throw;
  } catch (const unsupported_error& e) {
    const std::string what = e.what();
    if (what.starts_with("ONNX node")) throw;
    throw unsupported_error(fmt::format("ONNX node '{}' ({}): {}", name, n.op_type(), what));
  } catch (const error& e) {
    const std::string what = e.what();
    if (what.starts_with("ONNX node")) throw;
    throw invalid_argument(fmt::format("ONNX node '{}' ({}): {}", name, n.op_type(), what));
  }
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (i >= static_cast<std::size_t>(n.output_size()) || n.output(static_cast<int>(i)).empty()) continue;
    if (!results[i].out.valid()) {
      throw invalid_argument(fmt::format("ONNX node '{}' ({}): output {} ('{}') is not imported", name,
                                         n.op_type(), i, n.output(static_cast<int>(i))));
    }
    values_[n.output(static_cast<int>(i))] = std::move(results[i]);
  }
}

void importer::add_outputs(const ::onnx::GraphProto& g, imported_model& out) {
  for (const auto& o : g.output()) {
    auto it = values_.find(o.name());
    if (it == values_.end()) {
      throw invalid_argument(fmt::format("graph output '{}' is not produced by any node", o.name()));
    }
    model_value v;
    v.onnx_name = o.name();
    v.node = unique_name(o.name(), "output");
    v.tensor = v.node;
    const output y = ops::identity(it->second.out, {.name = v.node, .device = {}});
    v.type = y.dtype_of();
    if (y.type().shape) v.dims = *y.type().shape;
    if (o.type().has_tensor_type() && o.type().tensor_type().has_shape()) {
      for (const auto& dim : o.type().tensor_type().shape().dim()) {
        v.dim_names.push_back(dim.has_dim_param() ? dim.dim_param() : "");
      }
    }
    out.outputs.push_back(std::move(v));
  }
}

imported_model importer::run(::onnx::ModelProto& m) {
  check_and_convert(m, options_.check_model, origin_);
  imported_model out;
  if (options_.fuse_patterns) out.rewrites = rewrite_patterns(*m.mutable_graph(), dir_);
  check_supported(m);
  out.file_opset = default_opset(m);
  out.producer = m.producer_name();
  const std::int64_t opset = default_opset(m);
  out.opset = opset;
  const auto& g = m.graph();
  const auto scope = b_.with_device(options_.device);
  // Graph inputs and outputs keep their ONNX names: reserve them before the nodes' names.
  add_inputs(g, out);
  add_initializers(g, out);
  std::size_t index = 0;
  for (const auto& n : g.node()) lower(n, index++, opset);
  add_outputs(g, out);
  out.graph = std::move(g_);
  return out;
}

// ---- node_context ---------------------------------------------------------------------

node_context::node_context(importer& imp, graph_builder& b, const ::onnx::NodeProto& n,
                           std::string name, std::int64_t opset, std::vector<const value*> inputs)
    : imp_(imp), b_(b), n_(n), name_(std::move(name)), opset_(opset), inputs_(std::move(inputs)),
      outputs_(static_cast<std::size_t>(n.output_size())) {}

std::string node_context::describe() const { return fmt::format("'{}' ({})", name_, op_type()); }

void node_context::fail(std::string_view message) const {
  throw invalid_argument(fmt::format("ONNX node {}: {}", describe(), message));
}

void node_context::unsupported(std::string_view message) const {
  throw unsupported_error(fmt::format("ONNX node {}: {}", describe(), message));
}

bool node_context::has(std::size_t i) const noexcept {
  return i < inputs_.size() && inputs_[i] != nullptr;
}

output node_context::in(std::size_t i) const {
  if (!has(i)) fail(fmt::format("input {} is required", i));
  return inputs_[i]->out;
}

std::size_t node_context::rank(std::size_t i) const {
  const auto& t = type(i);
  if (!t.shape) fail(fmt::format("input {} ('{}') has an unknown rank", i, n_.input(static_cast<int>(i))));
  return t.shape->rank();
}

const tensor* node_context::constant(std::size_t i) const {
  if (!has(i) || !inputs_[i]->constant) return nullptr;
  return &*inputs_[i]->constant;
}

std::optional<known_ints> node_context::elements(std::size_t i) const {
  if (!has(i)) return std::nullopt;
  return inputs_[i]->elements;
}

void node_context::require_value(std::size_t i, std::string_view what) const {
  if (has(i) && inputs_[i]->graph_input) {
    const std::string& input = n_.input(static_cast<int>(i));
    throw value_required(fmt::format("ONNX node {}: input {} ('{}', the {}) is a graph input whose "
                                     "value must be known when the model is imported: give it in "
                                     "import_options::input_values",
                                     describe(), i, input, what),
                         input);
  }
}

std::vector<std::int64_t> node_context::ints(std::size_t i, std::string_view what) const {
  auto k = elements(i);
  if (!k || !k->all_known()) {
    require_value(i, what);
    unsupported(fmt::format("input {} ('{}', the {}) must be known when the model is imported: "
                            "it is computed at run time here",
                            i, has(i) ? n_.input(static_cast<int>(i)) : "", what));
  }
  return k->get();
}

double node_context::number(std::size_t i, std::string_view what) const {
  const tensor* t = constant(i);
  if (t == nullptr) require_value(i, what);
  if (t == nullptr || t->num_elements() != 1) {
    unsupported(fmt::format("input {} ('{}', the {}) must be one number known when the model "
                            "is imported",
                            i, has(i) ? n_.input(static_cast<int>(i)) : "", what));
  }
  if (const auto v = element_as_double(*t, 0)) return *v;
  unsupported(fmt::format("input {} ('{}', the {}) is a half-precision scalar", i,
                          n_.input(static_cast<int>(i)), what));
}

const ::onnx::AttributeProto* node_context::attribute(std::string_view name) const {
  for (const auto& a : n_.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

std::int64_t node_context::attr_int(std::string_view name, std::int64_t fallback) const {
  const auto* a = attribute(name);
  return a == nullptr ? fallback : a->i();
}

float node_context::attr_float(std::string_view name, float fallback) const {
  const auto* a = attribute(name);
  return a == nullptr ? fallback : a->f();
}

std::string node_context::attr_string(std::string_view name, std::string fallback) const {
  const auto* a = attribute(name);
  return a == nullptr ? std::move(fallback) : a->s();
}

std::vector<std::int64_t> node_context::attr_ints(std::string_view name,
                                                  std::vector<std::int64_t> fallback) const {
  const auto* a = attribute(name);
  if (a == nullptr) return fallback;
  return {a->ints().begin(), a->ints().end()};
}

std::vector<float> node_context::attr_floats(std::string_view name) const {
  const auto* a = attribute(name);
  if (a == nullptr) return {};
  return {a->floats().begin(), a->floats().end()};
}

std::size_t node_context::num_outputs() const noexcept { return outputs_.size(); }

bool node_context::wants(std::size_t i) const noexcept {
  return i < outputs_.size() && !n_.output(static_cast<int>(i)).empty();
}

void node_context::set(std::size_t i, output o) {
  if (i >= outputs_.size()) return;  // an optional output the model does not name
  outputs_[i].out = o;
}

bool node_context::set_ints(std::size_t i, const known_ints& k, dtype t) {
  if (i >= outputs_.size()) return true;
  outputs_[i].elements = k;
  if (!k.all_known()) return false;
  const auto v = k.get();
  shape s;
  if (!k.scalar) s.push_back(static_cast<std::int64_t>(v.size()));
  tensor value = memory::host_tensor(dtype::i64, s);
  std::copy(v.begin(), v.end(), value.data<std::int64_t>());
  if (t != dtype::i64) {
    tensor cast = memory::host_tensor(t, s);
    for (std::size_t j = 0; j < v.size(); ++j) {
      if (t == dtype::i32) cast.data<std::int32_t>()[j] = static_cast<std::int32_t>(v[j]);
      else fail("integer result of an unsupported dtype");
    }
    value = cast;
  }
  set_constant(i, std::move(value));
  return true;
}

void node_context::set_constant(std::size_t i, tensor value) {
  if (i >= outputs_.size()) return;
  outputs_[i].out = ops::constant(b_, value, i == 0 ? opts() : aux(std::to_string(i)));
  outputs_[i].elements = ints_of(value);
  outputs_[i].constant = std::move(value);
}

node_options node_context::aux(std::string_view suffix) const {
  return {.name = imp_.aux_name(name_, suffix), .device = {}};
}

output node_context::constant_node(tensor t, std::string_view suffix) const {
  return ops::constant(b_, std::move(t), aux(suffix));
}

output node_context::scalar(double v, dtype t, std::string_view suffix) const {
  return ops::scalar(b_, v, t, aux(suffix));
}

// ---- shared helpers -------------------------------------------------------------------

std::int64_t normalize_axis(const node_context& c, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis >= rank) {
    c.fail(fmt::format("axis {} is out of range for rank {}", axis, rank));
  }
  return axis < 0 ? axis + rank : axis;
}

std::int64_t int_at(const tensor& t, std::int64_t j) {
  switch (t.type()) {
    case dtype::i64: return t.data<std::int64_t>()[j];
    case dtype::i32: return t.data<std::int32_t>()[j];
    case dtype::i8: return t.data<std::int8_t>()[j];
    default: return t.data<std::uint8_t>()[j];
  }
}

const op_lowering* find_lowering(std::string_view op) {
  const auto& table = lowerings();
  auto it = table.find(op);
  if (it == table.end()) return nullptr;
  const auto& registry = op_registry::global();
  for (const auto& needed : it->second.needs) {
    if (registry.find(needed) == nullptr) return nullptr;
  }
  return &it->second;
}

bool has_loom_attr(std::string_view op, std::string_view attr) {
  const op_def* def = op_registry::global().find(op);
  return def != nullptr && def->find_attr(attr) != nullptr;
}

const op_table& lowerings() {
  static const op_table table = [] {
    op_table t;
    add_math_ops(t);
    add_array_ops(t);
    add_nn_ops(t);
    return t;
  }();
  return table;
}

}  // namespace loom::onnx::detail

namespace loom::onnx {

imported_model import_bytes(std::string_view bytes, const import_options& options,
                            std::string_view origin) {
  const std::string name = origin.empty() ? std::string("<bytes>") : std::string(origin);
  ::onnx::ModelProto m = detail::parse_model(bytes, name);
  detail::importer imp(options, options.external_data_dir, name);
  return imp.run(m);
}

imported_model import_file(const std::filesystem::path& path, const import_options& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw not_found(fmt::format("ONNX model '{}' cannot be opened", path.string()));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  ::onnx::ModelProto m = detail::parse_model(bytes, path.string());
  import_options o = options;
  if (o.external_data_dir.empty()) o.external_data_dir = path.parent_path();
  detail::importer imp(o, o.external_data_dir, path.string());
  return imp.run(m);
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> out;
  for (const auto& [name, l] : detail::lowerings()) {
    // Ops of ONNX's default domain at the opsets loom imports: not Gelu (opset 20), which
    // only GELU written in pieces becomes (import_passes.cpp), nor Mish (opset 18).
    const bool onnx_op = ::onnx::OpSchemaRegistry::Schema(name, static_cast<int>(max_opset), "") != nullptr;
    if (onnx_op && detail::find_lowering(name) != nullptr) out.push_back(name);
  }
  return out;
}

}  // namespace loom::onnx
