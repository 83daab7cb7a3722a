// The element-wise rules that decide what NaN, infinities and signed zeros become, written
// once for every backend: the CPU kernels (unfused, fused_elementwise, the matmul / conv2d
// epilogues), the CUDA kernels (nvcc) and the fused code NVRTC compiles at run time
// (fused_codegen.cpp prepends elementwise_rules_source to every program).
//
// Note [NaN rules]
// Every kernel of loom propagates NaN as NumPy and PyTorch do, and a graph pass never
// changes an answer, so the fused kernels use these same functions:
//   relu(x)          x < 0 ? 0 : x        relu(NaN) = NaN, relu(-0) = -0 (torch.relu's);
//   maximum(a, b)    NaN if a or b is     np.maximum; a tie returns b, so maximum(-0, +0)
//   minimum(a, b)    NaN, else the larger  = +0 and maximum(+0, -0) = -0, as np.maximum
//                    / smaller             (the order IEEE leaves open);
//   relu_grad(dy, y) y > 0 ? dy : 0       y NaN gives 0, as torch's threshold_backward
//                                          (y <= 0 ? 0 : dy) would not: loom's rule.
// A clamp is minimum(maximum(x, lo), hi) and so keeps NaN (torch.clamp(NaN, 0, 6) = NaN);
// relu6, hard sigmoid and hard swish are written with these.
// The forms are branch-free selects on comparisons (a NaN compares false), which vectorise
// on the CPU; std::max / fmaxf / vmaxps would drop a NaN (they return the other operand).
//
// The rules are defined by one macro, LOOM_ELEMENTWISE_RULES(qualifiers), expanded below
// as C++ (host, and device under nvcc) and turned into text for NVRTC, which compiles the
// same tokens: the text cannot drift from the code.
#pragma once

// The rules, for a compute type C (float or double; integers where noted by the callers).
// `|` rather than `||`: both comparisons are cheap and a select vectorises.
// clang-format off
#define LOOM_ELEMENTWISE_RULES(FN)                                                     \
  template <class C> FN C relu(C x) { return x < C(0) ? C(0) : x; }                    \
  template <class C> FN C maximum(C a, C b) { return ((a > b) | (a != a)) ? a : b; }   \
  template <class C> FN C minimum(C a, C b) { return ((a < b) | (a != a)) ? a : b; }   \
  template <class C> FN C relu_grad(C dy, C y) { return y > C(0) ? dy : C(0); }
// clang-format on

#if defined(__CUDACC__)
#define LOOM_RULE_FN __host__ __device__ __forceinline__
#else
#define LOOM_RULE_FN [[gnu::always_inline]] inline
#endif

namespace loom::rules {

LOOM_ELEMENTWISE_RULES(LOOM_RULE_FN)

#define LOOM_RULES_TEXT_(...) #__VA_ARGS__
#define LOOM_RULES_TEXT(...) LOOM_RULES_TEXT_(__VA_ARGS__)

/// The rules as CUDA C++ source for NVRTC: functions loom::rules::relu, maximum, minimum
/// and relu_grad, each `__device__ __forceinline__` (LOOM_RTC_RULE_FN, which the text
/// defines first).
inline constexpr const char* elementwise_rules_source =
    "#define LOOM_RTC_RULE_FN __device__ __forceinline__\n"
    "namespace loom { namespace rules {\n" LOOM_RULES_TEXT(
        LOOM_ELEMENTWISE_RULES(LOOM_RTC_RULE_FN)) "\n} }\n";

#undef LOOM_RULES_TEXT
#undef LOOM_RULES_TEXT_

}  // namespace loom::rules
