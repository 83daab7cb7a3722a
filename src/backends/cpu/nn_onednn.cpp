// Note [oneDNN integration] (nn_onednn.hpp).
#include "nn_onednn.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "loom/device/thread_pool.hpp"
#include "loom/graph/graph.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cpu::onednn {

dnnl::engine& engine() {
  // Never destroyed: a kernel running while statics are destroyed may still need it.
  static auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

std::optional<dnnl::memory::data_type> data_type_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return dnnl::memory::data_type::f32;
    case dtype::bf16:
      return dnnl::memory::data_type::bf16;
    case dtype::f16:
      return dnnl::memory::data_type::f16;
    default:
      return std::nullopt;
  }
}

dnnl::memory::dims dims_of(std::span<const std::int64_t> d) {
  return dnnl::memory::dims(d.begin(), d.end());
}

void use_threads(int threads) noexcept {
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
#if !defined(LOOM_TSAN)
  // From now on this thread's OpenMP team also runs loom's own kernels' work
  // (Note [a thread's team] in src/device/thread_pool.cpp).
  thread_local const bool registered = [] {
    thread_pool::use_team_on_this_thread(&parallel_for);
    return true;
  }();
  static_cast<void>(registered);
#endif
}

// Note [work after a primitive]
// After a primitive, OpenMP's workers spin for a while before they sleep (libgomp's default
// wait policy), ready for the next parallel region. Work split on loom's own pool right
// after a primitive (a fused kernel's epilogue) then shares the cores with spinning threads:
// at 2 threads, mobilenet_v2 at batch 1 ran slower than at 1 thread. Such work runs on the
// same OpenMP team instead, whose threads are awake anyway.
void parallel_for(int threads, std::int64_t n, double cost_per_item,
                  const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  // Below about 20 microseconds of work a parallel region costs more than it saves.
  constexpr double min_parallel_ns = 20'000;
  const std::int64_t parts =
      std::min<std::int64_t>(threads, static_cast<std::int64_t>(static_cast<double>(n) *
                                                                cost_per_item / min_parallel_ns));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast<int>(parts)) schedule(static, 1)
  for (std::int64_t part = 0; part < parts; ++part) {
    fn(n * part / parts, n * (part + 1) / parts);
  }
}

std::optional<std::string> emulated_reason(dtype t) {
  const auto type = data_type_of(t);
  if (!type || t == dtype::f32) return std::nullopt;
  // One probe per dtype, made the first time a pass asks.
  static std::mutex mutex;
  static std::unordered_map<int, std::optional<std::string>> probed;
  const std::lock_guard lock(mutex);
  const auto key = static_cast<int>(t);
  if (auto it = probed.find(key); it != probed.end()) return it->second;
  std::string impl;
  try {
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dims a{64, 64};
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(dnnl::memory::desc(a, *type, tag::ab), dnnl::memory::desc(a, *type, tag::ab),
                           dnnl::memory::desc(a, dnnl::memory::data_type::f32, tag::ab)),
        engine());
    impl = pd.impl_info_str();
  } catch (const dnnl::error&) {
    impl.clear();
  }
  std::optional<std::string> why;
  if (impl.empty() || impl.rfind("ref", 0) == 0) {
    const dnnl::version_t* v = dnnl::version();
    why = fmt::format("oneDNN {}.{} has {} for {} matrix products on this CPU", v->major, v->minor,
                      impl.empty() ? "no implementation" : "only its reference loops (" + impl + ")",
                      to_string(t));
  }
  return probed.emplace(key, std::move(why)).first->second;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

std::size_t primitive_cache::key_hash::operator()(const key& k) const noexcept {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the 64-bit values
  for (const auto v : k) {
    h ^= static_cast<std::uint64_t>(v);
    h *= 1099511628211ULL;
  }
  return static_cast<std::size_t>(h);
}

std::shared_ptr<const plan> primitive_cache::get(const key& k, const std::function<plan()>& build) {
  static std::atomic<std::uint64_t> next_id{1};
  std::lock_guard lock(mutex_);
  if (auto it = plans_.find(k); it != plans_.end()) return it->second;
  plan p;
  try {
    p = build();
  } catch (const dnnl::error&) {
    p = plan{};  // no implementation: the kernel runs its reference loops
  }
  p.id = next_id.fetch_add(1, std::memory_order_relaxed);
  if (plans_.size() >= capacity_) plans_.erase(plans_.begin());
  auto shared = std::make_shared<const plan>(std::move(p));
  plans_.emplace(k, shared);
  return shared;
}

std::size_t primitive_cache::size() const {
  std::lock_guard lock(mutex_);
  return plans_.size();
}

std::string describe(const dnnl::error& e) {
  return fmt::format("oneDNN failed (status {}): {}", static_cast<int>(e.status), e.what());
}

namespace {

// The memory objects of one plan's arguments on one thread, made on the thread's first
// call and re-pointed at each call's buffers (set_data_handle costs no allocation).
struct thread_args {
  std::uint64_t plan_id = 0;
  std::unordered_map<int, dnnl::memory> args;
  std::vector<dnnl::memory> in_order;  // p.args' order, then the scratchpad
  // For arguments in another layout (plan::reorders): the memory over loom's buffer, in
  // p.args' order (empty where no reorder is needed).
  std::vector<std::optional<dnnl::memory>> user;
};

// The calling thread's argument sets, replaced round-robin: 64 plans' worth, so that a
// model's oneDNN nodes all keep theirs from one run to the next (a transformer of 4 layers
// has 24 matmuls; with 16 slots every call made its memory objects anew, about 0.15 ms of
// a 9.5 ms run on one thread).
thread_args& args_for(const plan& p) {
  struct slots {
    std::array<std::unique_ptr<thread_args>, 64> entries;
    std::size_t next = 0;
  };
  thread_local slots cache;
  for (const auto& e : cache.entries) {
    if (e && e->plan_id == p.id) return *e;
  }
  auto t = std::make_unique<thread_args>();
  t->plan_id = p.id;
  for (const auto& a : p.args) {
    // No buffer yet; each call points it at the real one.
    const bool reordered = a.inner.get_size() != 0;
    dnnl::memory m(reordered ? a.inner : a.md, engine(), DNNL_MEMORY_NONE);
    t->args.emplace(a.arg, m);
    t->in_order.push_back(m);
    if (reordered) {
      t->user.emplace_back(dnnl::memory(a.md, engine(), DNNL_MEMORY_NONE));
    } else {
      t->user.emplace_back();
    }
  }
  if (p.scratchpad_bytes > 0) {
    dnnl::memory m(p.scratchpad_md, engine(), DNNL_MEMORY_NONE);
    t->args.emplace(DNNL_ARG_SCRATCHPAD, m);
    t->in_order.push_back(m);
  }
  auto& slot = cache.entries[cache.next];
  cache.next = (cache.next + 1) % cache.entries.size();
  slot = std::move(t);
  return *slot;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

}  // namespace

void execute(kernel_context& ctx, const plan& p, std::initializer_list<const void*> data) {
  static constant_reorders none;
  execute(ctx, p, data, none, 0);
}

const void* constant_reorders::get(const plan& p, std::size_t i, const void* handle) {
  const arg_desc& a = p.args.at(i);
  const std::lock_guard lock(mutex_);
  for (const copy& c : copies_) {
    if (c.handle == handle && c.from == a.md && c.to == a.inner) return c.data.raw_data();
  }
  copy c{handle, a.md, a.inner,
         memory::host_tensor(dtype::u8, shape{static_cast<std::int64_t>(a.inner.get_size())})};
  dnnl::memory from(a.md, engine(), const_cast<void*>(handle));  // NOLINT: read only
  dnnl::memory to(a.inner, engine(), c.data.raw_data());
  dnnl::stream s(engine());
  p.reorders.at(i)->execute(s, from, to);
  s.wait();
  copies_.push_back(std::move(c));
  return copies_.back().data.raw_data();
}

std::string_view input_op(const kernel_construction& c, std::size_t i) {
  const graph* g = c.graph();
  if (g == nullptr || i >= c.node().inputs.size()) return {};
  return g->at(c.node().inputs[i].node).op();
}

void execute(kernel_context& ctx, const plan& p, std::initializer_list<const void*> data,
             constant_reorders& constants, std::uint32_t constant_mask) {
  execute(ctx, p, std::span<const void* const>(data.begin(), data.size()), constants, constant_mask);
}

void execute(kernel_context& ctx, const plan& p, std::span<const void* const> data,
             constant_reorders& constants, std::uint32_t constant_mask) {
  use_threads(ctx.num_threads());
  tensor scratch;
  std::vector<tensor> staged;  // the temporaries of reordered arguments, alive until the end
  try {
    thread_args& t = args_for(p);
    dnnl::stream& s = thread_stream();
    std::size_t i = 0;
    for (const void* d : data) {
      // oneDNN takes a non-const handle for inputs too; it does not write to them.
      void* handle = const_cast<void*>(d);  // NOLINT
      if (!p.reorders.at(i)) {
        t.in_order.at(i++).set_data_handle(handle);
        continue;
      }
      if ((constant_mask >> i & 1U) != 0 && !p.args[i].output) {
        t.in_order.at(i).set_data_handle(const_cast<void*>(constants.get(p, i, d)));  // NOLINT
        ++i;
        continue;
      }
      const auto bytes = static_cast<std::int64_t>(p.args[i].inner.get_size());
      staged.push_back(ctx.allocate_temp(dtype::u8, shape{bytes}));
      t.in_order.at(i).set_data_handle(staged.back().raw_data());
      t.user.at(i)->set_data_handle(handle);
      if (!p.args[i].output) p.reorders[i]->execute(s, *t.user[i], t.in_order[i]);
      ++i;
    }
    if (p.scratchpad_bytes > 0) {
      scratch = ctx.allocate_temp(dtype::u8, shape{static_cast<std::int64_t>(p.scratchpad_bytes)});
      t.in_order.at(i).set_data_handle(scratch.raw_data());
    }
    p.primitive->execute(s, t.args);
    for (std::size_t k = 0; k < p.args.size(); ++k) {
      if (p.reorders[k] && p.args[k].output) p.reorders[k]->execute(s, t.in_order[k], *t.user[k]);
    }
    s.wait();
  } catch (const dnnl::error& e) {
    ctx.fail(describe(e));
  }
}

}  // namespace loom::cpu::onednn
