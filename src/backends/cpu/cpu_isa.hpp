// The widest instruction set the CPU kernels may use: LOOM_MAX_CPU_ISA caps it, so that tests
// run every variant of a kernel that dispatches by instruction set (Note [fused instruction
// sets]). Read once, in one place, for every kernel.
#pragma once

#include <cstdint>

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
