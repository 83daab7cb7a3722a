// Symbolic gradients: the backward graph built from the forward one.
//
//   auto loss = ops::reduce_mean(xent.loss);
//   auto grads = gradients(loss, {w1, b1, w2, b2});   // outputs in the same graph
//
// Every differentiable op has a gradient function, registered beside the op (its family's
// src/graph/ops/<family>_grads.cpp, listed once in register_standard_gradients). Given the
// forward node and the gradients flowing into its outputs, it adds the nodes computing the
// gradients of its inputs. `gradients` walks the nodes between the variables and the loss in
// reverse topological order, sums the gradients of outputs read more than once (fan-out),
// and reduces the gradient of a broadcast input back to the input's shape.
//
// Shapes: gradient functions use the shapes inference gave the forward nodes, so every
// tensor on a path from a variable to the loss must have a fully defined shape (feed
// placeholders with fixed batch sizes); otherwise `gradients` fails naming the node.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/graph/builder.hpp"

namespace loom {

/// What a gradient function sees.
class gradient_context {
 public:
  gradient_context(graph_builder& b, const node& forward, std::vector<std::optional<output>> grads)
      : b_(b), forward_(forward), grads_(std::move(grads)) {}

  [[nodiscard]] graph_builder& builder() const noexcept { return b_; }
  [[nodiscard]] const node& forward() const noexcept { return forward_; }
  /// The forward node's input i and output i, as outputs of the graph.
  [[nodiscard]] output input(std::size_t i) const;
  [[nodiscard]] output output_of(std::size_t i) const;
  [[nodiscard]] std::size_t num_inputs() const noexcept { return forward_.inputs.size(); }
  /// The (fully defined) shape of input i / output i; throws naming the node otherwise.
  [[nodiscard]] const shape& input_shape(std::size_t i) const;
  [[nodiscard]] const shape& output_shape(std::size_t i) const;
  [[nodiscard]] dtype input_type(std::size_t i) const;
  /// True when the loss depends on output i.
  [[nodiscard]] bool has_grad(std::size_t i) const noexcept {
    return i < grads_.size() && grads_[i].has_value();
  }
  /// d(loss)/d(output i); zeros of the output's shape when the loss does not depend on it.
  [[nodiscard]] output grad(std::size_t i = 0) const;
  template <class T>
  [[nodiscard]] T attr(std::string_view name) const {
    return forward_.attr<T>(name);
  }

  /// A scalar constant of input i's dtype (for the arithmetic of gradient formulas).
  [[nodiscard]] output scalar(double value, dtype t) const;
  /// `g` (the gradient of a broadcast result) summed back to input i's shape.
  [[nodiscard]] output unbroadcast(output g, std::size_t i) const;
  /// Throws loom::invalid_argument naming the forward node.
  [[noreturn]] void fail(const std::string& message) const;

 private:
  graph_builder& b_;
  const node& forward_;
  std::vector<std::optional<output>> grads_;
};

/// One entry per forward input: its gradient, or nullopt when the input is not
/// differentiable (indices, labels, conditions) or the op passes nothing back to it.
using gradient_fn = std::function<std::vector<std::optional<output>>(const gradient_context&)>;

class gradient_registry {
 public:
  /// The process's registry, filled by register_standard_gradients on first use.
  static gradient_registry& global();

  /// Registers the gradient of `op`. Throws loom::invalid_argument when one exists.
  void add(std::string op, gradient_fn fn);
  /// Declares `op` non-differentiable: gradients never flow through it (comparisons,
  /// argmax, random numbers ...). A path through an op with neither is an error.
  void add_none(std::string op);
  /// The op's gradient function; nullptr for a non-differentiable op; throws
  /// loom::not_found when the op has neither.
  [[nodiscard]] const gradient_fn* find(std::string_view op) const;
  [[nodiscard]] bool knows(std::string_view op) const;

 private:
  std::unordered_map<std::string, std::optional<gradient_fn>> fns_;
};

/// Registers the gradients of loom's standard ops (each family from its own function).
void register_standard_gradients(gradient_registry& r);
void register_elementwise_gradients(gradient_registry& r);
void register_nn_gradients(gradient_registry& r);
void register_reduction_gradients(gradient_registry& r);
void register_normalization_gradients(gradient_registry& r);
void register_array_gradients(gradient_registry& r);
void register_state_gradients(gradient_registry& r);
void register_fused_gradients(gradient_registry& r);
void register_collective_gradients(gradient_registry& r);

/// Adds to `loss`'s graph the gradients of `loss` with respect to each of `xs`, and returns
/// them in order. A non-scalar loss is seeded with ones (the gradient of its sum), or with
/// `seed` (loss's shape and dtype) when given. The gradient of an x the loss does not
/// depend on is zeros of x's shape. Throws loom::invalid_argument naming the node for a
/// non-float loss or x, an op without a gradient on the path, or an unknown shape.
std::vector<output> gradients(output loss, const std::vector<output>& xs,
                              std::optional<output> seed = std::nullopt,
                              const gradient_registry& registry = gradient_registry::global());

}  // namespace loom
