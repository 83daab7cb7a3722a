// graph_builder: the C++ API for writing graphs that read like the math.
//
//   graph g;
//   graph_builder b(g);
//   auto x = ops::placeholder(b, "x", dtype::f32, {64, 784});
//   auto w = ops::variable(b, "w", init_w);
//   auto h = ops::relu(ops::matmul(x, w) + b1, {.name = "h"});
//
// `output` is a handle to one output of a node; the free functions in loom::ops (graph/ops/
// *.hpp) add a node and return its outputs, and + - * / and unary - are the element-wise
// ops. Every function takes `node_options`: a name and a device request; a builder-wide
// device scope (`with_device`) applies to nodes that do not ask for one.
#pragma once

#include <string>
#include <vector>

#include "loom/graph/graph.hpp"

namespace loom {

class graph_builder;

/// Per-node options: a name (empty: derived from the op) and a device request.
struct node_options {
  std::string name;
  std::string device;
};

/// One output of a node in a builder's graph.
class output {
 public:
  output() = default;
  output(graph_builder* b, endpoint e) : builder_(b), endpoint_(e) {}

  [[nodiscard]] graph_builder& builder() const { return *builder_; }
  [[nodiscard]] endpoint ep() const noexcept { return endpoint_; }
  [[nodiscard]] const node& producer() const;
  [[nodiscard]] const tensor_type& type() const;
  [[nodiscard]] dtype dtype_of() const { return type().type; }
  /// "name" or "name:k": what session::run accepts as a fetch.
  [[nodiscard]] std::string name() const;
  [[nodiscard]] bool valid() const noexcept { return builder_ != nullptr; }

 private:
  graph_builder* builder_ = nullptr;
  endpoint endpoint_;
};

class graph_builder {
 public:
  explicit graph_builder(graph& g) : graph_(&g) {}

  [[nodiscard]] graph& g() const noexcept { return *graph_; }

  /// Adds one node and returns its outputs. Errors as graph::add_node.
  std::vector<output> add(std::string_view op, const std::vector<output>& inputs,
                          attr_map attrs = {}, const node_options& options = {});
  /// add() for single-output ops.
  output add1(std::string_view op, const std::vector<output>& inputs, attr_map attrs = {},
              const node_options& options = {});

  /// Nodes added while the returned guard lives ask for `device` unless they ask for
  /// another. Guards nest.
  class device_scope {
   public:
    device_scope(graph_builder& b, std::string device) : b_(b), saved_(std::move(b.device_)) {
      b_.device_ = std::move(device);
    }
    ~device_scope() { b_.device_ = std::move(saved_); }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

   private:
    graph_builder& b_;
    std::string saved_;
  };
  [[nodiscard]] device_scope with_device(std::string device) { return {*this, std::move(device)}; }

 private:
  graph* graph_;
  std::string device_;
};

}  // namespace loom
