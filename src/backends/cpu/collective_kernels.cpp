// CPU kernels of the collective ops (include/loom/graph/ops/collective.hpp): the group's
// communicator (loom::distributed) moves the bytes; the kernel starts the operation and
// waits for it, so the node's output is the collective's result when the node finishes.
// The kernels block (op_kernel::blocks): the executor runs them on threads of their own, so
// the device's threads compute while the ranks exchange (Note [blocking nodes] in
// src/runtime/executor.cpp).
#include <fmt/format.h>

#include <cstring>

#include "cpu_kernels.hpp"
#include "loom/distributed/communicator.hpp"

namespace loom::cpu {
namespace {

using distributed::reduce_op;

class collective_kernel : public op_kernel {
 public:
  explicit collective_kernel(const kernel_construction& c)
      : op_kernel(c), group_(c.attr<std::string>("group")) {}
  [[nodiscard]] bool blocks() const noexcept override { return true; }

 protected:
  // The group's communicator; the node fails naming the group when there is none.
  [[nodiscard]] std::shared_ptr<distributed::communicator> comm(kernel_context& ctx) const {
    try {
      return distributed::group(group_);
    } catch (const error& e) {
      ctx.fail("{}", e.what());
    }
  }

  // Starts the operation through `start` and waits for it. A loom::distributed_error (which
  // names the rank) goes out as it is: the executor adds the node to its message.
  template <class F>
  static void run(kernel_context& ctx, F&& start) {
    try {
      start()->wait();
    } catch (const distributed_error&) {
      throw;
    } catch (const error& e) {
      ctx.fail("{}", e.what());
    }
  }

  std::string group_;
};

class all_reduce_kernel final : public collective_kernel {
 public:
  explicit all_reduce_kernel(const kernel_construction& c)
      : collective_kernel(c),
        op_(distributed::reduce_op_from_string(c.attr<std::string>("reduction"))) {}
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    const tensor x = ctx.input_contiguous(0);
    tensor& y = ctx.allocate_output(0, x.shape());
    run(ctx, [&] { return c->all_reduce(x, y, op_); });
  }

 private:
  reduce_op op_;
};

class broadcast_kernel final : public collective_kernel {
 public:
  explicit broadcast_kernel(const kernel_construction& c)
      : collective_kernel(c), root_(static_cast<int>(c.attr<std::int64_t>("root"))) {}
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    const tensor x = ctx.input_contiguous(0);
    tensor& y = ctx.allocate_output(0, x.shape());
    copy_into(x, y);
    run(ctx, [&] { return c->broadcast(y, root_); });
  }

 private:
  // The root sends its input; the others' outputs are overwritten.
  static void copy_into(const tensor& x, const tensor& y) {
    if (x.nbytes() != 0) std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
  }
  int root_;
};

// all_gather and reduce_scatter: the output's dimension 0 is the input's times or over the
// group's size, checked against the node's group_size when it gave one.
class blocks_kernel : public collective_kernel {
 public:
  explicit blocks_kernel(const kernel_construction& c)
      : collective_kernel(c), group_size_(c.attr<std::int64_t>("group_size")) {}

 protected:
  void check_size(kernel_context& ctx, const distributed::communicator& c) const {
    if (group_size_ != 0 && group_size_ != c.size()) {
      ctx.fail("the node was built for {} ranks, but group '{}' has {}", group_size_, group_, c.size());
    }
  }
  std::int64_t group_size_;
};

class all_gather_kernel final : public blocks_kernel {
 public:
  using blocks_kernel::blocks_kernel;
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    check_size(ctx, *c);
    const tensor x = ctx.input_contiguous(0);
    if (x.rank() == 0) ctx.fail("all_gather needs a tensor of rank 1 or more, got {}", x.describe());
    shape s = x.shape();
    s[0] *= c->size();
    tensor& y = ctx.allocate_output(0, s);
    run(ctx, [&] { return c->all_gather(x, y); });
  }
};

class reduce_scatter_kernel final : public blocks_kernel {
 public:
  explicit reduce_scatter_kernel(const kernel_construction& c)
      : blocks_kernel(c),
        op_(distributed::reduce_op_from_string(c.attr<std::string>("reduction"))) {}
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    check_size(ctx, *c);
    const tensor x = ctx.input_contiguous(0);
    if (x.rank() == 0 || x.dim(0) % c->size() != 0) {
      ctx.fail("reduce_scatter needs dimension 0 of {} to be a multiple of the group's {} ranks",
               x.describe(), c->size());
    }
    shape s = x.shape();
    s[0] /= c->size();
    tensor& y = ctx.allocate_output(0, s);
    run(ctx, [&] { return c->reduce_scatter(x, y, op_); });
  }

 private:
  reduce_op op_;
};

}  // namespace

void register_collective_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(make_kernel_def<all_reduce_kernel>("all_reduce", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<broadcast_kernel>("broadcast", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<all_gather_kernel>("all_gather", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<reduce_scatter_kernel>("reduce_scatter", device_type::cpu, any, "mpi"));
}

}  // namespace loom::cpu
