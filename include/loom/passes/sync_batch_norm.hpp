// convert_sync_batch_norm: every batch_norm_train of a training graph made synchronized
// across the ranks of a communicator (sync_batch_norm), as PyTorch's
// SyncBatchNorm.convert_sync_batchnorm does for a model's modules.
#pragma once

#include <string>
#include <vector>

#include "loom/graph/graph.hpp"
#include "loom/passes/pass.hpp"

namespace loom::passes {

/// What convert_sync_batch_norm did.
struct sync_batch_norm_conversion {
  /// The node of the converted graph that each node of the original became (indexed by the
  /// original's ids): a converted batch_norm_train's is its sync_batch_norm node, which
  /// keeps its name and outputs.
  std::vector<node_id> new_id;
  /// One "sync_batch_norm" record per converted node, for the explain log.
  std::vector<pass_record> records;
};

/// Rewrites `g` in place: each batch_norm_train node N becomes batch_norm_stats "N/stats",
/// all_gather "N/gather" over `group` (a communicator registered with
/// loom::distributed::register_group) and sync_batch_norm "N" (same inputs, attributes and
/// outputs, so readers and names stay valid; node ids change: `new_id` maps them). Every
/// other node is kept as it was, in order. Convert before building gradients: throws
/// loom::invalid_argument naming the node when a batch_norm_train's statistics are already
/// read by its gradient (batch_norm_train_grad), whose sums would stay this rank's.
sync_batch_norm_conversion convert_sync_batch_norm(graph& g, const std::string& group = "world");

}  // namespace loom::passes
