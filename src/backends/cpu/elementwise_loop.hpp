// The CPU element-wise kernels' loops: element types in their compute type, the runs of
// unit-stride / stride-0 / strided loops, and the unary and binary drivers, walking the
// device-neutral plan of src/kernel/common/elementwise_plan.hpp (Note [element-wise
// iteration] there).
//
// float16 and bfloat16 elements are loaded as float, computed in float, and rounded to
// nearest even on store (compute_t / load / store).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "cpu_isa.hpp"
#include "elementwise_half.hpp"
#include "kernel/common/elementwise_checks.hpp"
#include "kernel/common/elementwise_plan.hpp"
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
[[gnu::always_inline]] inline compute_t<T> load(T v) noexcept {
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
[[gnu::always_inline]] inline T store(compute_t<T> v) noexcept {
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
[[gnu::always_inline]] inline compute_t<T> round_to(compute_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, half>) {
    return round_to_half(v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return round_to_bfloat16(v);
  } else {
    return v;
  }
}

// ---- plans and checks (src/kernel/common/elementwise_plan.hpp, elementwise_checks.hpp) ------

using loom::ew::broadcast_shape_of;
using loom::ew::flat_stride;
using loom::ew::for_each_run;
using loom::ew::forward_or_allocate;
using loom::ew::fused_expr_of;
using loom::ew::fused_shape_of;
using loom::ew::generator_shape;
using loom::ew::make_plan;
using loom::ew::plan;

// ---- runs ------------------------------------------------------------------------------------

/// out[i] = op(a[i * as]) for i < n (out dense).
template <class R, class A, class Op>
[[gnu::always_inline]] inline void unary_run(R* out, const A* a, std::int64_t as, std::int64_t n, const Op& op) {
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
[[gnu::always_inline]] inline void binary_run(R* out, const A* a, std::int64_t as, const B* b, std::int64_t bs,
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

// Note [16-bit element-wise variants]
// A float16 or bfloat16 element costs integer work on every load and store (the branch-free
// conversions of elementwise_half.hpp). The baseline instruction set (SSE2) has no
// 16-to-32-bit widening or 32-to-16-bit narrowing, so GCC spells each out in unpacks and
// shuffles, 8 elements a step: the bfloat16 relu_grad of the CNN's training step ran at a
// third of float32's bytes per second, and its cast to float32 no faster. So the runs of a
// kernel whose input or output is 16-bit are compiled for each instruction set, as the fused
// kernels are (Note [fused instruction sets] in fused_elementwise.cpp: the same source, the
// same bits in every variant, the widest allowed picked per process); runs of the other
// types keep the one baseline loop, which memory bounds already.
#define LOOM_EW_RUN_VARIANT(isa, target_attr)                                                  \
  struct runs_##isa {                                                                           \
    template <class R, class A, class Op>                                                       \
    target_attr static void unary(R* out, const A* a, std::int64_t as, std::int64_t n,         \
                                  const Op& op) {                                               \
      unary_run(out, a, as, n, op);                                                             \
    }                                                                                           \
    template <class R, class A, class B, class Op>                                              \
    target_attr static void binary(R* out, const A* a, std::int64_t as, const B* b,            \
                                   std::int64_t bs, std::int64_t n, const Op& op) {             \
      binary_run(out, a, as, b, bs, n, op);                                                     \
    }                                                                                           \
  };
LOOM_EW_RUN_VARIANT(baseline, LOOM_ISA_BASELINE)
#if LOOM_ISA_HAS_AVX2
LOOM_EW_RUN_VARIANT(avx2, LOOM_ISA_AVX2)
#endif
#if LOOM_ISA_HAS_AVX512
LOOM_EW_RUN_VARIANT(avx512, LOOM_ISA_AVX512)
#endif
#undef LOOM_EW_RUN_VARIANT

/// Calls f(runs) with `runs` the run loops to use for elements of A in and R out: the widest
/// instruction set's when either is 16-bit (Note [16-bit element-wise variants]), else the
/// baseline's.
template <class R, class A, class F>
void with_runs(F&& f) {
  if constexpr (is_half_like<A> || is_half_like<R>) {
    switch (cpu::widest_cpu_isa()) {
      case cpu::isa_cap::avx512:
#if LOOM_ISA_HAS_AVX512
        return f(runs_avx512{});
#endif
      case cpu::isa_cap::avx2:
#if LOOM_ISA_HAS_AVX2
        return f(runs_avx2{});
#endif
      case cpu::isa_cap::baseline:
        break;
    }
  }
  f(runs_baseline{});
}

// ---- drivers ---------------------------------------------------------------------------------

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
  with_runs<R, T>([&](auto runs) {
    using runs_t = decltype(runs);
    if (x.is_contiguous()) {
      // The common case needs no plan: one run over dense memory.
      ctx.parallel_for(count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
        runs_t::unary(out + begin, a + begin, 1, end - begin, op);
      });
      return;
    }
    const auto p = make_plan<2>(s, {&x});
    ctx.parallel_for(p.count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
      for_each_run(p, begin, end, [&](const std::array<std::int64_t, 2>& off, std::int64_t n) {
        runs_t::unary(out + off[0], a + off[1], p.inner[1], n, op);
      });
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
  with_runs<R, T>([&](auto runs) {
    using runs_t = decltype(runs);
    if (as >= 0 && bs >= 0) {
      ctx.parallel_for(count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
        runs_t::binary(out + begin, a + begin * as, as, b + begin * bs, bs, end - begin, op);
      });
      return;
    }
    const auto p = make_plan<3>(s, {&x, &y});
    ctx.parallel_for(p.count, cost_ns, [&](std::int64_t begin, std::int64_t end) {
      for_each_run(p, begin, end, [&](const std::array<std::int64_t, 3>& off, std::int64_t n) {
        runs_t::binary(out + off[0], a + off[1], p.inner[1], b + off[2], p.inner[2], n, op);
      });
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
