// Collective ops: all_reduce, broadcast, all_gather, reduce_scatter between the processes of
// a communicator (loom::distributed, docs/distributed.md), as graph nodes that the executor
// runs as dataflow like any other.
//
// Every rank builds the same graph and runs the same fetches, so every rank meets the same
// collectives; MPI needs them started in the same order everywhere, which the dataflow
// executor alone would not keep (two ready collectives may start in either order). So the
// graph gives each collective node a control input from its previous collective node, however
// the node is added (these builders, Python's Graph.op, a JSON graph): the collectives of a
// graph run one after another, in the order they were added, on every rank (Note
// [collective order] in src/graph/graph.cpp). Collectives are stateful:
// no pass folds, merges or drops them.
//
// `group` names a communicator registered with loom::distributed::register_group ("world",
// every process, always exists). `reduction` is "sum", "avg", "max", "min" or "prod".
#pragma once

#include <cstdint>
#include <string>

#include "loom/graph/builder.hpp"

namespace loom::ops {

/// op over every rank's x: x's shape and dtype.
output all_reduce(output x, const std::string& reduction = "sum",
                  const std::string& group = "world", const node_options& o = {});
/// Rank `root`'s x on every rank.
output broadcast(output x, std::int64_t root = 0, const std::string& group = "world",
                 const node_options& o = {});
/// The ranks' x concatenated along dimension 0 in rank order. `group_size` (the number of
/// ranks; 0 when unknown while building) makes dimension 0 of the output known.
output all_gather(output x, std::int64_t group_size = 0, const std::string& group = "world",
                  const node_options& o = {});
/// This rank's block of op over every rank's x, cut along dimension 0 into group_size
/// blocks. `group_size` as all_gather's.
output reduce_scatter(output x, const std::string& reduction = "sum", std::int64_t group_size = 0,
                      const std::string& group = "world", const node_options& o = {});

}  // namespace loom::ops
