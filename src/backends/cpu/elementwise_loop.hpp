// Strided, broadcasting iteration for the CPU element-wise kernels.
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
// nearest even on store (compute_t / load / store).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "elementwise_half.hpp"
#include "loom/core/half.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::cpu::ew {

// ---- element types ---------------------------------------------------------------------------

template <class T>
inline constexpr bool is_half_like = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// The type an element of T is computed in: float for half and bfloat16, else T.
template <class T>
using compute_t = std::conditional_t<is_half_like<T>, float, T>;

/// An element in its compute type (the conversions of elementwise_half.hpp: the same results
/// as loom::half's, without branches).
template <class T>
inline compute_t<T> load(T v) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    return half_to_float(v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16_to_float(v);
  } else {
    return v;
  }
}

/// A computed value as the element type T (float16 and bfloat16 round to nearest even).
template <class T>
inline T store(compute_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    return float_to_half(v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return float_to_bfloat16(v);
  } else {
    return v;
  }
}

/// A computed value as T holds it, in the compute type: load(store<T>(v)) bit for bit,
/// without the 16-bit round trip (round_to_half / round_to_bfloat16); v itself for the
/// other types.
template <class T>
inline compute_t<T> round_to(compute_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    return round_to_half(v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return round_to_bfloat16(v);
  } else {
    return v;
  }
}

// ---- plans -----------------------------------------------------------------------------------

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
/// by the caller: see broadcast_shape_of).
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

// ---- runs ------------------------------------------------------------------------------------

/// out[i] = op(a[i * as]) for i < n (out dense).
template <class R, class A, class Op>
inline void unary_run(R* out, const A* a, std::int64_t as, std::int64_t n, const Op& op) {
  if (as == 1) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = store<R>(op(load(a[i])));
  } else if (as == 0) {
    const R v = store<R>(op(load(*a)));
    for (std::int64_t i = 0; i < n; ++i) out[i] = v;
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = store<R>(op(load(a[i * as])));
  }
}

/// out[i] = op(a[i * as], b[i * bs]) for i < n (out dense), with the unit-stride and
/// stride-0 cases as plain loops.
template <class R, class A, class B, class Op>
inline void binary_run(R* out, const A* a, std::int64_t as, const B* b, std::int64_t bs,
                       std::int64_t n, const Op& op) {
  if (as == 1 && bs == 1) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = store<R>(op(load(a[i]), load(b[i])));
  } else if (as == 0 && bs == 1) {
    const auto av = load(*a);
    for (std::int64_t i = 0; i < n; ++i) out[i] = store<R>(op(av, load(b[i])));
  } else if (as == 1 && bs == 0) {
    const auto bv = load(*b);
    for (std::int64_t i = 0; i < n; ++i) out[i] = store<R>(op(load(a[i]), bv));
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = store<R>(op(load(a[i * as]), load(b[i * bs])));
    }
  }
}

// ---- drivers ---------------------------------------------------------------------------------

/// The stride of `t` along a flat walk over `count` output elements when no plan is needed:
/// 1 for a dense tensor of count elements, 0 for a single element, -1 otherwise (the
/// caller then makes a plan).
inline std::int64_t flat_stride(const tensor& t, std::int64_t count) noexcept {
  if (!t.is_contiguous()) return -1;
  const std::int64_t n = t.num_elements();
  return n == count ? 1 : n == 1 ? 0 : -1;
}

/// The broadcast shape of `shapes`; fails the node (loom::node_error) when they do not
/// broadcast, as fed placeholders with unknown dimensions can at run time.
shape broadcast_shape_of(const kernel_context& ctx, std::initializer_list<const shape*> shapes);

/// Output 0 for an element-wise result of shape `s`: written in place into the first of
/// `candidates` (input indices) that has shape `s` and whose buffer the node alone holds
/// (kernel_context::forward_input_or_allocate_output), else a new tensor.
tensor& forward_or_allocate(kernel_context& ctx, const shape& s,
                            std::initializer_list<std::size_t> candidates);

/// y = op(x) over input 0 into output 0 (R: the output's C++ type), in place when possible.
template <class T, class R, class Op>
void run_unary(kernel_context& ctx, const Op& op, double cost_ns) {
  const tensor& x = ctx.input(0);
  const shape s = x.shape();
  tensor& y = sizeof(R) == sizeof(T) ? forward_or_allocate(ctx, s, {0}) : ctx.allocate_output(0, s);
  const std::int64_t count = s.num_elements();
  if (count == 0) return;
  R* out = y.template data<R>();
  const T* a = x.template data<T>();
  if (x.is_contiguous()) {
    // The common case needs no plan: one run over dense memory.
    ctx.parallel_for(count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
      unary_run(out + begin, a + begin, 1, end - begin, op);
    });
    return;
  }
  const auto p = make_plan<2>(s, {&x});
  ctx.parallel_for(p.count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
    for_each_run(p, begin, end, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
      unary_run(out + off[0], a + off[1], p.inner[1], n, op);
    });
  });
}

/// z = op(x, y) over inputs 0 and 1 (broadcast) into output 0, in place when possible.
template <class T, class R, class Op>
void run_binary(kernel_context& ctx, const Op& op, double cost_ns) {
  const tensor& x = ctx.input(0);
  const tensor& y = ctx.input(1);
  const shape s = broadcast_shape_of(ctx, {&x.shape(), &y.shape()});
  tensor& z =
      sizeof(R) == sizeof(T) ? forward_or_allocate(ctx, s, {0, 1}) : ctx.allocate_output(0, s);
  const std::int64_t count = s.num_elements();
  if (count == 0) return;
  R* out = z.template data<R>();
  const T* a = x.template data<T>();
  const T* b = y.template data<T>();
  // The common cases need no plan: dense operands of the output's element count, or a
  // single element against a dense operand (stride 0).
  const std::int64_t as = flat_stride(x, count);
  const std::int64_t bs = flat_stride(y, count);
  if (as >= 0 && bs >= 0) {
    ctx.parallel_for(count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
      binary_run(out + begin, a + begin * as, as, b + begin * bs, bs, end - begin, op);
    });
    return;
  }
  const auto p = make_plan<3>(s, {&x, &y});
  ctx.parallel_for(p.count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
    for_each_run(p, begin, end, [&](const std::array<std::int64_t, 3>& off, std::int64_t n) {
      binary_run(out + off[0], a + off[1], p.inner[1], b + off[2], p.inner[2], n, op);
    });
  });
}

/// Applies f to every element of x (any strides), serially, until f returns false; returns
/// false when it stopped early.
template <class T, class F>
bool all_of(const tensor& x, F&& f) {
  if (x.num_elements() == 0) return true;
  const auto p = make_plan<2>(x.shape(), {&x});
  const T* a = x.template data<T>();
  bool ok = true;
  for_each_run(p, 0, p.count, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
    if (!ok) return;
    for (std::int64_t i = 0; i < n && ok; ++i) ok = f(a[off[1] + i * p.inner[1]]);
  });
  return ok;
}

}  // namespace loom::cpu::ew
