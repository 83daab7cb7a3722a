// free_bins: the free chunks of one stream state of a bfc_pool, by size class (private to
// the pool).
//
// Size classes are TLSF's: for sizes of n granules, the first 32 classes hold one n each,
// and above that each power of two [2^k, 2^(k+1)) is cut into 16 classes of equal width. Each class
// (bin) is a doubly linked list through the chunks' bin links, sorted by size, and among chunks of
// one size the most recently inserted first (it is the warmest in the caches, and the first 32
// bins, one size each, take an insert in O(1)). A two-level bitmap records which bins are
// non-empty. So the best fit for n granules is either in n's own bin (the first chunk there that is
// large enough) or the head of the next non-empty bin, found in O(1) with two count-trailing-zeros.
//
// The chunk inserted last is held apart, in recent_, and goes into its list only when another
// chunk is inserted (or for_each walks the bins). The pool's commonest pattern is to carve a
// block from the front of a free chunk and to merge the block back into the rest when it is
// given back: remove the chunk, insert the rest; remove the rest, insert the merged chunk.
// With recent_ each of those is a compare and a store, and no list or bitmap is touched. It
// changes no result: the lists hold only chunks inserted before recent_, so in its list it
// would come first among the chunks of its size; best_fit takes it over a listed chunk of the
// same size, and moving it into its list later puts it where insert() would have.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "memory/bfc_chunk.hpp"

namespace loom::memory::detail {

class free_bins {
 public:
  static constexpr std::size_t sub_bins_log2 = 4;
  static constexpr std::size_t sub_bins = std::size_t{1} << sub_bins_log2;
  /// Enough for any chunk (below 2^32 granules): the largest bin is (31 - 3) * 16 + 15.
  static constexpr std::size_t num_words = 8;
  static constexpr std::size_t num_bins = num_words * 64;

  free_bins() noexcept { heads_.fill(no_chunk); }

  /// The bin of a size of `n` granules (1 <= n < 2^32).
  ///
  /// Without a branch (on n < 2 * sub_bins, which sizes varying from call to call would
  /// mispredict): with k = max(0, floor(log2 n) - sub_bins_log2), the bin is
  /// k * sub_bins + (n >> k). Below 2 * sub_bins, k = 0 and the bin is n. Above, n >> k is
  /// n's top bit and the sub_bins_log2 bits after it, that is sub_bins plus the sub-bin, so
  /// the power of two [2^j, 2^(j+1)) takes the sub_bins bins after those of [2^(j-1), 2^j).
  [[nodiscard]] static std::size_t bin_of(std::size_t n) noexcept {
    const auto k = static_cast<std::size_t>(std::bit_width(n | sub_bins)) - 1 - sub_bins_log2;
    return k * sub_bins + (n >> k);
  }

  /// The smallest chunk of at least `n` granules (n < 2^32), the most recently inserted of
  /// equals; no_chunk if none.
  [[nodiscard]] chunk_handle best_fit(const chunk_table& t, std::size_t n) const noexcept {
    if (recent_ == no_chunk) return listed_best_fit(t, n);
    const std::uint32_t size = t[recent_].size;
    if (size == n) return recent_;  // nothing listed is smaller, or as large and more recent
    const chunk_handle listed = listed_best_fit(t, n);
    return size >= n && (listed == no_chunk || size <= t[listed].size) ? recent_ : listed;
  }

  /// Adds free chunk `h` (in no bins), before the chunks of its size in its bin.
  void insert(chunk_table& t, chunk_handle h) noexcept {
    list_recent(t);
    recent_ = h;
  }

  /// Takes chunk `h` out of its bin; its size must not have changed since insert().
  void remove(chunk_table& t, chunk_handle h) noexcept {
    if (h == recent_) {
      recent_ = no_chunk;
    } else {
      unlink(t, h);
    }
  }

  [[nodiscard]] bool empty() const noexcept { return top_ == 0 && recent_ == no_chunk; }

  /// A largest chunk; no_chunk when empty.
  [[nodiscard]] chunk_handle largest(const chunk_table& t) const noexcept;

  /// Calls f(handle) for every chunk, bin by bin, in list order (recent_ first goes into
  /// its list); f may remove the chunk it is given from these bins, but no other.
  template <class F>
  void for_each(chunk_table& t, F&& f) {
    list_recent(t);
    for (std::size_t b = first_nonempty_from(0); b < num_bins; b = first_nonempty_from(b + 1)) {
      for (chunk_handle h = heads_[b]; h != no_chunk;) {
        const chunk_handle next = t[h].bin_next;
        f(h);
        h = next;
      }
    }
  }

  /// Checks the bins (bitmap agrees with the lists, links agree both ways, every chunk is
  /// free and marked as held by bins number `id`, every listed chunk in the bin of its size,
  /// in size order) and returns how many chunks they hold, recent_ included. Throws
  /// loom::error naming the first fault. O(n).
  std::size_t check(const chunk_table& t, std::uint32_t id) const;

 private:
  // The best fit among the listed chunks (all but recent_): the first large enough in n's
  // own bin, else the head of the next non-empty bin.
  [[nodiscard]] chunk_handle listed_best_fit(const chunk_table& t, std::size_t n) const noexcept {
    const std::size_t b = bin_of(n);
    for (chunk_handle h = heads_[b]; h != no_chunk; h = t[h].bin_next) {
      if (t[h].size >= n) return h;
    }
    return heads_[first_nonempty_from(b + 1)];  // heads_[num_bins] is no_chunk
  }

  // Moves recent_, if any, into its list.
  void list_recent(chunk_table& t) noexcept {
    if (recent_ == no_chunk) return;
    link(t, recent_);
    recent_ = no_chunk;
  }

  // Puts free chunk `h` into its list, before the chunks of its size.
  void link(chunk_table& t, chunk_handle h) noexcept {
    chunk& c = t[h];
    const std::size_t b = bin_of(c.size);
    chunk_handle before = no_chunk;
    chunk_handle after = heads_[b];
    while (after != no_chunk && t[after].size < c.size) {
      before = after;
      after = t[after].bin_next;
    }
    c.bin_prev = before;
    c.bin_next = after;
    (before == no_chunk ? heads_[b] : t[before].bin_next) = h;
    if (after != no_chunk) t[after].bin_prev = h;
    words_[b / 64] |= std::uint64_t{1} << (b % 64);
    top_ |= std::uint64_t{1} << (b / 64);
  }

  // Takes listed chunk `h` out of its list; its size must not have changed since link().
  void unlink(chunk_table& t, chunk_handle h) noexcept {
    const chunk& c = t[h];
    if (c.bin_next != no_chunk) t[c.bin_next].bin_prev = c.bin_prev;
    if (c.bin_prev != no_chunk) {
      t[c.bin_prev].bin_next = c.bin_next;
      return;
    }
    const std::size_t b = bin_of(c.size);
    heads_[b] = c.bin_next;
    if (c.bin_next == no_chunk) {
      words_[b / 64] &= ~(std::uint64_t{1} << (b % 64));
      if (words_[b / 64] == 0) top_ &= ~(std::uint64_t{1} << (b / 64));
    }
  }

  // The first non-empty bin at or after b (b <= num_bins); num_bins when none.
  [[nodiscard]] std::size_t first_nonempty_from(std::size_t b) const noexcept {
    std::size_t w = b / 64;
    if (w >= num_words) return num_bins;
    if (const std::uint64_t here = words_[w] & (~std::uint64_t{0} << (b % 64)); here != 0) {
      return w * 64 + lowest_bit(here);
    }
    const std::uint64_t above = top_ & (~std::uint64_t{0} << (w + 1));
    if (above == 0) return num_bins;
    w = lowest_bit(above);
    return w * 64 + lowest_bit(words_[w]);
  }

  // The index of the lowest set bit of x != 0. (Setting bit 63 changes nothing then, and
  // it tells the compiler that x != 0, which spares the check countr_zero makes for 0.)
  [[nodiscard]] static std::size_t lowest_bit(std::uint64_t x) noexcept {
    return static_cast<std::size_t>(std::countr_zero(x | (std::uint64_t{1} << 63)));
  }

  chunk_handle recent_ = no_chunk;                // the chunk inserted last, while not in its list
  std::uint64_t top_ = 0;                         // bit w: words_[w] != 0
  std::array<std::uint64_t, num_words> words_{};  // bit b % 64 of word b / 64: bin b non-empty
  std::array<chunk_handle, num_bins + 1> heads_{};  // heads_[num_bins]: always no_chunk
};

}  // namespace loom::memory::detail
