// allocation_tag: who is asking for memory, without widening the allocator interface.
//
// A tag names the component and op on whose behalf the current thread allocates, such as
// "session/conv2d:node7". It is set for a scope on the calling thread; the tracking and
// logging adaptors read it when they record an allocation. Tags are cheap: a scope stores
// a pointer to a string the caller keeps alive for the scope's duration.
//
//   {
//     loom::memory::tag_scope tag{"optimizer/adam"};
//     void* p = resource.allocate(bytes);   // recorded with tag "optimizer/adam"
//   }
#pragma once

#include <string_view>

namespace loom::memory {

/// The calling thread's current tag, "" when none is set.
[[nodiscard]] std::string_view current_tag() noexcept;

/// Sets the calling thread's tag for its lifetime and restores the previous one after.
/// `tag` must outlive the scope. Not copyable or movable.
class tag_scope {
 public:
  explicit tag_scope(std::string_view tag) noexcept;
  ~tag_scope();
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;

 private:
  std::string_view previous_;
};

}  // namespace loom::memory
