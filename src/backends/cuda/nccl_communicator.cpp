// NCCL communicators (include/loom/distributed/nccl.hpp) and the collective ops' CUDA
// kernels on them.
//
// Note [nccl stream handshake]
// NCCL queues its work on a CUDA stream; loom's tensors are ordered on their GPU's compute
// stream (Note [cuda memory] in cuda_device.hpp). Each operation of a communicator therefore
// (1) makes its own stream wait for an event recorded on the tensors' stream, so it reads
// what the kernels queued before it wrote, (2) queues the NCCL call there, and (3) makes the
// tensors' stream wait for an event recorded after the call, so the kernels queued after it
// read its results and a block freed after it (in stream order) is not reused while NCCL
// still writes it. Neither step waits on the host. A graph's collective node is one more
// kernel in stream order: it queues the operation and returns (NCCL keeps the ranks' calls
// in the order they were queued, and the graph's collectives are queued in one order on
// every rank: Note [collective order] in src/graph/graph.cpp).
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "cuda_libraries.hpp"
#include "distributed/operation_checks.hpp"
#include "kernel/common/collective_shapes.hpp"
#include "loom/cuda/info.hpp"
#include "loom/distributed/nccl.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::distributed {
namespace {

std::optional<ncclDataType_t> nccl_type(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::i8: return ncclInt8;
    case dtype::u8: return ncclUint8;
    case dtype::boolean: return ncclUint8;
    default: return std::nullopt;
  }
}

// bool: sum and max are "any", prod and min "all" (as on MPI).
ncclRedOp_t nccl_op(reduce_op op, dtype t) {
  if (t == dtype::boolean) return op == reduce_op::sum || op == reduce_op::max ? ncclMax : ncclMin;
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
    case reduce_op::prod: return ncclProd;
  }
  return ncclSum;
}

class nccl_communicator;

// A queued operation: the event recorded after it on the communicator's stream.
class nccl_work final : public work {
 public:
  nccl_work(std::shared_ptr<nccl_communicator> comm, cudaEvent_t done, std::string what)
      : comm_(std::move(comm)), done_(done), what_(std::move(what)) {}
  ~nccl_work() override { (void)cudaEventDestroy(done_); }  // released once it has happened
  nccl_work(const nccl_work&) = delete;
  nccl_work& operator=(const nccl_work&) = delete;
  void wait() override;
  bool test() override;

 private:
  std::shared_ptr<nccl_communicator> comm_;
  cudaEvent_t done_;
  std::string what_;
};

class nccl_communicator final : public communicator,
                                public std::enable_shared_from_this<nccl_communicator> {
 public:
  nccl_communicator(std::shared_ptr<communicator> bootstrap, int ordinal, ncclComm_t comm,
                    cudaStream_t stream, void* scratch)
      : bootstrap_(std::move(bootstrap)), rank_(bootstrap_->rank()), size_(bootstrap_->size()),
        ordinal_(ordinal), comm_(comm), stream_(stream), scratch_(scratch) {
    set_timeout(bootstrap_->timeout());
  }
  ~nccl_communicator() override {
    const cuda::device_guard guard(ordinal_);
    if (!broken_.load()) (void)ncclCommDestroy(comm_);  // an aborted one is gone already
    (void)cudaFree(scratch_);
    (void)cudaStreamDestroy(stream_);
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string backend() const override { return "nccl"; }

  std::shared_ptr<communicator> split(int color, int key) override {
    usable("split");
    return make_nccl_communicator(bootstrap_->split(color, key), ordinal_);
  }

  std::unique_ptr<work> all_reduce(const tensor& in, const tensor& out, reduce_op op) override {
    const std::string what = fmt::format("all_reduce ({}) of {}", to_string(op), in.describe());
    on_gpu(what, in, "input");
    on_gpu(what, out, "output");
    require(what, checks::not_same_layout(in, out));
    require(what, reduce_op_refusal(op, in.type()));
    const ncclDataType_t type = typed(what, in.type());
    const ncclRedOp_t nop = nccl_op(op, in.type());
    const auto n = static_cast<std::size_t>(in.num_elements());
    return start(what, in, [&](cudaStream_t s) {
      return ncclAllReduce(in.raw_data(), out.raw_data(), n, type, nop, comm_, s);
    });
  }

  std::unique_ptr<work> broadcast(const tensor& t, int root) override {
    const std::string what = fmt::format("broadcast of {} from rank {}", t.describe(), root);
    on_gpu(what, t, "tensor");
    require(what, checks::not_peer(root, size_, "root"));
    const ncclDataType_t type = typed(what, t.type());
    const auto n = static_cast<std::size_t>(t.num_elements());
    return start(what, t, [&](cudaStream_t s) {
      return ncclBroadcast(t.raw_data(), t.raw_data(), n, type, root, comm_, s);
    });
  }

  std::unique_ptr<work> all_gather(const tensor& in, const tensor& out) override {
    const std::string what = fmt::format("all_gather of {} into {}", in.describe(), out.describe());
    on_gpu(what, in, "input");
    on_gpu(what, out, "output");
    require(what, checks::not_blocks(out, in, size_, "output", "input"));
    const ncclDataType_t type = typed(what, in.type());
    const auto n = static_cast<std::size_t>(in.num_elements());
    return start(what, in, [&](cudaStream_t s) {
      return ncclAllGather(in.raw_data(), out.raw_data(), n, type, comm_, s);
    });
  }

  std::unique_ptr<work> reduce_scatter(const tensor& in, const tensor& out, reduce_op op) override {
    const std::string what =
        fmt::format("reduce_scatter ({}) of {} into {}", to_string(op), in.describe(), out.describe());
    on_gpu(what, in, "input");
    on_gpu(what, out, "output");
    require(what, checks::not_blocks(in, out, size_, "input", "output"));
    require(what, reduce_op_refusal(op, in.type()));
    const ncclDataType_t type = typed(what, in.type());
    const ncclRedOp_t nop = nccl_op(op, in.type());
    const auto n = static_cast<std::size_t>(out.num_elements());
    return start(what, in, [&](cudaStream_t s) {
      return ncclReduceScatter(in.raw_data(), out.raw_data(), n, type, nop, comm_, s);
    });
  }

  std::unique_ptr<work> barrier() override {
    usable("barrier");
    // An all_reduce of one element of scratch memory: done when every rank has queued it.
    return start("barrier", tensor(), [&](cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, s);
    });
  }

  std::unique_ptr<work> send(const tensor& t, int dst, int tag) override {
    const std::string what = fmt::format("send of {} to rank {} (tag {})", t.describe(), dst, tag);
    point_to_point(what, t, dst, "destination", tag);
    const ncclDataType_t type = typed(what, t.type());
    const auto n = static_cast<std::size_t>(t.num_elements());
    return start(what, t, [&](cudaStream_t s) { return ncclSend(t.raw_data(), n, type, dst, comm_, s); });
  }

  std::unique_ptr<work> recv(const tensor& t, int src, int tag) override {
    const std::string what = fmt::format("recv of {} from rank {} (tag {})", t.describe(), src, tag);
    point_to_point(what, t, src, "source", tag);
    const ncclDataType_t type = typed(what, t.type());
    const auto n = static_cast<std::size_t>(t.num_elements());
    return start(what, t, [&](cudaStream_t s) { return ncclRecv(t.raw_data(), n, type, src, comm_, s); });
  }

  // ---- used by the work handles ------------------------------------------------------------

  [[noreturn]] void fail(std::string_view what, std::string_view why) const {
    throw distributed_error(
        fmt::format("rank {} of {} (nccl, cuda:{}): {}: {}", rank_, size_, ordinal_, what, why), rank_);
  }

  // NCCL's error for this communicator, once one of its operations has failed ("" if none).
  std::string async_error() {
    ncclResult_t e = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &e) != ncclSuccess || e == ncclSuccess || e == ncclInProgress) {
      return {};
    }
    return ncclGetErrorString(e);
  }

  // An operation timed out or failed: NCCL's communicator is aborted (its kernels stop), and
  // nothing more may be started here.
  void abort(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (broken_.load()) return;
    broken_why_ = why;
    (void)ncclCommAbort(comm_);
    broken_.store(true);
  }
  [[nodiscard]] int ordinal() const noexcept { return ordinal_; }

 private:
  void require(std::string_view what, const std::string& why) const {
    if (!why.empty()) fail(what, why);
  }

  void usable(std::string_view what) const {
    if (broken_.load()) {
      std::lock_guard lock(mutex_);
      fail(what, fmt::format("the communicator is unusable: {}", broken_why_));
    }
  }

  void on_gpu(std::string_view what, const tensor& t, std::string_view role) const {
    usable(what);
    require(what, checks::not_dense(t, role));
    if (t.device() != device_id{device_type::cuda, ordinal_}) {
      fail(what, fmt::format("the {} {} is not on cuda:{}, this rank's GPU", role, t.describe(), ordinal_));
    }
  }

  void point_to_point(std::string_view what, const tensor& t, int peer, std::string_view role,
                      int tag) const {
    on_gpu(what, t, "tensor");
    require(what, checks::not_peer(peer, size_, role));
    // NCCL matches a rank's sends and receives by order, not by tag.
    if (tag < 0) throw invalid_argument(fmt::format("{}: tag {} is negative", what, tag));
  }

  ncclDataType_t typed(std::string_view what, dtype t) const {
    const auto type = nccl_type(t);
    if (!type) fail(what, fmt::format("NCCL carries no {}", to_string(t)));
    return *type;
  }

  // Note [nccl stream handshake].
  template <class Enqueue>
  std::unique_ptr<work> start(std::string_view what, const tensor& ordered, Enqueue&& enqueue) {
    const cuda::device_guard guard(ordinal_);
    const auto tensors_stream = ordered.defined()
                                    ? static_cast<cudaStream_t>(ordered.buf()->stream_of().handle())
                                    : stream_;
    cudaEvent_t ready = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    (void)cudaEventRecord(ready, tensors_stream);
    (void)cudaStreamWaitEvent(stream_, ready, 0);
    (void)cudaEventDestroy(ready);
    const ncclResult_t rc = enqueue(stream_);
    if (rc != ncclSuccess) fail(what, ncclGetErrorString(rc));
    cudaEvent_t done = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    (void)cudaEventRecord(done, stream_);
    if (tensors_stream != stream_) (void)cudaStreamWaitEvent(tensors_stream, done, 0);
    return std::make_unique<nccl_work>(shared_from_this(), done, std::string(what));
  }

  std::shared_ptr<communicator> bootstrap_;
  int rank_;
  int size_;
  int ordinal_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  void* scratch_;
  mutable std::mutex mutex_;
  std::atomic<bool> broken_{false};
  std::string broken_why_;  // guarded by mutex_
};

bool nccl_work::test() {
  const cuda::device_guard guard(comm_->ordinal());
  const cudaError_t e = cudaEventQuery(done_);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) comm_->fail(what_, cuda::describe(e));
  if (const std::string why = comm_->async_error(); !why.empty()) {
    comm_->abort(why);
    comm_->fail(what_, why);
  }
  return false;
}

void nccl_work::wait() {
  const auto deadline = std::chrono::steady_clock::now() + comm_->timeout();
  while (!test()) {
    if (std::chrono::steady_clock::now() > deadline) {
      const std::string why = fmt::format("timed out after {} ms", comm_->timeout().count());
      comm_->abort(fmt::format("{} {}", what_, why));
      comm_->fail(what_, why);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

std::string nccl_availability() {
  if (cuda::device_count() == 0) return "no GPU: " + cuda::availability();
  return cuda::load_nccl();
}

std::shared_ptr<communicator> make_nccl_communicator(const std::shared_ptr<communicator>& bootstrap,
                                                     int cuda_ordinal) {
  if (bootstrap == nullptr) throw invalid_argument("make_nccl_communicator: no bootstrap communicator");
  const int rank = bootstrap->rank();
  const auto refuse = [&](const std::string& why) {
    throw distributed_error(
        fmt::format("rank {} of {}: an NCCL communicator on cuda:{}: {}", rank, bootstrap->size(), cuda_ordinal, why),
        rank);
  };
  // Every rank learns whether every rank can go on, so that none waits for rank 0's id alone.
  std::string why = nccl_availability();
  if (why.empty() && (cuda_ordinal < 0 || cuda_ordinal >= cuda::device_count())) {
    why = fmt::format("there is no cuda:{} ({} GPUs)", cuda_ordinal, cuda::device_count());
  }
  if (bootstrap->size() > 1) {
    tensor ok = memory::host_tensor<std::int32_t>({1}, std::vector<std::int32_t>{why.empty() ? 1 : 0});
    bootstrap->all_reduce(ok, ok, reduce_op::min)->wait();
    if (why.empty() && ok.data<std::int32_t>()[0] == 0) {
      refuse("another rank cannot make its part (its error says why)");
    }
  }
  if (!why.empty()) refuse(why);

  const cuda::device_guard guard(cuda_ordinal);
  ncclUniqueId id{};
  tensor id_bytes = memory::host_tensor(dtype::u8, {static_cast<std::int64_t>(sizeof(id))});
  if (rank == 0) {
    if (const ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) refuse(ncclGetErrorString(rc));
    std::memcpy(id_bytes.raw_data(), &id, sizeof(id));
  }
  if (bootstrap->size() > 1) {
    bootstrap->broadcast(id_bytes, 0)->wait();
    std::memcpy(&id, id_bytes.raw_data(), sizeof(id));
  }
  ncclComm_t comm = nullptr;
  if (const ncclResult_t rc = ncclCommInitRank(&comm, bootstrap->size(), id, rank); rc != ncclSuccess) {
    refuse(ncclGetErrorString(rc));
  }
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  try {
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LOOM_CUDA_CHECK(cudaMalloc(&scratch, sizeof(std::int32_t)));
  } catch (...) {
    (void)ncclCommDestroy(comm);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    throw;
  }
  return std::make_shared<nccl_communicator>(bootstrap, cuda_ordinal, comm, stream, scratch);
}

}  // namespace loom::distributed

// ---- the collective ops on a GPU -----------------------------------------------------------

namespace loom::cuda {
namespace {

// A collective node on a GPU. With an NCCL group the operation is queued in stream order
// and the node returns (Note [nccl stream handshake]); with another (MPI) group the input
// goes through host memory: copied off the GPU, exchanged there (the host waits), and the
// result copied back.
class gpu_collective_kernel : public op_kernel {
 public:
  explicit gpu_collective_kernel(const kernel_construction& c)
      : op_kernel(c), group_(c.attr<std::string>("group")) {}
  void compute(kernel_context& ctx) override {
    std::shared_ptr<distributed::communicator> c;
    try {
      c = distributed::group(group_);
    } catch (const error& e) {
      ctx.fail("{}", e.what());
    }
    const launch_scope scope(ctx);
    const tensor x = ctx.input_contiguous(0);
    const shape out = output_shape(ctx, x, *c);
    if (c->backend() == "nccl") {
      tensor& y = ctx.allocate_output(0, out);
      (void)start(*c, x, y, scope.stream);  // ordered by the handshake; dropping it does not wait
      return;
    }
    const tensor host_x = scope.dev.copy_to_host(x, scope.dev.pinned_host());
    const tensor host_y = memory::host_tensor(x.type(), out);
    start(*c, host_x, host_y, nullptr)->wait();
    ctx.set_output(0, scope.dev.copy_from_host(host_y));
  }

 protected:
  virtual shape output_shape(kernel_context& ctx, const tensor& x,
                             const distributed::communicator& c) const = 0;
  // Starts the operation from x into y (`stream`: the GPU's compute stream, or null on the
  // host).
  virtual std::unique_ptr<distributed::work> start(distributed::communicator& c, const tensor& x,
                                                   const tensor& y, cudaStream_t stream) const = 0;
  std::string group_;
};

class gpu_all_reduce_kernel final : public gpu_collective_kernel {
 public:
  explicit gpu_all_reduce_kernel(const kernel_construction& c)
      : gpu_collective_kernel(c),
        op_(distributed::reduce_op_from_string(c.attr<std::string>("reduction"))) {}

 private:
  shape output_shape(kernel_context&, const tensor& x, const distributed::communicator&) const override {
    return x.shape();
  }
  std::unique_ptr<distributed::work> start(distributed::communicator& c, const tensor& x,
                                           const tensor& y, cudaStream_t) const override {
    return c.all_reduce(x, y, op_);
  }
  distributed::reduce_op op_;
};

class gpu_broadcast_kernel final : public gpu_collective_kernel {
 public:
  explicit gpu_broadcast_kernel(const kernel_construction& c)
      : gpu_collective_kernel(c), root_(static_cast<int>(c.attr<std::int64_t>("root"))) {}

 private:
  shape output_shape(kernel_context&, const tensor& x, const distributed::communicator&) const override {
    return x.shape();
  }
  // The root's x, in place in y.
  std::unique_ptr<distributed::work> start(distributed::communicator& c, const tensor& x,
                                           const tensor& y, cudaStream_t stream) const override {
    if (x.nbytes() > 0) {
      if (stream != nullptr) {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(y.raw_data(), x.raw_data(), x.nbytes(),
                                        cudaMemcpyDeviceToDevice, stream));
      } else {
        std::memcpy(y.raw_data(), x.raw_data(), x.nbytes());
      }
    }
    return c.broadcast(y, root_);
  }
  int root_;
};

// all_gather (gather) and reduce_scatter: dimension 0 times or over the group's size.
class gpu_blocks_kernel : public gpu_collective_kernel {
 public:
  gpu_blocks_kernel(const kernel_construction& c, bool gather)
      : gpu_collective_kernel(c), gather_(gather), group_size_(c.attr<std::int64_t>("group_size")) {}

 private:
  shape output_shape(kernel_context& ctx, const tensor& x,
                     const distributed::communicator& c) const override {
    return common::collective_blocks_shape(ctx, x, gather_, group_size_, c.size(), group_);
  }
  bool gather_;
  std::int64_t group_size_;
};

class gpu_all_gather_kernel final : public gpu_blocks_kernel {
 public:
  explicit gpu_all_gather_kernel(const kernel_construction& c) : gpu_blocks_kernel(c, true) {}

 private:
  std::unique_ptr<distributed::work> start(distributed::communicator& c, const tensor& x,
                                           const tensor& y, cudaStream_t) const override {
    return c.all_gather(x, y);
  }
};

class gpu_reduce_scatter_kernel final : public gpu_blocks_kernel {
 public:
  explicit gpu_reduce_scatter_kernel(const kernel_construction& c)
      : gpu_blocks_kernel(c, false),
        op_(distributed::reduce_op_from_string(c.attr<std::string>("reduction"))) {}

 private:
  std::unique_ptr<distributed::work> start(distributed::communicator& c, const tensor& x,
                                           const tensor& y, cudaStream_t) const override {
    return c.reduce_scatter(x, y, op_);
  }
  distributed::reduce_op op_;
};

}  // namespace

void register_nccl_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(make_kernel_def<gpu_all_reduce_kernel>("all_reduce", device_type::cuda, any, "nccl"));
  r.add(make_kernel_def<gpu_broadcast_kernel>("broadcast", device_type::cuda, any, "nccl"));
  r.add(make_kernel_def<gpu_all_gather_kernel>("all_gather", device_type::cuda, any, "nccl"));
  r.add(make_kernel_def<gpu_reduce_scatter_kernel>("reduce_scatter", device_type::cuda, any, "nccl"));
}

}  // namespace loom::cuda
