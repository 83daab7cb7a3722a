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
//   OpenMP keeps one team per calling thread, so two oneDNN kernels run at once on two
//   pool threads would use 2 x num_threads cores: oneDNN kernels say uses_all_threads(),
//   and the executor runs them one at a time per device.
// - Fallback: a primitive oneDNN cannot make for this machine or these dtypes
//   (dnnl::error at creation) is recorded as such in the cache, and the kernel runs its
//   reference loops instead.
//
// Note [blocked layouts]
// oneDNN's fastest convolutions compute in blocked layouts (nChw16c activations, OIhw16i16o
// weights), not in the plain NCHW/OIHW loom's tensors use; on plain layouts it falls back to
// im2col + GEMM. The convolution kernels therefore ask for format_tag::any, and an
// argument whose chosen layout differs from loom's gets a reorder in its plan
// (arg_desc::inner, plan::reorders): execute() copies an input into a temporary of the
// chosen layout before the primitive, and an output back after it. Measured on 2 cores
// ([128, 32, 14, 14] * [64, 32, 3, 3]): forward 7.4 -> 3.3 ms, backward data 9.0 -> 3.3 ms,
// backward weights 7.7 -> 3.6 ms, for 0.4 ms of reorders. Tensors stay plain between
// nodes, so every other kernel, the fetches and DLPack see NCHW.
//
// Note [constant reorders]
// A filter from a `const` node (an imported model's weights) is the same buffer, holding
// the same values, on every run of the plan that made the kernel: its reorder into the
// primitive's layout is done once and kept by the kernel (constant_reorders), instead of on
// every run. matmul does the same for a constant B (Note [constant weights] in
// nn_matmul.cpp). The copy belongs to the buffer and the two layouts, not to the plan: a
// kernel that meets a new shape (a model's sequence length or image size) builds a new
// plan, which reuses the copy when oneDNN picked the same layout for the weights.
// Inference graphs reorder their weights once, as ONNX Runtime prepacks them; variables,
// which training updates in place, are reordered on every run as before. The kept copy is
// what the per-run reorder would make, so the answers are the same, except for the 3x3
// convolutions that a constant filter lets run Winograd's algorithm (Note [Winograd
// convolutions] in nn_conv.cpp): their filter transform is such a kept copy.
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
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/kernel/kernel_registry.hpp"
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

/// Calls fn(begin, end) over [0, n) split into at most `threads` contiguous parts on the
/// calling thread's OpenMP team, the one oneDNN's primitives run on (Note [work after a
/// primitive]); inline when the work (n * cost_per_item nanoseconds) is too small to split.
/// fn must not throw.
void parallel_for(int threads, std::int64_t n, double cost_per_item,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

/// Why oneDNN computes `t` slowly on this CPU (only its reference implementation of a
/// matrix product, "ref:any", where this machine lacks the instructions), or nullopt where
/// it has a native one. Probed once per dtype with a small product; for kernel_def::emulated
/// of the matmul and convolution kernels.
std::optional<std::string> emulated_reason(dtype t);
/// `def` with emulated_reason as its kernel_def::emulated.
inline kernel_def with_emulated_reason(kernel_def def) {
  def.emulated = &emulated_reason;
  return def;
}

/// A primitive attribute with scratchpad_mode::user (Note [oneDNN integration]).
dnnl::primitive_attr user_scratchpad_attr();

/// An argument of a primitive: its DNNL_ARG_* and its memory descriptor.
struct arg_desc {
  int arg = 0;
  /// The layout of loom's buffer for this argument (plain, as the tensor's strides say).
  dnnl::memory::desc md;
  /// The layout the primitive computes in, when oneDNN chose another (a blocked one, from
  /// format_tag::any: Note [blocked layouts]); empty when it is md.
  dnnl::memory::desc inner{};
  /// The primitive writes this argument (it is reordered back after the primitive runs).
  bool output = false;
};

/// A built primitive, the descriptors of its arguments (in the order execute() takes their
/// data), and the scratchpad bytes it needs. `primitive` is empty when oneDNN has no
/// implementation (the kernel falls back to its reference loops).
struct plan {
  std::optional<dnnl::primitive> primitive;
  std::vector<arg_desc> args;
  /// Per argument: the reorder between md and inner (md -> inner for inputs, inner -> md
  /// for outputs), or nothing when the primitive takes loom's buffer as it is.
  std::vector<std::optional<dnnl::reorder>> reorders;
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
  for (auto& a : p.args) {
    if (a.inner.get_size() == 0 || a.inner == a.md) {
      a.inner = dnnl::memory::desc();
      p.reorders.emplace_back();
    } else if (a.output) {
      p.reorders.emplace_back(dnnl::reorder(
          dnnl::reorder::primitive_desc(engine(), a.inner, engine(), a.md)));
    } else {
      p.reorders.emplace_back(dnnl::reorder(
          dnnl::reorder::primitive_desc(engine(), a.md, engine(), a.inner)));
    }
  }
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
/// (loom's buffers, no copy, except for arguments the primitive takes in another layout:
/// those go through a temporary from ctx.allocate_temp and a reorder, before the primitive
/// for inputs and after it for outputs): sets the thread count, adds a scratchpad of
/// p.scratchpad_bytes from ctx.allocate_temp, and waits for completion. The dnnl::memory
/// objects and the stream are kept per thread and per plan, so a repeated call allocates
/// nothing but the scratchpad (from loom's pool). A dnnl::error becomes ctx.fail naming
/// oneDNN's status.
void execute(kernel_context& ctx, const plan& p, std::initializer_list<const void*> data);

/// Reordered copies of a kernel's constant arguments (Note [constant reorders]), kept for the
/// kernel's life: one per buffer and pair of layouts, shared by every plan that needs it, so
/// that a kernel run at many shapes (sequence lengths, image sizes) keeps one copy of its
/// weights per layout, not one per shape. Thread-safe.
class constant_reorders {
 public:
  /// The argument `i` of plan `p` over `handle` in the primitive's layout, reordered on first
  /// use.
  const void* get(const plan& p, std::size_t i, const void* handle);

 private:
  struct copy {
    const void* handle;
    dnnl::memory::desc from;  // loom's layout of the buffer
    dnnl::memory::desc to;    // the primitive's
    tensor data;
  };
  std::mutex mutex_;
  std::vector<copy> copies_;  // few: a kernel's constant arguments times their layouts
};

/// execute() where the arguments whose bit is set in `constant_mask` (bit i: argument i)
/// never change: their reorders come from `constants`.
void execute(kernel_context& ctx, const plan& p, std::initializer_list<const void*> data,
             constant_reorders& constants, std::uint32_t constant_mask);
/// The same with the arguments' data in a span (a list whose length varies).
void execute(kernel_context& ctx, const plan& p, std::span<const void* const> data,
             constant_reorders& constants, std::uint32_t constant_mask);

/// The op of the node that input `i` of the node being made comes straight from; empty
/// when the node is made outside a graph.
std::string_view input_op(const kernel_construction& c, std::size_t i);
/// True when input `i` of the node being made comes straight from a `const` node.
inline bool input_is_constant(const kernel_construction& c, std::size_t i) { return input_op(c, i) == "const"; }

/// "oneDNN failed (status <n>): <message>", for error messages.
std::string describe(const dnnl::error& e);

}  // namespace loom::cpu::onednn
