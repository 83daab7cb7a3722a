// The widest instruction set the CPU kernels may use: LOOM_MAX_CPU_ISA caps it, so that tests
// run every variant of a kernel that dispatches by instruction set (Note [fused instruction
// sets]). Read once, in one place, for every kernel.
#pragma once

#include <cstdint>

// Function attributes for the instruction-set variants of a kernel (Note [fused instruction
// sets] in fused_elementwise.cpp): LOOM_ISA_BASELINE, LOOM_ISA_AVX2 and LOOM_ISA_AVX512 for
// the thin wrappers that instantiate the same always_inline loop per variant;
// LOOM_ISA_HAS_AVX2 / LOOM_ISA_HAS_AVX512 say whether this compiler builds the variant. Every
// variant is compiled with fp-contract=off (GCC), so that no a * b + c becomes an FMA and
// each lane's operations stay the baseline's: the variants give the same bits. clang has no
// such attribute and contracts within expressions, so it gets no AVX-512 variant (AVX-512
// implies FMA; AVX2 alone does not).
#if defined(__GNUC__) && !defined(__clang__)
#define LOOM_ISA_BASELINE [[gnu::optimize("fp-contract=off")]]
#else
#define LOOM_ISA_BASELINE
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_ISA_HAS_AVX2 1
#define LOOM_ISA_HAS_AVX512 1
#define LOOM_ISA_AVX2 [[gnu::target("avx2"), gnu::optimize("fp-contract=off")]]
#define LOOM_ISA_AVX512 \
  [[gnu::target("avx512f,avx512vl,avx512bw,avx512dq"), gnu::optimize("fp-contract=off")]]
#elif (defined(__x86_64__) || defined(__i386__)) && defined(__clang__)
#define LOOM_ISA_HAS_AVX2 1
#define LOOM_ISA_HAS_AVX512 0
#define LOOM_ISA_AVX2 [[gnu::target("avx2")]]
#else
#define LOOM_ISA_HAS_AVX2 0
#define LOOM_ISA_HAS_AVX512 0
#endif

namespace loom::cpu {

enum class isa_cap : std::uint8_t { baseline, avx2, avx512 };

/// LOOM_MAX_CPU_ISA: "baseline" (or "sse2"), "avx2", "avx512"; unset or empty means no cap.
/// Any other value is no cap either, and says so once on stderr.
[[nodiscard]] isa_cap max_cpu_isa() noexcept;

/// The widest of baseline, AVX2 and AVX-512 (F, VL, BW and DQ) that this CPU runs, within
/// max_cpu_isa()'s cap: what a kernel compiled in those variants dispatches on (a kernel
/// that lacks a variant takes the next narrower one it has). Computed once.
[[nodiscard]] isa_cap widest_cpu_isa() noexcept;

}  // namespace loom::cpu
