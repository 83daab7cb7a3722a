// Graph (de)serialization: a graph as JSON text, and back.
//
// Note [graph json format]
// A graph is one JSON object:
//
//   {
//     "format": "loom.graph",
//     "version": 1,
//     "nodes": [
//       {"name": "x", "op": "placeholder",
//        "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [2, -1]}}},
//       {"name": "y", "op": "identity", "inputs": ["x", "^init"], "device": "cpu:0",
//        "attrs": {"T": {"dtype": "float32"}}},
//       ...
//     ]
//   }
//
// - "inputs" lists the data inputs in order, TensorFlow style: "x" is output 0 of node x,
//   "h:1" output 1 of h; control inputs come after them, prefixed "^" ("^init"). Optional
//   (no inputs).
// - "device" is the requested device; left out when empty. "attrs" is optional too.
// - Every attribute value is an object with one key saying its type, so no value is
//   ambiguous: {"int": 3}, {"float": 0.5}, {"bool": true}, {"string": "..."},
//   {"dtype": "float32"}, {"ints": [1, 2]}, {"floats": [0.5, 1]}, {"shape": [2, -1]} (-1: an
//   unknown dimension), {"tensor": {"dtype": "float32", "shape": [2, 2], "data": [...]}}
//   with the elements flat in row-major order, and {"tensor": null} for an undefined tensor
//   (a variable without an initial value).
// - Floating-point values (float attributes, and the elements of float32, float64, float16
//   and bfloat16 tensors) are JSON numbers, written in the shortest form that reads back to
//   the same bits; the non-finite ones are strings: "inf", "-inf", "nan" (the dtype's
//   default quiet NaN), "-nan" (the same with the sign bit set) and "nan(0x7fc00001)" (any
//   other NaN, by its bits), so tensors round-trip bit-exactly. Integer elements are JSON
//   integers, bool elements true/false.
// - The writer writes every attribute of every node, defaults and inferred type attributes
//   ("T") included, so a graph reads back the same even if an op's defaults change. The
//   reader takes any subset: a missing attribute gets its default or is inferred, exactly
//   as graph::add_node does.
// - Nodes may appear in any order. The reader adds them in the file's order, except that
//   the nodes a node needs (through data or control inputs) that come later in the file are
//   added just before it. A graph whose node ids are a topological order (any graph without
//   control edges added by graph::add_control_input to earlier nodes) reads back with the
//   same node ids.
// - Keys other than the ones above are errors (a misspelt "input" would otherwise vanish).
#pragma once

#include <string>
#include <string_view>

#include "loom/graph/graph.hpp"

namespace loom {

/// The version of Note [graph json format] that graph_to_json writes and graph_from_json
/// reads.
inline constexpr int graph_json_version = 1;

/// `g` as JSON text (Note [graph json format]), indented by `indent` spaces per level (-1:
/// one line). Tensor attributes must live in host-accessible memory. Throws
/// loom::invalid_argument naming the node when a node cannot be written (a tensor on a
/// device the CPU cannot read, a name that begins with '^' or is not valid UTF-8).
/// Thread-safe with respect to other readers of `g`.
[[nodiscard]] std::string graph_to_json(const graph& g, int indent = 2);

/// The graph described by `text`, its ops looked up in `ops` (which must outlive it).
/// Tensors are allocated in host memory. Throws:
/// - loom::parse_error for malformed JSON (with the 1-based line of the error), and, with
///   line 0, for a wrong "format" or "version", a missing or mistyped field or attribute
///   value, or an unknown key; the message names the node;
/// - loom::not_found naming the node for an unknown op, or for an input naming a node
///   that is not in the graph (the message names the missing input too);
/// - loom::invalid_argument naming the nodes on it for a cycle (data or control edges),
///   and for two nodes of one name;
/// - whatever graph::add_node throws for a node that does not fit its op (it names the
///   node).
[[nodiscard]] graph graph_from_json(std::string_view text,
                                    const op_registry& ops = op_registry::global());

/// Writes graph_to_json(g) to the file at `path` (replacing it). Throws as graph_to_json,
/// and loom::error when the file cannot be written.
void save_graph(const graph& g, const std::string& path);

/// graph_from_json of the file at `path`, its ops looked up in `ops`. Throws
/// loom::not_found when the file cannot be opened, loom::error when reading fails, and as
/// graph_from_json otherwise (a parse_error's message names the file).
[[nodiscard]] graph load_graph(const std::string& path,
                               const op_registry& ops = op_registry::global());

}  // namespace loom
