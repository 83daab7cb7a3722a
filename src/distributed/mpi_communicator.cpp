// The MPI communicator: loom's collectives on Open MPI's non-blocking calls.
//
// Note [collectives on MPI]
// - Initialisation: world() calls MPI_Init_thread(MPI_THREAD_MULTIPLE) once, on first use
//   (unless the program initialised MPI itself), and MPI_Finalize runs at exit when loom
//   initialised it. A process that `mpirun` did not start is MPI's singleton: a world of
//   one rank.
// - Collectives are MPI's blocking calls (MPI_Allreduce, MPI_Bcast, MPI_Allgather,
//   MPI_Reduce_scatter_block, MPI_Barrier): Open MPI's tuned algorithms, which its
//   non-blocking collectives (libnbc) do not use. Measured on 2 ranks here, MPI_Iallreduce
//   driven by MPI_Test took 1.9 to 5 times MPI_Allreduce's time (`loom bench distributed`).
//   Each communicator keeps a queue of the collectives started on it, run one at a time in
//   the order they were started, whichever threads started them. The caller gets a work
//   handle at once; the first job in the queue is run by the thread that waits for it (or
//   for a later one) when no thread is running one, so a collective waited for at once
//   costs no hand-over between threads (a 4 KB all_reduce took 3.5 to 5 times MPI's own time when
//   every one went through a thread); a job nobody waits for is taken by the communicator's
//   own thread within about a millisecond, so that it progresses while its caller computes
//   (PyTorch's ProcessGroupMPI runs every collective on such a thread). send and recv are MPI_Isend /
//   MPI_Irecv, started by the caller: a send and a receive on one thread, in order, would
//   wait for each other.
// - Each loom communicator is a duplicate of the communicator it was made from (so its
//   traffic never matches a program's own), with MPI_ERRORS_RETURN: a failure is a return
//   code, turned into a distributed_error naming the call, the tensors, the rank and
//   MPI_Error_string's text.
// - Data types: MPI's own for float32/64, the integers and bool; float16 and bfloat16 move
//   as 16-bit words and reduce through MPI user operations that compute in float and round
//   once per combination (as a 16-bit sum does anywhere). avg is the sum, then a division
//   by the number of ranks in the tensor's dtype; integers and bool have no avg.
// - Completion and timeouts: MPI has no timed wait, and a blocking collective that a rank
//   never joins never returns. So each collective starts with a small non-blocking exchange
//   between the ranks (Note [agreeing ranks]), polled until the communicator's timeout: once
//   it completes every rank has come to the collective, and the blocking call that follows
//   cannot wait for a missing one (a rank that dies in between ends the job: mpirun ends the
//   others). When the timeout passes first, wait() throws and the communicator is marked
//   broken and refuses further operations with the reason; a thread of the job's own goes on
//   waiting for the ranks and makes the call, so that ranks that come late complete it rather
//   than hang. A send or receive polls MPI_Test; one that times out stays pending in MPI.
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
#include "mpi_persistent.hpp"
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

// Collectives started and not finished, on any communicator. At exit, one that timed out and
// never completed (its ranks never joined) would make MPI_Finalize wait for ever: after a
// grace of 2 s for calls that are finishing, MPI is then left alone (mpirun reports the
// process as ending without finalising, which it did).
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

// ---- operations ---------------------------------------------------------------------------

// What an operation is, for its errors: formatted only when one is raised (a small collective
// takes a few microseconds, and describing its tensors would cost about as much again).
struct operation {
  std::string_view kind;  // "all_reduce", "send", ...
  std::optional<reduce_op> op;
  tensor a;  // the input, or the tensor
  tensor b;  // the output, where it is named
  std::string_view peer_word;  // "from" or "to", before `peer`
  int peer = -1;
  int tag = -1;

  [[nodiscard]] std::string describe() const {
    std::string out(kind);
    if (op) out += fmt::format(" ({})", to_string(*op));
    if (a.defined()) out += fmt::format(" of {}", a.describe());
    if (b.defined()) out += fmt::format(" into {}", b.describe());
    if (peer >= 0) out += fmt::format(" {} rank {}", peer_word, peer);
    if (tag >= 0) out += fmt::format(" (tag {})", tag);
    return out;
  }
};

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
  request_work(std::shared_ptr<mpi_communicator> comm, MPI_Request request, operation op)
      : comm_(std::move(comm)), request_(request), op_(std::move(op)) {}
  ~request_work() override { wait_quietly(*this, done_); }
  request_work(const request_work&) = delete;
  request_work& operator=(const request_work&) = delete;

  void wait() override;
  bool test() override;

 private:
  std::shared_ptr<mpi_communicator> comm_;
  MPI_Request request_;
  operation op_;  // holds the tensor until the transfer is done
  bool done_ = false;
};

// Note [agreeing ranks]
// A collective that the ranks call with different arguments (another dtype, another element
// count, another root, another reduction, or another collective altogether) does not fail
// in MPI: it hangs, truncates, or reduces mismatched bytes into a plausible result. So each
// collective is preceded by an all-gather of what this rank is about to do (24 bytes); every
// rank then sees every rank's signature, and when they differ every rank skips the
// collective and fails it with the same list of who asked for what. The communicator stays
// usable. The same exchange is the collective's arrival check: it is polled against the
// timeout (Note [collectives on MPI]), so the blocking call that follows starts only once
// every rank has come to it. It must therefore be non-blocking, and MPI's non-blocking
// collectives cost about as much as a small blocking one: against a 4 KB MPI_Allreduce of
// 3.3 us on two processes here, an MPI_Iallgather before it made 0.84 of MPI's speed, an
// MPI_Ibarrier 0.85, one all-gather carrying the payload too 0.67. The exchange is one
// persistent all-gather (MPI_Allgather_init), made with the communicator (collectively, as
// its duplicate is) and started for each collective: 0.85, and 0.94 at 16 KB. `loom bench
// distributed` measures it made directly ("MPI+a") beside the communicator.
enum class collective : std::int32_t { all_reduce = 1, broadcast, all_gather, reduce_scatter, barrier, split };

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
                                               "reduce_scatter", "barrier", "split"};
  const auto k = static_cast<std::int32_t>(s.kind);
  std::string out(kinds[k >= 1 && k <= 6 ? k : 0]);
  if (s.op >= 0) out += fmt::format(" ({})", to_string(static_cast<reduce_op>(s.op)));
  if (s.type >= 0) out += fmt::format(" of {} {} elements", s.count, to_string(static_cast<dtype>(s.type)));
  if (s.root >= 0) out += fmt::format(" from rank {}", s.root);
  return out;
}

// "" when every rank's signature is `mine`, else who asked for what.
std::string disagreement(const signature& mine, const std::vector<signature>& all) {
  if (std::all_of(all.begin(), all.end(), [&](const signature& s) { return s == mine; })) return {};
  std::string out = "the ranks disagree:";
  for (std::size_t r = 0; r < all.size(); ++r) out += fmt::format(" rank {} {};", r, describe(all[r]));
  out.pop_back();
  return out;
}

using time_point = std::chrono::steady_clock::time_point;

// The blocking MPI call a job makes, as a record rather than two closures holding the tensors
// (a heap allocation each, and reference counts taken and dropped): a 4 KB all_reduce takes
// about 3.5 us here, and loom's own part of a call, measured on one rank, went from 0.25-0.28
// to 0.22-0.24 us with this and with no clock read for a job but its deadline's.
struct mpi_call {
  collective kind{};
  void* send = nullptr;  // the input; the same address as `recv` for an all_reduce in place
  void* recv = nullptr;  // the output (broadcast's tensor)
  int count = 0;         // elements, as MPI counts them (per rank for gathers and scatters)
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  int root = 0;            // broadcast
  int color = 0, key = 0;  // split
};

int make_call(const mpi_call& c, MPI_Comm comm, MPI_Comm* made) {
  switch (c.kind) {
    case collective::all_reduce:
      return MPI_Allreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, c.count, c.type, c.op, comm);
    case collective::broadcast:
      return MPI_Bcast(c.recv, c.count, c.type, c.root, comm);
    case collective::all_gather:
      return MPI_Allgather(c.send, c.count, c.type, c.recv, c.count, c.type, comm);
    case collective::reduce_scatter:
      return MPI_Reduce_scatter_block(c.send, c.recv, c.count, c.type, c.op, comm);
    case collective::barrier:
      return MPI_Barrier(comm);
    case collective::split:
      return MPI_Comm_split(comm, c.color, c.key, made);
  }
  return MPI_ERR_OTHER;
}

// avg: the sum divided by the number of ranks, in the tensor's dtype, once the sum has arrived.
void divide(const tensor& out, int ranks) {
  const std::int64_t k = out.num_elements();
  switch (out.type()) {
    case dtype::f32:
      for (std::int64_t i = 0; i < k; ++i) out.data<float>()[i] /= static_cast<float>(ranks);
      break;
    case dtype::f64:
      for (std::int64_t i = 0; i < k; ++i) out.data<double>()[i] /= static_cast<double>(ranks);
      break;
    case dtype::f16:
      for (std::int64_t i = 0; i < k; ++i) {
        out.data<half>()[i] = half(static_cast<float>(out.data<half>()[i]) / static_cast<float>(ranks));
      }
      break;
    case dtype::bf16:
      for (std::int64_t i = 0; i < k; ++i) {
        out.data<bfloat16>()[i] = bfloat16(static_cast<float>(out.data<bfloat16>()[i]) / static_cast<float>(ranks));
      }
      break;
    default:
      break;
  }
}

// A collective in a communicator's queue: the ranks' agreement (Note [agreeing ranks]),
// then the blocking MPI call and what follows it (avg's division). Shared by the queue, the
// work handle, and the thread that finishes it when its waiter gave up.
struct job {
  mpi_call call;
  // The tensors the call reads and writes, held until it is made (by a thread of the job's own
  // when its waiter gave up): the output, and the input where it is another tensor.
  tensor in;
  tensor out;
  int divide_by = 0;  // avg: the number of ranks; else 0
  std::shared_ptr<MPI_Comm> made;  // split's new communicator
  std::optional<signature> sig;
  MPI_Comm comm = MPI_COMM_NULL;
  bool started = false;
  // Set under the queue's mutex (its condition variable notified): done, with MPI's error
  // text in `error` (empty on success).
  std::atomic<bool> done{false};
  std::string error;
};

// A communicator's jobs, run one at a time in the order they were started, by whichever
// thread gets to the first one: the caller that waits for it, or the communicator's thread.
// Shared with those threads, so that one finishing a job its caller gave up on outlives the
// communicator safely.
struct job_queue {
  std::mutex mutex;
  std::condition_variable work;  // for the communicator's thread: a job queued, the queue free, stop
  std::condition_variable done;  // for the waiters: a job done
  std::deque<std::shared_ptr<job>> jobs;
  // The agreement of the job running (one at a time): this rank's signature, every rank's
  // once it completes, and the persistent all-gather between them (made with the
  // communicator: Note [agreeing ranks]).
  signature mine;
  std::vector<signature> all;
  MPI_Request agreement = MPI_REQUEST_NULL;
  int waiters = 0;  // threads asleep on `done`
  bool running = false;  // a thread is running a job
  bool sleeping = false;  // the communicator's thread waits for a job to be queued
  bool stop = false;
};

// Runs `j` on this thread: the agreement (`q`'s, which is `j`'s while it runs), polled until
// `deadline` (none: until it completes), then the MPI call. false: the deadline passed first
// (the agreement is left in flight, for a later call to go on with); else the job is finished,
// with j.error set.
bool execute(job& j, job_queue& q, std::optional<time_point> deadline) {
  std::string error;
  if (j.sig) {
    if (!j.started) {
      j.started = true;
      in_mpi.fetch_add(1);
      q.mine = *j.sig;
      const int rc = MPI_Start(&q.agreement);
      if (rc != MPI_SUCCESS) error = mpi_error_text(rc);
    }
    // Poll (MPI has no timed wait), yielding the core between polls once the exchange is not
    // immediate: the other ranks may share these cores (mpirun --oversubscribe).
    for (int polls = 0; error.empty(); ++polls) {
      int flag = 0;
      const int rc = MPI_Test(&q.agreement, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) error = mpi_error_text(rc);
      if (rc != MPI_SUCCESS || flag != 0) break;
      if (deadline && std::chrono::steady_clock::now() >= *deadline) return false;
      if (polls > 64) std::this_thread::yield();
    }
    if (error.empty()) error = disagreement(*j.sig, q.all);
  } else if (!j.started) {
    j.started = true;
    in_mpi.fetch_add(1);
  }
  if (error.empty()) {
    const int rc = make_call(j.call, j.comm, j.made.get());
    if (rc != MPI_SUCCESS) {
      error = mpi_error_text(rc);
    } else if (j.divide_by > 0) {
      divide(j.out, j.divide_by);
    }
  }
  in_mpi.fetch_sub(1);
  j.in = tensor();  // release the tensors before the waiter hears it is done
  j.out = tensor();
  j.error = std::move(error);
  return true;
}

// Marks `j` done and the queue free (the caller holds the queue's mutex).
void settle(job_queue& q, job& j) {
  j.done.store(true, std::memory_order_release);
  q.running = false;
  if (q.waiters > 0) q.done.notify_all();
  if (!q.jobs.empty()) q.work.notify_one();
}

// Runs the queue's first job on this thread (`lock` held on entry and on return; no other
// thread is running one). false: `deadline` passed in its agreement; a thread of its own then
// goes on waiting for the ranks and makes the call, so that ranks that come late still
// complete it, and the queue stays taken until it is done.
bool run_first(const std::shared_ptr<job_queue>& q, std::unique_lock<std::mutex>& lock,
               std::optional<time_point> deadline) {
  std::shared_ptr<job> j = std::move(q->jobs.front());
  q->jobs.pop_front();
  q->running = true;
  lock.unlock();
  const bool finished = execute(*j, *q, deadline);
  if (!finished) {
    std::thread([q, j] {
      (void)execute(*j, *q, std::nullopt);
      const std::lock_guard l(q->mutex);
      settle(*q, *j);
    }).detach();
  }
  lock.lock();
  if (finished) settle(*q, *j);
  return finished;
}

class queued_work final : public work {
 public:
  queued_work(std::shared_ptr<mpi_communicator> comm, std::shared_ptr<job_queue> q,
              std::shared_ptr<job> j, operation op)
      : comm_(std::move(comm)), q_(std::move(q)), j_(std::move(j)), op_(std::move(op)) {}
  ~queued_work() override { wait_quietly(*this, finished_); }
  queued_work(const queued_work&) = delete;
  queued_work& operator=(const queued_work&) = delete;

  void wait() override;
  bool test() override;

 private:
  void finished();

  std::shared_ptr<mpi_communicator> comm_;
  std::shared_ptr<job_queue> q_;
  std::shared_ptr<job> j_;
  operation op_;
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
    queue_->all.resize(static_cast<std::size_t>(size_));
    // Collective (every rank makes its communicators in the same order).
    const int rc = allgather_init(&queue_->mine, sizeof(signature), MPI_BYTE, queue_->all.data(), sizeof(signature),
                                  MPI_BYTE, comm_, MPI_INFO_NULL, &queue_->agreement);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&comm_);
      throw distributed_error(fmt::format("rank {} of {}: the ranks' agreement exchange could not be made: {}", rank_,
                                          size_, mpi_error_text(rc)),
                              rank_);
    }
  }
  ~mpi_communicator() override {
    bool taken = false;
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stop = true;
      taken = queue_->running;  // only by a job whose waiter gave up: no handle is left
    }
    queue_->work.notify_one();
    if (worker_.joinable()) worker_.join();
    // A job that timed out may still be waiting for its ranks: the MPI communicator is left
    // to it.
    if (taken) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) {
      MPI_Request_free(&queue_->agreement);
      MPI_Comm_free(&comm_);
    }
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] std::string backend() const override { return "mpi"; }

  std::shared_ptr<communicator> split(int color, int key) override {
    operation o{.kind = "split"};
    usable(o);
    if (color < 0) fail(o, fmt::format("color {} is negative", color));
    // Through the queue: MPI_Comm_split is a collective on this communicator too.
    auto j = std::make_shared<job>();
    j->call = {.kind = collective::split, .color = color, .key = key};
    j->made = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    const auto made = j->made;
    enqueue(std::move(o), std::move(j), signature{collective::split, -1, -1, -1, 0})->wait();
    auto c = std::make_shared<mpi_communicator>(*made);
    c->set_timeout(timeout());
    c->set_checked(checked());
    return c;
  }

  std::unique_ptr<work> all_reduce(const tensor& in, const tensor& out, reduce_op op) override {
    operation o{.kind = "all_reduce", .op = op, .a = in};
    dense(o, in, "input");
    dense(o, out, "output");
    same_layout(o, in, out);
    auto j = std::make_shared<job>();
    j->call = {.kind = collective::all_reduce, .send = in.raw_data(), .recv = out.raw_data(),
               .count = count(o, in), .type = mpi_type(in.type()), .op = reduction(o, in.type(), op)};
    hold(*j, in, out);
    if (op == reduce_op::avg) j->divide_by = size_;
    const signature sig{collective::all_reduce, static_cast<std::int32_t>(in.type()), static_cast<std::int32_t>(op),
                        -1, j->call.count};
    return enqueue(std::move(o), std::move(j), sig);
  }

  std::unique_ptr<work> broadcast(const tensor& t, int root) override {
    operation o{.kind = "broadcast", .a = t, .peer_word = "from", .peer = root};
    dense(o, t, "tensor");
    typed(o, t);
    peer(o, root, "root");
    auto j = std::make_shared<job>();
    j->call = {.kind = collective::broadcast, .recv = t.raw_data(), .count = count(o, t),
               .type = mpi_type(t.type()), .root = root};
    hold(*j, t, t);
    const signature sig{collective::broadcast, static_cast<std::int32_t>(t.type()), -1, root, j->call.count};
    return enqueue(std::move(o), std::move(j), sig);
  }

  std::unique_ptr<work> all_gather(const tensor& in, const tensor& out) override {
    operation o{.kind = "all_gather", .a = in, .b = out};
    dense(o, in, "input");
    dense(o, out, "output");
    typed(o, in);
    blocks(o, out, in, "output", "input");
    auto j = std::make_shared<job>();
    j->call = {.kind = collective::all_gather, .send = in.raw_data(), .recv = out.raw_data(),
               .count = count(o, in), .type = mpi_type(in.type())};
    hold(*j, in, out);
    const signature sig{collective::all_gather, static_cast<std::int32_t>(in.type()), -1, -1, j->call.count};
    return enqueue(std::move(o), std::move(j), sig);
  }

  std::unique_ptr<work> reduce_scatter(const tensor& in, const tensor& out, reduce_op op) override {
    operation o{.kind = "reduce_scatter", .op = op, .a = in, .b = out};
    dense(o, in, "input");
    dense(o, out, "output");
    blocks(o, in, out, "input", "output");
    auto j = std::make_shared<job>();
    j->call = {.kind = collective::reduce_scatter, .send = in.raw_data(), .recv = out.raw_data(),
               .count = count(o, out), .type = mpi_type(in.type()), .op = reduction(o, in.type(), op)};
    hold(*j, in, out);
    if (op == reduce_op::avg) j->divide_by = size_;
    const signature sig{collective::reduce_scatter, static_cast<std::int32_t>(in.type()),
                        static_cast<std::int32_t>(op), -1, j->call.count};
    return enqueue(std::move(o), std::move(j), sig);
  }

  std::unique_ptr<work> barrier() override {
    operation o{.kind = "barrier"};
    usable(o);
    auto j = std::make_shared<job>();
    j->call = {.kind = collective::barrier};
    return enqueue(std::move(o), std::move(j), signature{collective::barrier, -1, -1, -1, 0});
  }

  std::unique_ptr<work> send(const tensor& t, int dst, int tag) override {
    operation o{.kind = "send", .a = t, .peer_word = "to", .peer = dst, .tag = tag};
    dense(o, t, "tensor");
    typed(o, t);
    peer(o, dst, "destination");
    tagged(o, tag);
    MPI_Request r = MPI_REQUEST_NULL;
    check(o, MPI_Isend(t.raw_data(), count(o, t), mpi_type(t.type()), dst, tag, comm_, &r));
    return std::make_unique<request_work>(shared_from_this(), r, std::move(o));
  }

  std::unique_ptr<work> recv(const tensor& t, int src, int tag) override {
    operation o{.kind = "recv", .a = t, .peer_word = "from", .peer = src, .tag = tag};
    dense(o, t, "tensor");
    typed(o, t);
    peer(o, src, "source");
    tagged(o, tag);
    MPI_Request r = MPI_REQUEST_NULL;
    check(o, MPI_Irecv(t.raw_data(), count(o, t), mpi_type(t.type()), src, tag, comm_, &r));
    return std::make_unique<request_work>(shared_from_this(), r, std::move(o));
  }

  // ---- used by the work handles --------------------------------------------------------------

  [[noreturn]] void fail(const operation& o, std::string_view why) const {
    throw distributed_error(fmt::format("rank {} of {}: {}: {}", rank_, size_, o.describe(), why), rank_);
  }

  void check(const operation& o, int rc) const {
    if (rc != MPI_SUCCESS) fail(o, mpi_error_text(rc));
  }

  // An operation timed out: nothing more may be started here.
  void mark_broken(const operation& o) {
    std::lock_guard lock(mutex_);
    broken_why_ = fmt::format("{} did not complete within {} ms (a rank that died, hangs or never calls it)",
                              o.describe(), timeout().count());
    broken_.store(true);
  }

  [[noreturn]] void timed_out(const operation& o) {
    mark_broken(o);
    fail(o, fmt::format("timed out after {} ms", timeout().count()));
  }

 private:
  void usable(const operation& o) const {
    if (broken_.load()) {
      std::lock_guard lock(mutex_);
      fail(o, fmt::format("the communicator is unusable: {}", broken_why_));
    }
  }

  // The checks every communicator makes (operation_checks.hpp), raised as this one's errors.
  void require(const operation& o, const std::string& why) const {
    if (!why.empty()) fail(o, why);
  }

  void dense(const operation& o, const tensor& t, std::string_view role) const {
    usable(o);
    require(o, checks::not_dense(t, role));
  }

  void typed(const operation& o, const tensor& t) const { typed(o, t.type()); }

  void typed(const operation& o, dtype t) const {
    if (mpi_type(t) == MPI_DATATYPE_NULL) fail(o, fmt::format("no MPI type for {}", to_string(t)));
  }

  void same_layout(const operation& o, const tensor& in, const tensor& out) const {
    typed(o, in);
    require(o, checks::not_same_layout(in, out));
  }

  void blocks(const operation& o, const tensor& whole, const tensor& part, std::string_view whole_role,
              std::string_view part_role) const {
    typed(o, part);
    require(o, checks::not_blocks(whole, part, size_, whole_role, part_role));
  }

  void peer(const operation& o, int r, std::string_view role) const {
    require(o, checks::not_peer(r, size_, role));
  }

  static void tagged(const operation& o, int tag) {
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    const int max_tag = flag != 0 && ub != nullptr ? *ub : 32767;
    if (tag < 0 || tag > max_tag) {
      throw invalid_argument(fmt::format("{}: tag {} outside [0, {}]", o.describe(), tag, max_tag));
    }
  }

  int count(const operation& o, const tensor& t) const {
    const std::int64_t n = t.num_elements();
    if (n > std::numeric_limits<int>::max()) {
      fail(o, fmt::format("{} elements are more than MPI's int count holds", n));
    }
    return static_cast<int>(n);
  }

  MPI_Op reduction(const operation& o, dtype t, reduce_op op) const {
    typed(o, t);
    if (const std::string why = reduce_op_refusal(op, t); !why.empty()) fail(o, why);
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

  // Holds the tensors of `j`'s call until it is made: the output, and the input where it is
  // another buffer (an all_reduce in place holds one).
  static void hold(job& j, const tensor& in, const tensor& out) {
    j.out = out;
    if (in.raw_data() != out.raw_data()) j.in = in;
  }

  // Queues `j` (its call and its tensors set), preceded by the ranks' agreement on `sig` unless
  // the communicator is unchecked; starts the communicator's thread on first use, and wakes it
  // when it sleeps.
  std::unique_ptr<work> enqueue(operation o, std::shared_ptr<job> j, signature sig) {
    usable(o);
    if (checked()) j->sig = sig;
    j->comm = comm_;
    {
      std::lock_guard lock(queue_->mutex);
      if (!worker_.joinable()) worker_ = std::thread([q = queue_] { worker_loop(q); });
      queue_->jobs.push_back(j);
      if (queue_->sleeping) {
        queue_->sleeping = false;
        queue_->work.notify_one();
      }
    }
    return std::make_unique<queued_work>(shared_from_this(), queue_, std::move(j), std::move(o));
  }

  // How long a queued job is left for its caller to run in wait() before the communicator's
  // thread takes it.
  static constexpr std::chrono::microseconds grace{20};
  // How often the thread looks for jobs that nobody waits for while the communicator is in
  // use, and after how many looks that found nothing it sleeps until a job is queued.
  static constexpr std::chrono::milliseconds tick{1};
  static constexpr int idle_ticks = 100;

  // The communicator's thread: runs the jobs that nobody waits for, so that a started
  // collective progresses while its caller computes. Starting a job does not wake it (a
  // wake-up per collective cost more than a small collective itself: two processes share
  // two cores here); it looks at the queue every `tick` instead, and sleeps for good once
  // the communicator is idle (the next job then wakes it).
  static void worker_loop(const std::shared_ptr<job_queue>& q) {
    std::unique_lock lock(q->mutex);
    int idle = 0;
    const job* seen = nullptr;  // the first job, seen waiting `grace` ago
    while (!q->stop) {
      if (!q->running && !q->jobs.empty()) {
        idle = 0;
        // A job is taken once it has waited a grace (no clock is read when jobs are queued:
        // a small collective is counted in tens of nanoseconds).
        if (q->jobs.front().get() == seen) {
          seen = nullptr;
          (void)run_first(q, lock, std::nullopt);
        } else {
          seen = q->jobs.front().get();
          q->work.wait_for(lock, grace);
        }
      } else if (++idle < idle_ticks || q->running) {
        seen = nullptr;
        q->work.wait_for(lock, tick);
      } else {
        seen = nullptr;
        q->sleeping = true;
        q->work.wait(lock, [&] { return q->stop || !q->sleeping; });
        idle = 0;
      }
    }
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<bool> broken_{false};
  mutable std::mutex mutex_;
  std::string broken_why_;
  std::shared_ptr<job_queue> queue_ = std::make_shared<job_queue>();
  std::thread worker_;
};

bool request_work::test() {
  if (done_) return true;
  int flag = 0;
  MPI_Status status;
  comm_->check(op_, MPI_Test(&request_, &flag, &status));
  if (flag == 0) return false;
  done_ = true;
  op_.a = tensor();
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
      done_ = true;  // abandoned: the request stays pending inside MPI
      comm_->timed_out(op_);
    }
    if (polls > 64) std::this_thread::yield();
  }
}

void queued_work::finished() {
  finished_ = true;
  if (!j_->error.empty()) comm_->fail(op_, j_->error);
  op_.a = tensor();
  op_.b = tensor();
}

bool queued_work::test() {
  if (finished_) return true;
  if (!j_->done.load(std::memory_order_acquire)) return false;
  finished();
  return true;
}

void queued_work::wait() {
  if (finished_) return;
  // An unchecked job has no timeout: once it runs, its MPI call returns when MPI's does.
  const bool timed = j_->sig.has_value();
  const time_point deadline = timed ? std::chrono::steady_clock::now() + comm_->timeout() : time_point::max();
  {
    std::unique_lock lock(q_->mutex);
    while (!j_->done.load(std::memory_order_acquire)) {
      if (!q_->running && !q_->jobs.empty()) {
        // Nobody runs the queue: this thread does, in order, up to its own job (a small
        // collective then costs no hand-over between threads).
        if (!run_first(q_, lock, timed ? std::optional(deadline) : std::nullopt)) break;
        continue;
      }
      bool late = false;
      ++q_->waiters;
      if (timed) {
        late = q_->done.wait_until(lock, deadline) == std::cv_status::timeout;
      } else {
        q_->done.wait(lock);
      }
      --q_->waiters;
      if (late) break;
    }
  }
  if (!j_->done.load(std::memory_order_acquire)) {
    finished_ = true;  // abandoned: a thread still waits for the ranks to complete it
    comm_->timed_out(op_);
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
