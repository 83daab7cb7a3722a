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

}  // namespace loom::cpu
