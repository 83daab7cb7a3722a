// CPU kernels of the collective ops (include/loom/graph/ops/collective.hpp): the group's
// communicator (loom::distributed) moves the bytes; the kernel starts the operation and
// waits for it, so the node's output is the collective's result when the node finishes.
// The kernels block (op_kernel::blocks): the executor runs them on threads of their own, so
// the device's threads compute while the ranks exchange (Note [blocking nodes] in
// src/runtime/executor.cpp).
#include <fmt/format.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu_kernels.hpp"
#include "kernel/common/collective_shapes.hpp"
#include "loom/distributed/communicator.hpp"
#include "loom/memory/tensor_allocation.hpp"

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
      if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
        start();  // starts and waits itself
      } else {
        start()->wait();
      }
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
  // Also the GPU kernels' rule (kernel/common/collective_shapes.hpp).
  [[nodiscard]] shape output_shape(kernel_context& ctx, const tensor& x, bool gather,
                                   const distributed::communicator& c) const {
    return common::collective_blocks_shape(ctx, x, gather, group_size_, c.size(), group_);
  }
  std::int64_t group_size_;
};

class all_gather_kernel final : public blocks_kernel {
 public:
  using blocks_kernel::blocks_kernel;
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    const tensor x = ctx.input_contiguous(0);
    tensor& y = ctx.allocate_output(0, output_shape(ctx, x, true, *c));
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
    const tensor x = ctx.input_contiguous(0);
    tensor& y = ctx.allocate_output(0, output_shape(ctx, x, false, *c));
    run(ctx, [&] { return c->reduce_scatter(x, y, op_); });
  }

 private:
  reduce_op op_;
};

// Between the tasks of a session (Note [tasks] in src/runtime/partitioner.cpp): a header
// (dtype, rank, dimensions) and then the bytes, point to point, on tags 2 tag and 2 tag + 1.
constexpr std::int64_t max_header_rank = 32;
constexpr std::int64_t header_size = 2 + max_header_rank;

class send_task_kernel final : public collective_kernel {
 public:
  explicit send_task_kernel(const kernel_construction& c)
      : collective_kernel(c), to_(c.attr<std::vector<std::int64_t>>("to")),
        tag_(static_cast<int>(c.attr<std::int64_t>("tag"))) {}
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    const tensor x = ctx.input_contiguous(0);
    if (std::cmp_greater(x.rank(), max_header_rank)) {
      ctx.fail("{} has more than {} dimensions: it cannot cross tasks", x.describe(), max_header_rank);
    }
    tensor header = memory::host_tensor(dtype::i64, {header_size});
    auto h = header.span<std::int64_t>();
    std::fill(h.begin(), h.end(), 0);
    h[0] = static_cast<std::int64_t>(x.type());
    h[1] = static_cast<std::int64_t>(x.rank());
    for (std::size_t i = 0; i < x.rank(); ++i) h[2 + i] = x.dim(i);
    std::vector<std::unique_ptr<distributed::work>> sent;
    run(ctx, [&] {
      for (const std::int64_t t : to_) {
        sent.push_back(c->send(header, static_cast<int>(t), 2 * tag_));
        if (x.num_elements() > 0) sent.push_back(c->send(x, static_cast<int>(t), 2 * tag_ + 1));
      }
      for (auto& w : sent) w->wait();
    });
  }

 private:
  std::vector<std::int64_t> to_;
  int tag_;
};

class recv_task_kernel final : public collective_kernel {
 public:
  explicit recv_task_kernel(const kernel_construction& c)
      : collective_kernel(c), from_(static_cast<int>(c.attr<std::int64_t>("from"))),
        tag_(static_cast<int>(c.attr<std::int64_t>("tag"))), type_(c.attr<dtype>("T")) {}
  void compute(kernel_context& ctx) override {
    const auto c = comm(ctx);
    tensor header = memory::host_tensor(dtype::i64, {header_size});
    run(ctx, [&] { c->recv(header, from_, 2 * tag_)->wait(); });
    const auto h = header.span<std::int64_t>();
    if (h[0] != static_cast<std::int64_t>(type_) || h[1] < 0 || h[1] > max_header_rank) {
      ctx.fail("task {} sent a value that is not {} (a header of dtype code {}, rank {}): the "
               "tasks do not run the same graph",
               from_, to_string(type_), h[0], h[1]);
    }
    shape s;
    for (std::int64_t i = 0; i < h[1]; ++i) s.push_back(h[static_cast<std::size_t>(2 + i)]);
    tensor& y = ctx.allocate_output(0, s);
    if (y.num_elements() > 0) run(ctx, [&] { c->recv(y, from_, 2 * tag_ + 1)->wait(); });
  }

 private:
  int from_;
  int tag_;
  dtype type_;
};

}  // namespace

void register_collective_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(make_kernel_def<all_reduce_kernel>("all_reduce", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<broadcast_kernel>("broadcast", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<all_gather_kernel>("all_gather", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<reduce_scatter_kernel>("reduce_scatter", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<send_task_kernel>("_send_task", device_type::cpu, any, "mpi"));
  r.add(make_kernel_def<recv_task_kernel>("_recv_task", device_type::cpu, any, "mpi"));
}

}  // namespace loom::cpu
