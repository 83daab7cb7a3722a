// convert_sync_batch_norm (loom/passes/sync_batch_norm.hpp).
//
// Note [sync batch norm conversion]
// The conversion rebuilds the graph rather than editing a plan's copy, as the other passes
// do, for the collectives' sake: every rank must start a graph's collectives in one order,
// which the graph fixes as the order they were added (Note [collective order] in
// src/graph/graph.cpp). Added by a pass after the gradients' all_reduces, a forward
// all_gather would wait for them while they wait for it. Re-adding the nodes in their
// original order puts each layer's all_gather where its batch_norm_train was: before every
// collective of the backward pass, which is built afterwards from the converted graph.
#include "loom/passes/sync_batch_norm.hpp"

#include <fmt/format.h>

#include "loom/core/error.hpp"

namespace loom::passes {

sync_batch_norm_conversion convert_sync_batch_norm(graph& g, const std::string& group) {
  sync_batch_norm_conversion out;
  out.new_id.assign(g.num_nodes(), -1);
  // A batch_norm_train whose statistics a batch_norm_train_grad reads: gradients built first.
  for (const node& n : g.nodes()) {
    if (n.op() != "batch_norm_train_grad") continue;
    for (std::size_t i = 3; i < 5 && i < n.inputs.size(); ++i) {
      const node& src = g.at(n.inputs[i].node);
      if (src.op() == "batch_norm_train") {
        throw invalid_argument(fmt::format(
            "convert_sync_batch_norm: the gradient of batch_norm_train '{}' ('{}') is already "
            "built and would use this rank's statistics alone: convert the model before "
            "building its gradients",
            src.name, n.name));
      }
    }
  }
  graph rebuilt(g.ops());
  const auto map = [&](endpoint e) {
    return endpoint{out.new_id[static_cast<std::size_t>(e.node)], e.index};
  };
  for (const node& n : g.nodes()) {
    node_spec spec{.name = n.name,
                   .op = n.op(),
                   .inputs = {},
                   .attrs = n.attrs,
                   .device = n.requested_device,
                   .control_inputs = {}};
    for (endpoint e : n.inputs) spec.inputs.push_back(map(e));
    for (node_id c : n.control_inputs) {
      spec.control_inputs.push_back(out.new_id[static_cast<std::size_t>(c)]);
    }
    if (n.op() == "batch_norm_train") {
      const endpoint x = spec.inputs.at(0);
      const std::string format = n.attr<std::string>("data_format");
      const node& stats = rebuilt.add_node(node_spec{.name = n.name + "/stats",
                                                     .op = "batch_norm_stats",
                                                     .inputs = {x},
                                                     .attrs = {{"data_format", format}},
                                                     .device = n.requested_device,
                                                     .control_inputs = {}});
      const node& gather =
          rebuilt.add_node(node_spec{.name = n.name + "/gather",
                                     .op = "all_gather",
                                     .inputs = {{stats.id, 0}},
                                     .attrs = {{"group", group}},
                                     .device = n.requested_device,
                                     .control_inputs = {}});
      spec.op = "sync_batch_norm";
      spec.inputs.push_back({gather.id, 0});
      spec.attrs.insert_or_assign("group", attr_value(group));
      out.records.push_back(pass_record{
          .pass = "sync_batch_norm",
          .what = pass_record::kind::rewrite,
          .nodes = {n.name},
          .result = fmt::format("sync_batch_norm '{}' (statistics of every rank of '{}': "
                                "'{}', '{}')",
                                n.name, group, stats.name, gather.name),
          .reason = {}});
    }
    out.new_id[static_cast<std::size_t>(n.id)] = rebuilt.add_node(std::move(spec)).id;
  }
  g = std::move(rebuilt);
  return out;
}

}  // namespace loom::passes
