#include "kernel/known_bounds.hpp"

#include <cmath>
#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace loom::known_bounds {
namespace {

constexpr std::size_t capacity = 4096;

struct records {
  std::mutex mutex;
  std::unordered_map<const buffer*, float> bound;
};

records& all() {
  static records r;
  return r;
}

}  // namespace

void record(const buffer* b, float bound) {
  records& r = all();
  const std::lock_guard lock(r.mutex);
  if (!std::isfinite(bound)) {
    r.bound.erase(b);
  } else {
    if (r.bound.size() >= capacity) r.bound.clear();
    r.bound[b] = bound;
  }
}

float of(const buffer* b) {
  records& r = all();
  const std::lock_guard lock(r.mutex);
  const auto it = r.bound.find(b);
  return it == r.bound.end() ? HUGE_VALF : it->second;
}

}  // namespace loom::known_bounds
