// The executor: a plan run as dataflow.
//
// Every plan node has a count of the edges it waits for; a run copies the counts, starts
// the roots, and each node that finishes decrements its consumers' counts. A node whose
// count reaches zero is ready. The thread that made it ready runs it next when it is cheap,
// when its kernel uses all of the device's threads itself (oneDNN's: those also hold the
// device's whole_device_mutex, so two never overlap), or when it is the first expensive
// node made ready; other expensive ready nodes go to their device's thread pool. A dependent chain
// therefore runs on one thread with no scheduling at all, and independent branches spread over the
// pool.
//
// Outputs live in per-run *slots*; each slot counts the inputs that read it.
//
// Note [caller helps]
// A CPU pool of N threads has N - 1 workers: the thread that hands it work is counted as
// the N-th. So the caller of a run does not sleep while the run goes on elsewhere: it
// waits in thread_pool::run_until on the first root's device, running that pool's queued
// tasks (scheduled nodes, parallel_for chunks) until the run is done. Without it, once the
// critical path moved to a worker (any scheduled node), every parallel_for on that path ran
// on one thread: the CNN's pooling and ReLU gradients took as long on 2 threads as on 1.
//
// Note [the caller's root]
// The caller runs the first root that is not cheap (an imported model's first node past its
// constants), not simply the first root, which is often a constant: that root was scheduled
// on the pool, and whichever thread took it first, the caller or a worker, ran the model's
// whole chain. oneDNN runs on OpenMP, which keeps a team per thread that starts parallel
// regions: a chain that ran on two threads made two teams, more OpenMP threads than cores,
// and libgomp then sleeps after every primitive instead of spinning (its throttled spin
// count), waking each worker again on the next. At 2 threads, mobilenet_v2 at batch 1 took
// 4 to 5 ms or 8 to 11 ms from one process to the next.
//
// Note [buffer forwarding]
// The last reader of a slot *moves* the tensor out instead of copying it, so when nothing
// else refers to the buffer (not a fetch, not a feed the caller holds, not a variable, not
// a second input of the same node), the kernel holds the only reference and
// kernel_context::forward_input_or_allocate_output may write its output into that buffer.
// A reader that is not the last copies first and then decrements, so the last reader's
// move never races with a copy. Slots that are fetched hold one extra read, so they are
// never moved.
//
// Note [blocking nodes]
// A node whose kernel blocks (op_kernel::blocks: a collective waiting for the other ranks)
// runs on a thread of the process's blocking runner, never on a device's pool: while it
// waits, the device's threads go on with the rest of the graph, so a data-parallel
// backward pass computes the next gradients while a bucket of them is all-reduced. The
// runner has a thread for every blocking node in flight (idle ones are reused, more are made
// when all are busy), so blocking nodes never queue behind one another: two ranks that
// reach two groups' collectives in different orders must not deadlock on a shared thread.
// When a blocking node finishes, its thread computes nothing of the graph: each consumer it
// makes ready goes to its device's pool, and when that pool has no workers, it is posted
// (thread_pool::post) to the pool whose thread serves the run (Note [caller helps]), so a
// one-thread device still computes on one thread.
//
// Errors: the first exception a kernel throws is kept; nodes after it skip their kernels
// but still release their inputs and make their consumers ready, so the run drains, every
// slot is released, and the error is rethrown to the caller. Cancellation is the same,
// triggered by the cancel flag.
#include "executor.hpp"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "loom/memory/allocation_tag.hpp"
#include "loom/device/thread_pool.hpp"

namespace loom::runtime {
namespace {

using clock_type = std::chrono::steady_clock;

// Threads for blocking nodes (Note [blocking nodes]): one per task in flight.
class blocking_runner {
 public:
  static blocking_runner& instance() {
    static blocking_runner r;
    return r;
  }
  // Runs `fn` on an idle runner thread, or a new one; on the caller when no thread can be
  // made (the node then blocks its caller, as any kernel does).
  void submit(std::function<void()> fn) {
    {
      std::unique_lock lock(mutex_);
      queue_.push_back(std::move(fn));
      if (std::cmp_less_equal(queue_.size(), idle_)) {
        lock.unlock();
        cv_.notify_one();
        return;
      }
      try {
        threads_.emplace_back([this] { loop(); });
        return;
      } catch (const std::system_error&) {
        fn = std::move(queue_.back());
        queue_.pop_back();
      }
    }
    fn();
  }
  blocking_runner(const blocking_runner&) = delete;
  blocking_runner& operator=(const blocking_runner&) = delete;

 private:
  blocking_runner() = default;
  ~blocking_runner() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (!queue_.empty()) {
        std::function<void()> fn = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        fn();
        fn = nullptr;
        lock.lock();
        continue;
      }
      if (stopping_) return;
      ++idle_;
      cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
      --idle_;
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mutex_
  std::size_t idle_ = 0;                     // guarded by mutex_: threads in cv_.wait
  bool stopping_ = false;                    // guarded by mutex_
  std::vector<std::thread> threads_;         // guarded by mutex_
};

int small_thread_id() {
  static std::atomic<int> next{0};
  thread_local int id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

struct run_state {
  run_state(const plan& pl, variable_store& v, cancel_flags c, run_metadata* t)
      : p(pl),
        buffers(pl.buffers.take()),
        remaining(pl.nodes_to_run),
        variables(v),
        cancel(c),
        trace(t) {
    const std::size_t n = pl.nodes.size();
    const auto slot_count = static_cast<std::size_t>(pl.slot_count);
    if (!buffers) {
      buffers = std::make_unique<run_buffers>();
      buffers->slots.resize(slot_count);
      buffers->pending = std::make_unique<std::atomic<std::int32_t>[]>(n);
      buffers->readers = std::make_unique<std::atomic<std::int32_t>[]>(slot_count);
    }
    slots = buffers->slots.data();
    pending = buffers->pending.get();
    readers = buffers->readers.get();
    for (std::size_t i = 0; i < n; ++i) {
      pending[i].store(pl.nodes[i].pending, std::memory_order_relaxed);
    }
    for (std::size_t s = 0; s < slot_count; ++s) {
      readers[s].store(pl.slot_readers[s], std::memory_order_relaxed);
    }
    // The constants' values (Note [constants bound with the plan] in partitioner.cpp).
    for (std::int32_t k : pl.bound_constants) {
      const exec_node& e = pl.nodes[static_cast<std::size_t>(k)];
      slots[e.first_output] = e.constant;
    }
    if (trace != nullptr) records.resize(n);
    start = clock_type::now();
  }
  // Every slot but these was emptied by its last reader, or at once when nothing reads it;
  // fetched slots and feeds nobody read still hold tensors. Emptied here, their buffers go
  // back to their pools before execute_plan returns or throws, and the run buffers go back
  // clean for the next run.
  ~run_state() {
    for (std::int32_t s : p.fetch_slots) slots[s] = tensor();
    for (std::int32_t s : p.feed_slots) slots[s] = tensor();
    p.buffers.give_back(std::move(buffers));
  }
  run_state(const run_state&) = delete;
  run_state& operator=(const run_state&) = delete;

  const plan& p;
  std::unique_ptr<run_buffers> buffers;
  tensor* slots = nullptr;
  std::atomic<std::int32_t>* pending = nullptr;
  std::atomic<std::int32_t>* readers = nullptr;
  std::atomic<std::int32_t> remaining;
  variable_store& variables;
  cancel_flags cancel;
  run_metadata* trace;
  std::vector<node_execution> records;
  clock_type::time_point start;

  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  // The caller waits for `done` by running tasks of its device's pool (helper) when there
  // is one, else on done_cv.
  thread_pool* helper = nullptr;
  std::atomic<bool> done{false};
  std::mutex done_mutex;
  std::condition_variable done_cv;

  void fail(std::exception_ptr e) {
    std::lock_guard lock(error_mutex);
    if (!error) error = std::move(e);
    failed.store(true, std::memory_order_release);
  }
};

// Takes input slot `s` for a reader (Note [buffer forwarding]).
void read_slot(run_state& st, std::int32_t s, tensor& into) {
  auto& count = st.readers[static_cast<std::size_t>(s)];
  auto& slot = st.slots[static_cast<std::size_t>(s)];
  if (count.load(std::memory_order_acquire) == 1) {
    into = std::move(slot);
    count.store(0, std::memory_order_relaxed);
    return;
  }
  into = slot;
  if (count.fetch_sub(1, std::memory_order_acq_rel) == 1) slot = tensor();
}

std::exception_ptr wrap_error(const exec_node& e) {
  try {
    throw;
  } catch (const node_error&) {
    return std::current_exception();
  } catch (const cancelled_error&) {
    return std::current_exception();
  } catch (const distributed_error& d) {
    // Still a distributed_error, so that callers can tell a failed exchange from a failed
    // computation; the message names the node too.
    return std::make_exception_ptr(distributed_error(describe_failure(*e.n, e.dev, d.what()), d.rank()));
  } catch (const out_of_memory& oom) {
    return std::make_exception_ptr(out_of_memory(describe_failure(*e.n, e.dev, oom.what()),
                                                 oom.requested_bytes(), oom.refused_by(),
                                                 oom.stats()));
  } catch (const std::exception& ex) {
    return std::make_exception_ptr(
        node_error(describe_failure(*e.n, e.dev, ex.what()), e.n->name, e.n->op()));
  } catch (...) {
    return std::make_exception_ptr(
        node_error(describe_failure(*e.n, e.dev, "unknown exception"), e.n->name, e.n->op()));
  }
}

// Runs node `index`, its inputs taken into `inputs` (room for all of them).
void run_one(run_state& st, std::int32_t index, tensor* inputs) {
  const exec_node& e = st.p.nodes[static_cast<std::size_t>(index)];
  const std::size_t n_in = e.input_slots.size();
  for (std::size_t k = 0; k < n_in; ++k) read_slot(st, e.input_slots[k], inputs[k]);

  if (st.cancel.raised() && !st.failed.load(std::memory_order_relaxed)) {
    st.fail(std::make_exception_ptr(
        cancelled_error("the run was cancelled before node " + e.n->describe() + " ran")));
  }
  const std::size_t n_out = e.n->outputs.size();
  tensor* outputs = st.slots + e.first_output;
  if (!st.failed.load(std::memory_order_acquire)) {
    clock_type::time_point t0;
    if (st.trace != nullptr) t0 = clock_type::now();
    try {
      // What the kernel allocates is tagged with its node (allocation logs, leak reports and
      // memory reports name it); the name lives as long as the plan.
      const memory::tag_scope tag(e.n->name);
      kernel_context ctx(*e.n, *e.dev, std::span<tensor>(inputs, n_in),
                         std::span<tensor>(outputs, n_out), &st.variables, st.cancel.session);
      if (e.whole_device) {
        const std::lock_guard lock(e.dev->whole_device_mutex());
        e.kernel->compute(ctx);
      } else {
        e.kernel->compute(ctx);
      }
      for (std::size_t k = 0; k < n_out; ++k) {
        if (!outputs[k].defined()) ctx.fail("the kernel did not produce output {}", k);
      }
    } catch (...) {
      st.fail(wrap_error(e));
    }
    if (st.trace != nullptr) {
      const auto t1 = clock_type::now();
      auto& r = st.records[static_cast<std::size_t>(index)];
      r.node = e.n->name;
      r.op = e.n->op();
      r.device = e.dev->name();
      r.start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - st.start).count();
      r.duration_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
      for (std::size_t k = 0; k < n_out; ++k) {
        if (outputs[k].defined()) r.output_bytes += outputs[k].nbytes();
      }
      r.thread = small_thread_id();
      r.blocking = e.blocking;
    }
  }
  for (std::size_t k = 0; k < n_in; ++k) inputs[k] = tensor();
  // Outputs nobody reads (and nobody fetches) go back to their pool at once.
  for (std::size_t k = 0; k < n_out; ++k) {
    if (st.p.slot_readers[static_cast<std::size_t>(e.first_output) + k] == 0) outputs[k] = tensor();
  }
}

void execute_from(run_state& st, std::int32_t first);
void run_blocking(run_state& st, std::int32_t index);

void schedule(run_state& st, std::int32_t index) {
  const exec_node& e = st.p.nodes[static_cast<std::size_t>(index)];
  thread_pool* pool = e.dev->pool();
  pool->schedule([&st, index] { execute_from(st, index); });
}

void submit_blocking(run_state& st, std::int32_t index) {
  blocking_runner::instance().submit([&st, index] { run_blocking(st, index); });
}

// Tells the run that this thread finished `finished` nodes; the last one wakes the caller.
void finish(run_state& st, std::int32_t finished) {
  if (st.remaining.fetch_sub(finished, std::memory_order_acq_rel) == finished) {
    if (thread_pool* helper = st.helper) {
      // Once `done` is set the caller may return and destroy st, and then the session with
      // `helper`: set_and_wake() is safe for that (it holds the pool's mutex throughout).
      helper->set_and_wake(st.done);
    } else {
      std::lock_guard lock(st.done_mutex);
      st.done.store(true, std::memory_order_relaxed);
      st.done_cv.notify_all();
    }
  }
}

// Whether consumer `c` of a node that just finished is ready now (its last edge).
bool make_ready(run_state& st, std::int32_t c) {
  const exec_node& ce = st.p.nodes[static_cast<std::size_t>(c)];
  // A node waiting for one edge has no other decrementer: it is ready now.
  return ce.pending == 1 ||
         st.pending[static_cast<std::size_t>(c)].fetch_sub(1, std::memory_order_acq_rel) == 1;
}

// Runs blocking node `index` on a runner thread and hands what it makes ready to the
// devices' threads (Note [blocking nodes]).
void run_blocking(run_state& st, std::int32_t index) {
  const exec_node& e = st.p.nodes[static_cast<std::size_t>(index)];
  {
    std::vector<tensor> inputs(e.input_slots.size());
    run_one(st, index, inputs.data());
  }
  for (std::int32_t c : e.consumers) {
    if (!make_ready(st, c)) continue;
    const exec_node& ce = st.p.nodes[static_cast<std::size_t>(c)];
    thread_pool* pool = ce.dev->pool();
    if (ce.blocking) {
      submit_blocking(st, c);
    } else if (pool != nullptr && pool->size() > 1) {
      schedule(st, c);
    } else if (st.helper != nullptr) {
      st.helper->post([&st, c] { execute_from(st, c); });
    } else {
      execute_from(st, c);
    }
  }
  finish(st, 1);
}

void execute_from(run_state& st, std::int32_t first) {
  // A small stack of nodes this thread runs next; a chain never grows it past one.
  std::vector<std::int32_t> stack;
  // Where this thread puts the inputs of the node it runs: grown to the largest node it
  // meets, so a root without inputs (a variable, a constant) allocates nothing.
  std::vector<tensor> inputs;
  // Nodes this thread finished since it last told `remaining` (told once, at the end, so a
  // chain pays no atomic per node for it).
  std::int32_t finished = 0;
  std::int32_t next = first;
  for (;;) {
    const std::size_t n_in = st.p.nodes[static_cast<std::size_t>(next)].input_slots.size();
    if (inputs.size() < n_in) inputs.resize(n_in);
    run_one(st, next, inputs.data());
    ++finished;
    const exec_node& e = st.p.nodes[static_cast<std::size_t>(next)];
    std::int32_t inline_expensive = -1;
    for (std::int32_t c : e.consumers) {
      if (!make_ready(st, c)) continue;
      const exec_node& ce = st.p.nodes[static_cast<std::size_t>(c)];
      if (ce.blocking) {
        submit_blocking(st, c);
        continue;
      }
      // Cheap nodes, and nodes that use all of the device's threads themselves, run on
      // this thread: scheduling them beside other work would only add overhead or
      // oversubscribe the cores (op_kernel::uses_all_threads); so do all the nodes of a
      // device that runs such kernels (Note [one team per device], partitioner.cpp).
      if (ce.cheap || ce.whole_device || ce.keeps_thread || st.failed.load(std::memory_order_relaxed)) {
        stack.push_back(c);
      } else if (inline_expensive < 0 || ce.dev->pool() == nullptr || ce.dev->pool()->size() <= 1) {
        if (inline_expensive >= 0) stack.push_back(inline_expensive);
        inline_expensive = c;
      } else {
        schedule(st, c);
      }
    }
    if (inline_expensive >= 0) stack.push_back(inline_expensive);
    if (stack.empty()) break;
    next = stack.back();
    stack.pop_back();
  }
  finish(st, finished);
}

}  // namespace

std::vector<tensor> execute_plan(const plan& p, std::vector<tensor> feeds,
                                 variable_store& variables, cancel_flags cancel,
                                 run_metadata* trace) {
  run_state st(p, variables, cancel, trace);
  for (std::size_t i = 0; i < feeds.size(); ++i) {
    st.slots[p.feed_slots[i]] = std::move(feeds[i]);
  }
  feeds.clear();
  if (p.nodes_to_run > 0) {
    // The caller runs one root itself, the first expensive one (Note [the caller's root]),
    // and is one of that root's device's threads for the run (Note [caller helps]): it
    // runs the root and then the pool's queued work until the run ends.
    std::size_t mine = 0;
    for (std::size_t i = 0; i < p.roots.size(); ++i) {
      if (!p.nodes[static_cast<std::size_t>(p.roots[i])].cheap) {
        mine = i;
        break;
      }
    }
    // A pool of one thread too: blocking nodes post the work they make ready to it (Note
    // [blocking nodes]).
    st.helper = p.nodes[static_cast<std::size_t>(p.roots[mine])].dev->pool();
    // The other roots go to their devices' pools.
    for (std::size_t i = 0; i < p.roots.size(); ++i) {
      if (i == mine) continue;
      const exec_node& e = p.nodes[static_cast<std::size_t>(p.roots[i])];
      if (e.blocking) {
        submit_blocking(st, p.roots[i]);
      } else if (e.dev->pool() != nullptr && e.dev->pool()->size() > 1 && !e.cheap &&
                 !e.whole_device && !e.keeps_thread) {
        schedule(st, p.roots[i]);
      } else {
        execute_from(st, p.roots[i]);
      }
    }
    if (p.nodes[static_cast<std::size_t>(p.roots[mine])].blocking) {
      submit_blocking(st, p.roots[mine]);
    } else {
      execute_from(st, p.roots[mine]);
    }
    if (st.helper != nullptr) {
      st.helper->run_until(st.done);
    } else {
      std::unique_lock lock(st.done_mutex);
      st.done_cv.wait(lock, [&] { return st.done.load(std::memory_order_relaxed); });
    }
  }
  std::vector<tensor> out;
  if (!st.failed.load(std::memory_order_acquire)) {
    out.reserve(p.fetch_slots.size());
    for (std::int32_t s : p.fetch_slots) out.push_back(st.slots[s]);
  }
  if (trace != nullptr) {
    trace->total_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - st.start).count();
    for (auto& r : st.records) {
      if (!r.node.empty()) trace->nodes.push_back(std::move(r));
    }
  }
  if (st.error) std::rethrow_exception(st.error);
  return out;
}

}  // namespace loom::runtime
