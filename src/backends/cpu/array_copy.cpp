// Note [strided copy] (array_copy.hpp): simplify the copy, then rows, tiles or elements.
#include "array_copy.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace loom::cpu {
namespace {

struct copy_dim {
  std::int64_t n;   // extent
  std::int64_t ss;  // source stride (elements)
  std::int64_t ds;  // destination stride (elements)
};

// Drops size-1 dimensions and merges neighbours contiguous on both sides. Returns false
// when the copy is empty.
bool simplify(const shape& dims, const shape& ss, const shape& ds, std::vector<copy_dim>& out) {
  out.clear();
  for (std::size_t k = 0; k < dims.rank(); ++k) {
    if (dims[k] == 0) return false;
    if (dims[k] == 1) continue;
    const copy_dim cur{dims[k], ss[k], ds[k]};
    if (!out.empty()) {
      copy_dim& prev = out.back();
      if (prev.ss == cur.ss * cur.n && prev.ds == cur.ds * cur.n) {
        prev = {prev.n * cur.n, cur.ss, cur.ds};
        continue;
      }
    }
    out.push_back(cur);
  }
  return true;
}

// Walks the multi-indices of some dimensions in row-major order, tracking the source and
// destination offsets.
class walker {
 public:
  walker(const std::vector<copy_dim>& dims, std::int64_t start)
      : dims_(dims), idx_(shape::filled(dims.size(), 0)) {
    for (std::size_t k = dims_.size(); k-- > 0;) {
      idx_[k] = start % dims_[k].n;
      start /= dims_[k].n;
      src_ += idx_[k] * dims_[k].ss;
      dst_ += idx_[k] * dims_[k].ds;
    }
  }
  [[nodiscard]] std::int64_t src() const noexcept { return src_; }
  [[nodiscard]] std::int64_t dst() const noexcept { return dst_; }
  void next() noexcept {
    for (std::size_t k = dims_.size(); k-- > 0;) {
      src_ += dims_[k].ss;
      dst_ += dims_[k].ds;
      if (++idx_[k] < dims_[k].n) return;
      src_ -= dims_[k].n * dims_[k].ss;
      dst_ -= dims_[k].n * dims_[k].ds;
      idx_[k] = 0;
    }
  }

 private:
  const std::vector<copy_dim>& dims_;
  shape idx_;  // inline storage: no allocation for up to shape::inline_rank dims
  std::int64_t src_ = 0;
  std::int64_t dst_ = 0;
};

std::int64_t count(const std::vector<copy_dim>& dims) {
  std::int64_t n = 1;
  for (const auto& d : dims) n *= d.n;
  return n;
}

// Rough costs for parallel_for, in nanoseconds.
constexpr double ns_per_byte_copied = 0.1;
constexpr double ns_per_element_strided = 0.8;
// Rows longer than this are cut into pieces of about half of it.
constexpr std::int64_t long_row_bytes = 256 * 1024;

template <class T>
void copy_rows(const kernel_context& ctx, const std::vector<copy_dim>& dims, const T* src, T* dst) {
  const std::vector<copy_dim> outer(dims.begin(), dims.end() - 1);
  const std::int64_t rows = count(outer);
  const std::int64_t len = dims.back().n;
  const std::int64_t row_bytes = len * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t pieces =
      row_bytes > long_row_bytes ? (row_bytes + long_row_bytes / 2 - 1) / (long_row_bytes / 2) : 1;
  const std::int64_t piece_len = (len + pieces - 1) / pieces;
  const double cost =
      static_cast<double>(piece_len * static_cast<std::int64_t>(sizeof(T))) * ns_per_byte_copied +
      5.0;
  ctx.parallel_for(rows * pieces, cost, [&](std::int64_t begin, std::int64_t end) {
    if (pieces == 1) {
      walker w(outer, begin);
      for (std::int64_t u = begin; u < end; ++u, w.next()) {
        std::memcpy(dst + w.dst(), src + w.src(), static_cast<std::size_t>(len) * sizeof(T));
      }
      return;
    }
    for (std::int64_t u = begin; u < end; ++u) {
      const walker w(outer, u / pieces);
      const std::int64_t first = (u % pieces) * piece_len;
      const std::int64_t n = std::min(len, first + piece_len) - first;
      if (n > 0) {
        std::memcpy(dst + w.dst() + first, src + w.src() + first,
                    static_cast<std::size_t>(n) * sizeof(T));
      }
    }
  });
}

// A square block of K×K elements moved in registers: d[j·a_dst + k] = s[j + k·b_src].
// K = 1 (no block kernel) where SSE2 is missing and for 1-byte elements.
template <class T>
constexpr std::int64_t block_size() {
#if defined(__SSE2__)
  return sizeof(T) == 1 ? 1 : 16 / static_cast<std::int64_t>(sizeof(T));
#else
  return 1;
#endif
}

#if defined(__SSE2__)
inline __m128i load(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}
inline void store(void* p, __m128i v) {
  _mm_storeu_si128(static_cast<__m128i*>(p), v);
}

template <class T>
void transpose_block(const T* s, std::int64_t b_src, T* d, std::int64_t a_dst) {
  if constexpr (sizeof(T) == 8) {
    const __m128i r0 = load(s);
    const __m128i r1 = load(s + b_src);
    store(d, _mm_unpacklo_epi64(r0, r1));
    store(d + a_dst, _mm_unpackhi_epi64(r0, r1));
  } else if constexpr (sizeof(T) == 4) {
    const __m128i r0 = load(s);
    const __m128i r1 = load(s + b_src);
    const __m128i r2 = load(s + 2 * b_src);
    const __m128i r3 = load(s + 3 * b_src);
    const __m128i t0 = _mm_unpacklo_epi32(r0, r1);
    const __m128i t1 = _mm_unpacklo_epi32(r2, r3);
    const __m128i t2 = _mm_unpackhi_epi32(r0, r1);
    const __m128i t3 = _mm_unpackhi_epi32(r2, r3);
    store(d, _mm_unpacklo_epi64(t0, t1));
    store(d + a_dst, _mm_unpackhi_epi64(t0, t1));
    store(d + 2 * a_dst, _mm_unpacklo_epi64(t2, t3));
    store(d + 3 * a_dst, _mm_unpackhi_epi64(t2, t3));
  } else if constexpr (sizeof(T) == 2) {
    __m128i r[8];
    for (int k = 0; k < 8; ++k) r[k] = load(s + k * b_src);
    __m128i t[8];
    for (int k = 0; k < 4; ++k) {
      t[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
    }
    // u[0..3]: columns (0,1), (2,3), (4,5), (6,7) of rows 0-3; u[4..7]: the same of rows 4-7.
    __m128i u[8];
    for (int h = 0; h < 2; ++h) {
      u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h], t[4 * h + 2]);
      u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h], t[4 * h + 2]);
      u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);
      u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int k = 0; k < 4; ++k) {
      store(d + (2 * k) * a_dst, _mm_unpacklo_epi64(u[k], u[k + 4]));
      store(d + (2 * k + 1) * a_dst, _mm_unpackhi_epi64(u[k], u[k + 4]));
    }
  }
}
#endif

// The part [a0, a1) × [b0, b1) of a transpose: d[a·a_dst + b] = s[a + b·b_src].
template <class T>
void transpose_tile(const T* s, std::int64_t b_src, T* d, std::int64_t a_dst, std::int64_t a0,
                    std::int64_t a1, std::int64_t b0, std::int64_t b1) {
  constexpr std::int64_t k = block_size<T>();
  std::int64_t a = a0;
#if defined(__SSE2__)
  if constexpr (k > 1) {
    for (; a + k <= a1; a += k) {
      std::int64_t b = b0;
      for (; b + k <= b1; b += k) {
        transpose_block(s + a + b * b_src, b_src, d + a * a_dst + b, a_dst);
      }
      for (; b < b1; ++b) {
        for (std::int64_t j = a; j < a + k; ++j) d[j * a_dst + b] = s[j + b * b_src];
      }
    }
  }
#endif
  for (; a < a1; ++a) {
    T* drow = d + a * a_dst;
    const T* scol = s + a;
    for (std::int64_t b = b0; b < b1; ++b) drow[b] = scol[b * b_src];
  }
}

// dims[j] is dense in the source, dims.back() in the destination.
template <class T>
void copy_tiles(const kernel_context& ctx, const std::vector<copy_dim>& dims, std::size_t j,
                const T* src, T* dst) {
  // Square tiles of at most 16 KiB per side (measured: 64 beats 16 and 32 for 1-4 byte
  // elements, in and out of cache); a multiple of every block size.
  constexpr std::int64_t tile = sizeof(T) == 8 ? 32 : 64;
  std::vector<copy_dim> batch;
  for (std::size_t k = 0; k + 1 < dims.size(); ++k) {
    if (k != j) batch.push_back(dims[k]);
  }
  const std::int64_t a_n = dims[j].n;
  const std::int64_t a_dst = dims[j].ds;
  const std::int64_t b_n = dims.back().n;
  const std::int64_t b_src = dims.back().ss;
  const std::int64_t a_tiles = (a_n + tile - 1) / tile;
  const std::int64_t b_tiles = (b_n + tile - 1) / tile;
  const std::int64_t per_batch = a_tiles * b_tiles;
  const double cost = static_cast<double>(tile * tile) * 0.5 + 20.0;
  ctx.parallel_for(count(batch) * per_batch, cost, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t u = begin; u < end; ++u) {
      const walker w(batch, u / per_batch);
      const std::int64_t t = u % per_batch;
      const std::int64_t a0 = (t / b_tiles) * tile;
      const std::int64_t b0 = (t % b_tiles) * tile;
      const std::int64_t a1 = std::min(a_n, a0 + tile);
      const std::int64_t b1 = std::min(b_n, b0 + tile);
      transpose_tile(src + w.src(), b_src, dst + w.dst(), a_dst, a0, a1, b0, b1);
    }
  });
}

template <class T>
void copy_elements(const kernel_context& ctx, const std::vector<copy_dim>& dims, const T* src,
                   T* dst) {
  const std::vector<copy_dim> outer(dims.begin(), dims.end() - 1);
  const std::int64_t len = dims.back().n;
  const std::int64_t ss = dims.back().ss;
  const std::int64_t ds = dims.back().ds;
  const double cost = static_cast<double>(len) * ns_per_element_strided + 5.0;
  ctx.parallel_for(count(outer), cost, [&](std::int64_t begin, std::int64_t end) {
    walker w(outer, begin);
    for (std::int64_t u = begin; u < end; ++u, w.next()) {
      const T* s = src + w.src();
      T* d = dst + w.dst();
      if (ds == 1) {
        for (std::int64_t i = 0; i < len; ++i) d[i] = s[i * ss];
      } else {
        for (std::int64_t i = 0; i < len; ++i) d[i * ds] = s[i * ss];
      }
    }
  });
}

template <class T>
void copy_typed(const kernel_context& ctx, const std::vector<copy_dim>& dims, const void* src,
                void* dst) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  if (dims.empty()) {
    *d = *s;
    return;
  }
  const copy_dim& inner = dims.back();
  if (inner.ss == 1 && inner.ds == 1) return copy_rows(ctx, dims, s, d);
  if (inner.ds == 1) {
    for (std::size_t j = dims.size() - 1; j-- > 0;) {
      if (dims[j].ss == 1) return copy_tiles(ctx, dims, j, s, d);
    }
  }
  copy_elements(ctx, dims, s, d);
}

}  // namespace

void strided_copy(const kernel_context& ctx, std::size_t elem_size, const shape& dims,
                  const void* src, const shape& src_strides, void* dst, const shape& dst_strides) {
  std::vector<copy_dim> d;
  if (!simplify(dims, src_strides, dst_strides, d)) return;
  switch (elem_size) {
    case 1:
      return copy_typed<std::uint8_t>(ctx, d, src, dst);
    case 2:
      return copy_typed<std::uint16_t>(ctx, d, src, dst);
    case 4:
      return copy_typed<std::uint32_t>(ctx, d, src, dst);
    case 8:
      return copy_typed<std::uint64_t>(ctx, d, src, dst);
    default:
      ctx.fail("strided_copy: elements of {} bytes are not supported", elem_size);
  }
}

void copy_dense(const kernel_context& ctx, const tensor& src, void* dst) {
  if (src.num_elements() == 0) return;
  strided_copy(ctx, size_of(src.type()), src.shape(), src.raw_data(), src.strides(), dst,
               contiguous_strides(src.shape()));
}

void dense_copy::operator()(std::size_t i, const tensor& src, const shape& out) const {
  tensor& dense = ctx_.allocate_output(i, out);
  copy_dense(ctx_, src, dense.raw_data());
}

}  // namespace loom::cpu
