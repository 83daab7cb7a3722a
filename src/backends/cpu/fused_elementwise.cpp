// CPU kernel of fused_elementwise (Note [fused element-wise semantics] in
// src/graph/ops/fused_ops.cpp): the whole expression in one pass over memory.
//
// Note [tiled fused evaluation]
// The output's elements (row-major, broadcast shape S) are walked in tiles of a few hundred
// elements. Per tile, every value of the expression is a short array in the compute type:
//   - a dense input of S's element count, stored in the compute type, is read in place;
//   - any other input (broadcast, strided, float16 / bfloat16) is gathered into a tile
//     buffer, converting as it goes; a one-element input is a constant, read once per call;
//   - each instruction runs one tight loop over the tile (the op inlined, so the loop
//     vectorises as the unfused kernels' loops do) from its operands' arrays or constants
//     into a tile buffer, or straight into an output's memory when the value is a result
//     and the output is in the compute type; for float16 / bfloat16 the loop rounds each
//     value to T, as the op's own kernel stores it (Note [fused element-wise semantics];
//     round_to, without a 16-bit round trip; not for ops that select an operand);
//   - instructions whose operands are all constants (literals, one-element inputs) are
//     computed once per call, with the same functions, and are constants themselves.
// Tile buffers are assigned by a linear scan over the instructions, and a buffer is reused
// as soon as its value's last reader has run, so the working set stays in L1 however long
// the expression is. Results not written directly are stored (rounded to T) at the end of
// the tile. Each memory element is read and written once per call, and the tiles are split
// over the device's threads (ctx.parallel_for), each range with its own buffers; tiles never
// depend on the split, so results do not depend on the thread count.
//
// An output may take an input's buffer (Note [buffer forwarding]) when the input has the
// output's shape: reads and writes of one tile touch only that tile's elements, so only the
// order inside a tile matters. An output written directly by instruction k may share the
// buffer of an input that no instruction after k reads; any other forwarded output is
// stored after every instruction of the tile. An input that is itself a result is never
// forwarded (its copy to the other output could read overwritten elements).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <utility>
#include <vector>

#include "cpu_isa.hpp"
#include "elementwise_kernels.hpp"
#include "elementwise_loop.hpp"
#include "elementwise_math.hpp"
#include "elementwise_ops.hpp"
#include "kernel/common/elementwise_checks.hpp"
#include "loom/graph/fused_expr.hpp"

namespace loom::cpu {
namespace {

using namespace ew;

// Unary ops come first in ew_op.
template <ew_op Op>
inline constexpr bool is_unary = static_cast<int>(Op) < static_cast<int>(ew_op::add);

// ---- one element -----------------------------------------------------------------------------

// The functor of elementwise_ops.hpp that computes Op.
template <ew_op Op>
struct functor_of;
#define LOOM_FUNCTOR_OF(op, f) \
  template <>                  \
  struct functor_of<ew_op::op> { \
    using type = f;            \
  };
LOOM_FUNCTOR_OF(neg, neg_op)
LOOM_FUNCTOR_OF(abs, abs_op)
LOOM_FUNCTOR_OF(exp, exp_op)
LOOM_FUNCTOR_OF(log, log_op)
LOOM_FUNCTOR_OF(sqrt, sqrt_op)
LOOM_FUNCTOR_OF(rsqrt, rsqrt_op)
LOOM_FUNCTOR_OF(tanh, tanh_op)
LOOM_FUNCTOR_OF(sigmoid, sigmoid_op)
LOOM_FUNCTOR_OF(relu, relu_op)
LOOM_FUNCTOR_OF(gelu, gelu_erf_op)
LOOM_FUNCTOR_OF(gelu_tanh, gelu_tanh_op)
LOOM_FUNCTOR_OF(erf, erf_op)
LOOM_FUNCTOR_OF(square, square_op)
LOOM_FUNCTOR_OF(reciprocal, reciprocal_op)
LOOM_FUNCTOR_OF(add, add_op)
LOOM_FUNCTOR_OF(sub, sub_op)
LOOM_FUNCTOR_OF(mul, mul_op)
LOOM_FUNCTOR_OF(div, div_op)
LOOM_FUNCTOR_OF(pow, pow_op)
LOOM_FUNCTOR_OF(maximum, maximum_op)
LOOM_FUNCTOR_OF(minimum, minimum_op)
LOOM_FUNCTOR_OF(relu_grad, relu_grad_op)
#undef LOOM_FUNCTOR_OF

// Op applied to (a, b) in the compute type C (b unused by unary ops): the very functor the
// op's own kernel runs (elementwise_ops.hpp), so every value is bit for bit the unfused one.
template <ew_op Op, class C>
[[gnu::always_inline]] inline C eval(C a, [[maybe_unused]] C b) noexcept {
  using F = typename functor_of<Op>::type;
  if constexpr (is_unary<Op>) {
    return F{}(a);
  } else {
    return F{}(a, b);
  }
}

// Approximate cost of one element in nanoseconds (as the unfused kernels count it).
double cost_of(ew_op op, bool f32) {
  switch (op) {
    case ew_op::exp:
    case ew_op::tanh:
    case ew_op::sigmoid:
    case ew_op::gelu_tanh:
      return f32 ? 4.0 : 15.0;
    case ew_op::sqrt:
    case ew_op::rsqrt:
      return 4.0;
    case ew_op::log:
    case ew_op::gelu:
    case ew_op::erf:
      return 15.0;
    case ew_op::pow:
      return 20.0;
    default:
      return 0.5;
  }
}

// ---- one instruction over a tile ---------------------------------------------------------------

// Note [fused instruction sets]
// Every loop of the tile evaluator is compiled up to three times: for the baseline
// instruction set (SSE2 on x86-64) and, on x86, for AVX2 and (GCC) AVX-512 F/VL/BW/DQ; the
// widest the CPU supports is picked once per process, capped by the environment variable
// LOOM_MAX_CPU_ISA ("baseline", "avx2" or "avx512", as oneDNN's ONEDNN_MAX_CPU_ISA), which
// is how the tests run every variant. The loops are always_inline templates instantiated
// inside thin wrappers whose only difference is the target attribute, so the same source
// vectorises 4, 8 or 16 floats wide. The results are the same bit for bit in every variant,
// and the same as the unfused kernels': the loops use only IEEE arithmetic and bit
// operations, and libm calls stay calls. That needs one guard: GCC contracts a * b + c into
// an FMA whenever the target has one (C++ defaults to -ffp-contract=fast), and AVX-512
// implies FMA, which changes fast_exp's rounding; so the wrappers are compiled with
// fp-contract=off (GCC's optimize attribute; clang, which has no such attribute and
// contracts within expressions, gets no AVX-512 variant): cpu_isa.hpp's LOOM_ISA_*
// attributes, which every kernel compiled in variants uses. Measured on the 2-core
// development machine (Xeon, Sapphire Rapids), an 8-op float chain over data in L1 costs
// 1.25 ns per element on one thread with SSE2, 0.72 with AVX2 and 0.41 with AVX-512; at
// 16M elements on 2 threads that decides whether the chain is bound by its arithmetic or,
// as it should be, by memory.

// out[i] = op(a[i] or sa, b[i] or sb) for i < n. Operands may be the output itself (a value's
// buffer is reused by the instruction that reads it last): element-aligned, that is safe,
// and GCC's overlap check lets equal pointers take the vector loop.
template <class C>
using step_fn = void (*)(C* out, const C* a, const C* b, C sa, C sb, std::int64_t n);

// Ops whose value is one of their operands, its negation or a zero: from values of T they
// give a value of T, which needs no rounding.
template <ew_op Op>
inline constexpr bool selects_in_t = Op == ew_op::neg || Op == ew_op::abs || Op == ew_op::relu ||
                                     Op == ew_op::maximum || Op == ew_op::minimum ||
                                     Op == ew_op::relu_grad;

// Op's value as T holds it (Note [fused element-wise semantics]): a float16 / bfloat16 value
// rounded to the type, as the op's own kernel stores it; float and double as computed.
template <ew_op Op, class T>
[[gnu::always_inline]] inline compute_t<T> value_of(compute_t<T> v) noexcept {
  if constexpr (selects_in_t<Op>) {
    return v;
  } else {
    return round_to<T>(v);
  }
}

// The loops of element type T, computing in C = compute_t<T>.
template <ew_op Op, class T, class C = compute_t<T>>
[[gnu::always_inline]] inline void loop_vv(C* out, const C* a, const C* b, std::int64_t n) {
  if constexpr (is_unary<Op>) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = value_of<Op, T>(eval<Op, C>(a[i], C{}));
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = value_of<Op, T>(eval<Op, C>(a[i], b[i]));
  }
}
template <ew_op Op, class T, class C = compute_t<T>>
[[gnu::always_inline]] inline void loop_sv(C* out, C sa, const C* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = value_of<Op, T>(eval<Op, C>(sa, b[i]));
}
template <ew_op Op, class T, class C = compute_t<T>>
[[gnu::always_inline]] inline void loop_vs(C* out, const C* a, C sb, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = value_of<Op, T>(eval<Op, C>(a[i], sb));
}

// The three loops of every op: both operands arrays (the only one a unary op uses), a
// constant first operand, a constant second operand.
template <class C>
struct op_loops {
  step_fn<C> vv;
  step_fn<C> sv;
  step_fn<C> vs;
};

// ---- the kernel --------------------------------------------------------------------------------

// Tile buffers of one range of tiles live on its thread's stack up to this size (L1 is
// 32-48 KiB on the machines loom runs on); tiles shrink when an expression needs many.
constexpr std::size_t scratch_bytes = 24 * 1024;
constexpr std::int64_t max_tile = 512;
constexpr std::int64_t min_tile = 16;

// Note [fused prefetch]
// A tile first reads its inputs from memory, then computes in L1 for as long as the
// expression takes, then writes its results. Left to the hardware prefetcher, memory sits
// idle while a tile computes and the core waits while it reads: the two add up instead of
// overlapping. So each tile requests the memory of the tile `prefetch_tiles` ahead (its
// dense inputs for reading, its outputs for writing), a slice before each instruction
// rather than all at once, which would stall on the core's limit of outstanding misses.
// Measured on the development machine (8-op f32 chain, 16M elements, 2 threads, the two
// variants alternating in one process, the machine busy): 16.2 ms without, 12.0 ms with
// prefetching 2 tiles of 512 ahead; 1024-element tiles and other distances were no
// better. Nothing outside the calling range's tiles is prefetched.
constexpr std::int64_t prefetch_tiles = 2;

// Where a value's tile lives during one call.
enum class where : std::uint8_t {
  unused,    // not needed by any result
  constant,  // one value for every element (literal-only, one-element inputs, folded)
  memory,    // in place: a dense input's memory, or the output it is written to
  buffer,    // a tile buffer
};

// A tile's address: memory + tile start, or the scratch buffer's.
template <class C>
struct tile_ref {
  C* base = nullptr;  // where::memory
  int buf = -1;       // where::buffer
  /// nullptr for an operand that is not an array (a constant, a unary op's second).
  [[nodiscard]] C* at(C* scratch, std::int64_t tile, std::int64_t begin) const noexcept {
    if (buf >= 0) return scratch + buf * tile;
    return base == nullptr ? nullptr : base + begin;
  }
};

template <class C>
struct value_state {
  where w = where::unused;
  C constant{};
  tile_ref<C> ref;
  int last_use = -1;  // the last instruction reading it (results: past the last)
  int def = -1;       // the instruction defining it (-1 for inputs)
};

template <class C>
struct step {
  step_fn<C> fn = nullptr;
  tile_ref<C> out;
  tile_ref<C> a;
  tile_ref<C> b;
  bool a_const = false;
  bool b_const = false;
  C sa{};
  C sb{};
};

template <class T>
struct gather {
  const T* data = nullptr;
  int buf = -1;
  bool dense = false;
  plan<2> p;
};

template <class T, class C>
struct store_op {
  T* out = nullptr;
  bool is_constant = false;
  C constant{};
  tile_ref<C> src;
};

// What one call runs over every tile (Note [tiled fused evaluation]).
template <class T, class C>
struct tile_program {
  std::vector<gather<T>> gathers;
  std::vector<step<C>> steps;
  std::vector<store_op<T, C>> stores;
  /// Element 0 of the memory the tiles stream through: dense inputs read, outputs written.
  std::vector<const char*> reads;
  std::vector<const char*> writes;
  std::int64_t tile = max_tile;
  std::int64_t count = 0;
};

// Tiles [tb, te) of `p`, with `scratch` holding the tile buffers.
template <class T, class C>
[[gnu::always_inline]] inline void run_tiles(const tile_program<T, C>& p, std::int64_t tb,
                                             std::int64_t te, C* scratch) {
  const std::int64_t tile = p.tile;
  for (std::int64_t t = tb; t < te; ++t) {
    const std::int64_t begin = t * tile;
    const std::int64_t n = std::min(tile, p.count - begin);
    // The memory of the tile `prefetch_tiles` ahead is requested in slices, one before each
    // instruction, so that it arrives while this tile computes (Note [fused prefetch]).
    std::int64_t pf_lines = 0;
    std::size_t pf_from = 0;
    if (t + prefetch_tiles < te) {
      pf_from = static_cast<std::size_t>(begin + prefetch_tiles * tile) * sizeof(T);
      pf_lines = (std::min(tile, p.count - begin - prefetch_tiles * tile) *
                      static_cast<std::int64_t>(sizeof(T)) +
                  63) /
                 64;
    }
    const std::int64_t pf_per_slice = pf_lines / static_cast<std::int64_t>(p.steps.size() + 1) + 1;
    std::int64_t pf_done = 0;
    auto prefetch_slice = [&] {
      const std::int64_t until = std::min(pf_lines, pf_done + pf_per_slice);
      for (; pf_done < until; ++pf_done) {
        const std::size_t off = pf_from + static_cast<std::size_t>(pf_done) * 64;
        for (const char* r : p.reads) __builtin_prefetch(r + off, 0, 3);
        for (const char* w : p.writes) __builtin_prefetch(w + off, 1, 3);
      }
    };
    prefetch_slice();
    for (const gather<T>& g : p.gathers) {
      C* dst = scratch + g.buf * tile;
      if (g.dense) {
        const T* src = g.data + begin;
        for (std::int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
        continue;
      }
      for_each_run(g.p, begin, begin + n,
                   [&](const std::array<std::int64_t, 2>& off, std::int64_t m) {
                     C* d = dst + (off[0] - begin);
                     const T* src = g.data + off[1];
                     const std::int64_t stride = g.p.inner[1];
                     if (stride == 1) {
                       for (std::int64_t i = 0; i < m; ++i) d[i] = load(src[i]);
                     } else if (stride == 0) {
                       const C x = load(*src);
                       for (std::int64_t i = 0; i < m; ++i) d[i] = x;
                     } else {
                       for (std::int64_t i = 0; i < m; ++i) d[i] = load(src[i * stride]);
                     }
                   });
    }
    for (const step<C>& st : p.steps) {
      prefetch_slice();
      st.fn(st.out.at(scratch, tile, begin), st.a.at(scratch, tile, begin),
            st.b.at(scratch, tile, begin), st.sa, st.sb, n);
    }
    for (const store_op<T, C>& so : p.stores) {
      T* d = so.out + begin;
      if (so.is_constant) {
        const T x = store<T>(so.constant);
        for (std::int64_t i = 0; i < n; ++i) d[i] = x;
      } else {
        const C* src = so.src.at(scratch, tile, begin);
        for (std::int64_t i = 0; i < n; ++i) d[i] = store<T>(src[i]);
      }
    }
  }
}

// One set of compiled loops per instruction set: the same always_inline templates
// instantiated in wrappers that differ only in their target attribute.
#define LOOM_FUSED_ISA(name, target_attr)                                                        \
  struct name {                                                                                  \
    template <ew_op Op, class T, class C = compute_t<T>>                                         \
    target_attr static void vv(C* out, const C* a, const C* b, C, C, std::int64_t n) {           \
      loop_vv<Op, T>(out, a, b, n);                                                              \
    }                                                                                            \
    template <ew_op Op, class T, class C = compute_t<T>>                                         \
    target_attr static void sv(C* out, const C*, const C* b, C sa, C, std::int64_t n) {          \
      loop_sv<Op, T>(out, sa, b, n);                                                             \
    }                                                                                            \
    template <ew_op Op, class T, class C = compute_t<T>>                                         \
    target_attr static void vs(C* out, const C* a, const C*, C, C sb, std::int64_t n) {          \
      loop_vs<Op, T>(out, a, sb, n);                                                             \
    }                                                                                            \
    template <class T, class C>                                                                  \
    target_attr static void tiles(const tile_program<T, C>& p, std::int64_t tb, std::int64_t te, \
                                  C* scratch) {                                                  \
      run_tiles(p, tb, te, scratch);                                                             \
    }                                                                                            \
  };
LOOM_FUSED_ISA(baseline_isa, LOOM_ISA_BASELINE)
#if LOOM_ISA_HAS_AVX2
LOOM_FUSED_ISA(avx2_isa, LOOM_ISA_AVX2)
#endif
#if LOOM_ISA_HAS_AVX512
LOOM_FUSED_ISA(avx512_isa, LOOM_ISA_AVX512)
#endif
#undef LOOM_FUSED_ISA

// In cpu::isa_cap's order (max_cpu_isa() converts).
enum class isa_level : std::uint8_t { baseline, avx2, avx512 };
static_assert(static_cast<int>(isa_level::avx512) == static_cast<int>(cpu::isa_cap::avx512));

// The widest instruction set this CPU runs (within LOOM_MAX_CPU_ISA's cap, for testing every
// variant: Note [fused instruction sets]) that this build compiled a variant for.
isa_level best_isa() noexcept {
  static const isa_level level = [] {
    auto widest = static_cast<isa_level>(cpu::widest_cpu_isa());
    if (widest == isa_level::avx512 && !LOOM_ISA_HAS_AVX512) widest = isa_level::avx2;
    if (widest == isa_level::avx2 && !LOOM_ISA_HAS_AVX2) widest = isa_level::baseline;
    return widest;
  }();
  return level;
}

template <class Isa, class T, std::size_t... I>
constexpr std::array<op_loops<compute_t<T>>, num_ew_ops> make_loops(std::index_sequence<I...>) {
  return {{op_loops<compute_t<T>>{&Isa::template vv<static_cast<ew_op>(I), T>,
                                  &Isa::template sv<static_cast<ew_op>(I), T>,
                                  &Isa::template vs<static_cast<ew_op>(I), T>}...}};
}

// The loops of `op` for element type T (each rounds its values to T).
template <class T>
const op_loops<compute_t<T>>& loops_of(ew_op op, isa_level isa) {
  constexpr auto all = std::make_index_sequence<num_ew_ops>{};
  static constexpr auto baseline = make_loops<baseline_isa, T>(all);
#if LOOM_ISA_HAS_AVX512
  static constexpr auto avx512 = make_loops<avx512_isa, T>(all);
  if (isa == isa_level::avx512) return avx512[static_cast<std::size_t>(op)];
#endif
#if LOOM_ISA_HAS_AVX2
  static constexpr auto avx2 = make_loops<avx2_isa, T>(all);
  if (isa == isa_level::avx2) return avx2[static_cast<std::size_t>(op)];
#endif
  (void)isa;
  return baseline[static_cast<std::size_t>(op)];
}

template <class T, class C>
using tiles_fn = void (*)(const tile_program<T, C>&, std::int64_t, std::int64_t, C*);

template <class T, class C>
tiles_fn<T, C> tiles_of(isa_level isa) {
#if LOOM_ISA_HAS_AVX512
  if (isa == isa_level::avx512) return &avx512_isa::tiles<T, C>;
#endif
#if LOOM_ISA_HAS_AVX2
  if (isa == isa_level::avx2) return &avx2_isa::tiles<T, C>;
#endif
  (void)isa;
  return &baseline_isa::tiles<T, C>;
}

class fused_elementwise_kernel final : public op_kernel {
 public:
  explicit fused_elementwise_kernel(const kernel_construction& c)
      : op_kernel(c), type_(c.attr<dtype>("T")), expr_(fused_expr_of(c)) {
    // Values some result needs; the others are never computed.
    live_.assign(static_cast<std::size_t>(expr_.num_values()), false);
    for (std::int32_t r : expr_.results) live_[static_cast<std::size_t>(r)] = true;
    for (std::size_t k = expr_.instrs.size(); k-- > 0;) {
      if (!live_[static_cast<std::size_t>(expr_.num_inputs) + k]) continue;
      const fused_instr& in = expr_.instrs[k];
      for (int j = 0; j < info(in.op).arity; ++j) {
        const fused_operand& a = in.args[static_cast<std::size_t>(j)];
        if (!a.is_literal()) live_[static_cast<std::size_t>(a.value)] = true;
      }
    }
  }

  void compute(kernel_context& ctx) override {
    switch (type_) {
      case dtype::f32:
        return run<float>(ctx);
      case dtype::f64:
        return run<double>(ctx);
      case dtype::f16:
        return run<half>(ctx);
      case dtype::bf16:
        return run<bfloat16>(ctx);
      default:
        ctx.fail("fused_elementwise does not take {}", to_string(type_));
    }
  }

 private:
  template <class T>
  void run(kernel_context& ctx) const;

  dtype type_;
  fused_expr expr_;
  std::vector<bool> live_;
};

template <class T>
void fused_elementwise_kernel::run(kernel_context& ctx) const {
  using C = compute_t<T>;
  constexpr bool in_place_type = std::is_same_v<T, C>;
  const isa_level isa = best_isa();
  const auto n_in = static_cast<std::size_t>(expr_.num_inputs);
  const auto n_instr = static_cast<int>(expr_.instrs.size());
  const std::size_t n_out = expr_.results.size();
  // The output shape: all the inputs broadcast.
  const shape s = fused_shape_of(ctx, expr_);
  const std::int64_t count = s.num_elements();
  if (count == 0) {
    for (std::size_t j = 0; j < n_out; ++j) (void)ctx.allocate_output(j, s);
    return;
  }

  // Inputs: constants, in place, or gathered.
  std::vector<value_state<C>> val(static_cast<std::size_t>(expr_.num_values()));
  tile_program<T, C> prog;
  std::vector<gather<T>>& gathers = prog.gathers;
  for (std::size_t i = 0; i < n_in; ++i) {
    if (!live_[i]) continue;
    const tensor& x = ctx.input(i);
    T* data = x.template data<T>();
    const bool dense = x.is_contiguous() && x.num_elements() == count;
    if (x.num_elements() == 1) {
      val[i].w = where::constant;
      val[i].constant = load(*data);
    } else if (in_place_type && dense) {
      val[i].w = where::memory;
      if constexpr (in_place_type) val[i].ref.base = data;  // only read
      prog.reads.push_back(reinterpret_cast<const char*>(data));
    } else {
      val[i].w = where::buffer;
      gather<T> g;
      g.data = data;
      g.dense = dense;
      if (dense) prog.reads.push_back(reinterpret_cast<const char*>(data));
      if (!dense) g.p = make_plan<2>(s, {&x});
      gathers.push_back(std::move(g));
    }
  }

  // Instructions: fold those of constants; note each value's defining and last reader.
  // A value of T in the compute type: a float16 / bfloat16 value rounded to T first.
  auto as_t = [](C c) { return round_to<T>(c); };
  auto operand_constant = [&](const fused_operand& a, C& c) {
    if (a.is_literal()) {
      // As expand() writes it: ops::scalar of T (a double rounded through float for the
      // 16-bit types).
      c = as_t(static_cast<C>(a.literal));
      return true;
    }
    const auto& v = val[static_cast<std::size_t>(a.value)];
    c = v.constant;
    return v.w == where::constant;
  };
  for (int k = 0; k < n_instr; ++k) {
    const auto v = n_in + static_cast<std::size_t>(k);
    if (!live_[v]) continue;
    const fused_instr& in = expr_.instrs[static_cast<std::size_t>(k)];
    const int arity = info(in.op).arity;
    C c[2]{};
    bool all_constant = true;
    for (int j = 0; j < arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      all_constant = operand_constant(a, c[j]) && all_constant;
      if (!a.is_literal()) val[static_cast<std::size_t>(a.value)].last_use = k;
    }
    val[v].def = k;
    if (all_constant) {
      val[v].w = where::constant;
      loops_of<T>(in.op, isa).vv(&val[v].constant, &c[0], &c[1], c[0], c[1], 1);
    } else {
      val[v].w = where::buffer;  // or an output's memory, decided below
    }
  }
  for (std::int32_t r : expr_.results) val[static_cast<std::size_t>(r)].last_use = n_instr;

  // Outputs: in an input's buffer when that is safe (Note [tiled fused evaluation]), and
  // written directly by the instruction defining the result when the types allow.
  std::vector<bool> input_taken(n_in, false);
  std::vector<bool> input_is_result(n_in, false);
  for (std::int32_t r : expr_.results) {
    if (static_cast<std::size_t>(r) < n_in) input_is_result[static_cast<std::size_t>(r)] = true;
  }
  std::vector<tensor*> outs(n_out, nullptr);
  std::vector<int> alias(n_out, -1);
  for (std::size_t j = 0; j < n_out; ++j) {
    const auto& rv = val[static_cast<std::size_t>(expr_.results[j])];
    const bool direct = in_place_type && rv.def >= 0 && rv.w == where::buffer;
    for (int pass = 0; pass < 2 && outs[j] == nullptr; ++pass) {
      for (std::size_t i = 0; i < n_in && outs[j] == nullptr; ++i) {
        if (input_taken[i] || input_is_result[i] || ctx.input(i).shape() != s) continue;
        // First pass: only inputs that leave a direct write possible.
        if (pass == 0 && !(direct && val[i].last_use <= rv.def)) continue;
        if (tensor* o = ctx.forward_input(i, j, s)) {
          outs[j] = o;
          alias[j] = static_cast<int>(i);
          input_taken[i] = true;
        }
      }
    }
    if (outs[j] == nullptr) outs[j] = &ctx.allocate_output(j, s);
    if (alias[j] < 0) prog.writes.push_back(static_cast<const char*>(outs[j]->raw_data()));
  }
  std::vector<bool> stored(n_out, true);
  if constexpr (in_place_type) {
    for (std::size_t j = 0; j < n_out; ++j) {
      auto& rv = val[static_cast<std::size_t>(expr_.results[j])];
      if (rv.def < 0 || rv.w != where::buffer) continue;  // an input, a constant, or taken
      if (alias[j] >= 0 && val[static_cast<std::size_t>(alias[j])].last_use > rv.def) continue;
      rv.w = where::memory;
      rv.ref.base = outs[j]->template data<T>();
      stored[j] = false;
    }
  }

  // Tile buffers, by linear scan: gathered inputs first, then each instruction's value,
  // which may take the buffer of an operand it reads last.
  std::vector<int> free_bufs;
  int num_bufs = 0;
  auto take = [&] {
    if (free_bufs.empty()) return num_bufs++;
    const int b = free_bufs.back();
    free_bufs.pop_back();
    return b;
  };
  {
    std::size_t g = 0;
    for (std::size_t i = 0; i < n_in; ++i) {
      if (live_[i] && val[i].w == where::buffer) {
        val[i].ref.buf = gathers[g++].buf = take();
      }
    }
  }
  std::vector<step<C>>& steps = prog.steps;
  for (int k = 0; k < n_instr; ++k) {
    const auto v = n_in + static_cast<std::size_t>(k);
    if (!live_[v] || val[v].w == where::constant) continue;
    const fused_instr& in = expr_.instrs[static_cast<std::size_t>(k)];
    const int arity = info(in.op).arity;
    step<C> st;
    tile_ref<C>* refs[2] = {&st.a, &st.b};
    bool* consts[2] = {&st.a_const, &st.b_const};
    C* scalars[2] = {&st.sa, &st.sb};
    for (int j = 0; j < arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      C c{};
      if (operand_constant(a, c)) {
        *consts[j] = true;
        *scalars[j] = c;
      } else {
        *refs[j] = val[static_cast<std::size_t>(a.value)].ref;
      }
    }
    // Operands read for the last time give their buffers back first.
    for (int j = 0; j < arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      if (a.is_literal() || (j == 1 && !in.args[0].is_literal() && in.args[0].value == a.value)) {
        continue;
      }
      auto& u = val[static_cast<std::size_t>(a.value)];
      if (u.w == where::buffer && u.last_use == k) free_bufs.push_back(u.ref.buf);
    }
    if (val[v].w == where::buffer) val[v].ref.buf = take();
    st.out = val[v].ref;
    const op_loops<C>& l = loops_of<T>(in.op, isa);
    st.fn = st.a_const ? l.sv : st.b_const ? l.vs : l.vv;
    steps.push_back(st);
  }

  std::vector<store_op<T, C>>& stores = prog.stores;
  for (std::size_t j = 0; j < n_out; ++j) {
    if (!stored[j]) continue;
    const auto& rv = val[static_cast<std::size_t>(expr_.results[j])];
    store_op<T, C> so;
    so.out = outs[j]->template data<T>();
    so.is_constant = rv.w == where::constant;
    so.constant = rv.constant;
    so.src = rv.ref;
    stores.push_back(so);
  }

  // Tiles: as large as the buffers allow in scratch_bytes.
  std::int64_t tile = max_tile;
  if (num_bufs > 0) {
    const auto fit =
        static_cast<std::int64_t>(scratch_bytes / (static_cast<std::size_t>(num_bufs) * sizeof(C)));
    tile = std::clamp<std::int64_t>(fit / min_tile * min_tile, min_tile, max_tile);
  }
  const std::int64_t num_tiles = (count + tile - 1) / tile;
  double cost = 0.5 * static_cast<double>(gathers.size() + stores.size());
  for (int k = 0; k < n_instr; ++k) {
    const auto v = n_in + static_cast<std::size_t>(k);
    if (live_[v] && val[v].w != where::constant) {
      cost += cost_of(expr_.instrs[static_cast<std::size_t>(k)].op, std::is_same_v<C, float>);
    }
  }
  if constexpr (!in_place_type) cost += 1.0;  // conversions
  const auto scratch_elems = static_cast<std::size_t>(num_bufs) * static_cast<std::size_t>(tile);

  prog.tile = tile;
  prog.count = count;
  const auto run_some_tiles = tiles_of<T, C>(isa);
  ctx.parallel_for(num_tiles, cost * static_cast<double>(tile),
                   [&](std::int64_t tb, std::int64_t te) {
                     alignas(64) C stack_scratch[scratch_bytes / sizeof(C)];
                     std::vector<C> heap_scratch;
                     C* scratch = stack_scratch;
                     if (scratch_elems > scratch_bytes / sizeof(C)) {
                       heap_scratch.resize(scratch_elems);
                       scratch = heap_scratch.data();
                     }
                     run_some_tiles(prog, tb, te, scratch);
                   });
}

}  // namespace

void register_fused_kernels(kernel_registry& r) {
  r.add(make_kernel_def<fused_elementwise_kernel>(
      "fused_elementwise", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16})));
}

}  // namespace loom::cpu
