// The plan of one (feeds, fetches, targets) signature: the pruned nodes, placed (placer.cpp)
// and partitioned (partitioner.hpp), with their kernels. Immutable once built; shared by
// concurrent runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/device/device.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/op_kernel.hpp"
#include "loom/passes/pass.hpp"
#include "loom/runtime/session.hpp"

namespace loom::runtime {

/// Hashes an endpoint, for maps keyed by the signature's endpoints.
struct endpoint_hash {
  std::size_t operator()(endpoint e) const noexcept {
    return std::hash<std::int64_t>()((static_cast<std::int64_t>(e.node) << 20) ^ e.index);
  }
};

/// One node of the plan: a graph node or a _send/_recv the partitioner added.
struct exec_node {
  const node* n = nullptr;
  device* dev = nullptr;
  std::unique_ptr<op_kernel> kernel;
  /// Output slot read by each input.
  std::vector<std::int32_t> input_slots;
  /// First output slot (outputs are consecutive).
  std::int32_t first_output = 0;
  /// Plan nodes that wait for this one, once per edge (data or control).
  std::vector<std::int32_t> consumers;
  /// Edges this node waits for.
  std::int32_t pending = 0;
  bool cheap = false;
  /// The kernel uses all of the device's threads (op_kernel::uses_all_threads).
  bool whole_device = false;
  /// Runs on the thread that made it ready, never handed to its device's pool: its device
  /// runs whole_device kernels in this plan (Note [one team per device] in
  /// src/runtime/partitioner.cpp).
  bool keeps_thread = false;
  /// The kernel waits for something outside the process (op_kernel::blocks).
  bool blocking = false;
  /// A constant's value, made once with the plan (Note [constants bound with the plan] in
  /// partitioner.cpp): the node never runs, every run finds the value in its output slot.
  tensor constant;
};

/// The per-run memory of a plan (slots and counters), kept between runs so that a run
/// neither allocates nor first-touches memory proportional to the plan's size. Between
/// runs every slot is empty.
struct run_buffers {
  std::vector<tensor> slots;
  std::unique_ptr<std::atomic<std::int32_t>[]> pending;
  std::unique_ptr<std::atomic<std::int32_t>[]> readers;
};

/// run_buffers not in use, shared by the concurrent runs of one plan (each run takes its
/// own). Thread-safe.
class run_buffer_cache {
 public:
  std::unique_ptr<run_buffers> take() {
    const std::lock_guard lock(mutex_);
    if (free_.empty()) return nullptr;
    auto b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  // Called from run_state's destructor: lets nothing escape (with no memory to keep `b`,
  // it is freed instead).
  void give_back(std::unique_ptr<run_buffers> b) noexcept {
    const std::lock_guard lock(mutex_);
    // As many as runs have overlapped, at most a few: more would only hold memory.
    if (free_.size() < max_kept) {
      try {
        free_.push_back(std::move(b));
      } catch (...) {
        // push_back's strong guarantee: b still holds the buffers, freed on return.
      }
    }
  }

 private:
  static constexpr std::size_t max_kept = 8;
  std::mutex mutex_;
  std::vector<std::unique_ptr<run_buffers>> free_;
};

struct plan {
  /// The graph the plan runs: what the signature needs of the session's graph, rewritten
  /// by the passes (loom/passes/pass_manager.hpp). exec_node::n points into it.
  std::unique_ptr<graph> g;
  /// What the passes rewrote and refused, in order.
  std::vector<passes::pass_record> pass_log;
  std::vector<exec_node> nodes;
  /// Nodes ready at the start (nothing to wait for).
  std::vector<std::int32_t> roots;
  /// Constants bound with the plan (exec_node::constant) whose value somebody reads, and
  /// how many nodes the plan runs (the others).
  std::vector<std::int32_t> bound_constants;
  std::int32_t nodes_to_run = 0;
  std::int32_t slot_count = 0;
  /// For each slot: how many inputs read it (the last reader may take it).
  std::vector<std::int32_t> slot_readers;
  /// Feeds: the slot each one fills, in the order of the signature's feed names.
  std::vector<std::int32_t> feed_slots;
  std::vector<endpoint> feed_endpoints;
  /// Fetches: the slot each one reads.
  std::vector<std::int32_t> fetch_slots;
  /// Why each node went where it did.
  std::vector<placement_decision> placement;
  /// _send/_recv nodes live here (the graph's nodes live in the session's graph).
  std::deque<node> transfer_nodes;
  /// Per-run memory for the executor (mutable: a plan is otherwise immutable once built).
  mutable run_buffer_cache buffers;
};

/// Another process's device, as this one's placer sees it (session_options::cluster): its
/// name ("/job:worker/task:1/device:CPU:0"), id and description. It runs nothing: the nodes
/// placed on it run in its own process.
class remote_device final : public device {
 public:
  remote_device(std::int32_t task, device_id id, std::string description);
  memory::memory_resource& allocator() override;
  [[nodiscard]] std::int32_t task() const noexcept { return task_; }

 private:
  std::int32_t task_;
};

/// The processes a session places across (session_options::cluster; Note [tasks] in
/// src/runtime/partitioner.cpp). One process: task 0 of 1, nothing remote.
struct cluster_view {
  std::int32_t task = 0;  // this process
  std::int32_t tasks = 1;
  /// The communicator's group name for the transfers between tasks (_send_task, _recv_task).
  std::string group;
  /// For each task, stand-ins for its devices (empty for this task).
  std::vector<std::vector<std::unique_ptr<device>>> remote;
  /// Place every node here, whatever task it asks for: constant folding's plans, which
  /// every task runs for itself, on the same constants.
  bool all_here = false;
};

/// Decides a device for every node in `needed` (ids of g), in topological order.
/// Returns one device per node id (nullptr for nodes not needed) and records why. A node
/// whose request names another task of `cluster` ("/job:worker/task:1/...") gets one of
/// that task's remote_devices; `task_of` gets, per node id, the task a request pinned it to,
/// or -1 for a node that every task runs itself.
std::vector<device*> place_nodes(const graph& g, const std::vector<bool>& needed,
                                 const std::vector<std::unique_ptr<device>>& devices,
                                 const session_options& options, const cluster_view& cluster,
                                 std::vector<std::int32_t>& task_of,
                                 std::vector<placement_decision>& decisions);

}  // namespace loom::runtime
