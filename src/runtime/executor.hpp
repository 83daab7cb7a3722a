// The executor: runs a plan as dataflow. See executor.cpp.
#pragma once

#include <atomic>
#include <vector>

#include "loom/kernel/variable_store.hpp"
#include "loom/runtime/run_metadata.hpp"
#include "plan.hpp"

namespace loom::runtime {

/// The flags that cancel a run: the session's (session::cancel) and the caller's.
struct cancel_flags {
  const std::atomic<bool>* session = nullptr;
  const std::atomic<bool>* caller = nullptr;
  [[nodiscard]] bool raised() const noexcept {
    return (session != nullptr && session->load(std::memory_order_relaxed)) ||
           (caller != nullptr && caller->load(std::memory_order_relaxed));
  }
};

/// Runs `p` once with `feeds` (one per p.feed_slots, already validated) and returns the
/// fetched tensors. Throws the first error a node raised (node_error, out_of_memory,
/// cancelled_error); every intermediate buffer is released before it returns or throws.
/// The cancel flags (either may be null) are polled before each node; `trace` (may be null) receives one
/// record per node.
std::vector<tensor> execute_plan(const plan& p, std::vector<tensor> feeds,
                                 variable_store& variables, cancel_flags cancel,
                                 run_metadata* trace);

}  // namespace loom::runtime
