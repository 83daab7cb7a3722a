#include "loom/core/buffer.hpp"

namespace loom {

buffer_ptr buffer::adopt(void* data, std::size_t bytes, std::size_t alignment, device_id device,
                         stream s, release_fn on_release, void* context, bool read_only) {
  return buffer_ptr(new buffer(data, bytes, alignment, device, s, on_release, context, read_only));
}

void buffer::drop_ref() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (release_) release_(context_, data_, bytes_, alignment_, stream_);
  delete this;
}

}  // namespace loom
