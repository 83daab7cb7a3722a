// op_def: what an op is, independent of any device: its typed inputs and outputs, its
// attributes (with defaults and validation) and its shape and dtype inference.
//
// Types: an input or output is either of a fixed dtype or of a *type attribute* ("T"),
// whose value is taken from the inputs when a node is added (all inputs naming "T" must
// agree) or given explicitly (for ops with no input of that type, like `zeros`). A type
// attribute may restrict the dtypes it accepts. The last input (or output) may be a list
// whose length is an integer attribute ("N"), as concat's inputs and split's outputs are.
//
// Inference runs when a node is added (graph::add_node), so a dtype or shape mismatch is
// an error at construction, naming the node, wherever the shapes are known.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/graph/attr_value.hpp"

namespace loom {

/// A tensor's type as inference knows it: the dtype, and the shape when its rank is known
/// (dimensions may be -1, unknown).
struct tensor_type {
  dtype type = dtype::f32;
  std::optional<loom::shape> shape;

  friend bool operator==(const tensor_type&, const tensor_type&) = default;
};
/// "float32[2, ?]" or "float32[*]" (unknown rank).
std::string to_string(const tensor_type& t);

struct arg_def {
  std::string name;
  /// The type attribute ("T") this argument's dtype comes from; empty for a fixed dtype.
  std::string type_attr;
  /// The fixed dtype, when type_attr is empty.
  dtype fixed = dtype::f32;
  /// The integer attribute holding this list's length; empty for a single tensor.
  std::string list_length_attr;
  /// Inputs only: any dtype, each list element its own (TensorFlow's list(type)), as a
  /// fused optimizer over parameters of mixed precision takes. type_attr and fixed are
  /// ignored; the op's inference checks what it accepts.
  bool any_type = false;
};

struct attr_def {
  std::string name;
  attr_type type = attr_type::integer;
  /// Used when the node does not give the attribute; none means the attribute is required.
  std::optional<attr_value> default_value;
  /// For type attributes: the dtypes accepted (empty: any).
  std::vector<dtype> allowed_types;
  /// For type attributes: when the node does not give it, the value of this other type
  /// attribute once the inputs have set theirs (reduce_sum's output_type is T's unless
  /// given). Empty: none.
  std::string default_from;
  /// Extra validation; throws loom::invalid_argument with a message saying what is wrong
  /// with the value (the graph adds the node's name and the attribute's).
  std::function<void(const attr_value&)> validate;
};

class inference_context;

struct op_def {
  std::string name;
  std::vector<arg_def> inputs;
  std::vector<arg_def> outputs;
  std::vector<attr_def> attrs;
  /// Sets every output's type from the inputs' types and the attributes; throws
  /// loom::invalid_argument naming what does not fit. Outputs not set default to their
  /// arg's dtype with an unknown shape.
  std::function<void(inference_context&)> infer;
  /// Fills attributes that follow from others before validation (const's dtype from its
  /// value), so hand-written graphs need not repeat them. May be empty.
  std::function<void(attr_map&)> derive_attrs;
  /// True for ops whose kernels hold state (variables) or have effects (assign): never
  /// pruned as dead when targeted, never folded or deduplicated.
  bool is_stateful = false;
  /// For ops that every process of a job must start in one order (the collectives): the
  /// graph gives each such node a control input from the previous one added (Note
  /// [collective order] in src/graph/graph.cpp), whoever adds it (a builder, Python, JSON).
  bool ordered_across_processes = false;
  /// For ops that update a variable (assign, assign_add): the input whose producer (the
  /// variable) this node must be placed with. -1: none.
  int colocate_with_input = -1;
  /// For ops that write a variable without reading it (assign): the string attribute
  /// naming the variable node this node must be placed with. Empty: none.
  std::string colocate_with_attr;
  /// Cheap ops the executor runs inline rather than on the device's thread pool.
  bool is_cheap = false;
  /// A short description for listings and error messages.
  std::string summary;

  [[nodiscard]] const attr_def* find_attr(std::string_view attr) const noexcept;
};

/// What inference sees of a node being added.
class inference_context {
 public:
  inference_context(const op_def& def, const std::string& node_name, const attr_map& attrs,
                    std::vector<tensor_type> inputs, std::size_t num_outputs);

  [[nodiscard]] const std::string& node_name() const noexcept { return node_name_; }
  [[nodiscard]] const op_def& def() const noexcept { return def_; }
  [[nodiscard]] std::size_t num_inputs() const noexcept { return inputs_.size(); }
  [[nodiscard]] const tensor_type& input(std::size_t i) const { return inputs_.at(i); }
  [[nodiscard]] std::size_t num_outputs() const noexcept { return outputs_.size(); }
  /// The attribute (the node's value or the default), converted as attr_value::as<T>.
  template <class T>
  [[nodiscard]] T attr(std::string_view name) const {
    return attr_value_of(name).as<T>();
  }
  [[nodiscard]] const attr_value& attr_value_of(std::string_view name) const;

  void set_output(std::size_t i, tensor_type t) { outputs_.at(i) = std::move(t); }
  /// Output i: dtype `t`, shape `s`.
  void set_output(std::size_t i, dtype t, std::optional<loom::shape> s) {
    set_output(i, tensor_type{t, std::move(s)});
  }
  [[nodiscard]] std::vector<tensor_type>& outputs() noexcept { return outputs_; }

  /// Throws loom::invalid_argument "<message>" (graph::add_node prefixes the node and op).
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const op_def& def_;
  const std::string& node_name_;
  const attr_map& attrs_;
  std::vector<tensor_type> inputs_;
  std::vector<tensor_type> outputs_;
};

}  // namespace loom
