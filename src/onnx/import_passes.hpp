// Rewrites of an ONNX graph before it is lowered (import_passes.cpp): BatchNormalization
// folded into the Conv or Gemm before it, GELU written in pieces made one Gelu node.
#pragma once

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <string>
#include <vector>

namespace loom::onnx::detail {

/// Applies every rewrite to `g` (external data read from `dir`); returns one line per
/// rewrite made.
std::vector<std::string> rewrite_patterns(::onnx::GraphProto& g, const std::filesystem::path& dir);

}  // namespace loom::onnx::detail
