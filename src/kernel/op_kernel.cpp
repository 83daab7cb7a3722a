#include "loom/kernel/op_kernel.hpp"

#include "loom/device/thread_pool.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom {

std::string describe_failure(const node& n, const device* d, const std::string& message) {
  if (d == nullptr) return fmt::format("node {}: {}", n.describe(), message);
  return fmt::format("node {} on {}: {}", n.describe(), d->name(), message);
}

void kernel_construction::fail(const std::string& message) const {
  throw node_error(describe_failure(node_, &device_, message), node_.name, node_.op());
}

void kernel_context::fail(const std::string& message) const {
  throw node_error(describe_failure(node_, &device_, message), node_.name, node_.op());
}

tensor kernel_context::input_contiguous(std::size_t i) {
  const tensor& in = inputs_[i];
  if (in.is_contiguous()) return in;
  return device_.contiguous_copy(in);
}

tensor& kernel_context::allocate_output(std::size_t i, const shape& s) {
  return allocate_output(i, node_.outputs[i].type, s);
}

tensor& kernel_context::allocate_output(std::size_t i, dtype t, const shape& s) {
  outputs_[i] = memory::allocate_tensor(device_.allocator(), device_.id(), t, s, device_.tensor_stream());
  return outputs_[i];
}

tensor* kernel_context::forward_input(std::size_t input, std::size_t i, const shape& s) {
  const tensor& in = inputs_[input];
  const dtype t = node_.outputs[i].type;
  if (!in.defined() || !in.buf()->writable_in_place() || in.offset() != 0 || !in.is_contiguous() ||
      size_of(in.type()) != size_of(t) || in.buf()->bytes() != in.nbytes() ||
      s.num_elements() != in.num_elements() || in.device() != device_.id()) {
    return nullptr;
  }
  if (in.type() == t && in.shape() == s) {
    // The same view: a copy of the tensor (the buffer stays this node's alone: the input
    // is released when the node finishes).
    outputs_[i] = in;
  } else {
    outputs_[i] = tensor(in.buf(), t, s);
  }
  return &outputs_[i];
}

tensor& kernel_context::forward_input_or_allocate_output(std::size_t input, std::size_t i,
                                                         const shape& s) {
  if (tensor* out = forward_input(input, i, s)) return *out;
  return allocate_output(i, node_.outputs[i].type, s);
}

void kernel_context::set_output(std::size_t i, tensor t) { outputs_[i] = std::move(t); }

tensor kernel_context::allocate_temp(dtype t, const shape& s) {
  return memory::allocate_tensor(device_.allocator(), device_.id(), t, s, device_.tensor_stream());
}

thread_pool* kernel_context::pool() const noexcept { return device_.pool(); }

int kernel_context::num_threads() const noexcept {
  const thread_pool* p = device_.pool();
  return p == nullptr ? 1 : p->size();
}

variable_store& kernel_context::variables() const {
  if (variables_ == nullptr) fail("this kernel needs a session's variables and runs without one");
  return *variables_;
}

}  // namespace loom
