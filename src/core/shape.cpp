#include "loom/core/shape.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "loom/core/error.hpp"

namespace loom {

void shape::copy_heap(const shape& o) {
  heap_ = std::make_unique<std::int64_t[]>(o.rank_);
  std::memcpy(heap_.get(), o.heap_.get(), o.rank_ * sizeof(std::int64_t));
}

void shape::assign(const std::int64_t* dims, std::size_t rank) {
  if (rank > inline_rank) {
    if (!heap_ || rank > rank_) heap_ = std::make_unique<std::int64_t[]>(rank);
  } else {
    heap_.reset();
  }
  rank_ = rank;
  if (rank != 0) std::memmove(data(), dims, rank * sizeof(std::int64_t));
}

std::size_t shape::normalize_axis(std::int64_t axis) const {
  const auto r = static_cast<std::int64_t>(rank_);
  const std::int64_t a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r) {
    throw invalid_argument(
        fmt::format("axis {} is out of range for shape {} of rank {}", axis, to_string(*this), r));
  }
  return static_cast<std::size_t>(a);
}

void shape::grow_by_one(std::int64_t d) {
  resize(rank_ + 1);
  data()[rank_ - 1] = d;
}

void shape::resize(std::size_t rank, std::int64_t fill) {
  if (rank > inline_rank && (!heap_ || rank > rank_)) {
    auto grown = std::make_unique<std::int64_t[]>(rank);
    std::copy(begin(), begin() + std::min(rank, rank_), grown.get());
    heap_ = std::move(grown);
  } else if (rank <= inline_rank && heap_) {
    std::copy(heap_.get(), heap_.get() + std::min(rank, rank_), inline_);
    heap_.reset();
  }
  for (std::size_t i = rank_; i < rank; ++i) data()[i] = fill;
  rank_ = rank;
}

std::string to_string(const shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.rank(); ++i) {
    if (i) out += ", ";
    out += s[i] < 0 ? std::string("?") : std::to_string(s[i]);
  }
  return out + "]";
}

shape broadcast_shapes(const shape& a, const shape& b) {
  const std::size_t rank = std::max(a.rank(), b.rank());
  shape out = shape::filled(rank, 1);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t da = i < rank - a.rank() ? 1 : a[i - (rank - a.rank())];
    const std::int64_t db = i < rank - b.rank() ? 1 : b[i - (rank - b.rank())];
    if (da == db) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else if (db == 1) {
      out[i] = da;
    } else if (da < 0 || db < 0) {
      out[i] = da < 0 ? db : da;
    } else {
      throw invalid_argument(fmt::format("shapes {} and {} do not broadcast (dimension {}: {} vs {})",
                                         to_string(a), to_string(b), i, da, db));
    }
  }
  return out;
}

}  // namespace loom
