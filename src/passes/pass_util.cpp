#include "pass_util.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>

#include "loom/core/device_id.hpp"
#include "loom/core/half.hpp"
#include "loom/kernel/kernel_registry.hpp"

namespace loom::passes {

std::optional<double> uniform_constant(const graph_editor& ed, endpoint e,
                                       std::int64_t max_elements) {
  const node& n = ed.at(e.node);
  if (n.op() != "const") return std::nullopt;
  const auto& value = n.attr_value_of("value");
  if (value.type() != attr_type::tensor) return std::nullopt;
  const tensor t = value.as<tensor>();
  if (!t.defined() || t.device().type != device_type::cpu || !t.is_contiguous())
    return std::nullopt;
  const std::int64_t count = t.num_elements();
  if (count == 0 || count > max_elements) return std::nullopt;
  std::optional<double> out;
  visit_dtype(t.type(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, half> ||
                  std::is_same_v<T, bfloat16>) {
      const T* p = t.data<T>();
      const auto as_double = [](T v) {
        if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
          return static_cast<double>(static_cast<float>(v));
        } else {
          return static_cast<double>(v);
        }
      };
      const double first = as_double(p[0]);
      for (std::int64_t i = 1; i < count; ++i) {
        // Bitwise for floats would be stricter; -0 == 0 matters only to sub/add rules,
        // which check the sign themselves.
        if (!(as_double(p[i]) == first)) return;
      }
      out = first;
    }
  });
  return out;
}

bool same_request(const node& a, const node& b) {
  return a.requested_device == b.requested_device;
}

bool unused(const graph_editor& ed, node_id id) {
  if (ed.has_control_users(id)) return false;
  const node& n = ed.at(id);
  for (std::size_t k = 0; k < n.outputs.size(); ++k) {
    const endpoint e{id, static_cast<std::int32_t>(k)};
    if (!ed.uses(e).empty() || ed.is_fetched(e)) return false;
  }
  return true;
}

std::optional<endpoint> other_input(const graph_editor& ed, node_id id, endpoint known) {
  const auto& in = ed.inputs(id);
  if (in.size() != 2) return std::nullopt;
  if (in[0] == known) return in[1];
  if (in[1] == known) return in[0];
  return std::nullopt;
}

std::vector<std::string> names_of(const graph_editor& ed, const std::vector<node_id>& ids) {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (node_id id : ids) out.push_back(ed.at(id).name);
  return out;
}

bool same_known_shape(const std::optional<shape>& a, const std::optional<shape>& b) {
  return a && b && a->is_fully_defined() && *a == *b;
}

std::optional<device_type> requested_type(const std::string& request) {
  if (request.empty()) return std::nullopt;
  try {
    return parse_task_request(request).device.type;
  } catch (const invalid_argument&) {
    // A malformed request is the placer's to report; any device type will do here.
    return std::nullopt;
  }
}

std::vector<const kernel_def*> fitting_kernels(std::string_view op,
                                               const std::vector<std::pair<std::string, dtype>>& types,
                                               const std::string& request,
                                               const std::vector<device_type>& device_types) {
  const std::optional<device_type> want = requested_type(request);
  std::vector<const kernel_def*> out;
  for (const kernel_def* d : kernel_registry::global().kernels_for(op)) {
    if (want && d->device != *want) continue;
    if (!device_types.empty() &&
        std::find(device_types.begin(), device_types.end(), d->device) == device_types.end()) {
      continue;
    }
    bool fits = true;
    for (const auto& [attr, allowed] : d->constraints) {
      for (const auto& [name, t] : types) {
        if (name == attr && std::find(allowed.begin(), allowed.end(), t) == allowed.end()) {
          fits = false;
        }
      }
    }
    if (fits) out.push_back(d);
  }
  return out;
}

std::optional<std::string> missing_kernel(std::string_view op,
                                          const std::vector<std::pair<std::string, dtype>>& types,
                                          const std::string& request) {
  if (!fitting_kernels(op, types, request).empty()) return std::nullopt;
  const std::optional<device_type> want = requested_type(request);
  const auto defs = kernel_registry::global().kernels_for(op);
  std::string wanted;
  for (const auto& [name, t] : types) {
    wanted += fmt::format("{}{} = {}", wanted.empty() ? "" : ", ", name, to_string(t));
  }
  std::string have;
  for (const kernel_def* d : defs)
    have += fmt::format("{}{}", have.empty() ? "" : "; ", d->describe());
  return fmt::format("no {} kernel{}{} (kernels: {})", op, wanted.empty() ? "" : " for " + wanted,
                     want ? fmt::format(" on {}", to_string(*want)) : std::string(),
                     have.empty() ? "none" : have);
}

std::optional<std::string> outside_reader(const graph_editor& ed, endpoint e,
                                          const std::vector<node_id>& inside) {
  for (const use& u : ed.uses(e)) {
    if (std::find(inside.begin(), inside.end(), u.node) == inside.end()) {
      return fmt::format("'{}'", ed.at(u.node).name);
    }
  }
  if (ed.is_fetched(e)) return std::string("a fetch");
  if (ed.has_control_users(e.node)) return std::string("a node waiting for it (a control edge)");
  return std::nullopt;
}

std::string read_outside_reason(const graph_editor& ed, endpoint e, const std::string& reader,
                                std::string_view fused_builder) {
  return fmt::format(
      "'{}' is also read by {} outside the pattern (when that reader is its gradient, "
      "gradients() ran before the passes: build with {}, or run the passes before gradients)",
      ed.g().endpoint_name(e), reader, fused_builder);
}

bool reaches(const graph_editor& ed, node_id from, node_id to) {
  // Backwards from `to`, through inputs and control inputs: what a node depends on.
  std::vector<bool> seen(ed.g().num_nodes(), false);
  std::vector<node_id> stack{to};
  while (!stack.empty()) {
    const node_id id = stack.back();
    stack.pop_back();
    auto visit = [&](node_id p) {
      if (p == from) return true;
      if (!seen[static_cast<std::size_t>(p)]) {
        seen[static_cast<std::size_t>(p)] = true;
        stack.push_back(p);
      }
      return false;
    };
    for (endpoint e : ed.inputs(id)) {
      if (visit(e.node)) return true;
    }
    for (node_id c : ed.control_inputs(id)) {
      if (visit(c)) return true;
    }
  }
  return false;
}

}  // namespace loom::passes
