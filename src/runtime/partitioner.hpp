// The partitioner: a placed graph cut into per-device partitions, with the copies between
// them (_send/_recv pairs), the slot numbering and the edges the executor counts. See
// partitioner.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "plan.hpp"

namespace loom::runtime {

/// A graph with a device for every node a signature needs: what the partitioner reads.
/// Every reference must outlive the call; the graph (and its nodes) must outlive the plan.
struct placed_graph {
  const graph& g;
  /// One per node id of g: whether the signature needs the node (passes::needed_nodes).
  const std::vector<bool>& needed;
  /// One per node id of g: the node's device (place_nodes); non-null for every needed node.
  const std::vector<device*>& placement;
  /// Feeds, fetches and targets, as endpoints and ids of g. A fed value lives in the
  /// caller's memory and fills its own slot.
  const passes::signature& sig;
  /// The device fed values are sent from to a consumer the CPU cannot reach (a GPU): the
  /// session's first CPU device, or null when it has none. Transfers between tasks run on it.
  device* host = nullptr;
  /// The processes of the session and, per node id, the task a request pinned the node to
  /// (-1: every task runs it); null for a session of one process (place_nodes).
  const cluster_view* cluster = nullptr;
  const std::vector<std::int32_t>* task_of = nullptr;
};

/// Cuts `in` into partitions, one per device, and fills `p`'s nodes (their kernels not yet
/// made), transfer_nodes, slot_count, slot_readers, feed_slots, fetch_slots, roots and
/// nodes_to_run (all of them: instantiate_kernels binds the constants);
/// leaves the rest of `p` alone (`p` holds no nodes before).
///
/// - Plan nodes: the needed graph nodes in id order, then the _send/_recv nodes in the order
///   their edges are met.
/// - Slots: feeds take the first ones, in signature order; then each plan node's outputs,
///   consecutive, in plan-node order.
/// - Copies: an input whose producer is on another device (or a feed read on a device the
///   CPU cannot reach, from `in.host`) reads the slot of a _recv on its own device, fed by a
///   _send on the source device; one pair per (slot, destination device), however many
///   nodes there read it. The pair is named "_send/<endpoint>_<k>" and "_recv/<endpoint>_<k>",
///   k the destination device's index; both have attribute T (the dtype), the _send
///   recv_device and the _recv send_device (the other device's name). Neither is a node of
///   the graph (id -1; they live in p.transfer_nodes) and each has one input slot.
/// - Tasks (Note [tasks] in partitioner.cpp): nodes pinned to another task are left out; a
///   value that crosses tasks leaves its task through a _send_task and arrives through a
///   _recv_task, both on `in.host`, tagged alike on every task.
/// - Edges: a node waits once per data input made by a plan node and once per control
///   input (control edges cross devices directly, through no copy); `consumers` lists each
///   wait on its producer. A slot's readers are the inputs that read it plus one per fetch.
void partition(const placed_graph& in, plan& p);

/// Makes each plan node's kernel for its device (kernel_registry::global()), with `g` the
/// graph the nodes belong to; an unknown kernel throws the registry's error.
void instantiate_kernels(plan& p, const graph& g);

/// One device's partition: the plan nodes placed on it, in plan order.
struct device_partition {
  device* dev = nullptr;
  std::vector<std::int32_t> nodes;
};

/// The partitions of `p`, in the order of `devices`, devices with no node left out.
std::vector<device_partition> partitions_of(const plan& p,
                                            const std::vector<std::unique_ptr<device>>& devices);

}  // namespace loom::runtime
