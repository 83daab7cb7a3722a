#include "loom/graph/op_registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>

namespace loom {

op_registry& op_registry::global() {
  static op_registry* registry = [] {
    auto* r = new op_registry;  // immortal: kernels and graphs may outlive static destruction
    register_standard_ops(*r);
    return r;
  }();
  return *registry;
}

void register_standard_ops(op_registry& registry) {
  register_state_ops(registry);
  register_elementwise_ops(registry);
  register_nn_ops(registry);
  register_reduction_ops(registry);
  register_normalization_ops(registry);
  register_array_ops(registry);
  register_transfer_ops(registry);
  register_optimizer_ops(registry);
  register_fused_ops(registry);
  register_collective_ops(registry);
}

namespace {
void check_arg(const op_def& def, const arg_def& arg) {
  for (const auto& attr : {arg.type_attr, arg.list_length_attr}) {
    if (!attr.empty() && def.find_attr(attr) == nullptr) {
      throw invalid_argument(fmt::format("op {}: argument '{}' names undeclared attribute '{}'",
                                         def.name, arg.name, attr));
    }
  }
}
}  // namespace

void op_registry::add(op_def def) {
  if (def.name.empty()) throw invalid_argument("op_registry::add: an op needs a name");
  for (const auto& a : def.inputs) check_arg(def, a);
  for (const auto& a : def.outputs) check_arg(def, a);
  std::unique_lock lock(mutex_);
  if (ops_.contains(def.name)) {
    throw invalid_argument(fmt::format("op '{}' is already registered", def.name));
  }
  auto name = def.name;
  ops_.emplace(std::move(name), std::make_unique<op_def>(std::move(def)));
}

const op_def* op_registry::find(std::string_view name) const {
  std::shared_lock lock(mutex_);
  auto it = ops_.find(std::string(name));
  return it == ops_.end() ? nullptr : it->second.get();
}

namespace {
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0u : 1u)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

const op_def& op_registry::get(std::string_view name) const {
  if (const op_def* d = find(name)) return *d;
  std::vector<std::string> close;
  for (const auto& n : names()) {
    if (edit_distance(n, name) <= 2) close.push_back(n);
  }
  throw not_found(close.empty()
                      ? fmt::format("unknown op '{}'", name)
                      : fmt::format("unknown op '{}' (did you mean {}?)", name,
                                    fmt::join(close, ", ")));
}

std::vector<std::string> op_registry::names() const {
  std::shared_lock lock(mutex_);
  std::vector<std::string> out;
  out.reserve(ops_.size());
  for (const auto& [n, d] : ops_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace loom
