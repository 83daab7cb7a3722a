// The element-wise iteration plan, shared by every backend's element-wise kernels: how to walk
// the operands of out[i] = f(in_0[i], in_1[i], ...) over a broadcast output shape.
//
// Note [element-wise iteration]
// An element-wise kernel computes out[i] = f(in_0[i], in_1[i], ...) over the output's elements
// in row-major order, each input broadcast (NumPy's rules) to the output's shape. Inputs are
// never copied to make them dense: a plan gives every operand its stride (in elements) along
// each output dimension -- 0 where the input is broadcast -- and then simplifies: dimensions
// of size 1 are dropped, and neighbouring dimensions merge wherever every operand steps
// through them as through one (stride[d] == stride[d + 1] * dims[d + 1]). So contiguous
// operands of one shape collapse to a single dimension, a scalar against a tensor to one
// dimension with stride 0, a bias row against a matrix to two. The innermost dimension is
// walked in runs, and each run is one of: every input at unit stride (a plain loop the
// compiler vectorises), one input at stride 0 (its value hoisted out of the loop), or
// general strides (transposed views). The output (operand 0) is always dense, so its inner
// stride is 1. The work splits by output element index over the device's threads; each range
// starts its own walk, so results do not depend on the number of threads.
//
// float16 and bfloat16 elements are loaded as float, computed in float, and rounded to
// nearest even on store (the CPU's compute_t / load / store in
// src/backends/cpu/elementwise_loop.hpp; the CUDA kernels' in kernels/elementwise_device.cuh).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom::ew {

/// How to walk N operands (operand 0: the dense output; 1..N-1: inputs) over an output
/// shape. dims has rank >= 1 after simplification (a scalar is one dimension of 1).
template <std::size_t N>
struct plan {
  shape dims;
  std::array<shape, N> strides;
  /// Each operand's stride along the innermost dimension.
  std::array<std::int64_t, N> inner{};
  std::int64_t count = 0;
};

/// The plan for writing a dense `out` from `inputs`, each broadcastable to `out` (checked
/// by the caller: see broadcast_shape_of in elementwise_outputs.hpp).
template <std::size_t N>
plan<N> make_plan(const shape& out, const std::array<const tensor*, N - 1>& inputs) {
  const std::size_t rank = out.rank();
  // Full strides of every operand along every output dimension.
  std::array<shape, N> full;
  full[0] = contiguous_strides(out);
  for (std::size_t k = 1; k < N; ++k) {
    const tensor& t = *inputs[k - 1];
    full[k] = shape::filled(rank, 0);
    const std::size_t lead = rank - t.rank();
    for (std::size_t d = 0; d < t.rank(); ++d) {
      full[k][lead + d] = t.dim(d) == 1 ? 0 : t.strides()[d];
    }
  }
  plan<N> p;
  p.count = out.num_elements();
  for (std::size_t k = 0; k < N; ++k) p.strides[k] = shape{};
  for (std::size_t d = 0; d < rank; ++d) {
    const std::int64_t n = out[d];
    if (n == 1) continue;
    const std::size_t r = p.dims.rank();
    bool merge = r > 0;
    for (std::size_t k = 0; k < N && merge; ++k) {
      merge = p.strides[k][r - 1] == full[k][d] * n;
    }
    if (merge) {
      p.dims[r - 1] *= n;
      for (std::size_t k = 0; k < N; ++k) p.strides[k][r - 1] = full[k][d];
    } else {
      p.dims.push_back(n);
      for (std::size_t k = 0; k < N; ++k) p.strides[k].push_back(full[k][d]);
    }
  }
  if (p.dims.rank() == 0) {
    p.dims.push_back(1);
    for (std::size_t k = 0; k < N; ++k) p.strides[k].push_back(k == 0 ? 1 : 0);
  }
  for (std::size_t k = 0; k < N; ++k) p.inner[k] = p.strides[k][p.dims.rank() - 1];
  return p;
}

/// Calls f(offsets, n) for the runs covering output elements [begin, end): n consecutive
/// elements along the innermost dimension, operand k's first one at element offset
/// offsets[k] (from its element 0); along the run operand k advances by p.inner[k].
template <std::size_t N, class F>
void for_each_run(const plan<N>& p, std::int64_t begin, std::int64_t end, F&& f) {
  const std::size_t r = p.dims.rank();
  const std::int64_t inner = p.dims[r - 1];
  std::array<std::int64_t, N> off{};
  shape idx = shape::filled(r, 0);
  std::int64_t rem = begin;
  for (std::size_t d = r; d-- > 0;) {
    idx[d] = rem % p.dims[d];
    rem /= p.dims[d];
    for (std::size_t k = 0; k < N; ++k) off[k] += idx[d] * p.strides[k][d];
  }
  std::int64_t left = end - begin;
  while (left > 0) {
    const std::int64_t n = std::min(inner - idx[r - 1], left);
    f(off, n);
    left -= n;
    if (left == 0) return;
    // Back to the start of this row, then on to the next row.
    for (std::size_t k = 0; k < N; ++k) off[k] -= idx[r - 1] * p.strides[k][r - 1];
    idx[r - 1] = 0;
    for (std::size_t d = r - 1; d-- > 0;) {
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += p.strides[k][d];
      if (idx[d] < p.dims[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= idx[d] * p.strides[k][d];
      idx[d] = 0;
    }
  }
}

/// The stride of `t` along a flat walk over `count` output elements when no plan is needed:
/// 1 for a dense tensor of count elements, 0 for a single element, -1 otherwise (the
/// caller then makes a plan).
inline std::int64_t flat_stride(const tensor& t, std::int64_t count) noexcept {
  if (!t.is_contiguous()) return -1;
  const std::int64_t n = t.num_elements();
  return n == count ? 1 : n == 1 ? 0 : -1;
}

}  // namespace loom::ew
