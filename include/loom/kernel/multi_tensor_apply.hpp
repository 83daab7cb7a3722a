// multi_tensor_apply: one kernel call over a list of tensors of any sizes and any count.
//
// The tensors are cut into chunks of at most `multi_tensor_chunk_elements` elements, each
// chunk inside one tensor, listed in a flat table of (tensor index, begin, end) in tensor
// order. A functor then runs once per chunk, the chunks spread over the device's threads
// (ctx.parallel_for on CPU; one chunk per CUDA block is the plan for GPUs). The same table
// serves every pass of a kernel, so a per-chunk result (a partial sum of squares) lands in
// the same slot whatever the thread count, and reducing the slots in chunk order gives the
// same answer on 1 thread or 16 (Note [deterministic multi-tensor reductions]).
//
// Device independent: nothing here touches memory; the functor gets indices and finds its
// tensors' data itself. Used by the fused optimizers (src/backends/cpu/optimizer_*.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/kernel/op_kernel.hpp"

namespace loom {

/// Elements per chunk. 64K f32 elements are 256 KiB per operand: the few operands an
/// optimizer streams (param, grad, two moments) stay within a core's L2 while it works on
/// a chunk, a chunk is ~50-100 µs of work (well above the pool's 20 µs split threshold, so
/// waking a thread pays), and a 1M-element tensor still splits 16 ways for the threads.
inline constexpr std::int64_t multi_tensor_chunk_elements = std::int64_t{1} << 16;

/// One chunk: elements [begin, end) of tensor `tensor`.
struct tensor_chunk {
  std::int32_t tensor = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;

  [[nodiscard]] std::int64_t size() const noexcept { return end - begin; }
  friend bool operator==(const tensor_chunk&, const tensor_chunk&) = default;
};

/// The chunk table of tensors of `sizes` elements: each tensor's elements in order, cut
/// every `chunk_elements` (the last chunk of a tensor may be shorter). Empty tensors have
/// no chunk. Throws loom::invalid_argument for chunk_elements < 1 or a negative size.
inline std::vector<tensor_chunk> make_chunk_table(
    std::span<const std::int64_t> sizes,
    std::int64_t chunk_elements = multi_tensor_chunk_elements) {
  if (chunk_elements < 1) throw invalid_argument("make_chunk_table: chunk_elements must be >= 1");
  std::vector<tensor_chunk> table;
  std::size_t count = 0;
  for (const std::int64_t n : sizes) {
    if (n < 0) throw invalid_argument("make_chunk_table: a tensor size is negative");
    count += static_cast<std::size_t>((n + chunk_elements - 1) / chunk_elements);
  }
  table.reserve(count);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    for (std::int64_t b = 0; b < sizes[t]; b += chunk_elements) {
      table.push_back({static_cast<std::int32_t>(t), b, std::min(sizes[t], b + chunk_elements)});
    }
  }
  return table;
}

/// Calls fn(chunk_index, chunk) once for every chunk of `table`, on the device's threads
/// (each call on one thread; calls for different chunks may run at once). `ns_per_element`
/// is the rough cost of one element, which decides how finely the work is split (small
/// lists run inline on the caller). Returns when every chunk is done. fn must not throw.
template <class F>
void multi_tensor_apply(const kernel_context& ctx, std::span<const tensor_chunk> table,
                        double ns_per_element, F&& fn) {
  if (table.empty()) return;
  std::int64_t total = 0;
  for (const auto& c : table) total += c.size();
  const double per_chunk =
      ns_per_element * static_cast<double>(total) / static_cast<double>(table.size());
  ctx.parallel_for(static_cast<std::int64_t>(table.size()), per_chunk,
                   [&](std::int64_t begin, std::int64_t end) {
                     for (std::int64_t i = begin; i < end; ++i) {
                       fn(static_cast<std::size_t>(i), table[static_cast<std::size_t>(i)]);
                     }
                   });
}

}  // namespace loom
