// fused_expr: the straight-line element-wise program a `fused_elementwise` node computes,
// and the op's builder.
//
// The element-wise fusion pass turns a group of element-wise nodes into one
// fused_elementwise node whose "expr" attribute is the group as text:
//
//   mul(%0, %1); add(%2, 0.5); relu(%3)
//
// Values %0 .. %(N-1) are the node's inputs; instruction k defines %(N + k); the "results"
// attribute lists the values that are the node's outputs. An operand is a value or a
// literal (a finite double). The text is the IR every backend compiles: the CPU kernel
// evaluates it in tiles (src/backends/cpu/fused_elementwise.cpp), a CUDA backend can print
// it as source for NVRTC. parse(to_string()) gives back the same expression, literals
// included, bit for bit.
//
// Semantics (Note [fused element-wise semantics], src/graph/ops/fused_ops.cpp): every value
// is computed element-wise over the broadcast shape of all the inputs, in the compute type
// (float for float16 / bfloat16), each op exactly as its own kernel computes it and rounded
// to the element type as that kernel stores it, so the node gives bit for bit what `expand`
// gives: the same program as ordinary nodes (the unfused form), which is also how the op's
// gradient is built.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/graph/builder.hpp"

namespace loom {

/// The element-wise operations a fused expression can hold.
// clang-format off
enum class ew_op : std::uint8_t {
  // unary
  neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu, gelu_tanh, erf, square, reciprocal,
  // binary
  add, sub, mul, div, pow, maximum, minimum, relu_grad,
};
// clang-format on

/// The number of ew_op values (ew_op(0) .. ew_op(num_ew_ops - 1) are all valid).
inline constexpr int num_ew_ops = static_cast<int>(ew_op::relu_grad) + 1;

/// An ew_op's name in the text form (the op's name, "gelu_tanh" for gelu with
/// approximate="tanh") and its number of operands (1 or 2).
struct ew_op_info {
  std::string_view name;
  int arity;
};
/// The name and arity of `op`. For a value outside the enum: name "?" and arity 0.
[[nodiscard]] const ew_op_info& info(ew_op op) noexcept;
/// The ew_op named `name` in the text form, or nullopt.
[[nodiscard]] std::optional<ew_op> ew_op_from_name(std::string_view name) noexcept;

/// The ew_op a graph node computes: by op name (gelu: by its "approximate" attribute,
/// "tanh" -> gelu_tanh), nullopt for every other op. Looks at the op only: whether the
/// node's dtype can be fused (fused_elementwise takes the float types) is the caller's
/// question.
[[nodiscard]] std::optional<ew_op> fusable_op(const node& n);

/// An instruction's operand: a value or a literal.
struct fused_operand {
  std::int32_t value = -1;  // >= 0: the value %value; -1: a literal
  double literal = 0.0;
  [[nodiscard]] bool is_literal() const noexcept { return value < 0; }

  friend bool operator==(const fused_operand&, const fused_operand&) = default;
};

/// One instruction: op applied to its operands.
struct fused_instr {
  ew_op op{};
  std::array<fused_operand, 2> args{};  // args[1] unused for unary ops

  friend bool operator==(const fused_instr&, const fused_instr&) = default;
};

/// A straight-line element-wise program. Values %0 .. %(num_inputs-1) are the inputs;
/// instruction k defines %(num_inputs + k). `results` lists the values that are outputs
/// (any values, inputs included, each any number of times).
struct fused_expr {
  std::int32_t num_inputs = 0;
  std::vector<fused_instr> instrs;
  std::vector<std::int32_t> results;

  /// The number of values: num_inputs + instrs.size().
  [[nodiscard]] std::int32_t num_values() const noexcept {
    return num_inputs + static_cast<std::int32_t>(instrs.size());
  }

  /// Text form: "mul(%0, %1); add(%2, 0.5); relu(%3)" (instructions joined by "; ",
  /// literals printed in the shortest form that reads back as the same double, so that
  /// parse(to_string()) round-trips every finite double, -0 included). Does not validate.
  [[nodiscard]] std::string to_string() const;
  /// Parses the text form (spaces allowed around every token; "" is no instructions) and
  /// validates the result. Throws loom::invalid_argument naming the position (0-based
  /// character offset) and what is wrong: unknown op, wrong arity, malformed operand, a
  /// value used before it is defined, a non-finite literal, a result out of range, ...
  static fused_expr parse(std::string_view text, std::int32_t num_inputs,
                          const std::vector<std::int64_t>& results);
  /// Checks the invariants: num_inputs >= 0, every op a known one, every operand either a
  /// finite literal or a value defined before its instruction, at least one result and
  /// every result an existing value. Throws loom::invalid_argument naming what is wrong.
  void validate() const;

  friend bool operator==(const fused_expr&, const fused_expr&) = default;
};

/// The unfused form: adds the expression's primitive ops to `inputs`' graph (neg, mul, ...,
/// gelu with approximate="tanh" for gelu_tanh, relu_grad; literals as ops::scalar of the
/// inputs' dtype) and returns the result outputs in order. A result whose value has a
/// smaller shape than the broadcast shape of all the inputs (the shape fused_elementwise
/// gives every output) goes through ops::broadcast_to, so each result has the fused
/// node's output type when the shapes are known. `options.name`, when given, prefixes the
/// new nodes' names ("<name>/mul", ...); `options.device` is asked for by every new node.
/// Throws loom::invalid_argument when the expression is invalid, inputs.size() !=
/// e.num_inputs, there are no inputs, or the inputs' dtypes differ; graph errors as
/// graph::add_node.
std::vector<output> expand(const fused_expr& e, const std::vector<output>& inputs,
                           const node_options& options = {});
/// expand(), returning every value instead of the results: the inputs, then one output per
/// instruction (the node computing it), without broadcast_to. The gradient uses it.
std::vector<output> expand_values(const fused_expr& e, const std::vector<output>& inputs,
                                  const node_options& options = {});

namespace ops {
/// Adds a fused_elementwise node computing `e` over `inputs` (N = inputs.size() >= 1, one
/// float dtype); returns its outputs, one per result, each of the inputs' dtype and their
/// broadcast shape. Throws loom::invalid_argument when `e` is invalid, its num_inputs
/// differs from inputs.size(), or as graph::add_node (dtypes, shapes that do not broadcast).
std::vector<output> fused_elementwise(const std::vector<output>& inputs, const fused_expr& e,
                                      const node_options& options = {});
}  // namespace ops

}  // namespace loom
