// How the nn kernels call oneDNN: one engine per process, primitives cached per kernel,
// every byte from loom's allocator, and OpenMP told the device's thread count.
//
// Note [oneDNN integration]
// - Engine: one dnnl::engine(cpu, 0) for the process, made on first use and never
//   destroyed (kernels may still run while statics are torn down).
// - Primitives: building one costs tens of microseconds to milliseconds (JIT), so each
//   kernel keeps a primitive_cache keyed by what the primitive depends on (dtype, thread
//   count, shapes, strides); a repeated run only looks it up and executes.
// - Memory: inputs and outputs are loom's buffers (outputs from ctx.allocate_output),
//   handed to oneDNN through dnnl::memory objects kept per thread and per plan and
//   re-pointed with set_data_handle, so a repeated call creates no oneDNN objects;
//   primitives use scratchpad_mode::user with a scratchpad from ctx.allocate_temp, so
//   oneDNN allocates nothing of its own per run either.
// - Threads: oneDNN runs on OpenMP (Debian's build uses libgomp). Before building or
//   executing a primitive the calling thread sets omp_set_num_threads(ctx.num_threads()),
//   so oneDNN's team has as many threads as the device's pool, and the primitive runs on
//   the calling thread (never inside ctx.parallel_for). The thread count is part of the
//   cache key because oneDNN picks its blocking for the count it sees at creation.
//   Caveat: OpenMP keeps one team per calling thread, so two oneDNN kernels that the
//   executor runs at once on two pool threads use up to 2 x num_threads cores.
// - Fallback: a primitive oneDNN cannot make for this machine or these dtypes
//   (dnnl::error at creation) is recorded as such in the cache, and the kernel runs its
//   reference loops instead.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::cpu::onednn {

/// The process's CPU engine (created on first use; never destroyed). Thread-safe.
dnnl::engine& engine();

/// oneDNN's data type for `t`, or nullopt when oneDNN has none (float64, integers).
std::optional<dnnl::memory::data_type> data_type_of(dtype t) noexcept;

/// dnnl dims from loom dims.
dnnl::memory::dims dims_of(std::span<const std::int64_t> d);

/// Tells OpenMP (and so oneDNN) to use `threads` threads for parallel regions started by
/// the calling thread. Cheap; call before creating and before executing a primitive.
void use_threads(int threads) noexcept;

/// A primitive attribute with scratchpad_mode::user (Note [oneDNN integration]).
dnnl::primitive_attr user_scratchpad_attr();

/// An argument of a primitive: its DNNL_ARG_* and its memory descriptor.
struct arg_desc {
  int arg = 0;
  dnnl::memory::desc md;
};

/// A built primitive, the descriptors of its arguments (in the order execute() takes their
/// data), and the scratchpad bytes it needs. `primitive` is empty when oneDNN has no
/// implementation (the kernel falls back to its reference loops).
struct plan {
  std::optional<dnnl::primitive> primitive;
  std::vector<arg_desc> args;
  std::size_t scratchpad_bytes = 0;
  dnnl::memory::desc scratchpad_md;
  /// oneDNN's implementation name ("brg:avx512_core"), for tests and listings.
  std::string implementation;
  /// Unique in the process: names the plan in the per-thread argument caches.
  std::uint64_t id = 0;
};

/// Builds a plan from a primitive descriptor and the descriptors of its arguments.
template <class Primitive, class PrimitiveDesc>
plan make_plan(const PrimitiveDesc& pd, std::vector<arg_desc> args) {
  plan p;
  p.primitive = Primitive(pd);
  p.args = std::move(args);
  p.scratchpad_md = pd.scratchpad_desc();
  p.scratchpad_bytes = p.scratchpad_md.get_size();
  p.implementation = pd.impl_info_str();
  return p;
}

/// A small thread-safe map from a key (a list of integers: dtype, threads, dims, strides)
/// to a shared plan. get() builds a missing plan under the lock (so concurrent first runs
/// build it once); a dnnl::error from `build` is recorded as "no primitive". At most
/// `capacity` plans are kept; adding past it drops an arbitrary one (its users keep it
/// alive through the shared_ptr).
class primitive_cache {
 public:
  using key = std::vector<std::int64_t>;

  explicit primitive_cache(std::size_t capacity = 32) : capacity_(capacity) {}

  /// The plan for `k`, built with `build` when missing. Thread-safe.
  std::shared_ptr<const plan> get(const key& k, const std::function<plan()>& build);

  /// Plans held now.
  [[nodiscard]] std::size_t size() const;

 private:
  struct key_hash {
    std::size_t operator()(const key& k) const noexcept;
  };
  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::unordered_map<key, std::shared_ptr<const plan>, key_hash> plans_;
};

/// Executes p.primitive on the calling thread with `data[i]` as the memory of p.args[i]
/// (loom's buffers, no copy): sets the thread count, adds a scratchpad of
/// p.scratchpad_bytes from ctx.allocate_temp, and waits for completion. The dnnl::memory
/// objects and the stream are kept per thread and per plan, so a repeated call allocates
/// nothing but the scratchpad (from loom's pool). A dnnl::error becomes ctx.fail naming
/// oneDNN's status.
void execute(kernel_context& ctx, const plan& p, std::initializer_list<const void*> data);

/// "oneDNN failed (status <n>): <message>", for error messages.
std::string describe(const dnnl::error& e);

}  // namespace loom::cpu::onednn
