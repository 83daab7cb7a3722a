#include "loom/graph/graph.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <limits>

#include "loom/core/device_id.hpp"

namespace loom {

const attr_value& node::attr_value_of(std::string_view attr_name) const {
  auto it = attrs.find(attr_name);
  if (it == attrs.end()) {
    throw not_found(fmt::format("node {} has no attribute '{}'", describe(), attr_name));
  }
  return it->second;
}

std::string node::describe() const {
  return fmt::format("'{}' ({})", name, def ? def->name : std::string("?"));
}

tensor_name split_tensor_name(std::string_view text) {
  tensor_name out{text, 0};
  if (auto colon = text.rfind(':'); colon != std::string_view::npos) {
    out.node = text.substr(0, colon);
    const auto digits = text.substr(colon + 1);
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out.index);
    if (ec == std::errc::result_out_of_range && p == digits.data() + digits.size() &&
        !digits.starts_with('-')) {
      throw invalid_argument(fmt::format(
          "'{}' is not a tensor name: output index {} is out of range (at most {})", text, digits,
          std::numeric_limits<std::int32_t>::max()));
    }
    if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size() ||
        out.index < 0) {
      throw invalid_argument(fmt::format(
          "'{}' is not a tensor name (expected 'node' or 'node:k' with k an output index)",
          text));
    }
  }
  if (out.node.empty()) {
    throw invalid_argument(fmt::format("'{}' is not a tensor name: the node name is empty", text));
  }
  return out;
}

void check_node_name(std::string_view name) {
  if (name.empty()) throw invalid_argument("a node name may not be empty");
  if (name.front() == '^') {
    throw invalid_argument("a node name may not begin with '^' (it marks a control input)");
  }
  for (const char c : name) {
    if (c == ':') {
      throw invalid_argument("a node name may not contain ':' (it separates an output index)");
    }
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) {
      throw invalid_argument(
          "a node name may not contain spaces, white space or control characters");
    }
  }
}

void check_shape_attr(const shape& s) {
  std::int64_t known = 1;
  for (std::size_t i = 0; i < s.rank(); ++i) {
    const std::int64_t d = s[i];
    if (d < shape::unknown) {
      throw invalid_argument(fmt::format(
          "dimension {} is {}; a dimension is >= 0, or -1 (None in Python) for any size", i, d));
    }
    if (d > 0 && known > std::numeric_limits<std::int64_t>::max() / d) {
      throw invalid_argument("the known dimensions' product is more than 2^63 - 1 elements");
    }
    if (d > 0) known *= d;
  }
}

namespace {

bool attr_type_fits(attr_type want, attr_type have) {
  if (want == have) return true;
  if (want == attr_type::real && have == attr_type::integer) return true;
  if (want == attr_type::shape && have == attr_type::ints) return true;
  if (want == attr_type::ints && have == attr_type::shape) return true;
  if (want == attr_type::reals && have == attr_type::ints) return true;
  return false;
}

// Converts a value to the alternative the attribute declares, so kernels and serialization
// see one type per attribute.
attr_value normalize(attr_type want, const attr_value& v) {
  switch (want) {
    case attr_type::real: return v.as<double>();
    case attr_type::shape: return v.as<shape>();
    case attr_type::ints: return v.as<std::vector<std::int64_t>>();
    case attr_type::reals: return v.as<std::vector<double>>();
    default: return v;
  }
}

}  // namespace

const node& graph::add_node(node_spec spec) {
  const op_def* def = ops_->find(spec.op);
  const std::string name = spec.name.empty() ? unique_name(spec.op) : spec.name;
  if (def == nullptr) {
    try {
      (void)ops_->get(spec.op);
    } catch (const not_found& e) {
      throw not_found(fmt::format("node '{}': {}", name, e.what()));
    }
  }
  const std::string who = fmt::format("node '{}' ({})", name, def->name);
  auto fail = [&](const std::string& msg) -> void {
    throw invalid_argument(fmt::format("{}: {}", who, msg));
  };
  if (by_name_.contains(name)) fail("a node of this name already exists");
  try {
    check_node_name(name);
  } catch (const invalid_argument& e) {
    fail(e.what());
  }

  if (!spec.device.empty()) {
    try {
      (void)parse_task_request(spec.device);
    } catch (const invalid_argument& e) {
      fail(e.what());
    }
  }

  // Inputs exist.
  std::vector<tensor_type> input_types;
  input_types.reserve(spec.inputs.size());
  for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
    const endpoint e = spec.inputs[i];
    if (e.node < 0 || static_cast<std::size_t>(e.node) >= nodes_.size()) {
      throw not_found(fmt::format("{}: input {} refers to a node that is not in the graph", who, i));
    }
    const node& src = nodes_[static_cast<std::size_t>(e.node)];
    if (e.index < 0 || static_cast<std::size_t>(e.index) >= src.outputs.size()) {
      throw not_found(fmt::format("{}: input {} refers to output {} of {}, which has {}", who, i,
                                  e.index, src.describe(), src.outputs.size()));
    }
    input_types.push_back(src.outputs[static_cast<std::size_t>(e.index)]);
  }
  for (node_id c : spec.control_inputs) {
    if (c < 0 || static_cast<std::size_t>(c) >= nodes_.size()) {
      throw not_found(fmt::format("{}: a control input is not in the graph", who));
    }
  }

  // Attributes: no unknown ones; list lengths inferred from the input count.
  attr_map attrs = std::move(spec.attrs);
  for (const auto& [attr_name, v] : attrs) {
    if (def->find_attr(attr_name) == nullptr) {
      fail(fmt::format("op {} has no attribute '{}'", def->name, attr_name));
    }
  }
  if (def->derive_attrs) def->derive_attrs(attrs);
  std::size_t fixed_inputs = 0;
  const arg_def* list_arg = nullptr;
  for (const auto& a : def->inputs) {
    if (a.list_length_attr.empty()) ++fixed_inputs;
    else list_arg = &a;
  }
  if (list_arg != nullptr && !attrs.contains(list_arg->list_length_attr) &&
      spec.inputs.size() >= fixed_inputs) {
    attrs.emplace(list_arg->list_length_attr,
                  static_cast<std::int64_t>(spec.inputs.size() - fixed_inputs));
  }
  for (const auto& ad : def->attrs) {
    auto it = attrs.find(ad.name);
    if (it == attrs.end()) {
      if (ad.default_value) {
        attrs.emplace(ad.name, *ad.default_value);
      }
      continue;  // a type attribute may still come from the inputs
    }
    if (!attr_type_fits(ad.type, it->second.type())) {
      fail(fmt::format("attribute '{}' must be {}, got {} ({})", ad.name, to_string(ad.type),
                       to_string(it->second.type()), it->second.to_string()));
    }
    it->second = normalize(ad.type, it->second);
    if (ad.type == attr_type::shape) {
      try {
        check_shape_attr(it->second.as<shape>());
      } catch (const invalid_argument& e) {
        fail(fmt::format("attribute '{}' = [{}]: {}", ad.name,
                         fmt::join(it->second.as<shape>().dims(), ", "), e.what()));
      }
    }
  }

  // Expected input count and types.
  std::size_t expected = 0;
  std::vector<const arg_def*> input_args;
  for (const auto& a : def->inputs) {
    std::size_t count = 1;
    if (!a.list_length_attr.empty()) {
      const auto n = attrs.at(a.list_length_attr).as<std::int64_t>();
      if (n < 0) fail(fmt::format("attribute '{}' must be >= 0", a.list_length_attr));
      // Checked before any list is built: a length read from a file can be anything.
      if (static_cast<std::uint64_t>(n) > spec.inputs.size()) {
        fail(fmt::format("attribute '{}' = {} asks for more inputs than the {} given",
                         a.list_length_attr, n, spec.inputs.size()));
      }
      count = static_cast<std::size_t>(n);
    }
    expected += count;
  }
  if (spec.inputs.size() != expected) {
    fail(fmt::format("expects {} input{}, got {}", expected, expected == 1 ? "" : "s",
                     spec.inputs.size()));
  }
  for (const auto& a : def->inputs) {
    const std::size_t count =
        a.list_length_attr.empty()
            ? 1
            : static_cast<std::size_t>(attrs.at(a.list_length_attr).as<std::int64_t>());
    for (std::size_t k = 0; k < count; ++k) input_args.push_back(&a);
  }
  for (std::size_t i = 0; i < input_args.size(); ++i) {
    const arg_def& a = *input_args[i];
    const dtype have = input_types[i].type;
    const node& src = nodes_[static_cast<std::size_t>(spec.inputs[i].node)];
    if (a.any_type) continue;
    if (a.type_attr.empty()) {
      if (have != a.fixed) {
        fail(fmt::format("input {} ('{}', from {}) must be {}, got {}", i, a.name, src.name,
                         to_string(a.fixed), to_string(have)));
      }
      continue;
    }
    auto it = attrs.find(a.type_attr);
    if (it == attrs.end()) {
      attrs.emplace(a.type_attr, have);
    } else if (it->second.as<dtype>() != have) {
      fail(fmt::format("input {} ('{}', from {}) is {} but {} is {}", i, a.name, src.name,
                       to_string(have), a.type_attr, to_string(it->second.as<dtype>())));
    }
  }

  // Type attributes that default to another's.
  for (const auto& ad : def->attrs) {
    if (ad.default_from.empty() || attrs.contains(ad.name)) continue;
    if (const auto from = attrs.find(ad.default_from); from != attrs.end()) {
      attrs.emplace(ad.name, from->second);
    }
  }

  // Required attributes present; type restrictions and validation.
  for (const auto& ad : def->attrs) {
    auto it = attrs.find(ad.name);
    if (it == attrs.end()) fail(fmt::format("missing required attribute '{}'", ad.name));
    if (ad.type == attr_type::type && !ad.allowed_types.empty()) {
      const dtype t = it->second.as<dtype>();
      if (std::find(ad.allowed_types.begin(), ad.allowed_types.end(), t) ==
          ad.allowed_types.end()) {
        std::vector<std::string> allowed;
        for (dtype d : ad.allowed_types) allowed.emplace_back(to_string(d));
        fail(fmt::format("{} = {} is not supported (allowed: {})", ad.name, to_string(t),
                         fmt::join(allowed, ", ")));
      }
    }
    if (ad.validate) {
      try {
        ad.validate(it->second);
      } catch (const invalid_argument& e) {
        fail(fmt::format("attribute '{}' = {}: {}", ad.name, it->second.to_string(), e.what()));
      }
    }
  }

  // Outputs: count and default types, then inference.
  std::vector<tensor_type> outputs;
  for (const auto& a : def->outputs) {
    std::size_t count = 1;
    if (!a.list_length_attr.empty()) {
      // Bounded before the list is built: a length read from a file can be anything.
      constexpr std::int64_t max_list_outputs = std::int64_t{1} << 16;
      const auto n = attrs.at(a.list_length_attr).as<std::int64_t>();
      if (n < 0 || n > max_list_outputs) {
        fail(fmt::format("attribute '{}' = {} must be in [0, {}]", a.list_length_attr, n,
                         max_list_outputs));
      }
      count = static_cast<std::size_t>(n);
    }
    const dtype t = a.type_attr.empty() ? a.fixed : attrs.at(a.type_attr).as<dtype>();
    for (std::size_t k = 0; k < count; ++k) outputs.push_back({t, std::nullopt});
  }
  if (def->infer) {
    inference_context ctx(*def, name, attrs, std::move(input_types), outputs.size());
    for (std::size_t i = 0; i < outputs.size(); ++i) ctx.set_output(i, outputs[i]);
    try {
      def->infer(ctx);
    } catch (const not_found& e) {
      throw not_found(fmt::format("{}: {}", who, e.what()));
    } catch (const error& e) {
      fail(e.what());
    }
    outputs = std::move(ctx.outputs());
  }

  node n;
  n.id = static_cast<node_id>(nodes_.size());
  n.name = name;
  n.def = def;
  n.inputs = std::move(spec.inputs);
  n.control_inputs = std::move(spec.control_inputs);
  // Note [collective order]
  // MPI (and NCCL) need every rank to start a communicator's collectives in the same order.
  // The executor runs ready nodes in whatever order its threads reach them, which differs
  // from rank to rank, so two collectives without a path between them could start as A, B
  // on one rank and B, A on another: a deadlock, or worse, two reductions mixed up. Each
  // node of such an op therefore waits (a control input) for the previous one added to the
  // graph, whatever its group: the collectives of a graph form one chain, in the order they
  // were added, the same on every rank that builds the same graph. They still overlap with
  // the rest of the graph (a data-parallel step's gradient all_reduces with the backward
  // pass of earlier layers); they do not overlap with each other.
  if (def->ordered_across_processes) {
    if (last_ordered_ >= 0 && std::find(n.control_inputs.begin(), n.control_inputs.end(),
                                        last_ordered_) == n.control_inputs.end()) {
      n.control_inputs.push_back(last_ordered_);
    }
    last_ordered_ = n.id;
  }
  n.attrs = std::move(attrs);
  n.requested_device = std::move(spec.device);
  n.outputs = std::move(outputs);
  by_name_.emplace(n.name, n.id);
  nodes_.push_back(std::move(n));
  return nodes_.back();
}

void graph::add_control_input(node_id to, node_id from) {
  const node& t = at(to);
  const node& f = at(from);
  // A cycle appears when `to` already reaches `from`.
  std::vector<std::vector<node_id>> consumers(nodes_.size());
  for (const auto& n : nodes_) {
    for (const auto& e : n.inputs) consumers[static_cast<std::size_t>(e.node)].push_back(n.id);
    for (node_id c : n.control_inputs) consumers[static_cast<std::size_t>(c)].push_back(n.id);
  }
  std::vector<node_id> parent(nodes_.size(), -2);
  std::vector<node_id> stack{to};
  parent[static_cast<std::size_t>(to)] = -1;
  while (!stack.empty()) {
    const node_id cur = stack.back();
    stack.pop_back();
    if (cur == from) {
      std::vector<std::string> path;
      for (node_id p = from; p != -1; p = parent[static_cast<std::size_t>(p)]) {
        path.push_back(at(p).name);
      }
      std::reverse(path.begin(), path.end());
      throw invalid_argument(fmt::format(
          "control edge {} -> {} would make a cycle: {} -> {}", f.name, t.name,
          fmt::join(path, " -> "), t.name));
    }
    for (node_id c : consumers[static_cast<std::size_t>(cur)]) {
      if (parent[static_cast<std::size_t>(c)] == -2) {
        parent[static_cast<std::size_t>(c)] = cur;
        stack.push_back(c);
      }
    }
  }
  nodes_[static_cast<std::size_t>(to)].control_inputs.push_back(from);
}

void graph::set_requested_device(node_id id, std::string device) {
  (void)at(id);
  nodes_[static_cast<std::size_t>(id)].requested_device = std::move(device);
}

void graph::throw_no_node(node_id id) const {
  throw not_found(fmt::format(
      "the graph has no node #{} (it has {}): an id from another graph, or an output kept "
      "after its graph was moved (into a session: fetch it by name instead)",
      id, nodes_.size()));
}

const node* graph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &nodes_[static_cast<std::size_t>(it->second)];
}

const node& graph::get(std::string_view name) const {
  if (const node* n = find(name)) return *n;
  throw not_found(fmt::format("no node named '{}' in the graph", name));
}

endpoint graph::parse_endpoint(std::string_view text) const {
  const auto [name, index] = split_tensor_name(text);
  const node& n = get(name);
  if (static_cast<std::size_t>(index) >= n.outputs.size()) {
    throw not_found(fmt::format("'{}': node {} has {} output{}", text, n.describe(),
                                n.outputs.size(), n.outputs.size() == 1 ? "" : "s"));
  }
  return {n.id, index};
}

std::string graph::endpoint_name(endpoint e) const {
  const node& n = at(e.node);
  return e.index == 0 ? n.name : fmt::format("{}:{}", n.name, e.index);
}

const tensor_type& graph::type_of(endpoint e) const {
  const node& n = at(e.node);
  if (e.index < 0 || static_cast<std::size_t>(e.index) >= n.outputs.size()) {
    throw not_found(fmt::format("node {} has no output {} (it has {})", n.describe(), e.index,
                                n.outputs.size()));
  }
  return n.outputs[static_cast<std::size_t>(e.index)];
}

std::string graph::unique_name(std::string_view prefix) const {
  std::string base(prefix);
  if (!by_name_.contains(base)) return base;
  std::size_t& k = next_suffix_[base];
  for (k = std::max<std::size_t>(k, 1);; ++k) {
    auto candidate = fmt::format("{}_{}", base, k);
    if (!by_name_.contains(candidate)) return candidate;
  }
}

}  // namespace loom
