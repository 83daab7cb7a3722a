// kernel_registry: the kernels of every op for every kind of device, keyed by
// (op, device type, dtype constraints), with priorities.
//
// A kernel_def says which values of the node's type attributes it handles (T in {float32,
// float64}); lookup takes the highest-priority kernel whose constraints the node meets,
// so a faster kernel registered at a higher priority (a plugin's, a fused one) wins. When
// none matches, the error lists the kernels the op has. Each backend adds its kernels from
// one explicit table (register_cpu_kernels in src/backends/cpu/cpu_kernels.cpp), and the
// global registry takes the built-in backends' tables from src/backends/builtin.cpp on first
// use; nothing registers from static initializers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/kernel/op_kernel.hpp"

namespace loom {

struct kernel_def {
  std::string op;
  device_type device = device_type::cpu;
  /// For each listed type attribute, the dtypes this kernel handles. Left empty, it is the
  /// op definition's: kernel_registry::add copies each type attribute's allowed dtypes, so
  /// a kernel that covers everything its op accepts names no dtype itself.
  std::vector<std::pair<std::string, std::vector<dtype>>> constraints;
  int priority = 0;
  /// Which implementation this is ("onednn", "reference", ...), for listings.
  std::string label;
  std::function<std::unique_ptr<op_kernel>(const kernel_construction&)> create;
  /// For a dtype this kernel takes but computes slowly on this machine (emulated: bfloat16
  /// on a CPU without its instructions), why; nullopt where it runs at full speed. Unset:
  /// full speed for every dtype it takes. The AMP pass keeps float32 where the kernels for
  /// the low precision say so (docs/training.md, "Mixed precision").
  std::function<std::optional<std::string>(dtype)> emulated;

  /// True when `n`'s attributes meet every constraint.
  [[nodiscard]] bool matches(const node& n) const;
  /// "matmul on cpu [T in {float32, float64}] (onednn, priority 0)".
  [[nodiscard]] std::string describe() const;
};

class kernel_registry {
 public:
  /// The process's registry, with loom's backends' kernels added on first use.
  static kernel_registry& global();

  /// Adds a kernel (with the op definition's dtype constraints when it lists none). Throws
  /// loom::invalid_argument when it has no op, no factory, or an op the op registry does not
  /// know.
  void add(kernel_def def);
  /// The best kernel for `n` on `type`, or nullptr.
  [[nodiscard]] const kernel_def* find(const node& n, device_type type) const;
  /// The best kernel; throws loom::not_found naming the node, its type attributes and the
  /// device type, and listing the kernels the op has.
  [[nodiscard]] const kernel_def& get(const node& n, device_type type) const;
  /// Every kernel of `op`.
  [[nodiscard]] std::vector<const kernel_def*> kernels_for(std::string_view op) const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::vector<std::unique_ptr<kernel_def>>> kernels_;
};

/// Shorthand for the constraint "T in {types...}".
inline std::vector<std::pair<std::string, std::vector<dtype>>> type_constraint(
    std::vector<dtype> types, std::string attr = "T") {
  return {{std::move(attr), std::move(types)}};
}

/// A kernel_def whose factory constructs K from the kernel_construction; with no
/// constraints, it handles every dtype its op definition accepts.
template <class K>
kernel_def make_kernel_def(std::string op, device_type device, std::string label = "reference",
                           int priority = 0);

template <class K>
kernel_def make_kernel_def(std::string op, device_type device,
                           std::vector<std::pair<std::string, std::vector<dtype>>> constraints,
                           std::string label = "reference", int priority = 0) {
  kernel_def d;
  d.op = std::move(op);
  d.device = device;
  d.constraints = std::move(constraints);
  d.priority = priority;
  d.label = std::move(label);
  d.create = [](const kernel_construction& c) -> std::unique_ptr<op_kernel> {
    return std::make_unique<K>(c);
  };
  return d;
}

template <class K>
kernel_def make_kernel_def(std::string op, device_type device, std::string label, int priority) {
  return make_kernel_def<K>(std::move(op), device, {}, std::move(label), priority);
}

}  // namespace loom
