#include "loom/device/thread_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#endif

#include "loom/core/error.hpp"

// Note [thread pool wake-ups]
// One queue, guarded by one mutex; `pending_` mirrors its size (written under the mutex)
// so that idle threads can watch it without the lock. A worker that finds the queue empty
// first spins for a few microseconds watching `pending_` (counted in `spinners_`), so work
// scheduled soon after it finished starts without a system call on either side; then it
// sleeps on the condition variable (counted in `sleepers_`, under the mutex).
//
// schedule() pushes under the mutex and wakes min(sleepers, queued - spinners) sleepers:
// each spinner is counted on to take one item. That count cannot strand an item: a spinner
// decrements `spinners_` *before* it takes the mutex to look at the queue one last time
// and go to sleep, so a push either happens before that look (and the spinner sees the
// item) or sees the decremented count (and wakes someone). A worker only goes to sleep
// after finding the queue empty under the mutex, so every item pushed after that sees it
// in `sleepers_`. Extra wake-ups cost a little time; none can be lost.
//
// A run_until caller is an extra, temporary worker: it spins as one (in `spinners_`) and
// then sleeps on its own condition variable (counted in `waiters_`), so pushes wake
// sleeping workers first and a waiter only for items no worker will claim. Its flag is set
// by set_and_wake(), under the mutex, so the same argument covers the flag: a waiter either
// sees it set or is asleep when notified.

namespace loom {
namespace {

// Which pool, if any, the calling thread works for (set once by each worker).
struct worker_identity {
  const void* pool = nullptr;
  int index = 0;
};
thread_local worker_identity tl_identity;

// Note [a thread's team]
// oneDNN runs its primitives on OpenMP, which keeps a team of threads per thread that starts
// parallel regions; after a primitive that team's workers spin for a while before they
// sleep (libgomp's default wait policy). A chain of nodes run by one thread (the executor's
// caller, Note [the caller's root] in src/runtime/executor.cpp) that alternates oneDNN
// products with loom's own kernels (softmax, layer_norm, transposes between a transformer's
// matrix products) then split those kernels on the pool's workers while the team spun: three
// busy threads on two cores, and the same softmax took 0.36 or 0.65 ms from one run to the
// next. So the CPU backend registers OpenMP as the team of each thread that runs a primitive
// (cpu::onednn::use_threads), and parallel_for on such a thread runs on that team, whose
// threads are awake anyway, while the pool's workers sleep. A pool's own workers keep
// splitting on the pool: a worker that ran a primitive has a team too, and two teams at once
// would need twice the cores. The TSan build registers no team: libgomp is not instrumented,
// so TSan could not see the team's synchronisation.
thread_local thread_pool::team_runner tl_team = nullptr;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// How long an idle thread watches for work before it sleeps: about 10-50 µs of pause
// instructions, depending on the processor.
constexpr int spin_iterations = 1000;

// Chunks per thread at most: enough to even out uneven chunks, few enough to keep the
// per-chunk overhead small.
constexpr std::int64_t chunks_per_thread = 4;

void run_task(std::function<void()>& fn) noexcept {
  // schedule()'s contract: fn does not throw. If it does, noexcept ends the program here,
  // at the throw, rather than somewhere in the pool's loop.
  fn();
}

// How many chunks parallel_for splits [0, n) into (1: run inline).
std::int64_t chunk_count(std::int64_t n, double cost_per_item, int threads) noexcept {
  if (thread_pool::runs_inline(n, cost_per_item, threads)) return 1;
  const std::int64_t most = std::min<std::int64_t>(std::int64_t{threads} * chunks_per_thread, n);
  const double by_cost = static_cast<double>(n) * cost_per_item / thread_pool::min_chunk_cost;
  if (by_cost >= static_cast<double>(most)) return most;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(by_cost));
}

// The shared state of one parallel_for that runs on several threads. Reference-counted:
// the caller and each helper task hold one reference, so a helper that runs after the call
// returned (all chunks taken by others) only touches this, never the caller's `fn`.
struct for_state {
  for_state(const std::function<void(std::int64_t, std::int64_t)>& f, std::int64_t items,
            std::int64_t chunk_total, int references)
      : fn(&f), n(items), chunks(chunk_total), refs(references) {}

  const std::function<void(std::int64_t, std::int64_t)>* fn;
  const std::int64_t n;
  const std::int64_t chunks;
  std::atomic<std::int64_t> next{0};  // the next chunk to take
  std::atomic<std::int64_t> done{0};  // chunks finished (run, or skipped after an error)
  std::atomic<int> refs;
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // written once, by the thread that set `failed`
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;  // guarded by mutex: done == chunks

  void release() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Chunk i is [begin(i), begin(i + 1)): n / chunks items, the first n % chunks one more.
  [[nodiscard]] std::int64_t begin(std::int64_t i) const noexcept {
    return i * (n / chunks) + std::min(i, n % chunks);
  }

  // Takes and runs chunks until none is left.
  void work() noexcept {
    for (;;) {
      const std::int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= chunks) return;
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          (*fn)(begin(i), begin(i + 1));
        } catch (...) {
          if (!failed.exchange(true, std::memory_order_relaxed)) error = std::current_exception();
        }
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        const std::lock_guard<std::mutex> lock(mutex);
        finished = true;
        cv.notify_one();
      }
    }
  }
};

// parallel_for on a thread's team (Note [a thread's team]): the team's ranges skip their
// work once one has thrown, and the first exception is rethrown on the caller.
void run_on_team(thread_pool::team_runner team, int threads, std::int64_t n, double cost_per_item,
                 const std::function<void(std::int64_t, std::int64_t)>& fn) {
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // written once, by the range that set `failed`
  team(threads, n, cost_per_item, [&](std::int64_t begin, std::int64_t end) {
    if (failed.load(std::memory_order_relaxed)) return;
    try {
      fn(begin, end);
    } catch (...) {
      if (!failed.exchange(true, std::memory_order_relaxed)) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace

struct thread_pool::impl {
  impl(int thread_count, std::string pool_name)
      : threads(thread_count), name(std::move(pool_name)) {}

  const int threads;
  const std::string name;

  alignas(64) std::atomic<std::int64_t> pending{0};  // == queue.size(), written under mutex
  alignas(64) std::atomic<int> spinners{0};          // idle workers watching `pending`
  alignas(64) std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;  // guarded by mutex
  int sleepers = 0;                         // guarded by mutex: workers in cv.wait
  int waiters = 0;                          // guarded by mutex: run_until callers asleep
  std::condition_variable waiter_cv;        // where run_until callers sleep
  bool stopping = false;                    // guarded by mutex
  std::vector<std::thread> workers;

  // Who the queue needs woken (Note [thread pool wake-ups]): sleeping workers first, then
  // one sleeping run_until caller for what they leave unclaimed.
  struct wake_list {
    int workers = 0;
    bool waiter = false;
  };

  // Call with the mutex held; notify() after releasing it.
  [[nodiscard]] wake_list wakes_needed() const noexcept {
    const std::int64_t unclaimed =
        static_cast<std::int64_t>(queue.size()) - spinners.load(std::memory_order_seq_cst);
    const int w = static_cast<int>(std::clamp<std::int64_t>(unclaimed, 0, sleepers));
    return {w, unclaimed > w && waiters > 0};
  }

  // Wakes that many sleeping workers (all of them when that is every worker), and a waiter.
  void notify(wake_list w) {
    if (w.workers >= 2 && w.workers >= threads - 1) {
      cv.notify_all();
    } else {
      for (int i = 0; i < w.workers; ++i) cv.notify_one();
    }
    if (w.waiter) waiter_cv.notify_one();
  }

  void push(std::function<void()> fn) {
    wake_list wakes{};
    {
      const std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(std::move(fn));
      pending.store(static_cast<std::int64_t>(queue.size()), std::memory_order_seq_cst);
      wakes = wakes_needed();
    }
    notify(wakes);
  }

  // Pops one queued task and runs it on the calling thread; false when none was queued.
  bool try_run_one() {
    if (pending.load(std::memory_order_relaxed) == 0) return false;
    std::function<void()> fn;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      if (queue.empty()) return false;
      fn = std::move(queue.front());
      queue.pop_front();
      pending.store(static_cast<std::int64_t>(queue.size()), std::memory_order_seq_cst);
    }
    run_task(fn);
    return true;
  }

  void worker_loop(int index) {
    tl_identity = worker_identity{this, index};
#if defined(__linux__)
    // Linux allows 15 characters.
    const std::string thread_name = fmt::format("{}/{}", name, index).substr(0, 15);
    pthread_setname_np(pthread_self(), thread_name.c_str());
#endif
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      if (!queue.empty()) {
        std::function<void()> fn = std::move(queue.front());
        queue.pop_front();
        pending.store(static_cast<std::int64_t>(queue.size()), std::memory_order_seq_cst);
        lock.unlock();
        run_task(fn);
        fn = nullptr;  // destroy captures outside the lock
        lock.lock();
        continue;
      }
      if (stopping) return;
      // Idle: watch for work a little, then sleep (Note [thread pool wake-ups]).
      lock.unlock();
      spinners.fetch_add(1, std::memory_order_seq_cst);
      for (int i = 0; i < spin_iterations && pending.load(std::memory_order_relaxed) == 0; ++i) {
        cpu_relax();
      }
      spinners.fetch_sub(1, std::memory_order_seq_cst);
      lock.lock();
      if (!queue.empty() || stopping) continue;
      ++sleepers;
      cv.wait(lock, [this] { return !queue.empty() || stopping; });
      --sleepers;
    }
  }

  // Waits until every chunk of `st` is done, running queued tasks meanwhile.
  void wait_for(for_state& st) {
    for (;;) {
      if (st.done.load(std::memory_order_acquire) == st.chunks) return;
      if (try_run_one()) continue;
      for (int i = 0; i < spin_iterations; ++i) {
        if (st.done.load(std::memory_order_acquire) == st.chunks) return;
        if (pending.load(std::memory_order_relaxed) != 0) break;
        cpu_relax();
      }
      if (pending.load(std::memory_order_relaxed) != 0) continue;
      // The remaining chunks run on other threads, which need nothing from this one.
      std::unique_lock<std::mutex> lock(st.mutex);
      st.cv.wait(lock, [&st] { return st.finished; });
      return;
    }
  }
};

thread_pool::thread_pool(int threads, std::string name) {
  if (threads < 1) {
    throw invalid_argument(fmt::format(
        "thread_pool '{}': {} threads requested; a pool needs at least 1", name, threads));
  }
  impl_ = std::make_unique<impl>(threads, std::move(name));
  impl_->workers.reserve(static_cast<std::size_t>(threads - 1));
  try {
    for (int i = 1; i < threads; ++i) {
      impl_->workers.emplace_back([p = impl_.get(), i] { p->worker_loop(i); });
    }
  } catch (...) {
    {
      const std::lock_guard<std::mutex> lock(impl_->mutex);
      impl_->stopping = true;
    }
    impl_->cv.notify_all();
    for (std::thread& t : impl_->workers) t.join();
    throw;
  }
}

thread_pool::~thread_pool() {
  {
    const std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
}

int thread_pool::size() const noexcept {
  return impl_->threads;
}

void thread_pool::schedule(std::function<void()> fn) {
  if (!fn)
    throw invalid_argument(
        fmt::format("thread_pool '{}': schedule of an empty function", impl_->name));
  if (impl_->workers.empty()) {
    run_task(fn);
    return;
  }
  impl_->push(std::move(fn));
}

void thread_pool::post(std::function<void()> fn) {
  if (!fn) {
    throw invalid_argument(fmt::format("thread_pool '{}': post of an empty function", impl_->name));
  }
  impl_->push(std::move(fn));
}

void thread_pool::parallel_for(std::int64_t n, double cost_per_item,
                               const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  const std::int64_t chunks = chunk_count(n, cost_per_item, impl_->threads);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  if (tl_team != nullptr && tl_identity.pool != impl_.get()) {
    run_on_team(tl_team, impl_->threads, n, cost_per_item, fn);
    return;
  }
  const int helpers = static_cast<int>(std::min<std::int64_t>(chunks - 1, impl_->threads - 1));
  auto* st = new for_state(fn, n, chunks, helpers + 1);
  impl::wake_list wakes{};
  {
    const std::lock_guard<std::mutex> lock(impl_->mutex);
    int queued = 0;
    try {
      for (; queued < helpers; ++queued) {
        impl_->queue.emplace_back([st] {
          st->work();
          st->release();
        });
      }
    } catch (...) {
      // Out of memory for the queue: fewer helpers (the caller runs what they would have).
      st->refs.fetch_sub(helpers - queued, std::memory_order_relaxed);
    }
    impl_->pending.store(static_cast<std::int64_t>(impl_->queue.size()), std::memory_order_seq_cst);
    wakes = impl_->wakes_needed();
  }
  impl_->notify(wakes);
  st->work();
  impl_->wait_for(*st);
  // Moved out, not copied: the exception must not be freed by a helper thread dropping the
  // last for_state reference (exception_ptr counts its references in libstdc++, which TSan
  // cannot see, so that free would look like a race with the caller reading the exception).
  const std::exception_ptr error = std::move(st->error);
  st->release();
  if (error) std::rethrow_exception(error);
}

void thread_pool::run_until(const std::atomic<bool>& flag) {
  impl& im = *impl_;
  for (;;) {
    if (flag.load(std::memory_order_acquire)) return;
    if (im.try_run_one()) continue;
    // Idle: as a worker, watch for work a little, then sleep (Note [thread pool wake-ups]).
    im.spinners.fetch_add(1, std::memory_order_seq_cst);
    for (int i = 0; i < spin_iterations && im.pending.load(std::memory_order_relaxed) == 0 &&
                    !flag.load(std::memory_order_relaxed);
         ++i) {
      cpu_relax();
    }
    im.spinners.fetch_sub(1, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(im.mutex);
    if (!im.queue.empty()) continue;
    ++im.waiters;
    im.waiter_cv.wait(lock,
                      [&] { return !im.queue.empty() || flag.load(std::memory_order_acquire); });
    --im.waiters;
  }
}

void thread_pool::set_and_wake(std::atomic<bool>& flag) {
  // Under the mutex: a waiter either saw the flag before this or is inside wait() and gets
  // the notification. And the notification goes out before the mutex is released: a waiter
  // that sees the flag may return and destroy the pool at once (a session.run ending on a
  // thread outside the pool), and ~thread_pool takes this mutex before anything is freed.
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  flag.store(true, std::memory_order_release);
  impl_->waiter_cv.notify_all();
}

void thread_pool::use_team_on_this_thread(team_runner team) noexcept { tl_team = team; }

int thread_pool::current_thread_index() const noexcept {
  return tl_identity.pool == impl_.get() ? tl_identity.index : 0;
}

}  // namespace loom
