// thread_pool: a CPU device's compute resource.
//
// A pool of `threads` threads counting the caller: it starts threads - 1 workers, and a
// thread that waits on the pool's work (parallel_for, wait) helps run it, so a pool of N
// never has more than N threads busy for it. oneDNN (OpenMP) is told the same N, so the
// two never oversubscribe the cores (docs/runtime.md, "Threads").
//
// Thread-safe: any thread may schedule and call parallel_for, including the pool's own
// workers (nested parallel_for runs its chunks on whichever threads are free, the caller
// included, and never deadlocks).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace loom {

class thread_pool {
 public:
  /// A pool of `threads` threads (>= 1; 1 means the caller alone, no workers). `name`
  /// names the workers for debuggers ("cpu:0/1", ...). Throws loom::invalid_argument for
  /// threads < 1.
  explicit thread_pool(int threads, std::string name = "loom");
  /// Runs what is queued (including what those tasks queue), then joins the workers.
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  /// Threads counting the caller.
  [[nodiscard]] int size() const noexcept;

  /// parallel_for does not split work below this much per range (in cost_per_item units,
  /// roughly nanoseconds): below it, waking a thread costs more than it saves.
  static constexpr double min_chunk_cost = 20000.0;
  /// True when parallel_for(n, cost_per_item, fn) on a pool of `threads` runs fn(0, n)
  /// inline on the caller, so callers can skip building a std::function for small work.
  [[nodiscard]] static constexpr bool runs_inline(std::int64_t n, double cost_per_item,
                                                  int threads) noexcept {
    // !(x > 0) also catches NaN.
    return threads <= 1 || !(cost_per_item > 0.0) || n < 2 ||
           static_cast<double>(n) * cost_per_item < 2.0 * min_chunk_cost;
  }

  /// Queues `fn` to run on a worker (or, with no workers, runs it now on the caller).
  /// Tasks start in the order queued, on whichever worker is free first (an idle worker
  /// picks up new work within microseconds). `fn` must not throw (if it does, the program
  /// terminates); wrap work that can. Throws loom::invalid_argument for an empty `fn`.
  /// Must not be called once the destructor has begun, except from the pool's own tasks.
  void schedule(std::function<void()> fn);
  /// Queues `fn` like schedule(), but never runs it now, even on a pool with no workers:
  /// a worker, or a thread that waits on the pool (run_until, parallel_for), runs it. For a
  /// thread outside the pool that hands work to the pool's own threads (the executor's
  /// blocking nodes, Note [blocking nodes] in src/runtime/executor.cpp); on a pool with no
  /// workers, someone must be in run_until (or come to it) for `fn` to run.
  void post(std::function<void()> fn);

  /// Calls fn(begin, end) over disjoint ranges that cover [0, n), in parallel, and returns
  /// when all are done. `cost_per_item` (roughly, in nanoseconds) decides how finely to
  /// split: into at most size() * 4 ranges (and at most n), none below about 20 µs of work
  /// (n * cost_per_item / 20000 ranges). Work of one range or less (and any work on a pool
  /// of size 1, or with cost_per_item <= 0) runs inline on the caller, with no locking and
  /// no allocation. The caller runs ranges too, and while it waits for the others it runs
  /// other queued tasks, so parallel_for from inside a task or from fn never deadlocks.
  /// Exceptions: once fn has thrown, ranges not yet started are skipped; the ranges running
  /// finish, and then the first exception is rethrown here. n <= 0 does nothing. On a thread
  /// that uses a team (use_team_on_this_thread) the ranges run on the team, with the same
  /// exception rules.
  void parallel_for(std::int64_t n, double cost_per_item,
                    const std::function<void(std::int64_t, std::int64_t)>& fn);

  /// Runs queued tasks on the calling thread until `flag` is true, sleeping when there are
  /// none, so a thread that waits for work it handed to the pool (a session.run) is one of
  /// the pool's threads meanwhile instead of an idle one. Set `flag` with set_and_wake().
  /// Returns at once when `flag` is already true.
  void run_until(const std::atomic<bool>& flag);
  /// Sets `flag` and wakes every run_until caller to look at its flag again. Safe when the
  /// caller of run_until destroys the pool as soon as it sees `flag`: everything this call
  /// does with the pool happens under the pool's mutex, which the destructor takes first.
  void set_and_wake(std::atomic<bool>& flag);

  /// Index of the calling thread in this pool (1 .. size()-1 for workers), or 0 when the
  /// caller is not one of its workers.
  [[nodiscard]] int current_thread_index() const noexcept;

  /// A parallel runtime with threads of its own that the calling thread keeps awake (oneDNN's
  /// OpenMP team): calls fn over [0, n) split into at most `threads` ranges on those threads
  /// and the caller, and returns when all are done. fn does not throw.
  using team_runner = void (*)(int threads, std::int64_t n, double cost_per_item,
                               const std::function<void(std::int64_t, std::int64_t)>& fn);
  /// From now on, parallel_for called on this thread, when it is not one of the pool's
  /// workers, splits its work on `team` (with the pool's size as its thread count) instead of
  /// on the pool's workers; nullptr goes back to the workers (Note [a thread's team]).
  static void use_team_on_this_thread(team_runner team) noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace loom
