#include "memory/bfc_bins.hpp"

#include <fmt/format.h>

#include "loom/core/error.hpp"

namespace loom::memory::detail {

chunk_handle free_bins::largest(const chunk_table& t) const noexcept {
  if (top_ == 0) return recent_;
  const auto w = static_cast<std::size_t>(63 - std::countl_zero(top_));
  const std::size_t b = w * 64 + static_cast<std::size_t>(63 - std::countl_zero(words_[w]));
  chunk_handle h = heads_[b];
  while (t[h].bin_next != no_chunk) h = t[h].bin_next;
  return recent_ != no_chunk && t[recent_].size > t[h].size ? recent_ : h;
}

std::size_t free_bins::check(const chunk_table& t, std::uint32_t id) const {
  const auto fault = [id](std::size_t bin, const std::string& what) {
    return error(fmt::format("free bins {}, bin {}: {}", id, bin, what));
  };
  std::size_t count = 0;
  if (recent_ != no_chunk) {  // held apart from the lists
    if (recent_ >= t.handles()) {
      throw fault(num_bins, fmt::format("the latest chunk, handle {}, is out of range", recent_));
    }
    const chunk& c = t[recent_];
    if (c.state != chunk_state::free) {
      throw fault(bin_of(c.size), fmt::format("chunk {} is not free", recent_));
    }
    if (c.bins != id) {
      throw fault(bin_of(c.size),
                  fmt::format("chunk {} is marked as held by bins {}", recent_, c.bins));
    }
    ++count;
  }
  for (std::size_t w = 0; w < num_words; ++w) {
    if (((top_ >> w) & 1U) != (words_[w] != 0 ? 1U : 0U)) {
      throw fault(w * 64, fmt::format("the top bitmap disagrees with word {}", w));
    }
  }
  for (std::size_t b = 0; b < num_bins; ++b) {
    const bool marked = ((words_[b / 64] >> (b % 64)) & 1U) != 0;
    if (marked != (heads_[b] != no_chunk)) throw fault(b, "the bitmap disagrees with the list");
    chunk_handle before = no_chunk;
    for (chunk_handle h = heads_[b]; h != no_chunk; before = h, h = t[h].bin_next) {
      if (h >= t.handles()) throw fault(b, fmt::format("handle {} out of range", h));
      const chunk& c = t[h];
      if (c.state != chunk_state::free) throw fault(b, fmt::format("chunk {} is not free", h));
      if (c.bins != id) {
        throw fault(b, fmt::format("chunk {} is marked as held by bins {}", h, c.bins));
      }
      if (bin_of(c.size) != b) {
        throw fault(
            b, fmt::format("chunk {} of {} bytes belongs in bin {}", h, c.size, bin_of(c.size)));
      }
      if (c.bin_prev != before) throw fault(b, fmt::format("chunk {} has a wrong back link", h));
      if (h == recent_) throw fault(b, fmt::format("chunk {} is both listed and held apart", h));
      if (before != no_chunk && t[before].size > c.size) {
        throw fault(b, fmt::format("chunk {} is out of size order", h));
      }
      if (++count > t.live()) throw fault(b, "the list has a cycle");
    }
  }
  return count;
}

}  // namespace loom::memory::detail
