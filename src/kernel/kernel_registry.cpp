#include "loom/kernel/kernel_registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>

#include "kernel/common/neutral_kernels.hpp"
#include "loom/graph/op_registry.hpp"

namespace loom {

bool kernel_def::matches(const node& n) const {
  for (const auto& [attr, types] : constraints) {
    auto it = n.attrs.find(attr);
    if (it == n.attrs.end() || it->second.type() != attr_type::type) return false;
    const dtype t = it->second.as<dtype>();
    if (!types.empty() && std::find(types.begin(), types.end(), t) == types.end()) return false;
  }
  return true;
}

std::string kernel_def::describe() const {
  std::vector<std::string> parts;
  for (const auto& [attr, types] : constraints) {
    std::vector<std::string> names;
    for (dtype t : types) names.emplace_back(to_string(t));
    parts.push_back(fmt::format("{} in {{{}}}", attr, fmt::join(names, ", ")));
  }
  return fmt::format("{} on {}{} ({}, priority {})", op, to_string(device),
                     parts.empty() ? "" : fmt::format(" [{}]", fmt::join(parts, "; ")), label,
                     priority);
}

kernel_registry& kernel_registry::global() {
  static kernel_registry* registry = [] {
    auto* r = new kernel_registry;  // immortal, as the op registry
    register_cpu_kernels(*r);
#ifdef LOOM_HAVE_CUDA
    register_cuda_kernels(*r);
#endif
    common::register_device_neutral_kernels(*r);
    return r;
  }();
  return *registry;
}

void kernel_registry::add(kernel_def def) {
  if (def.op.empty() || !def.create) {
    throw invalid_argument("kernel_registry::add: a kernel needs an op and a factory");
  }
  const op_def* op = op_registry::global().find(def.op);
  if (op == nullptr) {
    throw invalid_argument(fmt::format("kernel_registry::add: unknown op '{}'", def.op));
  }
  if (def.constraints.empty()) {
    // The op definition's dtype rules, written there once.
    for (const attr_def& a : op->attrs) {
      if (a.type == attr_type::type && !a.allowed_types.empty()) {
        def.constraints.emplace_back(a.name, a.allowed_types);
      }
    }
  }
  std::unique_lock lock(mutex_);
  auto& list = kernels_[def.op];
  list.push_back(std::make_unique<kernel_def>(std::move(def)));
  // Highest priority first; among equals, the first registered.
  std::stable_sort(list.begin(), list.end(),
                   [](const auto& a, const auto& b) { return a->priority > b->priority; });
}

const kernel_def* kernel_registry::find(const node& n, device_type type) const {
  std::shared_lock lock(mutex_);
  auto it = kernels_.find(n.op());
  if (it == kernels_.end()) return nullptr;
  for (const auto& k : it->second) {
    if (k->device == type && k->matches(n)) return k.get();
  }
  return nullptr;
}

const kernel_def& kernel_registry::get(const node& n, device_type type) const {
  if (const kernel_def* k = find(n, type)) return *k;
  std::vector<std::string> type_attrs;
  for (const auto& [name, v] : n.attrs) {
    if (v.type() == attr_type::type) type_attrs.push_back(fmt::format("{}={}", name, v.to_string()));
  }
  std::vector<std::string> known;
  for (const kernel_def* k : kernels_for(n.op())) known.push_back(k->describe());
  throw not_found(fmt::format(
      "no {} kernel for node {}{}; registered kernels: {}", to_string(type), n.describe(),
      type_attrs.empty() ? "" : fmt::format(" with {}", fmt::join(type_attrs, ", ")),
      known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, "; "))));
}

std::vector<const kernel_def*> kernel_registry::kernels_for(std::string_view op) const {
  std::shared_lock lock(mutex_);
  std::vector<const kernel_def*> out;
  auto it = kernels_.find(std::string(op));
  if (it != kernels_.end()) {
    for (const auto& k : it->second) out.push_back(k.get());
  }
  return out;
}

}  // namespace loom
