// What the optimizer kernels of every device share: the node as they read it, their view of
// their variables (the parameters, graph variables, and the state each keeps in the
// session's variable_store under derived names, locked together for one step), and their
// checks of the gradients. Each backend makes the buffers writable and creates missing
// state its own way (src/backends/*/optimizer_kernels.cpp).
//
// Note [optimizer state]
// A parameter `w` (a `variable` node) has, created lazily on its first step:
//   w/momentum  SGD's momentum buffer (moment_dtype), only when momentum != 0; it starts as
//               the first step's gradient, as PyTorch's does;
//   w/adam_m, w/adam_v  Adam's moments (moment_dtype), zeros before the first step;
//   w/master    an f32 copy of an f16/bf16 parameter (master_weights), initialised from the
//               parameter; the update is computed on it and the parameter is its rounding.
// They are ordinary store variables, so checkpoints save them with the model. A step holds
// the mutexes of every variable it touches, taken in address order (so two steps over
// overlapping variables cannot deadlock), and writes each buffer in place when nothing else
// holds it, else into a copy (the update_kernel's copy-on-write in state_kernels.cpp).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/kernel/op_kernel.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::optim {

/// Which optimizer a kernel runs.
enum class algorithm { sgd, adam, adamw };

/// A parameter as a kernel sees it when it is made: its variable and the names of its state.
struct param_info {
  std::string name;  // the variable node
  dtype type = dtype::f32;
  loom::shape shape;
  std::string momentum;  // empty: none (SGD without momentum, Adam)
  std::string adam_m;    // empty: none (SGD)
  std::string adam_v;
  std::string master;  // empty: none (f32 parameters, or master_weights = false)
};

/// The param_info of variable node `var` for `algo`.
param_info describe_param(const node& var, algorithm algo, bool has_momentum, bool master_weights);

/// Locks mutexes in address order (duplicates once) and unlocks them on destruction.
class ordered_locks {
 public:
  explicit ordered_locks(std::vector<std::mutex*> mutexes);
  ~ordered_locks();
  ordered_locks(const ordered_locks&) = delete;
  ordered_locks& operator=(const ordered_locks&) = delete;

 private:
  std::vector<std::mutex*> held_;
};

/// The variables of one parameter, looked up (created when missing) in the store.
struct param_variables {
  variable_store::variable* param = nullptr;
  variable_store::variable* momentum = nullptr;
  variable_store::variable* adam_m = nullptr;
  variable_store::variable* adam_v = nullptr;
  variable_store::variable* master = nullptr;

  void add_mutexes(std::vector<std::mutex*>& out) const;
};
param_variables find_variables(variable_store& store, const param_info& p);

/// Under the locks, before anything is written: checks the parameter's value (defined,
/// dtype, shape) and its existing state (dtype and shape, naming the state variable when
/// they do not fit: a checkpoint of another configuration). Fails through ctx (node_error).
void validate_param(kernel_context& ctx, const param_info& p, const param_variables& v,
                    dtype moment_type);

/// An optimizer node as its kernels read it when they are made: the hyper-parameters, the
/// positions of its inputs and its parameters.
struct optimizer_node {
  algorithm algo = algorithm::adam;
  bool fused = false;
  double momentum = 0.0;  // SGD
  double dampening = 0.0;
  bool nesterov = false;
  double beta1 = 0.9;  // Adam, AdamW
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  dtype moment_type = dtype::f32;
  double max_grad_norm = 0.0;  // fused
  bool check_finite = true;
  std::size_t grads = 1;  // index of the first gradient input
  std::size_t lr = 2;
  std::size_t step = 3;
  std::size_t scale = 4;
  std::vector<param_info> params;

  /// Gradient k in messages: "grads[k] (input i)", or "grad (input 1)".
  [[nodiscard]] std::string grad_name(std::size_t k) const;
};

/// Reads the node's attributes and finds its parameters in the graph. Fails through c
/// (node_error) without the graph, or when a parameter is not a variable's output or
/// updates a variable an earlier one updates.
optimizer_node read_optimizer_node(const kernel_construction& c, algorithm algo, bool fused);

/// The node's gradients, dense (ctx.input_contiguous), each checked against its parameter
/// (optimizer_rules::check_grad); sizes[k] becomes parameter k's element count.
std::vector<tensor> dense_grads(kernel_context& ctx, const optimizer_node& n,
                                std::vector<std::int64_t>& sizes);

/// The variables of a step's parameters, held for the step: looked up (state created empty
/// when missing), locked in address order; then the kernel's reads of the parameters
/// (inputs 0 to N - 1) are dropped and every parameter is checked (validate_param).
class locked_params {
 public:
  locked_params(kernel_context& ctx, const optimizer_node& n);

  [[nodiscard]] param_variables& operator[](std::size_t k) { return vars_[k]; }
  [[nodiscard]] std::size_t size() const noexcept { return vars_.size(); }

 private:
  std::vector<param_variables> vars_;
  ordered_locks locks_;
};

}  // namespace loom::optim
