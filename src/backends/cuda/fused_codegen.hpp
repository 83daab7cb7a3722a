// fused_codegen: a fused_elementwise expression (loom/graph/fused_expr.hpp) printed as one
// CUDA C++ kernel for NVRTC (nvrtc_compiler.hpp), and the index layout its launch needs.
//
// Note [fused cuda kernel]
// The generated kernel is a grid-stride loop over the output's elements (int64 indices,
// row-major over the broadcast shape S). Each thread, per element i:
//   - loads every input the results need, by its kind (fused_input_kind): a dense input
//     (contiguous, S's element count) at i; a scalar input (one element) once, before the
//     loop; any other (broadcast, transposed, offset views) at the offset its strides give
//     for i's coordinates, computed once per element over the collapsed dims;
//   - evaluates every live instruction in registers, in the compute type (float for
//     float16 / bfloat16, as the CPU kernel), literals inlined exactly (hex floats), and
//     for float16 / bfloat16 rounds each value to the type, as the unfused kernels store
//     it (Note [fused element-wise semantics]; literals are rounded to the type too);
//   - stores every result.
// Every load of element i happens before any store of element i, and no thread touches
// another's elements, so an output may take the buffer of a dense input of S's shape
// (Note [buffer forwarding]).
//
// The math is the CPU kernel's (src/backends/cpu/fused_elementwise.cpp), op by op. float32
// exp / tanh / sigmoid / gelu_tanh are the CPU's own polynomials (fast_exp, fast_tanh of
// elementwise_math.hpp) and float16 / bfloat16 conversions its bit-level ones
// (elementwise_half.hpp), and the source is compiled with --fmad=false (the CPU kernel is
// compiled with fp-contract=off), IEEE division and square root and no flush to zero: so
// every op built from IEEE arithmetic gives the CPU's result bit for bit. log, erf, gelu's
// erfc, pow, and the float64 transcendental functions are CUDA's libdevice functions
// (within 1-4 ulp of glibc's, not bit-identical). relu, maximum, minimum and relu_grad are
// loom::rules' (Note [NaN rules] in src/kernel/common/elementwise_rules.hpp), whose source the
// program carries: the very text the CPU and nvcc kernels compile. The source includes no
// header: NVRTC's built-in math functions and bit casts only.
//
// Against the unfused CUDA kernels (nvcc, libdevice expf / tanhf / erff, FMA contraction
// on), a fused float32 exp, tanh, sigmoid or gelu_tanh differs by a few ulp: on CUDA the
// fused kernel is bitwise the CPU's, not the unfused CUDA kernels' (docs/passes.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"
#include "loom/graph/fused_expr.hpp"

namespace loom::cuda {

/// How the generated kernel reads one input of the expression.
enum class fused_input_kind : std::uint8_t {
  unused,   // read by no live instruction and no result: not a kernel parameter
  scalar,   // one element: read once per thread
  dense,    // contiguous with the output's element count: element i
  strided,  // anything else: the offset of i's coordinates through the input's strides
};

/// What the source of one kernel depends on besides the expression: the element type,
/// each input's kind, and the number of (collapsed) dims the strided inputs are indexed by
/// (0 when none is strided).
struct fused_layout {
  dtype type = dtype::f32;
  std::vector<fused_input_kind> inputs;
  int rank = 0;

  friend bool operator==(const fused_layout&, const fused_layout&) = default;
};

/// A compact key of a layout ("f32:dsu:2"), for caches.
[[nodiscard]] std::string layout_key(const fused_layout& layout);

/// The layout of one launch and the values of its index parameter.
struct fused_index {
  fused_layout layout;
  /// The output's dims after dropping those of size 1 and merging those every strided
  /// input walks contiguously (layout.rank of them); empty when no input is strided.
  std::vector<std::int64_t> sizes;
  /// Per strided input, in input order: its stride (in elements) along each of `sizes`
  /// (0 where it broadcasts).
  std::vector<std::vector<std::int64_t>> strides;
};

/// Which values of `e` its results need (inputs and instructions; the others are never
/// computed). Size e.num_values(). `e` must be valid.
[[nodiscard]] std::vector<bool> live_values(const fused_expr& e);

/// The index layout for `inputs` (one per expression input, any strides) broadcast to
/// `out` (their broadcast shape, at least one element), all of type `t`. Inputs the
/// results do not need are `unused`. Throws loom::invalid_argument when inputs.size() !=
/// e.num_inputs or an input does not broadcast to `out`.
[[nodiscard]] fused_index plan_fused_index(const fused_expr& e, dtype t,
                                           const std::vector<const tensor*>& inputs,
                                           const shape& out);

/// The bytes of the kernel's parameters for `layout` and `num_outputs` outputs (count,
/// pointers, index struct), to keep a launch under the 4 KiB every CUDA device takes.
[[nodiscard]] std::size_t kernel_param_bytes(const fused_layout& layout, std::size_t num_outputs);

/// The CUDA C++ source of one kernel computing `e` for `layout` (Note [fused cuda
/// kernel]), named `kernel_name` (extern "C", so that is its symbol). Its parameters, in
/// order: `long long n` (the output's element count), one `const T*` per input that is not
/// `unused` (in input order; the element at the input's offset), one `T*` per result
/// (dense), and, when layout.rank > 0, a struct passed by value of `long long
/// size[rank]` followed by `long long stride[S][rank]` for the S strided inputs (the
/// fused_index values, int64 row-major). T is float / double / unsigned short (float16 and
/// bfloat16 bits). Launch with any 1-D grid; blocks of at most 256 threads.
/// Throws loom::invalid_argument when `e` is invalid, layout.inputs.size() !=
/// e.num_inputs, the type is not a float type, a live input is `unused`, the rank does not
/// match the strided inputs (> 0 exactly when one is strided), or the name is not a C
/// identifier.
[[nodiscard]] std::string generate_cuda_source(const fused_expr& e, const fused_layout& layout,
                                               const std::string& kernel_name);

}  // namespace loom::cuda
