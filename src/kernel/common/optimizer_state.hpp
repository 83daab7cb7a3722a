// The optimizer kernels' view of their variables: the parameters (graph variables) and the
// state each keeps in the session's variable_store under derived names, locked together
// and made writable for one step.
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

namespace loom::cpu::optim {

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

/// One parameter's buffers for one step, all writable by this step (resolved under the
/// locks by prepare_param).
struct param_buffers {
  void* param = nullptr;
  dtype param_type = dtype::f32;
  float* master = nullptr;  // nullptr: none
  const void* grad = nullptr;
  dtype grad_type = dtype::f32;
  void* state[2] = {nullptr, nullptr};  // adam: m, v; sgd: momentum (or none)
  dtype state_type = dtype::f32;
  std::int64_t size = 0;
  bool first = false;  // SGD: the momentum buffer is new this step
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

/// Under the locks, after validate_param: creates missing state (zeros; the master from
/// the parameter), makes every buffer writable (copy on write) and returns the pointers.
/// `grad` must be contiguous and of the parameter's shape.
param_buffers prepare_param(kernel_context& ctx, const param_info& p, const param_variables& v,
                            const tensor& grad, dtype moment_type);

}  // namespace loom::cpu::optim
