/// Collectives between processes: a communicator of ranks, whatever engine moves the bytes.
///
/// A communicator is a group of processes (ranks 0 .. size-1) that call the same
/// collectives in the same order: all_reduce, broadcast, all_gather, reduce_scatter,
/// barrier, and point-to-point send / recv. Each call starts the operation and returns a
/// `work` handle at once, so communication overlaps with what the caller does next;
/// `wait()` returns when the operation is complete (the output holds the result and the
/// input may be reused) or throws a loom::distributed_error naming the operation, the rank
/// and the reason, the timeout among them. Tensors are host tensors (CPU memory), dense,
/// of any dtype loom has; the output of a collective is allocated by the caller.
///
/// The engine is MPI (Open MPI from Debian; processes started by `mpirun`): world() is
/// MPI_COMM_WORLD, initialised on first use, and a process started without `mpirun` is a
/// world of one rank. The transport, the algorithms (rings, trees) and the progress of
/// non-blocking operations are MPI's (Note [collectives on MPI] in
/// src/distributed/mpi_communicator.cpp). docs/distributed.md is the guide.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/reduce_op.hpp"
#include "loom/core/tensor.hpp"

namespace loom::distributed {

/// How all_reduce and reduce_scatter combine the ranks' values (loom/core/reduce_op.hpp):
/// avg is the sum divided by the number of ranks.
using loom::reduce_op;
using loom::reduce_op_from_string;

/// A started operation. wait() blocks until it completes; test() says whether it has.
/// Dropping a handle whose operation has not completed waits for it first (its buffers
/// must outlive the transfer).
class work {
 public:
  virtual ~work() = default;
  /// Returns when the operation is complete; throws loom::distributed_error when it failed
  /// or did not complete within the communicator's timeout (the communicator is then
  /// unusable: an operation that other ranks never join cannot be taken back).
  virtual void wait() = 0;
  /// Whether the operation has completed (throws as wait() when it failed).
  [[nodiscard]] virtual bool test() = 0;
};

/// A group of ranks. Every member calls the same collectives, in the same order, with
/// tensors of the same dtype and matching shapes; a mismatch that the engine can see is a
/// distributed_error naming the rank. Thread-safe: operations may be started from several
/// threads, but two threads must not interleave the *order* of collectives differently on
/// different ranks (use a communicator per thread for that: split()).
class communicator {
 public:
  virtual ~communicator() = default;

  /// This process's rank, in [0, size()).
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// The number of ranks.
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// What carries the bytes ("mpi").
  [[nodiscard]] virtual std::string backend() const = 0;

  /// A sub-group: the ranks that pass the same `color` (>= 0), ordered by `key` then by
  /// their rank here. Collective: every rank calls it.
  [[nodiscard]] virtual std::shared_ptr<communicator> split(int color, int key) = 0;

  /// out = op over every rank's `in` (same shape and dtype everywhere; out of in's shape
  /// and dtype; out may be in itself).
  virtual std::unique_ptr<work> all_reduce(const tensor& in, const tensor& out, reduce_op op) = 0;
  /// t = root's t on every rank (same shape and dtype everywhere).
  virtual std::unique_ptr<work> broadcast(const tensor& t, int root) = 0;
  /// out = the ranks' `in` concatenated along dimension 0, in rank order (out's dimension
  /// 0 is size() times in's, the rest equal).
  virtual std::unique_ptr<work> all_gather(const tensor& in, const tensor& out) = 0;
  /// out = this rank's block of op over every rank's `in` cut along dimension 0 into
  /// size() equal blocks (in's dimension 0 is size() times out's).
  virtual std::unique_ptr<work> reduce_scatter(const tensor& in, const tensor& out,
                                               reduce_op op) = 0;
  /// Completes when every rank has started it.
  virtual std::unique_ptr<work> barrier() = 0;
  /// Sends `t` to rank `dst`, matched by a recv with the same tag (>= 0).
  virtual std::unique_ptr<work> send(const tensor& t, int dst, int tag) = 0;
  /// Receives into `t` (its shape and dtype as the sender's) from rank `src`.
  virtual std::unique_ptr<work> recv(const tensor& t, int src, int tag) = 0;

  /// How long wait() waits before it gives up (default 300 s; LOOM_DISTRIBUTED_TIMEOUT, in
  /// seconds, overrides the default for communicators made after it is set).
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Whether each collective first checks that every rank has come to it with the same
  /// arguments (default: yes). The check is what makes a rank that never comes a timeout
  /// and ranks that disagree (another dtype, count, root, reduction or collective) an error
  /// that lists each rank's call; it is one small exchange per collective, about a
  /// microsecond between two processes here (a 4 KB all_reduce takes 3 to 5). Off, a
  /// collective is the engine's call alone, as fast as calling it directly: wait() then
  /// waits as long as the engine does (a rank that never comes hangs it, with no timeout),
  /// and ranks that disagree get the engine's undefined behaviour. An engine that orders
  /// collectives on a device (NCCL) has no such check and ignores this.
  void set_checked(bool on) noexcept { checked_ = on; }
  [[nodiscard]] bool checked() const noexcept { return checked_; }

 protected:
  communicator();

 private:
  std::chrono::milliseconds timeout_;
  bool checked_ = true;
};

/// The world: every process of the job (MPI_COMM_WORLD), made on first use. A process
/// that `mpirun` did not start is a world of one rank.
[[nodiscard]] std::shared_ptr<communicator> world();

/// Whether a launcher (mpirun, or another that sets PMI's variables) started this process
/// as one of a job of several: its environment says so, and world() then has them all.
/// Reads the environment only (initialises nothing), so a tool can decide whether to
/// train data-parallel without starting MPI in a process that runs alone.
[[nodiscard]] bool launched_with_peers() noexcept;

/// Names `comm` for the collective ops of graphs (their `group` attribute; "world" is
/// world() and cannot be replaced). Replaces an earlier group of that name.
void register_group(const std::string& name, std::shared_ptr<communicator> comm);
/// The communicator registered as `name` ("world": world()); throws loom::not_found
/// listing the registered names for another.
[[nodiscard]] std::shared_ptr<communicator> group(const std::string& name);
/// Forgets the group `name` (nothing when there is none; "world" stays).
void unregister_group(const std::string& name);

/// `comm` registered as `name` for the guard's lifetime (register_group, then
/// unregister_group); an empty name registers nothing.
class scoped_group {
 public:
  scoped_group() = default;
  scoped_group(std::string name, std::shared_ptr<communicator> comm) : name_(std::move(name)) {
    if (!name_.empty()) register_group(name_, std::move(comm));
  }
  ~scoped_group() {
    if (!name_.empty()) unregister_group(name_);
  }
  scoped_group(const scoped_group&) = delete;
  scoped_group& operator=(const scoped_group&) = delete;

 private:
  std::string name_;
};

/// Every rank's `text`, in rank order (collective: two all-gathers, of the lengths and of
/// the bytes).
[[nodiscard]] std::vector<std::string> all_gather_strings(communicator& comm,
                                                          const std::string& text);

}  // namespace loom::distributed
