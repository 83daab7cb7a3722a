// The import's working state, and what each ONNX op's lowering sees of its node.
//
// Every ONNX value maps to a loom output. Values the import knows are kept beside it:
// `constant` (a host tensor: initializers, Constant nodes, and any node whose inputs are all
// known, which the import evaluates with loom's own kernels) and `elements` (an integer
// vector of rank 0 or 1 whose elements are partly known: what Shape gives of a tensor with
// symbolic dimensions, followed through Gather, Concat, Unsqueeze, arithmetic...). A
// lowering that needs a value at import (a Reshape's target shape, a Slice's bounds) asks
// for it; where only some elements are known it uses loom's run-time form of the op.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/graph/builder.hpp"
#include "loom/onnx/import.hpp"

namespace loom::onnx::detail {

/// An integer vector (or scalar) whose elements may be known at import.
struct known_ints {
  std::vector<std::optional<std::int64_t>> values;
  bool scalar = false;

  [[nodiscard]] bool all_known() const;
  /// The values; call when all_known().
  [[nodiscard]] std::vector<std::int64_t> get() const;
};

/// One ONNX value as the import knows it.
struct value {
  output out;
  /// The ONNX value is a graph input fed at run time.
  bool graph_input = false;
  std::optional<tensor> constant;
  std::optional<known_ints> elements;
};

class importer;

class node_context {
 public:
  node_context(importer& imp, graph_builder& b, const ::onnx::NodeProto& n, std::string name,
               std::int64_t opset, std::vector<const value*> inputs);

  [[nodiscard]] const ::onnx::NodeProto& proto() const noexcept { return n_; }
  [[nodiscard]] const std::string& op_type() const noexcept { return n_.op_type(); }
  [[nodiscard]] std::int64_t opset() const noexcept { return opset_; }
  [[nodiscard]] graph_builder& b() const noexcept { return b_; }
  /// The loom name of the node's last loom node; aux(suffix) names the others.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  // ---- inputs ----
  [[nodiscard]] std::size_t num_inputs() const noexcept { return inputs_.size(); }
  /// Input i is given (present and not the empty name of an omitted optional input).
  [[nodiscard]] bool has(std::size_t i) const noexcept;
  /// Input i's loom output; fails naming the input when it is omitted.
  [[nodiscard]] output in(std::size_t i) const;
  [[nodiscard]] const tensor_type& type(std::size_t i) const { return in(i).type(); }
  /// Input i's rank; fails when inference does not know it.
  [[nodiscard]] std::size_t rank(std::size_t i) const;
  /// Input i's value when the import knows it.
  [[nodiscard]] const tensor* constant(std::size_t i) const;
  /// Input i as partly known integers (from its constant or from shape tracking).
  [[nodiscard]] std::optional<known_ints> elements(std::size_t i) const;
  /// Input i's integer values, which must be known at import (`what` names the role, as
  /// "shape"); fails naming the input otherwise.
  [[nodiscard]] std::vector<std::int64_t> ints(std::size_t i, std::string_view what) const;
  /// Input i as one number known at import.
  [[nodiscard]] double number(std::size_t i, std::string_view what) const;
  /// Throws value_required when input i is a graph input (its value is needed at import).
  void require_value(std::size_t i, std::string_view what) const;

  // ---- attributes ----
  [[nodiscard]] const ::onnx::AttributeProto* attribute(std::string_view name) const;
  [[nodiscard]] bool has_attr(std::string_view name) const { return attribute(name) != nullptr; }
  [[nodiscard]] std::int64_t attr_int(std::string_view name, std::int64_t fallback) const;
  [[nodiscard]] float attr_float(std::string_view name, float fallback) const;
  [[nodiscard]] std::string attr_string(std::string_view name, std::string fallback) const;
  [[nodiscard]] std::vector<std::int64_t> attr_ints(std::string_view name,
                                                    std::vector<std::int64_t> fallback = {}) const;
  [[nodiscard]] std::vector<float> attr_floats(std::string_view name) const;

  // ---- outputs ----
  [[nodiscard]] std::size_t num_outputs() const noexcept;
  /// Output i is asked for (present and named).
  [[nodiscard]] bool wants(std::size_t i) const noexcept;
  void set(std::size_t i, output o);
  /// Sets output i from integers: a constant when all are known (returns true: nothing else
  /// to add), else only records them beside the output the lowering then sets (false).
  bool set_ints(std::size_t i, const known_ints& k, dtype t = dtype::i64);
  /// Sets output i to a constant node holding `value`, known at import.
  void set_constant(std::size_t i, tensor value);
  [[nodiscard]] const std::vector<value>& results() const noexcept { return outputs_; }

  // ---- building ----
  /// Options for the node's last loom node: the ONNX node's name.
  [[nodiscard]] node_options opts() const { return {.name = name_, .device = {}}; }
  /// Options for a helper node: "<name>/<suffix>".
  [[nodiscard]] node_options aux(std::string_view suffix) const;
  /// A constant node (named "<name>/<suffix>").
  output constant_node(tensor t, std::string_view suffix) const;
  /// A scalar constant of dtype `t`.
  output scalar(double v, dtype t, std::string_view suffix) const;

  /// Throws loom::invalid_argument "ONNX node 'n' (Op): <message>".
  [[noreturn]] void fail(std::string_view message) const;
  /// Throws loom::unsupported_error "ONNX node 'n' (Op): <message>".
  [[noreturn]] void unsupported(std::string_view message) const;
  /// "'n' (Op)".
  [[nodiscard]] std::string describe() const;

 private:
  importer& imp_;
  graph_builder& b_;
  const ::onnx::NodeProto& n_;
  std::string name_;
  std::int64_t opset_;
  std::vector<const value*> inputs_;
  std::vector<value> outputs_;
};

/// How one ONNX op becomes loom nodes, and the loom ops it needs (the ONNX op is imported
/// when all of them are registered).
using lowering = std::function<void(node_context&)>;
struct op_lowering {
  lowering lower;
  std::vector<std::string> needs;
};
using op_table = std::map<std::string, op_lowering, std::less<>>;

void add_math_ops(op_table& t);
void add_array_ops(op_table& t);
void add_nn_ops(op_table& t);
/// Every lowering, by ONNX op type (default domain).
const op_table& lowerings();
/// The lowering of ONNX op `op` when it is imported (its loom ops registered), else null.
const op_lowering* find_lowering(std::string_view op);
/// True when loom's op `op` has an attribute `attr` (for lowerings that use an attribute
/// only some versions of an op have).
bool has_loom_attr(std::string_view op, std::string_view attr);

// ---- helpers shared by the lowerings ----

/// `axis` (negative counts from the end) as an index into a rank-`rank` shape; fails
/// through `c` when out of range.
std::int64_t normalize_axis(const node_context& c, std::int64_t axis, std::int64_t rank);
/// Element j of a dense host tensor of an integer dtype, as int64.
std::int64_t int_at(const tensor& t, std::int64_t j);

}  // namespace loom::onnx::detail
