// graph: nodes (ops with attributes and a device request) and the edges between them.
//
// A node is added with all its inputs already in the graph, so a graph built through
// add_node has no cycles; control edges added later and deserialized graphs are checked
// (graph::add_control_input, graph_from_json). Adding a node validates it against its
// op_def (input count and types, attributes, defaults) and runs inference, so mismatches
// surface at construction with the node's name. Node ids are dense, in insertion order,
// which is a topological order.
//
// Not thread-safe for writing; a graph that is no longer changed may be read from many
// threads (sessions copy what they need).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/graph/op_registry.hpp"

namespace loom {

using node_id = std::int32_t;

/// Output `index` of node `node`.
struct endpoint {
  node_id node = -1;
  std::int32_t index = 0;
  friend bool operator==(endpoint, endpoint) = default;
};

/// "node" (output 0) or "node:k" split into the node's name and k.
struct tensor_name {
  std::string_view node;
  std::int32_t index = 0;
};
/// Splits a tensor name; throws loom::invalid_argument naming the text when it is neither
/// "node" nor "node:k" with k a non-negative decimal integer. The one parser of tensor names:
/// the graph, its JSON form, the Python package and the `loom` tool all read them with it.
[[nodiscard]] tensor_name split_tensor_name(std::string_view text);

/// Checks a node name: not empty, no ':' (it separates an output index), no '^' first (it
/// marks a control input in the JSON form), no white space or control characters. Throws
/// loom::invalid_argument saying which rule the name breaks. graph::add_node calls it, so the
/// builder, the JSON loader and the Python package accept the same names.
void check_node_name(std::string_view name);

/// Checks a shape attribute (a placeholder's or a variable's declared shape): every dimension
/// >= 0 or -1 (unknown), and the known dimensions' product fits in int64. Throws
/// loom::invalid_argument naming the dimension. graph::add_node checks every shape attribute
/// with it.
void check_shape_attr(const shape& s);

struct node {
  node_id id = -1;
  std::string name;
  const op_def* def = nullptr;
  std::vector<endpoint> inputs;
  std::vector<node_id> control_inputs;
  /// Every attribute of the op, defaults filled in.
  attr_map attrs;
  /// The device asked for ("", "cpu", "/device:CPU:1", ...).
  std::string requested_device;
  std::vector<tensor_type> outputs;

  [[nodiscard]] const std::string& op() const noexcept { return def->name; }
  template <class T>
  [[nodiscard]] T attr(std::string_view attr_name) const {
    return attr_value_of(attr_name).as<T>();
  }
  /// Throws loom::not_found naming the node and the attribute.
  [[nodiscard]] const attr_value& attr_value_of(std::string_view attr_name) const;
  /// "'h1' (matmul)", for error messages.
  [[nodiscard]] std::string describe() const;
};

/// What add_node takes.
struct node_spec {
  std::string name;  // empty: a unique name from the op ("matmul", "matmul_1", ...)
  std::string op;
  std::vector<endpoint> inputs;
  attr_map attrs;
  std::string device;
  std::vector<node_id> control_inputs;
};

class graph {
 public:
  explicit graph(const op_registry& ops = op_registry::global()) : ops_(&ops) {}

  /// Validates and adds a node; returns it. Throws loom::not_found for an unknown op or
  /// input, loom::invalid_argument for a duplicate name, wrong input count, missing or
  /// invalid attribute, or a dtype/shape mismatch found by inference; the message names
  /// the node and op. On a throw the graph is unchanged.
  const node& add_node(node_spec spec);
  /// Makes `to` wait for `from`. Throws loom::invalid_argument (naming the nodes on the
  /// cycle) when that would create a cycle.
  void add_control_input(node_id to, node_id from);
  void set_requested_device(node_id id, std::string device);

  [[nodiscard]] std::size_t num_nodes() const noexcept { return nodes_.size(); }
  /// Node `id`; throws loom::not_found when the graph has no such node (an id from another
  /// graph, or an output kept after its graph was moved into a session).
  [[nodiscard]] const node& at(node_id id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= nodes_.size()) throw_no_node(id);
    return nodes_[static_cast<std::size_t>(id)];
  }
  [[nodiscard]] const std::deque<node>& nodes() const noexcept { return nodes_; }
  [[nodiscard]] const node* find(std::string_view name) const;
  /// Throws loom::not_found naming the missing node.
  [[nodiscard]] const node& get(std::string_view name) const;
  /// Parses "name" (output 0) or "name:k"; throws loom::not_found / invalid_argument.
  [[nodiscard]] endpoint parse_endpoint(std::string_view text) const;
  /// "name" for output 0, "name:k" otherwise.
  [[nodiscard]] std::string endpoint_name(endpoint e) const;
  [[nodiscard]] const tensor_type& type_of(endpoint e) const;
  /// A name not used yet, from `prefix`.
  [[nodiscard]] std::string unique_name(std::string_view prefix) const;
  [[nodiscard]] const op_registry& ops() const noexcept { return *ops_; }

 private:
  [[noreturn]] void throw_no_node(node_id id) const;

  const op_registry* ops_;
  std::deque<node> nodes_;
  std::unordered_map<std::string, node_id> by_name_;
  // The last node of an op ordered across processes (op_def::ordered_across_processes), or -1.
  node_id last_ordered_ = -1;
  // Next suffix to try per prefix, so naming n nodes of one op costs O(n), not O(n^2).
  mutable std::unordered_map<std::string, std::size_t> next_suffix_;
};

}  // namespace loom
