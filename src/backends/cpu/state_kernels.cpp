// CPU kernels of the state ops: placeholder (fed by the executor, never computed), const,
// variable, assign, assign_add, assign_sub, identity, no_op, and the transfer ops.
#include <cstring>
#include <mutex>

#include "cpu_kernels.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cpu {
namespace {

constexpr device_type cpu = device_type::cpu;

std::vector<dtype> all_types() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32,
          dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
}

// A placeholder's (or a plan's _arg's) value comes from the feeds; the executor never runs
// this kernel unless the feed is missing.
class placeholder_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    ctx.fail("placeholder '{}' needs a feed ({}{})", ctx.node().name,
             to_string(ctx.node().attr<dtype>("dtype")),
             to_string(ctx.node().attr<shape>("shape")));
  }
};

// The value is copied to the device once, when the kernel is made.
class const_kernel final : public op_kernel {
 public:
  explicit const_kernel(const kernel_construction& c) : op_kernel(c) {
    const tensor v = c.attr<tensor>("value");
    value_ = v.device() == c.device().id() && v.is_contiguous() ? v : c.device().copy_from_host(v);
  }
  void compute(kernel_context& ctx) override { ctx.set_output(0, value_); }

 private:
  tensor value_;
};

class variable_kernel final : public op_kernel {
 public:
  explicit variable_kernel(const kernel_construction& c)
      : op_kernel(c), initial_(c.attr<tensor>("initial_value")) {}
  void compute(kernel_context& ctx) override {
    auto& var = ctx.variables().get(ctx.node().name);
    std::lock_guard lock(var.mutex);
    if (!var.value.defined()) {
      if (!initial_.defined()) {
        ctx.fail("variable '{}' is read before it is assigned (it has no initial value)",
                 ctx.node().name);
      }
      var.value = ctx.device().copy_from_host(initial_);
    }
    ctx.set_output(0, var.value);
  }

 private:
  tensor initial_;
};

enum class update { set, add, sub };

template <class T>
void apply(update u, T* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      const float a = static_cast<float>(dst[i]);
      const float b = static_cast<float>(src[i]);
      dst[i] = T(u == update::add ? a + b : a - b);
    } else if constexpr (!std::is_same_v<T, bool>) {
      dst[i] = static_cast<T>(u == update::add ? dst[i] + src[i] : dst[i] - src[i]);
    }
  }
}

// Finds the variable: assign names it; the updates read it as input 0.
std::string variable_name_of(const kernel_construction& c) {
  if (c.node().op() == "assign") return c.attr<std::string>("variable");
  if (c.graph() == nullptr) c.fail("an update needs the graph to find its variable");
  const node& src = c.graph()->at(c.node().inputs.at(0).node);
  if (src.op() != "variable") {
    c.fail("input 0 must come from a variable, not from " + src.describe());
  }
  return src.name;
}

template <update U>
class update_kernel final : public op_kernel {
 public:
  explicit update_kernel(const kernel_construction& c)
      : op_kernel(c), variable_(variable_name_of(c)) {
    const loom::node* v = c.graph()->find(variable_);
    if (v == nullptr || v->op() != "variable") {
      c.fail("it names variable '" + variable_ + "', which is not a variable of the graph");
    }
    shape_ = v->attr<shape>("shape");
  }
  void compute(kernel_context& ctx) override {
    auto& var = ctx.variables().get(variable_);
    constexpr std::size_t value_input = U == update::set ? 0 : 1;
    const tensor& value = ctx.input(value_input);
    std::lock_guard lock(var.mutex);
    if (U != update::set && !var.value.defined()) {
      ctx.fail("variable '{}' is updated before it is assigned", variable_);
    }
    if (value.shape() != shape_) {
      ctx.fail("value {} does not fit variable '{}' of shape {}", value.describe(), variable_,
               to_string(shape_));
    }
    // The variable's own buffer is updated in place when no read still holds it (the value
    // read as input 0 by this node is dropped first); otherwise the variable gets a new one.
    if constexpr (U != update::set) (void)ctx.take_input(0);
    const bool writable = var.value.defined() && var.value.buf()->writable_in_place() &&
                          var.value.shape() == value.shape();
    if (U == update::set) {
      if (!writable) {
        var.value = memory::allocate_tensor(ctx.device().allocator(), ctx.device().id(),
                                            value.type(), value.shape());
      }
      copy_to_dense(value, var.value.raw_data());
    } else {
      if (!writable) {
        tensor fresh = memory::contiguous_copy(var.value, ctx.device().allocator(), ctx.device().id());
        var.value = std::move(fresh);
      }
      const tensor src = ctx.input_contiguous(value_input);
      visit_dtype(value.type(), [&](auto tag) {
        using T = decltype(tag);
        apply<T>(U, var.value.template data<T>(), src.template data<T>(), src.num_elements());
      });
    }
    ctx.set_output(0, var.value);
  }

 private:
  std::string variable_;
  shape shape_;
};

class identity_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override { ctx.set_output(0, ctx.input(0)); }
};

class no_op_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& /*ctx*/) override {}
};

// The copy happens on the receiving side: the tensor, wherever it lives, becomes a new
// buffer from the receiving device's allocator.
class recv_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    if (in.device() == ctx.device().id()) {
      ctx.set_output(0, in);
      return;
    }
    ctx.set_output(0, ctx.device().copy_from_host(in));
  }
  bool is_cheap() const noexcept override { return false; }
};

}  // namespace

void register_state_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types(), "dtype");
  r.add(make_kernel_def<placeholder_kernel>("placeholder", cpu, any));
  // A plan's fed values (Note [fed values in rewritten graphs]): filled by the executor,
  // never computed; a kernel so that placement can weigh them like placeholders.
  r.add(make_kernel_def<placeholder_kernel>("_arg", cpu, any));
  r.add(make_kernel_def<const_kernel>("const", cpu, any));
  r.add(make_kernel_def<variable_kernel>("variable", cpu, any));
  r.add(make_kernel_def<update_kernel<update::set>>("assign", cpu, type_constraint(all_types())));
  const auto numeric = type_constraint(
      {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64});
  r.add(make_kernel_def<update_kernel<update::add>>("assign_add", cpu, numeric));
  r.add(make_kernel_def<update_kernel<update::sub>>("assign_sub", cpu, numeric));
  r.add(make_kernel_def<identity_kernel>("identity", cpu, type_constraint(all_types())));
  r.add(make_kernel_def<no_op_kernel>("no_op", cpu));
}

void register_transfer_kernels(kernel_registry& r) {
  r.add(make_kernel_def<identity_kernel>("_send", cpu, type_constraint(all_types())));
  r.add(make_kernel_def<recv_kernel>("_recv", cpu, type_constraint(all_types())));
}

}  // namespace loom::cpu
