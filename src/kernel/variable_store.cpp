#include "loom/kernel/variable_store.hpp"

#include <algorithm>

namespace loom {

variable_store::variable& variable_store::get(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto& slot = variables_[name];
  if (!slot) slot = std::make_unique<variable>();
  return *slot;
}

variable_store::variable* variable_store::find(const std::string& name) {
  std::lock_guard lock(mutex_);
  auto it = variables_.find(name);
  return it == variables_.end() ? nullptr : it->second.get();
}

std::vector<std::string> variable_store::names() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [n, v] : variables_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

void variable_store::clear() {
  std::lock_guard lock(mutex_);
  for (auto& [n, v] : variables_) {
    std::lock_guard value_lock(v->mutex);
    v->value = tensor();
  }
}

}  // namespace loom
