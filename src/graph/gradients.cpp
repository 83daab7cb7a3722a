// gradients(): reverse-mode differentiation over the graph (see gradients.hpp).
//
// The walk visits the nodes that lie on a path from some x to the loss, from the loss
// backwards (node ids are a topological order: a node's inputs always have smaller ids).
// Each endpoint collects the gradients its consumers send it; when its node is visited they
// are summed (fan-out) and handed to the node's gradient function, whose results go to the
// node's inputs. Gradient nodes ask for the device of their forward node, so the backward
// pass runs where the forward one did.
#include "loom/graph/gradients.hpp"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom {

// ---- registry ------------------------------------------------------------------------------

gradient_registry& gradient_registry::global() {
  static gradient_registry* registry = [] {
    auto* r = new gradient_registry;  // immortal, as op_registry::global()
    register_standard_gradients(*r);
    return r;
  }();
  return *registry;
}

void register_standard_gradients(gradient_registry& r) {
  register_state_gradients(r);
  register_elementwise_gradients(r);
  register_nn_gradients(r);
  register_reduction_gradients(r);
  register_normalization_gradients(r);
  register_array_gradients(r);
  register_fused_gradients(r);
  register_collective_gradients(r);
}

void gradient_registry::add(std::string op, gradient_fn fn) {
  if (fns_.contains(op)) {
    throw invalid_argument(fmt::format("op {} already has a gradient", op));
  }
  fns_.emplace(std::move(op), std::move(fn));
}

void gradient_registry::add_none(std::string op) {
  if (fns_.contains(op)) {
    throw invalid_argument(fmt::format("op {} already has a gradient", op));
  }
  fns_.emplace(std::move(op), std::nullopt);
}

bool gradient_registry::knows(std::string_view op) const {
  return fns_.find(std::string(op)) != fns_.end();
}

const gradient_fn* gradient_registry::find(std::string_view op) const {
  auto it = fns_.find(std::string(op));
  if (it == fns_.end()) throw not_found(fmt::format("op {} has no gradient", op));
  return it->second ? &*it->second : nullptr;
}

// ---- gradient_context -----------------------------------------------------------------------

output gradient_context::input(std::size_t i) const {
  return {&b_, forward_.inputs.at(i)};
}

output gradient_context::output_of(std::size_t i) const {
  return {&b_, endpoint{forward_.id, static_cast<std::int32_t>(i)}};
}

namespace {

const shape& defined_shape(const node& n, const tensor_type& t, const std::string& what) {
  if (!t.shape || !t.shape->is_fully_defined()) {
    throw invalid_argument(fmt::format(
        "gradient of node {}: {} has shape {}, and gradients need fully defined shapes "
        "(give placeholders fixed dimensions)",
        n.describe(), what, t.shape ? to_string(*t.shape) : std::string("of unknown rank")));
  }
  return *t.shape;
}

}  // namespace

const shape& gradient_context::input_shape(std::size_t i) const {
  const endpoint e = forward_.inputs.at(i);
  return defined_shape(forward_, b_.g().type_of(e), fmt::format("input {}", i));
}

const shape& gradient_context::output_shape(std::size_t i) const {
  return defined_shape(forward_, forward_.outputs.at(i), fmt::format("output {}", i));
}

dtype gradient_context::input_type(std::size_t i) const {
  return b_.g().type_of(forward_.inputs.at(i)).type;
}

output gradient_context::grad(std::size_t i) const {
  if (has_grad(i)) return *grads_[i];
  return ops::zeros(b_, forward_.outputs.at(i).type, output_shape(i));
}

output gradient_context::scalar(double value, dtype t) const {
  return ops::scalar(b_, value, t);
}

output gradient_context::unbroadcast(output g, std::size_t i) const {
  const shape& in = input_shape(i);
  const shape& gs = defined_shape(forward_, g.type(), "a gradient");
  if (in == gs) return g;
  if (in.rank() > gs.rank()) {
    fail(fmt::format("input {} of shape {} does not broadcast to the gradient's shape {}", i,
                     to_string(in), to_string(gs)));
  }
  const std::size_t lead = gs.rank() - in.rank();
  std::vector<std::int64_t> axes;
  for (std::size_t d = 0; d < gs.rank(); ++d) {
    if (d < lead || (in[d - lead] == 1 && gs[d] != 1)) axes.push_back(static_cast<std::int64_t>(d));
  }
  output r = axes.empty() ? g : ops::reduce_sum(g, axes, false);
  return ops::reshape(r, in.to_vector());
}

void gradient_context::fail(const std::string& message) const {
  throw invalid_argument(fmt::format("gradient of node {}: {}", forward_.describe(), message));
}

// ---- gradients() ----------------------------------------------------------------------------

namespace {

output sum_of(const std::vector<output>& parts) {
  output total = parts.front();
  for (std::size_t k = 1; k < parts.size(); ++k) total = ops::add(total, parts[k]);
  return total;
}

}  // namespace

std::vector<output> gradients(output loss, const std::vector<output>& xs,
                              std::optional<output> seed, const gradient_registry& registry) {
  graph_builder& b = loss.builder();
  const graph& g = b.g();
  const auto n = static_cast<std::size_t>(loss.ep().node) + 1;
  if (!is_floating(loss.dtype_of())) {
    throw invalid_argument(fmt::format("gradients: the loss {} is {}, not a float type",
                                       loss.name(), to_string(loss.dtype_of())));
  }

  // Nodes the loss depends on, and nodes that depend on some x: the walk visits both.
  std::vector<bool> reaches_loss(n, false);
  reaches_loss[n - 1] = true;
  for (std::size_t id = n; id-- > 0;) {
    if (!reaches_loss[id]) continue;
    for (const endpoint& e : g.at(static_cast<node_id>(id)).inputs) {
      reaches_loss[static_cast<std::size_t>(e.node)] = true;
    }
  }
  std::vector<bool> from_x(n, false);
  for (const output& x : xs) {
    if (&x.builder().g() != &g) throw invalid_argument("gradients: x is in another graph");
    if (!is_floating(x.dtype_of())) {
      throw invalid_argument(
          fmt::format("gradients: {} is {}, not a float type", x.name(), to_string(x.dtype_of())));
    }
    if (static_cast<std::size_t>(x.ep().node) < n)
      from_x[static_cast<std::size_t>(x.ep().node)] = true;
  }
  for (std::size_t id = 0; id < n; ++id) {
    if (from_x[id]) continue;
    for (const endpoint& e : g.at(static_cast<node_id>(id)).inputs) {
      if (from_x[static_cast<std::size_t>(e.node)]) from_x[id] = true;
    }
  }

  // Gradients sent to each endpoint, summed when its node is visited.
  std::map<std::pair<node_id, std::int32_t>, std::vector<output>> partials;
  auto key = [](endpoint e) { return std::make_pair(e.node, e.index); };
  if (seed) {
    if (seed->type() != loss.type()) {
      throw invalid_argument(fmt::format("gradients: the seed is {} but the loss {} is {}",
                                         to_string(seed->type()), loss.name(),
                                         to_string(loss.type())));
    }
    partials[key(loss.ep())].push_back(*seed);
  } else {
    const node& ln = loss.producer();
    const shape& s = defined_shape(ln, loss.type(), "the loss");
    partials[key(loss.ep())].push_back(ops::fill(b, loss.dtype_of(), s, 1.0));
  }

  for (std::size_t id = n; id-- > 0;) {
    if (!reaches_loss[id] || !from_x[id]) continue;
    const node& fwd = g.at(static_cast<node_id>(id));
    bool inputs_wanted = false;
    for (const endpoint& e : fwd.inputs) {
      inputs_wanted = inputs_wanted || from_x[static_cast<std::size_t>(e.node)];
    }
    if (!inputs_wanted) continue;  // an x itself, or a node fed only by constants
    std::vector<std::optional<output>> out_grads(fwd.outputs.size());
    bool any = false;
    for (std::size_t k = 0; k < fwd.outputs.size(); ++k) {
      auto it = partials.find({fwd.id, static_cast<std::int32_t>(k)});
      if (it == partials.end()) continue;
      const auto guard = b.with_device(fwd.requested_device);
      out_grads[k] = sum_of(it->second);
      any = true;
    }
    if (!any) continue;
    if (!registry.knows(fwd.op())) {
      throw invalid_argument(fmt::format(
          "gradients: node {} is on the path from the variables to the loss, and op {} has "
          "no gradient",
          fwd.describe(), fwd.op()));
    }
    const gradient_fn* fn = registry.find(fwd.op());
    if (fn == nullptr) continue;  // not differentiable: nothing flows back through it
    std::vector<std::optional<output>> in_grads;
    {
      const auto guard = b.with_device(fwd.requested_device);
      const gradient_context ctx(b, fwd, std::move(out_grads));
      in_grads = (*fn)(ctx);
    }
    if (in_grads.size() != fwd.inputs.size()) {
      throw invalid_argument(fmt::format(
          "gradient of node {}: the gradient function returned {} gradients for {} inputs",
          fwd.describe(), in_grads.size(), fwd.inputs.size()));
    }
    for (std::size_t i = 0; i < in_grads.size(); ++i) {
      const endpoint e = fwd.inputs[i];
      if (!in_grads[i] || !from_x[static_cast<std::size_t>(e.node)]) continue;
      const tensor_type& want = g.type_of(e);
      if (!is_floating(want.type)) continue;
      const tensor_type& got = in_grads[i]->type();
      if (got.type != want.type || (want.shape && got.shape && *want.shape != *got.shape)) {
        throw invalid_argument(
            fmt::format("gradient of node {}: input {}'s gradient is {} but the input is {}",
                        fwd.describe(), i, to_string(got), to_string(want)));
      }
      partials[key(e)].push_back(*in_grads[i]);
    }
  }

  std::vector<output> result;
  result.reserve(xs.size());
  for (const output& x : xs) {
    auto it = partials.find(key(x.ep()));
    if (it != partials.end()) {
      const auto guard = b.with_device(x.producer().requested_device);
      result.push_back(sum_of(it->second));
    } else {
      const shape& s = defined_shape(x.producer(), x.type(), "x");
      result.push_back(ops::zeros(b, x.dtype_of(), s));
    }
  }
  return result;
}

}  // namespace loom
