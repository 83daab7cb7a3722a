// Reading an ONNX model: the bytes parsed into ONNX's ModelProto, checked by ONNX's checker,
// converted to an opset loom imports, and tensors (initializers, Constant values) turned into
// loom tensors with their external data read.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "loom/core/tensor.hpp"
#include "loom/onnx/import.hpp"

namespace loom::onnx::detail {

/// Parses `bytes` as a ModelProto; loom::parse_error naming `origin` when they do not parse.
::onnx::ModelProto parse_model(std::string_view bytes, std::string_view origin);

/// The default domain's opset a model imports (0 when it imports none).
std::int64_t default_opset(const ::onnx::ModelProto& m);

/// Runs ONNX's checker (loom::invalid_argument with its message), refuses opsets above
/// max_opset and converts those below min_opset to 13 with ONNX's version converter.
void check_and_convert(::onnx::ModelProto& m, bool check, std::string_view origin);

/// The loom dtype of an ONNX TensorProto data type; loom::unsupported_error naming `what`
/// for types loom has none for.
dtype dtype_of(std::int32_t onnx_type, std::string_view what);

/// An ONNX TensorProto as a host tensor (external data read from `dir`). Errors name the
/// tensor: an unsupported type, data of the wrong size, a missing or short external file.
tensor tensor_of(const ::onnx::TensorProto& t, const std::filesystem::path& dir);

/// Element i of the dense host tensor t as a double (bool as 0 / 1); nullopt for float16 and
/// bfloat16, which the import reads no numbers from.
std::optional<double> element_as_double(const tensor& t, std::int64_t i);

}  // namespace loom::onnx::detail
