#include "cpu_isa.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace loom::cpu {

isa_cap max_cpu_isa() noexcept {
  static const isa_cap cap = [] {
    const char* env = std::getenv("LOOM_MAX_CPU_ISA");
    if (env == nullptr) return isa_cap::avx512;
    const std::string_view v(env);
    if (v == "baseline" || v == "sse2") return isa_cap::baseline;
    if (v == "avx2") return isa_cap::avx2;
    if (v != "avx512" && !v.empty()) {
      std::fprintf(stderr,
                   "loom: LOOM_MAX_CPU_ISA='%s' is not baseline, sse2, avx2 or avx512; "
                   "the CPU kernels use every instruction set the CPU has\n",
                   env);
    }
    return isa_cap::avx512;
  }();
  return cap;
}

isa_cap widest_cpu_isa() noexcept {
  static const isa_cap level = [] {
    const isa_cap cap = max_cpu_isa();
#if defined(__x86_64__) || defined(__i386__)
    if (cap == isa_cap::avx512 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq")) {
      return isa_cap::avx512;
    }
    if (cap != isa_cap::baseline && __builtin_cpu_supports("avx2")) return isa_cap::avx2;
#endif
    (void)cap;
    return isa_cap::baseline;
  }();
  return level;
}

}  // namespace loom::cpu
