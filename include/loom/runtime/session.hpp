// session: runs graphs on the devices of this machine.
//
// A session creates its devices through the registered device factories, and keeps a
// copy of the graph it was given. session::run(feeds, fetches, targets) prunes the graph
// to what the fetches and targets need, rewrites that with the graph passes (folding,
// CSE, fusion: loom/passes/pass_manager.hpp), places every node on a device (placer), cuts the
// graph per device with _send/_recv copies on the edges between them (partitioner), makes
// each node's kernel once, and runs the result as dataflow (executor). All of that is a
// *plan*, cached per (feeds, fetches, targets) signature, so repeated runs pay only for
// kernels. Variables live in the session, on their devices, across runs.
//
// Thread safety: run() may be called from many threads at once (each run has its own
// state; plans and kernels are shared and immutable). cancel() may be called from any
// thread. A failed or cancelled run leaves the session usable and holds no memory.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/device/device_factory.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/passes/pass.hpp"
#include "loom/runtime/run_metadata.hpp"

namespace loom {
namespace distributed {
class communicator;
}

struct session_options {
  /// What the device factories create (virtual CPU devices, threads, memory limits).
  device_options devices;
  /// When a node asks for a device that does not exist or cannot run it, place it by the
  /// other rules instead of failing.
  bool allow_soft_placement = false;
  /// Print each node's device and the reason when a plan is made (to stderr).
  bool log_device_placement = false;
  /// The registry to take device factories from (nullptr: the global one).
  const device_factory_registry* factories = nullptr;
  /// The graph passes run on each plan before placement: all of them unless switched off
  /// (docs/passes.md). Checked when the session is made.
  passes::pass_options passes;
  /// The processes whose devices the session places on (docs/distributed.md, "Devices in
  /// other processes"): rank r of this communicator is /job:worker/task:r. Every rank makes
  /// the session, with the same graph, and calls every run with the same feeds, fetches and
  /// targets. A node that asks for "/job:worker/task:1/..." runs on task 1 alone; one that
  /// names no task runs on every task (each computes it itself); values cross tasks point
  /// to point (Note [tasks] in src/runtime/partitioner.cpp). nullptr, or one rank: this
  /// process alone (task 0).
  std::shared_ptr<distributed::communicator> cluster;
};

/// A feed: a tensor for a node output ("x" or "x:1").
using feed = std::pair<std::string, tensor>;

/// Why a node went where it did.
struct placement_decision {
  std::string node;
  std::string op;
  std::string device;
  std::string reason;
};

struct run_options {
  /// Record per-node timings into the run_metadata passed to run().
  bool trace = false;
  /// Cancels this run when it becomes true (checked before each node).
  const std::atomic<bool>* cancel = nullptr;
};

class session {
 public:
  /// Creates the devices and keeps `g`. Throws loom::invalid_argument for bad options.
  explicit session(graph g, session_options options = {});
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  /// Runs the graph: feeds `feeds`, returns the tensors named by `fetches` (in order),
  /// and also runs the nodes named in `targets`. Throws, naming the node:
  /// loom::not_found (unknown fetch, feed or target), loom::invalid_argument (a feed of the
  /// wrong dtype or shape, a missing feed, a cycle, a placement that cannot be met),
  /// loom::node_error (a kernel failed), loom::cancelled_error, loom::out_of_memory.
  std::vector<tensor> run(const std::vector<feed>& feeds, const std::vector<std::string>& fetches,
                          const std::vector<std::string>& targets = {},
                          run_metadata* metadata = nullptr, const run_options& options = {});

  /// Cancels every run in progress (they throw loom::cancelled_error).
  void cancel();

  /// Where each node that the signature needs would run, and why (makes the plan).
  std::vector<placement_decision> explain_placement(const std::vector<std::string>& feeds,
                                                     const std::vector<std::string>& fetches,
                                                     const std::vector<std::string>& targets = {});
  /// What the graph passes rewrote and refused (with the reasons) in the plan of this
  /// signature (makes the plan).
  std::vector<passes::pass_record> explain_passes(const std::vector<std::string>& feeds,
                                                  const std::vector<std::string>& fetches,
                                                  const std::vector<std::string>& targets = {});
  /// The graph the plan of this signature runs (after the passes), for inspection. Valid
  /// while the session lives.
  [[nodiscard]] const graph& planned_graph(const std::vector<std::string>& feeds,
                                           const std::vector<std::string>& fetches,
                                           const std::vector<std::string>& targets = {});
  /// Node names per device partition of the plan for this signature, _send/_recv included.
  std::vector<std::pair<std::string, std::vector<std::string>>> partitions(
      const std::vector<std::string>& feeds, const std::vector<std::string>& fetches,
      const std::vector<std::string>& targets = {});

  [[nodiscard]] const graph& get_graph() const noexcept;
  [[nodiscard]] const std::vector<std::unique_ptr<device>>& devices() const noexcept;
  /// Every task's devices by name, "/job:worker/task:0/device:CPU:0" and so on, in task
  /// order (this process's alone, as task 0, without a cluster).
  [[nodiscard]] std::vector<std::string> cluster_devices() const;
  /// The device of this name ("/device:CPU:1", "cpu:1"); throws loom::not_found.
  [[nodiscard]] device& find_device(std::string_view name) const;
  /// `t` in host memory: `t` itself when its memory is host-accessible (or it is undefined),
  /// else a copy made by the session's device that holds it, once that device's work on it
  /// is done. Fetched values stay where they were made (a GPU's on the GPU): read them on the
  /// host through this. Throws loom::not_found when no device of the session holds `t`.
  [[nodiscard]] tensor host_value(const tensor& t) const;
  [[nodiscard]] variable_store& variables() noexcept;
  /// Plans made so far (one per signature).
  [[nodiscard]] std::size_t plan_count() const;

 private:
  void join_cluster();

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace loom
