// Test support for builders composed of several ops: run a builder over placeholders in a
// session (the composed graph, not one kernel).
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {

/// Adds placeholders x0, x1, ... of `ins`' dtypes and shapes to a fresh graph, calls
/// build(placeholders) -> output, and returns that output's value with `ins` fed (copied
/// to host memory: the session's own memory goes with it).
template <class F>
tensor run_builder(const std::vector<tensor>& ins, F&& build) {
  graph g;
  graph_builder b(g);
  std::vector<output> xs;
  std::vector<feed> feeds;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const std::string name = fmt::format("x{}", i);
    xs.push_back(ops::placeholder(b, name, ins[i].type(), ins[i].shape()));
    feeds.push_back({name, ins[i]});
  }
  const std::string fetch = build(xs).name();
  session s(std::move(g));
  const tensor y = s.run(feeds, {fetch})[0];
  return memory::contiguous_copy(y, memory::host_resource::instance(), device_id{});
}

}  // namespace loom::testing
