// run_metadata: what one run did, node by node, and its Chrome trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

/// One node's execution.
struct node_execution {
  std::string node;
  std::string op;
  std::string device;       // "/device:CPU:0"
  std::int64_t start_ns = 0;  // from the start of the run
  std::int64_t duration_ns = 0;
  std::size_t output_bytes = 0;  // bytes of the outputs it produced
  int thread = 0;                // a small id of the thread that ran it
  /// The node waited for something outside the process (op_kernel::blocks: a collective):
  /// its time is communication, run beside the other nodes.
  bool blocking = false;
};

struct run_metadata {
  std::vector<node_execution> nodes;
  std::int64_t total_ns = 0;
  /// Per-device placement of the plan, for reference: "node -> device (reason)".
  std::vector<std::string> placement;

  /// The Chrome trace event format (JSON) that Perfetto and chrome://tracing open: one
  /// complete event per node, one process per device, one track per thread.
  [[nodiscard]] std::string chrome_trace() const;
  /// Writes chrome_trace() to `path`; throws loom::error when the file cannot be written.
  void write_chrome_trace(const std::string& path) const;
};

}  // namespace loom
