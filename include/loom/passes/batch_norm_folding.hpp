// fold_batch_norms: the inference batch norms of a frozen graph (statistics that are
// constants) folded into the convolution or product before them, as TensorFlow's
// fold_batch_norms graph transform and ONNX import (docs/onnx.md) do.
#pragma once

#include <vector>

#include "loom/graph/graph.hpp"
#include "loom/passes/pass.hpp"

namespace loom::passes {

/// Rewrites `g` in place: each batch_norm(y, scale, bias, mean, var) whose statistics are
/// `const` nodes, after y = conv2d(x, w) (the batch norm's data_format the conv's) or
/// y = matmul(a, w) of rank 2 (w [K, N], or [N, K] with transpose_b) with w a `const` node,
/// float32 or float64, becomes the same layer "<layer>/folded" over w scaled per output
/// channel by scale / sqrt(var + epsilon), then bias_add of bias - mean · scale /
/// sqrt(var + epsilon), named as the batch_norm was (so its readers and fetches by name stay
/// valid); a y read by anything else stays as it was. The answers change by rounding only
/// (the weights are scaled before the products): asked for by name, as a model is frozen for
/// inference, never by a session's plan (docs/passes.md, "Passes never change an answer").
/// Returns one "batch_norm_folding" record per batch_norm: rewritten, or refused with the
/// reason (statistics that are variables, another dtype, statistics that are not finite,
/// ...). Node ids change.
std::vector<pass_record> fold_batch_norms(graph& g);

}  // namespace loom::passes
