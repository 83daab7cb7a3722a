#include "loom/memory/bfc_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <exception>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/memory/misuse.hpp"
#include "memory/bfc_pool_impl.hpp"

#if defined(LOOM_ASAN)
#include <sanitizer/asan_interface.h>
#endif

// The helpers of allocate and deallocate: inlined into them whatever the compiler's
// heuristics say, so that each is one straight run of code with no calls.
#define LOOM_POOL_HOT [[gnu::always_inline]] inline

namespace loom::memory {

using detail::chunk;
using detail::chunk_handle;
using detail::chunk_state;
using detail::no_chunk;

namespace {

// Checks the options that cannot work and returns log2 of the granularity.
unsigned checked_granularity_log2(const bfc_pool_options& o) {
  const auto fault = [&o](const std::string& what) {
    return invalid_argument(fmt::format("bfc_pool '{}': {}", o.name, what));
  };
  if (o.granularity < 64 || o.granularity > (std::size_t{1} << 30) ||
      !is_valid_alignment(o.granularity)) {
    throw fault(
        fmt::format("granularity {} is not a power of two from 64 to 1 GiB", o.granularity));
  }
  if (!is_valid_alignment(o.region_alignment)) {
    throw fault(fmt::format("region_alignment {} is not a power of two", o.region_alignment));
  }
  if (o.initial_size > o.max_size || align_up(o.initial_size, o.granularity) > o.max_size) {
    throw fault(
        fmt::format("initial_size {} (rounded up to the granularity {}) exceeds max_size {}",
                    o.initial_size, o.granularity, o.max_size));
  }
  if (o.initial_size > detail::max_chunk_granules * o.granularity) {
    throw fault(
        fmt::format("initial_size {} exceeds the largest region the pool can index "
                    "(2^32 - 1 granules of {} bytes)",
                    o.initial_size, o.granularity));
  }
  if (o.initial_size == 0 && o.growth_step == 0) {
    throw fault("initial_size 0 with growth_step 0 leaves the pool no memory");
  }
  return static_cast<unsigned>(std::countr_zero(o.granularity));
}

void add_unique(std::vector<stream>& streams, stream s) {
  if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
}

// Hands a report to report_misuse. `fill` sets its resource and message; when building
// them runs out of memory, the report goes without (report_misuse writes a short message).
template <class Fill>
void send_report(misuse_report r, Fill&& fill) noexcept {
  try {
    fill(r);
  } catch (...) {
    r.resource.clear();
    r.message.clear();
  }
  report_misuse(std::move(r));
}

}  // namespace

// ---- construction and destruction ------------------------------------------------------

bfc_pool::impl::impl(memory_resource& upstream, bfc_pool_options options)
    : upstream_(upstream),
      options_(std::move(options)),
      label_(fmt::format("bfc_pool '{}'", options_.name)),
      shift_(checked_granularity_log2(options_)),
      granularity_(std::size_t{1} << shift_),
      region_alignment_(std::max<std::size_t>(granularity_, options_.region_alignment)),
      max_region_(detail::max_chunk_granules << shift_),
      step_(std::min(align_up(std::min(options_.growth_step, max_allocation_size), granularity_),
                     max_region_)) {
  if (options_.initial_size == 0) return;
  const std::size_t size = align_up(options_.initial_size, granularity_);
  region initial;
  try {
    initial = acquire(size);
  } catch (const std::bad_alloc& e) {
    throw out_of_memory(fmt::format("{}: the upstream refused the initial region of {} bytes "
                                    "({})",
                                    label_, size, e.what()),
                        size, label_, stats_locked());
  }
  held_ = size;
  try {
    reserve_for_attach();
  } catch (...) {
    return_region(initial);
    throw;
  }
  attach(std::move(initial));
}

bfc_pool::impl::~impl() {
  if (stats_.num_allocs != stats_.num_deallocs) report_leaks();
  // A destructor lets nothing escape. When a stream cannot be waited for, work on it may
  // still use the pool's memory: the regions are then left to the process (a leak) rather
  // than handed back for reuse, and the failure is reported.
  for (const auto& p : pending_) {
    if (p->bins.empty()) continue;
    try {
      options_.synchronize(p->owner);
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "loom: %s: waiting for stream %#llx failed (%s); its memory is not returned\n",
                   label_.c_str(), static_cast<unsigned long long>(p->owner.value()), e.what());
      return;
    } catch (...) {
      std::fprintf(stderr,
                   "loom: %s: waiting for stream %#llx failed; its memory is not returned\n",
                   label_.c_str(), static_cast<unsigned long long>(p->owner.value()));
      return;
    }
  }
  for (const region& r : regions_) {
    if (r.size != 0) return_region(r);
  }
}

bfc_pool::bfc_pool(memory_resource& upstream, bfc_pool_options options)
    : impl_(std::make_unique<impl>(upstream, std::move(options))) {}

bfc_pool::~bfc_pool() = default;

// ---- allocate ------------------------------------------------------------------------

void* bfc_pool::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  return impl_->allocate(bytes, alignment, s);
}

void* bfc_pool::impl::allocate(std::size_t bytes, std::size_t alignment, stream s) {
  const std::size_t granules = granules_for(bytes);
  const request r{bytes, alignment, s,
                  granules + (alignment > granularity_ ? (alignment >> shift_) - 1 : 0)};
  lock_type lock(mutex_);
  if (r.search > detail::max_chunk_granules) {
    fail(lock, r, fmt::format("a chunk cannot exceed 2^32 - 1 granules of {} bytes", granularity_));
  }
  chunk_handle h = find_fit(r.search, s);
  if (h == no_chunk && !pending_.empty()) h = find_fit_after_sync(lock, r);
  if (h == no_chunk) h = grow(lock, r);
  chunks_.reserve(2);  // the pieces carve() may split off
  h = carve(h, granules, alignment);
  chunk& c = chunks_[h];
  const std::size_t chunk_bytes = bytes_of(c.size);
  c.state = chunk_state::in_use;
  c.slack = static_cast<std::uint32_t>(chunk_bytes - bytes);
  c.alignment_log2 = static_cast<std::uint8_t>(std::countr_zero(alignment));
  stats_.bytes_in_use += bytes;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  stats_.total_bytes_allocated += bytes;
  ++stats_.num_allocs;
  in_use_chunk_bytes_ += chunk_bytes;
  const std::uintptr_t addr = addr_of(c);
  lock.unlock();
  unpoison(addr, bytes);
  return reinterpret_cast<void*>(addr);
}

LOOM_POOL_HOT std::uint32_t bfc_pool::impl::pending_id(stream s) const noexcept {
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (!pending_[i]->bins.empty() && pending_[i]->owner == s) {
      return static_cast<std::uint32_t>(i + 1);
    }
  }
  return 0;
}

// The smallest free chunk of at least `search` granules usable on `s`: ready, or pending on s
// (preferred between equals, which leaves ready chunks to other streams).
LOOM_POOL_HOT chunk_handle bfc_pool::impl::find_fit(std::size_t search, stream s) const noexcept {
  const std::uint32_t id = pending_id(s);
  if (id == 0) return ready_.best_fit(chunks_, search);
  const chunk_handle mine = bins(id).best_fit(chunks_, search);
  if (mine == no_chunk) return ready_.best_fit(chunks_, search);
  // A ready chunk wins only when strictly smaller, and none is smaller than an exact fit.
  if (chunks_[mine].size == search) return mine;
  const chunk_handle ready = ready_.best_fit(chunks_, search);
  return ready != no_chunk && chunks_[ready].size < chunks_[mine].size ? ready : mine;
}

// Note [syncing before growing]: when no chunk usable on the requesting stream fits, the
// pool looks for runs of adjacent free chunks that would hold the request once every
// chunk in the run were ready (a single pending chunk that fits is such a run), waits for
// the streams whose pending chunks are in those runs, and searches again. Only when that
// finds nothing does it grow. Waiting for a stream costs less than taking a region.
chunk_handle bfc_pool::impl::find_fit_after_sync(lock_type& lock, const request& r) {
  const std::vector<stream> streams = streams_to_sync(r.search);
  if (streams.empty()) return no_chunk;
  synchronize(lock, streams);
  return find_fit(r.search, r.on);
}

std::vector<stream> bfc_pool::impl::streams_to_sync(std::size_t search) const {
  std::vector<stream> streams;
  std::vector<stream> in_run;
  std::size_t run = 0;
  const auto end_run = [&] {
    if (run >= search) {
      for (const stream s : in_run) add_unique(streams, s);
    }
    run = 0;
    in_run.clear();
  };
  for (const region_ref& ref : by_address_) {
    for (chunk_handle h = regions_[ref.id].first; h != no_chunk; h = chunks_[h].next) {
      const chunk& c = chunks_[h];
      if (c.state != chunk_state::free) {
        end_run();
        continue;
      }
      run += c.size;
      if (c.bins != 0) add_unique(in_run, pending_[c.bins - 1]->owner);
    }
    end_run();
  }
  return streams;
}

chunk_handle bfc_pool::impl::grow(lock_type& lock, const request& r) {
  if (step_ == 0) fail(lock, r, "no free chunk fits and the pool is fixed (growth_step 0)");
  if (by_address_.size() + growing_ >= max_regions) {
    fail(lock, r,
         fmt::format("no free chunk fits and the pool holds {} regions, the most it can",
                     max_regions));
  }
  const std::size_t needed = bytes_of(r.search);
  const std::size_t room = options_.max_size - held_;
  if (needed > room) {
    fail(lock, r,
         fmt::format("no free chunk fits and a region of {} bytes would exceed max_size ({} "
                     "bytes, {} held)",
                     needed, options_.max_size, held_));
  }
  std::size_t size = std::max(step_, needed);
  if (size > room) size = room & ~(granularity_ - 1);  // still >= needed
  region fresh = take_region(lock, size, r);
  try {
    reserve_for_attach();
  } catch (...) {
    give_back(lock, std::move(fresh));
    throw;
  }
  attach(std::move(fresh));
  return find_fit(r.search, r.on);  // the new region holds a ready chunk that fits
}

// Takes a region of `size` bytes from the upstream without holding the lock; when the
// upstream refuses, tries once more with just what the request needs. Bytes are reserved
// against max_size before the lock is released, so concurrent growths cannot overshoot.
bfc_pool::impl::region bfc_pool::impl::take_region(lock_type& lock, std::size_t size,
                                                   const request& r) {
  held_ += size;
  ++growing_;
  lock.unlock();
  region fresh;
  std::exception_ptr failure;
  std::size_t attempt = size;
  for (;;) {
    try {
      fresh = acquire(attempt);
      break;
    } catch (...) {
      failure = std::current_exception();
    }
    if (attempt == bytes_of(r.search)) break;
    attempt = bytes_of(r.search);
  }
  lock.lock();
  --growing_;
  held_ -= size - fresh.size;
  if (fresh.size != 0) return fresh;
  try {
    std::rethrow_exception(failure);
  } catch (const std::bad_alloc& e) {
    fail(lock, r, fmt::format("the upstream refused a region of {} bytes ({})", attempt, e.what()));
  }
}

bfc_pool::impl::region bfc_pool::impl::acquire(std::size_t size) const {
  void* base = upstream_.allocate(size, region_alignment_);
  region fresh;
  try {
    fresh.slots = std::make_unique_for_overwrite<chunk_handle[]>(size >> shift_);
  } catch (...) {
    upstream_.deallocate(base, size, region_alignment_);
    throw;
  }
  std::fill_n(fresh.slots.get(), size >> shift_, no_chunk);
  fresh.base = reinterpret_cast<std::uintptr_t>(base);
  fresh.size = size;
  return fresh;
}

void bfc_pool::impl::return_region(const region& r) const noexcept {
  unpoison(r.base, r.size);
  upstream_.deallocate(reinterpret_cast<void*>(r.base), r.size, region_alignment_);
}

void bfc_pool::impl::give_back(lock_type& lock, region r) noexcept {
  lock.unlock();
  return_region(r);
  lock.lock();
  held_ -= r.size;
}

void bfc_pool::impl::reserve_for_attach() {
  by_address_.reserve(by_address_.size() + 1);
  if (std::none_of(regions_.begin(), regions_.end(), [](const region& r) { return r.size == 0; })) {
    regions_.reserve(regions_.size() + 1);
  }
  chunks_.reserve(3);  // the region's chunk and the two pieces an allocation may split off
}

void bfc_pool::impl::attach(region r) noexcept {
  const auto vacant =
      std::find_if(regions_.begin(), regions_.end(), [](const region& x) { return x.size == 0; });
  const auto id = static_cast<std::uint16_t>(vacant - regions_.begin());
  const chunk_handle h = chunks_.create();
  chunk& whole = chunks_[h];
  whole.offset = 0;
  whole.size = static_cast<std::uint32_t>(r.size >> shift_);
  whole.prev = no_chunk;
  whole.next = no_chunk;
  whole.bins = 0;
  whole.region = id;
  r.first = h;
  r.slots[0] = h;
  const region_ref ref{r.base, r.size, id};
  by_address_.insert(
      std::upper_bound(by_address_.begin(), by_address_.end(), ref,
                       [](const region_ref& a, const region_ref& b) { return a.base < b.base; }),
      ref);
  stats_.bytes_reserved += r.size;
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  ++stats_.num_regions;
  poison(r.base, r.size);
  if (vacant == regions_.end()) {
    regions_.push_back(std::move(r));
  } else {
    *vacant = std::move(r);
  }
  ready_.insert(chunks_, h);
}

// Takes free chunk `h` out of its bins and cuts the block from it: the unaligned front
// (when the alignment exceeds the granularity) and the unneeded back stay free, in the
// same bins as `h`, since they keep its stream state. Two spare handles must be reserved.
LOOM_POOL_HOT chunk_handle bfc_pool::impl::carve(chunk_handle h, std::size_t granules,
                                                 std::size_t alignment) noexcept {
  detail::free_bins& from = bins(chunks_[h].bins);
  from.remove(chunks_, h);
  if (alignment > granularity_) {  // smaller alignments hold for every chunk
    const std::uintptr_t addr = addr_of(chunks_[h]);
    if (const std::size_t skip = align_up(addr, alignment) - addr; skip != 0) {
      const chunk_handle aligned = split(h, static_cast<std::uint32_t>(skip >> shift_));
      from.insert(chunks_, h);
      h = aligned;
    }
  }
  if (chunks_[h].size > granules) {
    from.insert(chunks_, split(h, static_cast<std::uint32_t>(granules)));
  }
  return h;
}

// Cuts free chunk `h` after `front` granules; returns the new back chunk, which takes h's
// state (bins and stamp).
LOOM_POOL_HOT chunk_handle bfc_pool::impl::split(chunk_handle h, std::uint32_t front) noexcept {
  const chunk_handle back = chunks_.create();
  chunk& c = chunks_[h];
  chunk& rest = chunks_[back];
  rest.offset = c.offset + front;
  rest.size = c.size - front;
  rest.prev = h;
  rest.next = c.next;
  rest.bins = c.bins;
  rest.region = c.region;
  if (c.next != no_chunk) chunks_[c.next].prev = back;
  c.next = back;
  c.size = front;
  if (c.bins != 0) chunks_.stamp(back) = chunks_.stamp(h);
  regions_[c.region].slots[rest.offset] = back;
  return back;
}

// Merges free chunk `h` (in no bins) with its neighbours when they are free in the same
// bins, that is in the same stream state; returns the merged chunk (also in no bins).
LOOM_POOL_HOT chunk_handle bfc_pool::impl::coalesce(chunk_handle h) noexcept {
  const std::uint32_t id = chunks_[h].bins;
  detail::free_bins& same = bins(id);
  const auto mergeable = [&](chunk_handle n) {
    return n != no_chunk && chunks_[n].state == chunk_state::free && chunks_[n].bins == id;
  };
  const auto absorb = [&](chunk_handle into, chunk_handle gone) {
    chunk& a = chunks_[into];
    const chunk& b = chunks_[gone];
    a.size += b.size;
    a.next = b.next;
    if (b.next != no_chunk) chunks_[b.next].prev = into;
    if (id != 0 && chunks_.stamp(gone).seq > chunks_.stamp(into).seq) {
      chunks_.stamp(into) = chunks_.stamp(gone);
    }
    chunks_.destroy(gone);
  };
  if (const chunk_handle next = chunks_[h].next; mergeable(next)) {
    same.remove(chunks_, next);
    absorb(h, next);
  }
  if (const chunk_handle prev = chunks_[h].prev; mergeable(prev)) {
    same.remove(chunks_, prev);
    absorb(prev, h);
    h = prev;
  }
  return h;
}

[[noreturn]] void bfc_pool::impl::fail(lock_type& lock, const request& r,
                                       const std::string& reason) {
  ++stats_.num_failed_allocs;
  const memory_stats now = stats_locked();
  lock.unlock();
  throw out_of_memory(
      fmt::format("{}: cannot allocate {} bytes (alignment {}, stream {:#x}): "
                  "{}; {}",
                  label_, r.bytes, r.alignment, r.on.value(), reason, to_string(now)),
      r.bytes, label_, now);
}

// ---- deallocate ------------------------------------------------------------------------

void bfc_pool::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept {
  impl_->deallocate(p, bytes, alignment, s);
}

void bfc_pool::impl::deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                stream s) noexcept {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  lock_type lock(mutex_);
  const chunk_handle h = chunk_at(addr);
  if (h == no_chunk) {
    const char* what = region_of(addr) == nullptr
                           ? "the pointer is in no region of this pool"
                           : "the pointer is inside a region but not at the start of a block";
    return report(lock, {misuse_kind::unknown_pointer, what, 0, 0}, p, bytes, alignment, s);
  }
  const chunk& c = chunks_[h];
  if (c.state == chunk_state::free) {
    return report(lock, {misuse_kind::double_free, "the block was already given back", 0, 0}, p,
                  bytes, alignment, s);
  }
  const std::size_t requested = requested_of(c);
  const std::size_t allocated_alignment = std::size_t{1} << c.alignment_log2;
  if (requested != bytes) {
    return report(lock,
                  {misuse_kind::size_mismatch, "the size differs from the one allocated", requested,
                   allocated_alignment},
                  p, bytes, alignment, s);
  }
  if (alignment != allocated_alignment) {
    return report(lock,
                  {misuse_kind::alignment_mismatch, "the alignment differs from the one allocated",
                   requested, allocated_alignment},
                  p, bytes, alignment, s);
  }
  release(h, addr, s);
}

inline const bfc_pool::impl::region_ref* bfc_pool::impl::region_of(
    std::uintptr_t addr) const noexcept {
  const auto after =
      std::upper_bound(by_address_.begin(), by_address_.end(), addr,
                       [](std::uintptr_t a, const region_ref& r) { return a < r.base; });
  if (after == by_address_.begin()) return nullptr;
  const region_ref& ref = *(after - 1);
  return addr - ref.base < ref.size ? &ref : nullptr;
}

LOOM_POOL_HOT chunk_handle bfc_pool::impl::chunk_at(std::uintptr_t addr) const noexcept {
  const region_ref* ref = &last_region_;
  if (addr - ref->base >= ref->size) {
    ref = region_of(addr);
    if (ref == nullptr) return no_chunk;
    last_region_ = *ref;
  }
  const std::size_t offset = addr - ref->base;
  if ((offset & (granularity_ - 1)) != 0) return no_chunk;
  const std::size_t index = offset >> shift_;
  const chunk_handle h = regions_[ref->id].slots[index];
  if (h == no_chunk) return no_chunk;
  // A stale entry names a spare handle or a chunk that starts elsewhere.
  const chunk& c = chunks_[h];
  return c.state != chunk_state::spare && c.region == ref->id && c.offset == index ? h : no_chunk;
}

LOOM_POOL_HOT void bfc_pool::impl::release(chunk_handle h, std::uintptr_t addr, stream s) noexcept {
  chunk& c = chunks_[h];
  const std::size_t chunk_bytes = bytes_of(c.size);
  stats_.bytes_in_use -= chunk_bytes - c.slack;
  ++stats_.num_deallocs;
  in_use_chunk_bytes_ -= chunk_bytes;
  poison(addr, chunk_bytes);
  ++free_seq_;
  c.state = chunk_state::free;
  c.bins = bins_for_free(s);
  if (c.bins != 0) chunks_.stamp(h) = {free_seq_, s};
  const chunk_handle merged = coalesce(h);
  bins(chunks_[merged].bins).insert(chunks_, merged);
}

// The bins for a chunk freed on `s`: the ready bins when streams need no synchronisation,
// else the pending bins bound to s (binding a free or new one).
LOOM_POOL_HOT std::uint32_t bfc_pool::impl::bins_for_free(stream s) noexcept {
  if (!options_.synchronize) return 0;
  if (const std::uint32_t id = pending_id(s); id != 0) return id;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i]->bins.empty()) {
      pending_[i]->owner = s;
      return static_cast<std::uint32_t>(i + 1);
    }
  }
  try {
    pending_.push_back(std::make_unique<pending_bins>(s));
    return static_cast<std::uint32_t>(pending_.size());
  } catch (const std::bad_alloc&) {
    // No memory to track another stream: wait for this one now, and the chunk is ready.
    options_.synchronize(s);
    return 0;
  }
}

void bfc_pool::impl::report(lock_type& lock, const misuse_case& m, const void* p, std::size_t bytes,
                            std::size_t alignment, stream s) noexcept {
  lock.unlock();
  send_report({m.kind, {}, p, bytes, m.expected, s, {}}, [&](misuse_report& r) {
    r.resource = label_;
    r.message = fmt::format("{}: {} in deallocate({}, {} bytes, alignment {}, stream {:#x}): {}",
                            label_, to_string(m.kind), p, bytes, alignment, s.value(), m.what);
    if (m.expected_alignment != 0) {
      r.message += fmt::format(" (it was allocated with {} bytes, alignment {})", m.expected,
                               m.expected_alignment);
    }
    r.message += "; nothing was freed";
  });
}

void bfc_pool::impl::report_leaks() const noexcept {
  const void* first = nullptr;
  for (auto ref = by_address_.begin(); ref != by_address_.end() && first == nullptr; ++ref) {
    for (chunk_handle h = regions_[ref->id].first; h != no_chunk; h = chunks_[h].next) {
      if (chunks_[h].state == chunk_state::in_use) {
        first = reinterpret_cast<const void*>(addr_of(chunks_[h]));
        break;
      }
    }
  }
  send_report({misuse_kind::leak, {}, first, stats_.bytes_in_use, 0, stream{}, {}},
              [&](misuse_report& r) {
                r.resource = label_;
                r.message = fmt::format(
                    "{}: destroyed with {} blocks of {} bytes in all ({}) still in use, the "
                    "lowest at {}; their memory goes back to the upstream",
                    label_, stats_.num_allocs - stats_.num_deallocs, stats_.bytes_in_use,
                    format_bytes(stats_.bytes_in_use), first);
              });
}

// ---- streams ---------------------------------------------------------------------------

// Waits for `streams` without holding the lock, then makes ready their chunks freed before
// the wait began. A chunk freed on one of them while the lock was released may hold work
// queued after the wait began, so it stays pending (its stamp is above the horizon).
void bfc_pool::impl::synchronize(lock_type& lock, const std::vector<stream>& streams) {
  const std::uint64_t horizon = free_seq_;
  lock.unlock();
  for (const stream s : streams) options_.synchronize(s);
  lock.lock();
  for (const stream s : streams) make_ready(s, horizon);
}

void bfc_pool::impl::make_ready(stream s, std::uint64_t horizon) noexcept {
  const std::uint32_t id = pending_id(s);
  if (id == 0) return;
  detail::free_bins& pending = bins(id);
  pending.for_each(chunks_, [&](chunk_handle h) {
    if (chunks_.stamp(h).seq > horizon) return;
    pending.remove(chunks_, h);
    chunks_[h].bins = 0;
    ready_.insert(chunks_, coalesce(h));
  });
}

void bfc_pool::synchronize_streams() {
  impl_->synchronize_streams();
}

void bfc_pool::impl::synchronize_streams() {
  lock_type lock(mutex_);
  std::vector<stream> streams;
  for (const auto& p : pending_) {
    if (!p->bins.empty()) streams.push_back(p->owner);
  }
  if (!streams.empty()) synchronize(lock, streams);
}

// ---- trim ------------------------------------------------------------------------------

std::size_t bfc_pool::trim() {
  return impl_->trim();
}

std::size_t bfc_pool::impl::trim() {
  if (step_ == 0) return 0;  // a fixed pool could not take its regions back
  lock_type lock(mutex_);
  if (const std::vector<stream> streams = streams_of_free_regions(); !streams.empty()) {
    synchronize(lock, streams);
  }
  std::vector<region> released;
  released.reserve(by_address_.size());
  for (auto ref = by_address_.begin(); ref != by_address_.end();) {
    region& r = regions_[ref->id];
    const chunk& c = chunks_[r.first];
    if (c.state != chunk_state::free || c.bins != 0 || bytes_of(c.size) != r.size) {
      ++ref;
      continue;
    }
    ready_.remove(chunks_, r.first);
    chunks_.destroy(r.first);
    stats_.bytes_reserved -= r.size;
    --stats_.num_regions;
    released.push_back(std::exchange(r, region{}));
    ref = by_address_.erase(ref);
  }
  last_region_ = {0, 0, 0};  // it may name a region just detached
  lock.unlock();
  std::size_t total = 0;
  for (const region& r : released) {
    return_region(r);
    total += r.size;
  }
  if (total != 0) {
    lock.lock();
    held_ -= total;
  }
  return total;
}

std::vector<stream> bfc_pool::impl::streams_of_free_regions() const {
  std::vector<stream> streams;
  std::vector<stream> in_region;
  for (const region_ref& ref : by_address_) {
    in_region.clear();
    bool all_free = true;
    for (chunk_handle h = regions_[ref.id].first; h != no_chunk && all_free; h = chunks_[h].next) {
      const chunk& c = chunks_[h];
      all_free = c.state == chunk_state::free;
      if (all_free && c.bins != 0) add_unique(in_region, pending_[c.bins - 1]->owner);
    }
    if (all_free) {
      for (const stream s : in_region) add_unique(streams, s);
    }
  }
  return streams;
}

// ---- statistics ------------------------------------------------------------------------

memory_stats bfc_pool::get_stats() const {
  return impl_->stats();
}

memory_stats bfc_pool::impl::stats() const {
  const lock_type lock(mutex_);
  return stats_locked();
}

memory_stats bfc_pool::impl::stats_locked() const noexcept {
  memory_stats s = stats_;
  s.allocations_in_use = s.num_allocs - s.num_deallocs;
  s.free_bytes = s.bytes_reserved - in_use_chunk_bytes_;
  s.unusable_bytes = in_use_chunk_bytes_ - s.bytes_in_use;
  for (std::size_t id = 0; id <= pending_.size(); ++id) {
    if (const chunk_handle h = bins(id).largest(chunks_); h != no_chunk) {
      s.largest_free_block = std::max(s.largest_free_block, bytes_of(chunks_[h].size));
    }
  }
  return s;
}

void bfc_pool::reset_peaks() {
  impl_->reset_peaks();
}

void bfc_pool::impl::reset_peaks() {
  const lock_type lock(mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
}

const bfc_pool_options& bfc_pool::options() const noexcept {
  return impl_->options_;
}

memory_resource& bfc_pool::upstream() const noexcept {
  return impl_->upstream_;
}

// ---- AddressSanitizer ------------------------------------------------------------------
// (inline: without ASan they are empty, and deallocate should not call them)

inline void bfc_pool::impl::poison([[maybe_unused]] std::uintptr_t addr,
                                   [[maybe_unused]] std::size_t bytes) const noexcept {
#if defined(LOOM_ASAN)
  if (options_.poison_free_memory) {
    ASAN_POISON_MEMORY_REGION(reinterpret_cast<const void*>(addr), bytes);
  }
#endif
}

inline void bfc_pool::impl::unpoison([[maybe_unused]] std::uintptr_t addr,
                                     [[maybe_unused]] std::size_t bytes) const noexcept {
#if defined(LOOM_ASAN)
  if (options_.poison_free_memory) {
    ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<const void*>(addr), bytes);
  }
#endif
}

}  // namespace loom::memory
