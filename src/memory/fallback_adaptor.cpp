#include "loom/memory/fallback_adaptor.hpp"

#include "loom/core/error.hpp"

namespace loom::memory {

void* fallback_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  try {
    return primary_->allocate(bytes, alignment, s);
  } catch (const out_of_memory&) {
    // The fallback's own out_of_memory, if it fails too, is the one the caller sees.
    void* p = fallback_->allocate(bytes, alignment, s);
    try {
      const std::lock_guard lock(mutex_);
      from_fallback_.insert(p);
      fallback_bytes_ += bytes;
    } catch (...) {
      fallback_->deallocate(p, bytes, alignment, s);
      throw out_of_memory("fallback_adaptor: no memory to record a fallback block", bytes,
                          "fallback_adaptor");
    }
    live_fallback_.fetch_add(1, std::memory_order_release);
    fallback_count_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
}

void fallback_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                     stream s) noexcept {
  if (live_fallback_.load(std::memory_order_acquire) != 0) {
    bool ours = false;
    {
      const std::lock_guard lock(mutex_);
      ours = from_fallback_.erase(p) != 0;
      if (ours) fallback_bytes_ -= bytes;
    }
    if (ours) {
      live_fallback_.fetch_sub(1, std::memory_order_release);
      fallback_->deallocate(p, bytes, alignment, s);
      return;
    }
  }
  primary_->deallocate(p, bytes, alignment, s);
}

std::size_t fallback_adaptor::fallback_blocks() const {
  const std::lock_guard lock(mutex_);
  return from_fallback_.size();
}

std::size_t fallback_adaptor::fallback_bytes() const {
  const std::lock_guard lock(mutex_);
  return fallback_bytes_;
}

}  // namespace loom::memory
