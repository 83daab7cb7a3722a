// Vectors of L lanes of C (GCC/Clang vector extensions) and the few operations the
// normalization kernels' row loops build on: unaligned loads and stores, and a pairwise
// horizontal sum. Compiled into whatever instruction set the calling function targets
// (always_inline: Note [fused instruction sets] in fused_elementwise.cpp).
#pragma once

#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// Wide vectors pass only between always_inline functions, compiled into callers that target
// AVX2 or AVX-512; GCC and Clang still warn that such a signature would change the ABI
// without those instruction sets (for the rest of every file that includes this).
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wunknown-warning-option"
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace loom::cpu {

template <class C, int L>
struct vec_of {
  typedef C type __attribute__((vector_size(sizeof(C) * L)));
};
/// L lanes of C.
template <class C, int L>
using vec = typename vec_of<C, L>::type;

template <class C, int L>
[[gnu::always_inline]] inline vec<C, L> vload(const C* p) noexcept {
  vec<C, L> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class C, int L>
[[gnu::always_inline]] inline void vstore(C* p, const vec<C, L>& v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

// The sum of v's lanes, pairwise (log2(L) dependent adds rather than L).
template <class C, int L>
[[gnu::always_inline]] inline C hsum(const vec<C, L>& v) noexcept {
  C t[L];
  std::memcpy(t, &v, sizeof v);
  for (int w = L / 2; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) t[l] += t[l + w];
  }
  return t[0];
}

// Stores v at p, which must be 16-byte aligned, with non-temporal stores (Note [layer_norm
// streaming stores] in normalization_kernels.cpp): 16-byte SSE2 stores, two per 32-byte
// vector (write-combining joins them into whole lines). Without SSE2, a plain store.
template <class C, int L>
[[gnu::always_inline]] inline void vstream(C* p, const vec<C, L>& v) noexcept {
#if defined(__SSE2__)
  constexpr int parts = static_cast<int>(sizeof(v) / 16);
  if constexpr (std::is_same_v<C, float>) {
    __m128 q[parts];
    std::memcpy(q, &v, sizeof v);
    for (int k = 0; k < parts; ++k) _mm_stream_ps(p + 4 * k, q[k]);
  } else {
    __m128d q[parts];
    std::memcpy(q, &v, sizeof v);
    for (int k = 0; k < parts; ++k) _mm_stream_pd(p + 2 * k, q[k]);
  }
#else
  vstore<C, L>(p, v);
#endif
}

// vstream when Stream, else vstore.
template <bool Stream, class C, int L>
[[gnu::always_inline]] inline void vput(C* p, const vec<C, L>& v) noexcept {
  if constexpr (Stream) {
    vstream<C, L>(p, v);
  } else {
    vstore<C, L>(p, v);
  }
}

// Orders a task's streaming stores before whatever follows (the end of parallel_for).
inline void stream_fence() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace loom::cpu
