// bfc_pool's snapshots, dumps and invariant checks: everything that reads the whole pool.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <ostream>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "memory/bfc_pool_impl.hpp"

namespace loom::memory {

using detail::chunk;
using detail::chunk_handle;
using detail::chunk_state;
using detail::no_chunk;

namespace {

// "in_use", "free", or "pending:0x1" (free, waiting for stream 0x1).
std::string state_name(const chunk_info& c) {
  if (c.in_use) return "in_use";
  return c.needs_sync ? fmt::format("pending:{:#x}", c.freed_on.value()) : "free";
}

nlohmann::ordered_json to_json(const memory_stats& s) {
  return {{"bytes_in_use", s.bytes_in_use},
          {"peak_bytes_in_use", s.peak_bytes_in_use},
          {"total_bytes_allocated", s.total_bytes_allocated},
          {"bytes_reserved", s.bytes_reserved},
          {"peak_bytes_reserved", s.peak_bytes_reserved},
          {"allocations_in_use", s.allocations_in_use},
          {"num_allocs", s.num_allocs},
          {"num_deallocs", s.num_deallocs},
          {"num_failed_allocs", s.num_failed_allocs},
          {"free_bytes", s.free_bytes},
          {"largest_free_block", s.largest_free_block},
          {"unusable_bytes", s.unusable_bytes},
          {"num_regions", s.num_regions}};
}

}  // namespace

std::vector<region_info> bfc_pool::regions() const {
  const impl::lock_type lock(impl_->mutex_);
  return impl_->regions_locked();
}

std::vector<region_info> bfc_pool::impl::regions_locked() const {
  std::vector<region_info> out;
  out.reserve(by_address_.size());
  for (const region_ref& ref : by_address_) {
    region_info info{reinterpret_cast<const void*>(ref.base), ref.size, {}};
    for (chunk_handle h = regions_[ref.id].first; h != no_chunk; h = chunks_[h].next) {
      const chunk& c = chunks_[h];
      const bool in_use = c.state == chunk_state::in_use;
      const bool pending = !in_use && c.bins != 0;
      info.chunks.push_back({bytes_of(c.offset), bytes_of(c.size), in_use ? requested_of(c) : 0,
                             in_use, pending ? chunks_.stamp(h).on : stream{}, pending});
    }
    out.push_back(std::move(info));
  }
  return out;
}

void bfc_pool::dump(std::ostream& os) const {
  impl::lock_type lock(impl_->mutex_);
  const memory_stats stats = impl_->stats_locked();
  const std::vector<region_info> regions = impl_->regions_locked();
  lock.unlock();
  os << impl_->label_ << ": " << to_string(stats) << '\n';
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const region_info& r = regions[i];
    os << fmt::format("region {}: base {}, {} bytes ({}), {} chunks\n", i, r.base, r.size,
                      format_bytes(r.size), r.chunks.size());
    os << fmt::format("  {:>14} {:>14} {:>14}  {}\n", "offset", "size", "requested", "state");
    for (const chunk_info& c : r.chunks) {
      os << fmt::format("  {:>14} {:>14} {:>14}  {}\n", c.offset, c.size, c.requested,
                        state_name(c));
    }
  }
}

std::string bfc_pool::dump_json() const {
  impl::lock_type lock(impl_->mutex_);
  const memory_stats stats = impl_->stats_locked();
  const std::vector<region_info> regions = impl_->regions_locked();
  lock.unlock();
  nlohmann::ordered_json out{{"name", impl_->options_.name}, {"stats", to_json(stats)}};
  nlohmann::ordered_json& list = out["regions"] = nlohmann::ordered_json::array();
  for (const region_info& r : regions) {
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const chunk_info& c : r.chunks) {
      chunks.push_back({{"offset", c.offset},
                        {"size", c.size},
                        {"requested", c.requested},
                        {"in_use", c.in_use},
                        {"stream", c.freed_on.value()},
                        {"needs_sync", c.needs_sync}});
    }
    list.push_back({{"base", reinterpret_cast<std::uintptr_t>(r.base)},
                    {"size", r.size},
                    {"chunks", std::move(chunks)}});
  }
  return out.dump();
}

void bfc_pool::check_invariants() const {
  const impl::lock_type lock(impl_->mutex_);
  impl_->check_invariants_locked();
}

void bfc_pool::impl::check_invariants_locked() const {
  const auto violated = [this](const std::string& what) {
    throw error(fmt::format("{}: invariant broken: {}", label_, what));
  };
  std::size_t reserved = 0;
  std::size_t walked = 0;
  std::size_t free_chunks = 0;
  std::size_t in_use_bytes = 0;
  std::size_t requested = 0;
  std::uint64_t blocks = 0;
  std::uintptr_t end_of_previous = 0;
  std::uint64_t latest_free = 0;
  for (const region_ref& ref : by_address_) {
    const region& r = regions_[ref.id];
    if (r.base != ref.base || r.size != ref.size || r.size == 0) {
      violated(fmt::format("region {} disagrees with its address-order entry", ref.id));
    }
    if (r.base < end_of_previous) {
      violated(fmt::format("region {} overlaps or is out of order", ref.id));
    }
    if (r.base % region_alignment_ != 0 || r.size % granularity_ != 0) {
      violated(fmt::format("region {} is misaligned or not a multiple of the granularity", ref.id));
    }
    end_of_previous = r.base + r.size;
    reserved += r.size;
    const std::size_t granules = r.size >> shift_;
    std::size_t expected_offset = 0;
    chunk_handle before = no_chunk;
    for (chunk_handle h = r.first; h != no_chunk; before = h, h = chunks_[h].next) {
      const chunk& c = chunks_[h];
      const auto broken = [&](const std::string& what) {
        violated(fmt::format("chunk {} at granule {} of region {} {}", h, expected_offset, ref.id,
                             what));
      };
      if (++walked > chunks_.live()) violated("a region's chunk list has a cycle");
      if (c.state == chunk_state::spare) broken("is a spare handle");
      if (c.offset != expected_offset) broken("does not start where its predecessor ends");
      if (c.region != ref.id) broken("names another region");
      if (c.prev != before) broken("has a wrong back link");
      if (c.size == 0 || c.size > granules - c.offset) {
        broken(fmt::format("has a bad size of {} granules", c.size));
      }
      if (r.slots[c.offset] != h) broken("is not in its slot");
      if (c.state == chunk_state::in_use) {
        const std::size_t asked = requested_of(c);
        if (c.slack > bytes_of(c.size) || granules_for(asked) != c.size) {
          broken(
              fmt::format("is in use with {} granules for a request of {} bytes", c.size, asked));
        }
        if ((addr_of(c) & ((std::uintptr_t{1} << c.alignment_log2) - 1)) != 0) {
          broken("is not aligned as requested");
        }
        in_use_bytes += bytes_of(c.size);
        requested += asked;
        ++blocks;
      } else {
        if (c.bins > pending_.size() || (c.bins != 0 && pending_[c.bins - 1]->bins.empty())) {
          broken(fmt::format("is free in bins {} that cannot hold it", c.bins));
        }
        if (before != no_chunk && chunks_[before].state == chunk_state::free &&
            chunks_[before].bins == c.bins) {
          broken("is free next to a free chunk in the same stream state (not coalesced)");
        }
        if (c.bins != 0) latest_free = std::max(latest_free, chunks_.stamp(h).seq);
        ++free_chunks;
      }
      expected_offset += c.size;
    }
    if (expected_offset != granules) violated(fmt::format("region {} is not tiled", ref.id));
  }
  if (walked != chunks_.live()) {
    violated(fmt::format("{} live chunk handles but {} chunks in regions", chunks_.live(), walked));
  }
  std::size_t binned = 0;
  try {
    for (std::size_t id = 0; id <= pending_.size(); ++id) {
      const auto bins_id = static_cast<std::uint32_t>(id);
      binned += bins(bins_id).check(chunks_, bins_id);
    }
  } catch (const error& e) {
    violated(e.what());
  }
  if (binned != free_chunks) {
    violated(fmt::format("{} free chunks but {} chunks in bins", free_chunks, binned));
  }
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    for (std::size_t j = i + 1; j < pending_.size(); ++j) {
      if (!pending_[i]->bins.empty() && !pending_[j]->bins.empty() &&
          pending_[i]->owner == pending_[j]->owner) {
        violated(fmt::format("pending bins {} and {} wait for the same stream", i + 1, j + 1));
      }
    }
  }
  const auto expect = [&](const char* what, std::uint64_t recorded, std::uint64_t actual) {
    if (recorded != actual)
      violated(fmt::format("{} is {} but the chunks say {}", what, recorded, actual));
  };
  expect("bytes_reserved", stats_.bytes_reserved, reserved);
  expect("num_regions", stats_.num_regions, by_address_.size());
  expect("the regions held", by_address_.size(),
         static_cast<std::uint64_t>(std::count_if(regions_.begin(), regions_.end(),
                                                  [](const region& r) { return r.size != 0; })));
  expect("bytes_in_use", stats_.bytes_in_use, requested);
  expect("the bytes of chunks in use", in_use_chunk_bytes_, in_use_bytes);
  expect("num_allocs - num_deallocs", stats_.num_allocs - stats_.num_deallocs, blocks);
  if (stats_.peak_bytes_in_use < stats_.bytes_in_use ||
      stats_.peak_bytes_reserved < stats_.bytes_reserved) {
    violated("a peak is below its current value");
  }
  if (latest_free > free_seq_) violated("a pending chunk is stamped after the latest free");
  if (held_ < reserved || held_ > options_.max_size) {
    violated(fmt::format("{} bytes held from the upstream for {} reserved, max_size {}", held_,
                         reserved, options_.max_size));
  }
}

}  // namespace loom::memory
