#include "loom/graph/op_def.hpp"

#include <fmt/format.h>

namespace loom {

std::string to_string(const tensor_type& t) {
  return fmt::format("{}{}", to_string(t.type), t.shape ? to_string(*t.shape) : "[*]");
}

const attr_def* op_def::find_attr(std::string_view attr) const noexcept {
  for (const auto& a : attrs) {
    if (a.name == attr) return &a;
  }
  return nullptr;
}

inference_context::inference_context(const op_def& def, const std::string& node_name,
                                     const attr_map& attrs, std::vector<tensor_type> inputs,
                                     std::size_t num_outputs)
    : def_(def), node_name_(node_name), attrs_(attrs), inputs_(std::move(inputs)),
      outputs_(num_outputs) {}

const attr_value& inference_context::attr_value_of(std::string_view name) const {
  auto it = attrs_.find(name);
  if (it == attrs_.end()) {
    throw not_found(fmt::format("op {} has no attribute '{}'", def_.name, name));
  }
  return it->second;
}

void inference_context::fail(const std::string& message) const { throw invalid_argument(message); }

}  // namespace loom
