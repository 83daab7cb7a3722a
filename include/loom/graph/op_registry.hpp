// op_registry: every op loom knows, by name.
//
// The process's registry is made on first use by `register_standard_ops`, one explicit
// function listing each family of ops (no static initializers); a program may add ops of
// its own at any time. Lookups are thread-safe; so is adding.
#pragma once

#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/graph/op_def.hpp"

namespace loom {

class op_registry {
 public:
  /// The process's registry, with the standard ops registered.
  static op_registry& global();

  /// Adds `def`. Throws loom::invalid_argument when an op of that name exists, or when the
  /// definition is inconsistent (an argument naming an undeclared attribute, ...).
  void add(op_def def);
  /// The op named `name`, or nullptr.
  [[nodiscard]] const op_def* find(std::string_view name) const;
  /// The op named `name`; throws loom::not_found naming it (and the closest known names).
  [[nodiscard]] const op_def& get(std::string_view name) const;
  /// Every op's name, sorted.
  [[nodiscard]] std::vector<std::string> names() const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<op_def>> ops_;
};

/// Registers loom's standard ops (each family from its own function, listed here once).
void register_standard_ops(op_registry& registry);

// The families, each defined in src/graph/ops/<family>.cpp.
void register_state_ops(op_registry& registry);        // placeholder, const, variable, assign, identity
void register_elementwise_ops(op_registry& registry);  // unary, binary, where, cast, fill, range, random
void register_nn_ops(op_registry& registry);           // matmul, conv2d, pooling, bias_add
void register_reduction_ops(op_registry& registry);    // reductions, softmax, xent, argmax
void register_normalization_ops(op_registry& registry);  // layer_norm, layer_norm_grad
void register_array_ops(op_registry& registry);        // reshape, transpose, concat, split, slice, gather, one_hot
void register_transfer_ops(op_registry& registry);     // _send / _recv (inserted by the partitioner)
void register_optimizer_ops(op_registry& registry);    // apply_sgd/adam/adamw, fused_sgd/adam/adamw
void register_fused_ops(op_registry& registry);  // fused_elementwise
// all_reduce, broadcast, all_gather, reduce_scatter (src/graph/ops/collective_ops.cpp)
void register_collective_ops(op_registry& registry);

}  // namespace loom
