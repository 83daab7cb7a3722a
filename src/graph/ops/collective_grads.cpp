// Gradients of the collective ops (collective_ops.cpp), each again a collective, so every
// rank's backward pass makes the same collectives in the same order (Note [collective
// order]):
// - all_reduce sum: every rank's x reaches every rank's y, so dx = the sum of every rank's
//   dy, all_reduce(dy, sum); avg likewise with the mean. max, min and prod are refused
//   (their gradient needs which rank won, or the other ranks' values).
// - all_gather: rank r's x is block r of every rank's y, so dx = block r of the sum of the
//   ranks' dy, reduce_scatter(dy, sum); reduce_scatter sum the reverse, all_gather(dy).
// - broadcast: declared without a gradient (the root's would be the sum of every rank's dy,
//   the others' zero; not written yet).
#include <fmt/format.h>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/collective.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;

std::string reduction_of(const gradient_context& c) {
  const auto r = c.attr<std::string>("reduction");
  if (r != "sum" && r != "avg") {
    throw invalid_argument(fmt::format("node '{}' ({} {}): no gradient (sum and avg have one)",
                                       c.forward().name, c.forward().op(), r));
  }
  return r;
}

}  // namespace

void register_collective_gradients(gradient_registry& r) {
  r.add("all_reduce", [](const gradient_context& c) -> grads {
    return {ops::all_reduce(c.grad(0), reduction_of(c), c.attr<std::string>("group"))};
  });
  r.add("all_gather", [](const gradient_context& c) -> grads {
    return {ops::reduce_scatter(c.grad(0), "sum", c.attr<std::int64_t>("group_size"),
                                c.attr<std::string>("group"))};
  });
  r.add("reduce_scatter", [](const gradient_context& c) -> grads {
    if (reduction_of(c) != "sum") {
      throw invalid_argument(fmt::format("node '{}' (reduce_scatter avg): no gradient (sum has one)",
                                         c.forward().name));
    }
    return {ops::all_gather(c.grad(0), c.attr<std::int64_t>("group_size"),
                            c.attr<std::string>("group"))};
  });
  r.add_none("broadcast");
}

}  // namespace loom
