#include "loom/graph/builder.hpp"

namespace loom {

const node& output::producer() const { return builder_->g().at(endpoint_.node); }
const tensor_type& output::type() const { return builder_->g().type_of(endpoint_); }
std::string output::name() const { return builder_->g().endpoint_name(endpoint_); }

std::vector<output> graph_builder::add(std::string_view op, const std::vector<output>& inputs,
                                       attr_map attrs, const node_options& options) {
  node_spec spec;
  spec.name = options.name;
  spec.op = std::string(op);
  spec.inputs.reserve(inputs.size());
  for (const auto& in : inputs) {
    if (!in.valid()) {
      throw invalid_argument("graph_builder: an input of a new " + spec.op + " node is empty");
    }
    if (&in.builder().g() != graph_) {
      throw invalid_argument("graph_builder: an input of a new " + spec.op +
                             " node belongs to another graph");
    }
    spec.inputs.push_back(in.ep());
  }
  spec.attrs = std::move(attrs);
  spec.device = options.device.empty() ? device_ : options.device;
  const node& n = graph_->add_node(std::move(spec));
  std::vector<output> outs;
  outs.reserve(n.outputs.size());
  for (std::size_t i = 0; i < n.outputs.size(); ++i) {
    outs.emplace_back(this, endpoint{n.id, static_cast<std::int32_t>(i)});
  }
  return outs;
}

output graph_builder::add1(std::string_view op, const std::vector<output>& inputs, attr_map attrs,
                           const node_options& options) {
  auto outs = add(op, inputs, std::move(attrs), options);
  if (outs.size() != 1) {
    throw invalid_argument("graph_builder::add1: op " + std::string(op) + " has " +
                           std::to_string(outs.size()) + " outputs");
  }
  return outs[0];
}

}  // namespace loom
