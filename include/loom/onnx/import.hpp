// ONNX import: a .onnx model (ONNX's ModelProto) turned into a loom graph.
//
//   auto m = loom::onnx::import_file("resnet18.onnx");
//   loom::session s(std::move(m.graph));
//   auto y = s.run({{m.inputs[0].node, x}}, {m.outputs[0].tensor});
//
// The file is read with ONNX's own library (its protobuf classes, checker, shape inference
// and version converter). Models of opsets 11-17 of the default domain import as they are;
// older ones are converted to opset 13 first. Initializers become `const` nodes (or
// variables, on request); graph inputs become placeholders whose symbolic dimensions stay
// unknown (-1), so a dynamic batch stays dynamic. Each ONNX node becomes one or more loom
// nodes: the last carries the ONNX node's name, the others that name and a suffix
// ("conv1/pad"), so errors, traces and explain_placement name the ONNX node.
//
// Values the import can compute (constants, and shapes where the dimensions are known) are
// evaluated while importing: a Reshape whose target shape is computed from Shape -> Gather
// -> Concat becomes a plain reshape when the dimensions it reads are known.
//
// Errors (all loom::error, none leaves anything behind):
//   loom::parse_error        the bytes are not a ModelProto (truncated, corrupted)
//   loom::invalid_argument   ONNX's checker refused the model, or a node's inputs or
//                            attributes do not fit (names the node and the op)
//   loom::unsupported_error  ops loom does not import (one error listing every (domain,
//                            op, opset) and the nodes that use it), an opset above 17, a
//                            data type loom has no dtype for
//   loom::not_found          an external data file that is missing or too short
//   value_required           (an unsupported_error) a graph input's value is needed
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "loom/graph/graph.hpp"

namespace loom::onnx {

/// A graph input whose value the import needs (a Reshape's target shape, a Slice's bounds,
/// TopK's k fed at run time): import again with its value in import_options::input_values.
class value_required : public unsupported_error {
 public:
  value_required(const std::string& what, std::string input)
      : unsupported_error(what), input_(std::move(input)) {}
  /// The ONNX name of the graph input.
  [[nodiscard]] const std::string& input() const noexcept { return input_; }

 private:
  std::string input_;
};

struct import_options {
  /// Initializers become variables (trainable, checkpointed) instead of constants.
  bool initializers_as_variables = false;
  /// Where external data files are looked for; empty: the model file's directory.
  std::filesystem::path external_data_dir;
  /// Fixes symbolic dimensions of graph inputs, by ONNX input name (-1 keeps one unknown):
  /// the import then folds shape computations that read them.
  std::map<std::string, shape> input_shapes;
  /// The device every node asks for ("" none: the placer decides; "cuda:0", "cpu"). Nodes
  /// without a kernel there need the session's allow_soft_placement.
  std::string device;
  /// Values of graph inputs, by ONNX name: each becomes a constant (its dtype must be the
  /// input's, its shape fit the input's), so what depends on it is known at import.
  std::map<std::string, tensor> input_values;
  /// Run ONNX's checker on the model first (on by default).
  bool check_model = true;
  /// Rewrite what exporters write in pieces before lowering (on by default): a
  /// BatchNormalization after a Conv or Gemm with constant weights folded into them (in
  /// double; the answers then differ from the unfolded model's in rounding), and GELU
  /// written as x * 0.5 * (1 + erf(x / sqrt(2))) imported as loom's gelu.
  bool fuse_patterns = true;
};

/// A graph input or output of the imported model.
struct model_value {
  /// The ONNX value name ("input", "logits").
  std::string onnx_name;
  /// The loom node holding it: the placeholder to feed, or the identity to fetch.
  std::string node;
  /// What session::run takes ("node" or "node:k").
  std::string tensor;
  dtype type = dtype::f32;
  /// Known dimensions, -1 where symbolic.
  shape dims;
  /// The symbolic dimension names ("batch"; empty where the dimension is fixed or unnamed).
  std::vector<std::string> dim_names;
};

struct imported_model {
  loom::graph graph;
  std::vector<model_value> inputs;
  std::vector<model_value> outputs;
  /// The default domain's opset the nodes were read at (after conversion).
  std::int64_t opset = 0;
  /// The opset the file declared.
  std::int64_t file_opset = 0;
  std::string producer;
  /// Initializers that became variables, by loom node name (empty unless
  /// import_options::initializers_as_variables).
  std::vector<std::string> variables;
  /// What import_options::fuse_patterns rewrote, one line each, naming the ONNX nodes.
  std::vector<std::string> rewrites;
};

/// Imports the model in `path` (external data resolved against its directory).
imported_model import_file(const std::filesystem::path& path, const import_options& options = {});

/// Imports a serialized ModelProto. `origin` names it in errors ("<bytes>" when empty).
imported_model import_bytes(std::string_view bytes, const import_options& options = {},
                            std::string_view origin = {});

/// The ONNX op types of the default domain loom imports, sorted.
std::vector<std::string> supported_ops();

/// The opsets of the default domain loom imports as they are.
inline constexpr std::int64_t min_opset = 11;
inline constexpr std::int64_t max_opset = 17;

}  // namespace loom::onnx
