// The MPI communicator: loom's collectives on Open MPI's non-blocking calls.
//
// Note [collectives on MPI]
// - Initialisation: world() calls MPI_Init_thread(MPI_THREAD_MULTIPLE) once, on first use
//   (unless the program initialised MPI itself), and MPI_Finalize runs at exit when loom
//   initialised it. A process that `mpirun` did not start is MPI's singleton: a world of
//   one rank.
// - Collectives run on a thread of the communicator's own, one after another in the order
//   they were started, as MPI's blocking calls (MPI_Allreduce, MPI_Bcast, MPI_Allgather,
//   MPI_Reduce_scatter_block, MPI_Barrier): Open MPI's tuned algorithms, which its
//   non-blocking collectives (libnbc) do not use. Measured on 2 ranks here, MPI_Iallreduce
//   driven by MPI_Test took 1.9 to 5 times MPI_Allreduce's time (`loom bench distributed`);
//   this is PyTorch's ProcessGroupMPI's design too. The caller gets a work handle at once
//   and overlaps; the thread waits on a condition variable when there is nothing to do,
//   after spinning briefly (back-to-back collectives then cost no wake-up). One thread per
//   communicator also keeps its collectives in the order they were started, whichever
//   threads started them. send and recv are MPI_Isend / MPI_Irecv, started by the caller:
//   a send and a receive on one thread, in order, would wait for each other.
// - Each loom communicator is a duplicate of the communicator it was made from (so its
//   traffic never matches a program's own), with MPI_ERRORS_RETURN: a failure is a return
//   code, turned into a distributed_error naming the call, the tensors, the rank and
//   MPI_Error_string's text.
// - Data types: MPI's own for float32/64, the integers and bool; float16 and bfloat16 move
//   as 16-bit words and reduce through MPI user operations that compute in float and round
//   once per combination (as a 16-bit sum does anywhere). avg is the sum, then a division
//   by the number of ranks in the tensor's dtype; integers and bool have no avg.
// - Completion: wait() waits until the operation is done or the communicator's timeout
//   passes (a send or receive polls MPI_Test: MPI has no timed wait). A timeout leaves the
//   operation pending in MPI, so the communicator is marked broken and refuses further
//   operations with the reason; its thread is left behind and MPI is not finalised.
// - Argument checks that one rank can make (dtypes, shapes, density, roots, ranks, tags)
//   happen before anything is started, so a bad call never leaves a half-started
//   collective; what only the ranks together can see (another rank's shape) MPI reports,
//   when it can, as a truncation error.
// MPI's C API only (Open MPI's and MPICH's C++ bindings are deprecated).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>
#include <condition_variable>
#include <deque>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "loom/core/half.hpp"
#include "loom/distributed/communicator.hpp"
#include "operation_checks.hpp"

namespace loom::distributed {


namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(len));
}

// ---- 16-bit floats: MPI user operations that compute in float ------------------------------

template <class T, class F>
void combine16(void* in, void* inout, const int* len, F f) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

// MPI_User_function for T (half or bfloat16) and one reduction. NaN propagates through max and
// min as it does through the float ones (the comparison's NaN operand wins).
template <class T, reduce_op Op>
void user_op(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  combine16<T>(in, inout, len, [](float a, float b) {
    if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
      return a + b;
    } else if constexpr (Op == reduce_op::prod) {
      return a * b;
    } else if constexpr (Op == reduce_op::max) {
      return std::isnan(a) || a > b ? a : b;
    } else {
      return std::isnan(a) || a < b ? a : b;
    }
  });
}

// The MPI operations for 16-bit floats, created once (after MPI_Init) and never freed.
struct half_ops {
  MPI_Op op[2][4]{};  // [half, bfloat16][sum, max, min, prod]
};

int op_slot(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return 0;
    case reduce_op::max:
      return 1;
    case reduce_op::min:
      return 2;
    case reduce_op::prod:
      return 3;
  }
  return 0;
}

half_ops make_half_ops() {
  half_ops h;
  MPI_Op_create(&user_op<half, reduce_op::sum>, 1, &h.op[0][0]);
  MPI_Op_create(&user_op<half, reduce_op::max>, 1, &h.op[0][1]);
  MPI_Op_create(&user_op<half, reduce_op::min>, 1, &h.op[0][2]);
  MPI_Op_create(&user_op<half, reduce_op::prod>, 1, &h.op[0][3]);
  MPI_Op_create(&user_op<bfloat16, reduce_op::sum>, 1, &h.op[1][0]);
  MPI_Op_create(&user_op<bfloat16, reduce_op::max>, 1, &h.op[1][1]);
  MPI_Op_create(&user_op<bfloat16, reduce_op::min>, 1, &h.op[1][2]);
  MPI_Op_create(&user_op<bfloat16, reduce_op::prod>, 1, &h.op[1][3]);
  return h;
}

// ---- process-wide MPI state --------------------------------------------------------------

struct mpi_state {
  bool we_initialised = false;
  half_ops half;
};

// Collectives inside an MPI call right now, on any communicator's thread. At exit, one that
// timed out and never completed (its ranks never joined) would make MPI_Finalize wait for
// ever: after a grace of 2 s for calls that are finishing, MPI is then left alone (mpirun
// reports the process as ending without finalising, which it did).
std::atomic<int> in_mpi{0};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (in_mpi.load() != 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (in_mpi.load() == 0) MPI_Finalize();
}

mpi_state& state() {
  static mpi_state* s = [] {
    auto* st = new mpi_state();  // never destroyed: communicators may outlive statics
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised == 0) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS) {
        throw distributed_error(fmt::format("MPI_Init_thread failed: {}", mpi_error_text(rc)), -1);
      }
      if (provided < MPI_THREAD_MULTIPLE) {
        throw distributed_error(
            "this MPI does not support MPI_THREAD_MULTIPLE, which loom's collectives need "
            "(operations are started and completed from several threads)",
            -1);
      }
      st->we_initialised = true;
      std::atexit(finalize_at_exit);
    } else {
      int provided = 0;
      MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_MULTIPLE) {
        throw distributed_error(
            "MPI was initialised without MPI_THREAD_MULTIPLE; loom's collectives need it "
            "(call MPI_Init_thread with MPI_THREAD_MULTIPLE, or let loom initialise MPI)",
            -1);
      }
    }
    st->half = make_half_ops();
    return st;
  }();
  return *s;
}

// The MPI type of a loom dtype's elements (16-bit floats as 16-bit words), or MPI_DATATYPE_NULL.
MPI_Datatype mpi_type(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return MPI_FLOAT;
    case dtype::f64:
      return MPI_DOUBLE;
    case dtype::f16:
    case dtype::bf16:
      return MPI_UINT16_T;
    case dtype::i8:
      return MPI_INT8_T;
    case dtype::u8:
      return MPI_UINT8_T;
    case dtype::i32:
      return MPI_INT32_T;
    case dtype::i64:
      return MPI_INT64_T;
    case dtype::boolean:
      return MPI_C_BOOL;
    default:
      return MPI_DATATYPE_NULL;
  }
}

// ---- work handles ------------------------------------------------------------------------

class mpi_communicator;

// The handles' destructors: a handle dropped before its operation completed still waits for
// it (its buffers must outlive the transfer); what that wait throws is lost.
void wait_quietly(work& w, bool done) {
  if (done) return;
  try {
    w.wait();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor cannot report it
  }
}

// A send or receive: its request, polled by wait() and test().
class request_work final : public work {
 public:
  request_work(std::shared_ptr<mpi_communicator> comm, MPI_Request request, std::string what,
               std::vector<tensor> keep)
      : comm_(std::move(comm)), request_(request), what_(std::move(what)), keep_(std::move(keep)) {}
  ~request_work() override { wait_quietly(*this, done_); }
  request_work(const request_work&) = delete;
  request_work& operator=(const request_work&) = delete;

  void wait() override;
  bool test() override;

 private:
  std::shared_ptr<mpi_communicator> comm_;
  MPI_Request request_;
  std::string what_;
  std::vector<tensor> keep_;
  bool done_ = false;
};

// Note [agreeing ranks]
// A collective that the ranks call with different arguments (another dtype, another element
// count, another root, another reduction, or another collective altogether) does not fail
// in MPI: it hangs, truncates, or reduces mismatched bytes into a plausible result. So each
// collective is preceded, on the communicator's thread, by an MPI_Allgather of what this
// rank is about to do (24 bytes); every rank then sees every rank's signature, and when
// they differ every rank skips the collective and fails it with the same list of who asked
// for what. The communicator stays usable. It costs one small all-gather per collective
// (2 to 3 us between two processes here: a 4 KB all_reduce went from 5.2 to 7.9 us).
enum class collective : std::int32_t { all_reduce = 1, broadcast, all_gather, reduce_scatter, barrier };

struct signature {
  collective kind{};
  std::int32_t type = -1;  // the dtype's value, or -1
  std::int32_t op = -1;    // the reduce_op's value, or -1
  std::int32_t root = -1;  // broadcast's root, or -1
  std::int64_t count = 0;  // elements of this rank's input
};

bool operator==(const signature& a, const signature& b) noexcept {
  return a.kind == b.kind && a.type == b.type && a.op == b.op && a.root == b.root && a.count == b.count;
}

std::string describe(const signature& s) {
  static constexpr std::string_view kinds[] = {"?", "all_reduce", "broadcast", "all_gather",
                                               "reduce_scatter", "barrier"};
  const auto k = static_cast<std::int32_t>(s.kind);
  std::string out(kinds[k >= 1 && k <= 5 ? k : 0]);
  if (s.op >= 0) out += fmt::format(" ({})", to_string(static_cast<reduce_op>(s.op)));
  if (s.type >= 0) out += fmt::format(" of {} {} elements", s.count, to_string(static_cast<dtype>(s.type)));
  if (s.root >= 0) out += fmt::format(" from rank {}", s.root);
  return out;
}

// Every rank's signature through MPI_Allgather; "" when they agree, else who asked for what.
std::string disagreement(const signature& mine, MPI_Comm comm, int size) {
  std::vector<signature> all(static_cast<std::size_t>(size));
  const int rc = MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm);
  if (rc != MPI_SUCCESS) return mpi_error_text(rc);
  if (std::all_of(all.begin(), all.end(), [&](const signature& s) { return s == mine; })) return {};
  std::string out = "the ranks disagree:";
  for (std::size_t r = 0; r < all.size(); ++r) out += fmt::format(" rank {} {};", r, describe(all[r]));
  out.pop_back();
  return out;
}

// A collective, run by the communicator's thread: done once `done` is set, with MPI's error
// text in `error` (empty on success).
struct completion {
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::string error;
};

class queued_work final : public work {
 public:
  queued_work(std::shared_ptr<mpi_communicator> comm, std::shared_ptr<completion> c, std::string what)
      : comm_(std::move(comm)), c_(std::move(c)), what_(std::move(what)) {}
  ~queued_work() override { wait_quietly(*this, finished_); }
  queued_work(const queued_work&) = delete;
  queued_work& operator=(const queued_work&) = delete;

  void wait() override;
  bool test() override;

 private:
  void finished();

  std::shared_ptr<mpi_communicator> comm_;
  std::shared_ptr<completion> c_;
  std::string what_;
  bool finished_ = false;
};

class mpi_communicator final : public communicator,
                               public std::enable_shared_from_this<mpi_communicator> {
 public:
  // Takes ownership of `comm` (a duplicate made for loom).
  explicit mpi_communicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~mpi_communicator() override {
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stop = true;
    }
    queue_->cv.notify_all();
    if (worker_.joinable()) {
      // A thread still in a collective that timed out may never return: it is left to end
      // on its own (it holds its queue; the communicator is not freed).
      const bool stuck = queue_->in_call.load();
      stuck ? worker_.detach() : worker_.join();
      if (stuck) return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Comm_free(&comm_);
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string backend() const override { return "mpi"; }

  std::shared_ptr<communicator> split(int color, int key) override {
    usable("split");
    if (color < 0) fail("split", fmt::format("color {} is negative", color));
    // Through the thread: MPI_Comm_split is a collective on this communicator too.
    auto sub = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    const MPI_Comm comm = comm_;
    enqueue("split", [comm, color, key, sub] { return MPI_Comm_split(comm, color, key, sub.get()); },
            nullptr)
        ->wait();
    auto c = std::make_shared<mpi_communicator>(*sub);
    c->set_timeout(timeout());
    return c;
  }

  std::unique_ptr<work> all_reduce(const tensor& in, const tensor& out, reduce_op op) override {
    const std::string what = fmt::format("all_reduce ({}) of {}", to_string(op), in.describe());
    dense("all_reduce", in, "input");
    dense("all_reduce", out, "output");
    same_layout("all_reduce", in, out);
    const MPI_Op mop = reduction(what, in.type(), op);
    const int n = count(what, in);
    const MPI_Datatype type = mpi_type(in.type());
    const MPI_Comm comm = comm_;
    return enqueue(
        what,
        [in, out, n, type, mop, comm] {
          const bool in_place = in.raw_data() == out.raw_data();
          return MPI_Allreduce(in_place ? MPI_IN_PLACE : in.raw_data(), out.raw_data(), n, type, mop, comm);
        },
        averaging(op, out), signature{collective::all_reduce, static_cast<std::int32_t>(in.type()), static_cast<std::int32_t>(op), -1, n});
  }

  std::unique_ptr<work> broadcast(const tensor& t, int root) override {
    const std::string what = fmt::format("broadcast of {} from rank {}", t.describe(), root);
    dense("broadcast", t, "tensor");
    typed("broadcast", t);
    peer(what, root, "root");
    const int n = count(what, t);
    const MPI_Datatype type = mpi_type(t.type());
    const MPI_Comm comm = comm_;
    return enqueue(what, [t, n, type, root, comm] { return MPI_Bcast(t.raw_data(), n, type, root, comm); },
                   nullptr, signature{collective::broadcast, static_cast<std::int32_t>(t.type()), -1, root, n});
  }

  std::unique_ptr<work> all_gather(const tensor& in, const tensor& out) override {
    const std::string what = fmt::format("all_gather of {} into {}", in.describe(), out.describe());
    dense("all_gather", in, "input");
    dense("all_gather", out, "output");
    typed("all_gather", in);
    blocks(what, out, in, "output", "input");
    const int n = count(what, in);
    const MPI_Datatype type = mpi_type(in.type());
    const MPI_Comm comm = comm_;
    return enqueue(
        what, [in, out, n, type, comm] { return MPI_Allgather(in.raw_data(), n, type, out.raw_data(), n, type, comm); },
        nullptr, signature{collective::all_gather, static_cast<std::int32_t>(in.type()), -1, -1, n});
  }

  std::unique_ptr<work> reduce_scatter(const tensor& in, const tensor& out, reduce_op op) override {
    const std::string what =
        fmt::format("reduce_scatter ({}) of {} into {}", to_string(op), in.describe(), out.describe());
    dense("reduce_scatter", in, "input");
    dense("reduce_scatter", out, "output");
    blocks(what, in, out, "input", "output");
    const MPI_Op mop = reduction(what, in.type(), op);
    const int n = count(what, out);
    const MPI_Datatype type = mpi_type(in.type());
    const MPI_Comm comm = comm_;
    return enqueue(
        what,
        [in, out, n, type, mop, comm] {
          return MPI_Reduce_scatter_block(in.raw_data(), out.raw_data(), n, type, mop, comm);
        },
        averaging(op, out), signature{collective::reduce_scatter, static_cast<std::int32_t>(in.type()), static_cast<std::int32_t>(op), -1, n});
  }

  std::unique_ptr<work> barrier() override {
    usable("barrier");
    const MPI_Comm comm = comm_;
    return enqueue("barrier", [comm] { return MPI_Barrier(comm); }, nullptr, signature{collective::barrier, -1, -1, -1, 0});
  }

  std::unique_ptr<work> send(const tensor& t, int dst, int tag) override {
    const std::string what = fmt::format("send of {} to rank {} (tag {})", t.describe(), dst, tag);
    dense("send", t, "tensor");
    typed("send", t);
    peer(what, dst, "destination");
    tagged(what, tag);
    MPI_Request r = MPI_REQUEST_NULL;
    check(what, MPI_Isend(t.raw_data(), count(what, t), mpi_type(t.type()), dst, tag, comm_, &r));
    return std::make_unique<request_work>(shared_from_this(), r, what, std::vector<tensor>{t});
  }

  std::unique_ptr<work> recv(const tensor& t, int src, int tag) override {
    const std::string what = fmt::format("recv of {} from rank {} (tag {})", t.describe(), src, tag);
    dense("recv", t, "tensor");
    typed("recv", t);
    peer(what, src, "source");
    tagged(what, tag);
    MPI_Request r = MPI_REQUEST_NULL;
    check(what, MPI_Irecv(t.raw_data(), count(what, t), mpi_type(t.type()), src, tag, comm_, &r));
    return std::make_unique<request_work>(shared_from_this(), r, what, std::vector<tensor>{t});
  }

  // ---- used by the work handles --------------------------------------------------------------

  [[noreturn]] void fail(std::string_view what, std::string_view why) const {
    throw distributed_error(fmt::format("rank {} of {}: {}: {}", rank_, size_, what, why), rank_);
  }

  void check(std::string_view what, int rc) const {
    if (rc != MPI_SUCCESS) fail(what, mpi_error_text(rc));
  }

  // A pending operation timed out: nothing more may be started here.
  void mark_broken(std::string why) {
    std::lock_guard lock(mutex_);
    broken_why_ = std::move(why);
    broken_.store(true);
  }

 private:
  void usable(std::string_view what) const {
    if (broken_.load()) {
      std::lock_guard lock(mutex_);
      fail(what, fmt::format("the communicator is unusable: {}", broken_why_));
    }
  }

  // The checks every communicator makes (operation_checks.hpp), raised as this one's errors.
  void require(std::string_view what, const std::string& why) const {
    if (!why.empty()) fail(what, why);
  }

  void dense(std::string_view what, const tensor& t, std::string_view role) const {
    usable(what);
    require(what, checks::not_dense(t, role));
  }

  void typed(std::string_view what, const tensor& t) const {
    if (mpi_type(t.type()) == MPI_DATATYPE_NULL) {
      fail(what, fmt::format("no MPI type for {}", to_string(t.type())));
    }
  }

  void same_layout(std::string_view what, const tensor& in, const tensor& out) const {
    typed(what, in);
    require(what, checks::not_same_layout(in, out));
  }

  void blocks(std::string_view what, const tensor& whole, const tensor& part,
              std::string_view whole_role, std::string_view part_role) const {
    typed(what, part);
    require(what, checks::not_blocks(whole, part, size_, whole_role, part_role));
  }

  void peer(std::string_view what, int r, std::string_view role) const {
    require(what, checks::not_peer(r, size_, role));
  }

  static void tagged(std::string_view what, int tag) {
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    const int max_tag = flag != 0 && ub != nullptr ? *ub : 32767;
    if (tag < 0 || tag > max_tag) {
      throw invalid_argument(fmt::format("{}: tag {} outside [0, {}]", what, tag, max_tag));
    }
  }

  int count(std::string_view what, const tensor& t) const {
    const std::int64_t n = t.num_elements();
    if (n > std::numeric_limits<int>::max()) {
      fail(what, fmt::format("{} elements are more than MPI's int count holds", n));
    }
    return static_cast<int>(n);
  }

  MPI_Op reduction(std::string_view what, dtype t, reduce_op op) const {
    typed(what, t);
    if (const std::string why = reduce_op_refusal(op, t); !why.empty()) fail(what, why);
    if (t == dtype::f16 || t == dtype::bf16) {
      return state().half.op[t == dtype::f16 ? 0 : 1][op_slot(op)];
    }
    if (t == dtype::boolean) {
      return op == reduce_op::sum || op == reduce_op::max ? MPI_LOR : MPI_LAND;
    }
    switch (op) {
      case reduce_op::sum:
      case reduce_op::avg:
        return MPI_SUM;
      case reduce_op::max:
        return MPI_MAX;
      case reduce_op::min:
        return MPI_MIN;
      case reduce_op::prod:
        return MPI_PROD;
    }
    return MPI_SUM;
  }

  // typed() for a dtype alone.
  void typed(std::string_view what, dtype t) const {
    if (mpi_type(t) == MPI_DATATYPE_NULL) fail(what, fmt::format("no MPI type for {}", to_string(t)));
  }

  // avg: the sum divided by size() once the sum has arrived.
  std::function<void()> averaging(reduce_op op, const tensor& out) const {
    if (op != reduce_op::avg) return nullptr;
    const int n = size_;
    return [out, n] {
      const std::int64_t k = out.num_elements();
      switch (out.type()) {
        case dtype::f32:
          for (std::int64_t i = 0; i < k; ++i) out.data<float>()[i] /= static_cast<float>(n);
          break;
        case dtype::f64:
          for (std::int64_t i = 0; i < k; ++i) out.data<double>()[i] /= static_cast<double>(n);
          break;
        case dtype::f16:
          for (std::int64_t i = 0; i < k; ++i) {
            out.data<half>()[i] = half(static_cast<float>(out.data<half>()[i]) / static_cast<float>(n));
          }
          break;
        case dtype::bf16:
          for (std::int64_t i = 0; i < k; ++i) {
            out.data<bfloat16>()[i] =
                bfloat16(static_cast<float>(out.data<bfloat16>()[i]) / static_cast<float>(n));
          }
          break;
        default:
          break;
      }
    };
  }

  // Hands `run` (a blocking MPI call; its tensors held by the closure) and `then` to the
  // communicator's thread, starting it on first use.
  std::unique_ptr<work> enqueue(std::string_view what, std::function<int()> run,
                                std::function<void()> then, std::optional<signature> sig = {}) {
    usable(what);
    auto c = std::make_shared<completion>();
    {
      std::lock_guard lock(queue_->mutex);
      if (!worker_.joinable()) worker_ = std::thread([q = queue_] { worker_loop(*q); });
      queue_->jobs.push_back({std::move(run), std::move(then), c, sig, comm_, size_});
      queue_->pending.fetch_add(1);
    }
    queue_->cv.notify_one();
    return std::make_unique<queued_work>(shared_from_this(), std::move(c), std::string(what));
  }

  struct job {
    std::function<int()> run;
    std::function<void()> then;
    std::shared_ptr<completion> c;
    std::optional<signature> sig;  // checked across the ranks first (Note [agreeing ranks])
    MPI_Comm comm = MPI_COMM_NULL;
    int size = 1;
  };

  // What the communicator's thread works from; shared with it, so that a thread left in a
  // call that timed out outlives the communicator safely.
  struct job_queue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<job> jobs;
    std::atomic<int> pending{0};
    std::atomic<bool> in_call{false};
    bool stop = false;
  };

  // The communicator's thread: the queued collectives, in order. Between them it spins for
  // about 50 us (yielding the core), so that back-to-back collectives cost no wake-up, then
  // sleeps on the queue's condition variable.
  static void worker_loop(job_queue& q) {
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      while (q.pending.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
      }
      job j;
      {
        std::unique_lock lock(q.mutex);
        q.cv.wait(lock, [&] { return !q.jobs.empty() || q.stop; });
        if (q.jobs.empty()) return;  // stopping
        j = std::move(q.jobs.front());
        q.jobs.pop_front();
        q.pending.fetch_sub(1);
      }
      q.in_call.store(true);
      in_mpi.fetch_add(1);
      std::string error = j.sig ? disagreement(*j.sig, j.comm, j.size) : std::string();
      if (error.empty()) {
        const int rc = j.run();
        if (rc != MPI_SUCCESS) {
          error = mpi_error_text(rc);
        } else if (j.then) {
          j.then();
        }
      }
      in_mpi.fetch_sub(1);
      q.in_call.store(false);
      j.run = nullptr;  // release the tensors before the caller hears it is done
      {
        std::lock_guard lock(j.c->mutex);
        j.c->error = std::move(error);
        j.c->done.store(true, std::memory_order_release);
      }
      j.c->cv.notify_all();
    }
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<bool> broken_{false};
  mutable std::mutex mutex_;
  std::string broken_why_;
  // The thread and its queue.
  std::shared_ptr<job_queue> queue_ = std::make_shared<job_queue>();
  std::thread worker_;
};

bool request_work::test() {
  if (done_) return true;
  int flag = 0;
  MPI_Status status;
  comm_->check(what_, MPI_Test(&request_, &flag, &status));
  if (flag == 0) return false;
  done_ = true;
  keep_.clear();
  return true;
}

void request_work::wait() {
  if (done_) return;
  const auto deadline = std::chrono::steady_clock::now() + comm_->timeout();
  // Poll (MPI has no timed wait), yielding the core between polls: other processes on the
  // same cores (mpirun --oversubscribe) are what the operation waits for.
  for (int polls = 0;; ++polls) {
    if (test()) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      comm_->mark_broken(fmt::format("{} did not complete within {} ms (a rank that died, hangs or "
                                     "never calls it)",
                                     what_, comm_->timeout().count()));
      done_ = true;  // abandoned: the request stays pending inside MPI
      comm_->fail(what_, fmt::format("timed out after {} ms", comm_->timeout().count()));
    }
    if (polls > 64) std::this_thread::yield();
  }
}

void queued_work::finished() {
  finished_ = true;
  std::string error;
  {
    std::lock_guard lock(c_->mutex);
    error = c_->error;
  }
  if (!error.empty()) comm_->fail(what_, error);
}

bool queued_work::test() {
  if (finished_) return true;
  if (!c_->done.load(std::memory_order_acquire)) return false;
  finished();
  return true;
}

void queued_work::wait() {
  if (finished_) return;
  // A short spin first: a small collective is often done within microseconds.
  for (int i = 0; i < 256 && !c_->done.load(std::memory_order_acquire); ++i) std::this_thread::yield();
  if (!c_->done.load(std::memory_order_acquire)) {
    std::unique_lock lock(c_->mutex);
    const bool done = c_->cv.wait_for(lock, comm_->timeout(), [&] { return c_->done.load(); });
    if (!done) {
      lock.unlock();
      comm_->mark_broken(fmt::format("{} did not complete within {} ms (a rank that died, hangs or "
                                     "never calls it)",
                                     what_, comm_->timeout().count()));
      finished_ = true;  // abandoned: the communicator's thread is still in MPI
      comm_->fail(what_, fmt::format("timed out after {} ms", comm_->timeout().count()));
    }
  }
  finished();
}

}  // namespace

std::shared_ptr<communicator> world() {
  static std::shared_ptr<communicator> w = [] {
    (void)state();
    MPI_Comm dup = MPI_COMM_NULL;
    const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc != MPI_SUCCESS) {
      throw distributed_error(fmt::format("MPI_Comm_dup of the world failed: {}", mpi_error_text(rc)), -1);
    }
    return std::shared_ptr<communicator>(std::make_shared<mpi_communicator>(dup));
  }();
  return w;
}

}  // namespace loom::distributed
