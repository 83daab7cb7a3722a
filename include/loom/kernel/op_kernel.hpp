// op_kernel: the code of one op for one kind of device; kernel_context: what a kernel sees
// while it runs.
//
// A kernel object is made once per node when a plan is built (its constructor reads the
// node's attributes, so compute() does not), and compute() runs once per step, possibly on
// several threads at once for concurrent runs: compute() must not modify the kernel.
//
// A kernel takes its inputs from the context, and gets its outputs' memory from its
// device through the context: allocate_output, or forward_input_or_allocate_output, which
// writes in place into an input's buffer when nothing else can see it (Note [buffer
// forwarding] in src/runtime/executor.cpp). Errors are reported by throwing: ctx.fail()
// throws a loom::node_error naming the node, op and device.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/device/device.hpp"
#include "loom/device/thread_pool.hpp"
#include "loom/graph/graph.hpp"

namespace loom {

class variable_store;

/// What a kernel's constructor sees.
class kernel_construction {
 public:
  kernel_construction(const loom::node& n, loom::device& d, const loom::graph* g = nullptr)
      : node_(n), device_(d), graph_(g) {}
  [[nodiscard]] const loom::node& node() const noexcept { return node_; }
  /// The graph the node is in (nullptr when the kernel is made outside a graph).
  [[nodiscard]] const loom::graph* graph() const noexcept { return graph_; }
  [[nodiscard]] loom::device& device() const noexcept { return device_; }
  template <class T>
  [[nodiscard]] T attr(std::string_view name) const {
    return node_.attr<T>(name);
  }
  /// Throws loom::node_error naming the node (for attribute values the kernel rejects).
  [[noreturn]] void fail(const std::string& message) const;

 private:
  const loom::node& node_;
  loom::device& device_;
  const loom::graph* graph_;
};

class kernel_context {
 public:
  /// Made by the executor: `inputs` and `outputs` are its slots for this node (outputs
  /// start undefined and must all be set by compute()).
  kernel_context(const loom::node& n, loom::device& d, std::span<tensor> inputs,
                 std::span<tensor> outputs, variable_store* variables,
                 const std::atomic<bool>* cancelled) noexcept
      : node_(n), device_(d), inputs_(inputs), outputs_(outputs), variables_(variables),
        cancelled_(cancelled) {}

  [[nodiscard]] const loom::node& node() const noexcept { return node_; }
  [[nodiscard]] loom::device& device() const noexcept { return device_; }

  [[nodiscard]] std::size_t num_inputs() const noexcept { return inputs_.size(); }
  [[nodiscard]] const tensor& input(std::size_t i) const { return inputs_[i]; }
  /// Moves input i out of the context (it reads as undefined afterwards), so that the
  /// kernel drops its reference early, as an update does with the variable it replaces.
  [[nodiscard]] tensor take_input(std::size_t i) noexcept { return std::move(inputs_[i]); }
  /// Input i, dense: the input itself when it is contiguous, else a copy on this device.
  [[nodiscard]] tensor input_contiguous(std::size_t i);

  [[nodiscard]] std::size_t num_outputs() const noexcept { return outputs_.size(); }
  /// A new contiguous output i of the node's declared dtype (or `t`) and shape `s`.
  tensor& allocate_output(std::size_t i, const shape& s);
  tensor& allocate_output(std::size_t i, dtype t, const shape& s);
  /// Output i of shape `s` in the buffer of input `input`, when that buffer is held by this
  /// node alone (Note [buffer forwarding]), is contiguous from its start, lives on this
  /// device and holds exactly the output's bytes; else nullptr and nothing changes. The
  /// kernel must read each input element before it writes the same position.
  [[nodiscard]] tensor* forward_input(std::size_t input, std::size_t i, const shape& s);
  /// forward_input(input, i, s), or a new output when the buffer cannot be reused.
  tensor& forward_input_or_allocate_output(std::size_t input, std::size_t i, const shape& s);
  /// Sets output i to an existing tensor (views, identity, variable reads).
  void set_output(std::size_t i, tensor t);
  [[nodiscard]] const tensor& output(std::size_t i) const { return outputs_[i]; }

  /// A scratch tensor on this device, freed when the last reference goes.
  [[nodiscard]] tensor allocate_temp(dtype t, const shape& s);

  /// The device's thread pool (nullptr on devices without one).
  [[nodiscard]] thread_pool* pool() const noexcept;
  /// Calls fn(begin, end) over [0, n) on the device's threads (see thread_pool::parallel_for);
  /// inline, with no std::function made, when the device has no pool or the work is too
  /// small to split.
  template <class F>
  void parallel_for(std::int64_t n, double cost_per_item, F&& fn) const {
    if (n <= 0) return;
    thread_pool* p = pool();
    if (p == nullptr || thread_pool::runs_inline(n, cost_per_item, p->size())) {
      fn(std::int64_t{0}, n);
      return;
    }
    p->parallel_for(n, cost_per_item, std::function<void(std::int64_t, std::int64_t)>(fn));
  }
  /// Threads a kernel may use (the device's pool size; 1 without a pool).
  [[nodiscard]] int num_threads() const noexcept;

  /// The session's variables. Throws loom::error when the kernel runs without a session.
  [[nodiscard]] variable_store& variables() const;
  /// True once the run was cancelled; long kernels may check it and stop early.
  [[nodiscard]] bool is_cancelled() const noexcept {
    return cancelled_ != nullptr && cancelled_->load(std::memory_order_relaxed);
  }

  /// Throws loom::node_error: "node 'name' (op) on /device:CPU:0: <message>".
  [[noreturn]] void fail(const std::string& message) const;
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    fail(fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  const loom::node& node_;
  loom::device& device_;
  std::span<tensor> inputs_;
  std::span<tensor> outputs_;
  variable_store* variables_;
  const std::atomic<bool>* cancelled_;
};

class op_kernel {
 public:
  explicit op_kernel(const kernel_construction& c) : node_(&c.node()) {}
  virtual ~op_kernel() = default;
  op_kernel(const op_kernel&) = delete;
  op_kernel& operator=(const op_kernel&) = delete;

  /// Runs the op once. Thread-safe with respect to other compute() calls on this kernel.
  virtual void compute(kernel_context& ctx) = 0;
  /// True for kernels so cheap that the executor runs them inline instead of scheduling
  /// them on the device's pool (shape ops, identities, small element-wise work).
  [[nodiscard]] virtual bool is_cheap() const noexcept { return node_->def->is_cheap; }
  /// True for kernels that run on all of the device's threads by themselves, outside loom's
  /// pool (oneDNN's primitives, on OpenMP threads). The executor runs them on the thread
  /// that made them ready, one at a time per device (device::whole_device_mutex), instead
  /// of beside other nodes on the pool: two of them at once would put twice as many
  /// threads as cores to work, and each would run at well under half speed.
  [[nodiscard]] virtual bool uses_all_threads() const noexcept { return false; }
  /// True for kernels that mostly wait for something outside the process (a collective
  /// that other ranks join). The executor runs them on a thread of their own, not on the
  /// device's pool, so the device's threads compute while they wait (Note [blocking nodes]
  /// in src/runtime/executor.cpp).
  [[nodiscard]] virtual bool blocks() const noexcept { return false; }
  [[nodiscard]] const loom::node& node() const noexcept { return *node_; }

 private:
  const loom::node* node_;
};

/// Formats "node 'name' (op) on <device>: <message>".
std::string describe_failure(const node& n, const device* d, const std::string& message);

}  // namespace loom
