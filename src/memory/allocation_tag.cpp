#include "loom/memory/allocation_tag.hpp"

namespace loom::memory {
namespace {
thread_local std::string_view t_tag;
}  // namespace

std::string_view current_tag() noexcept { return t_tag; }

tag_scope::tag_scope(std::string_view tag) noexcept : previous_(t_tag) { t_tag = tag; }

tag_scope::~tag_scope() { t_tag = previous_; }

}  // namespace loom::memory
