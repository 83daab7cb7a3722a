// all_reduce, broadcast, all_gather, reduce_scatter: op definitions and builders.
#include <fmt/format.h>

#include "loom/core/reduce_op.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/collective.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

// The reduction attribute names a reduce_op that takes the input's dtype.
void check_reduction(inference_context& c) {
  reduce_op op{};
  try {
    op = reduce_op_from_string(c.attr<std::string>("reduction"));
  } catch (const invalid_argument& e) {
    c.fail(e.what());
  }
  if (const std::string why = reduce_op_refusal(op, c.input(0).type); !why.empty()) c.fail(why);
}

std::int64_t group_size(inference_context& c) {
  const auto n = c.attr<std::int64_t>("group_size");
  if (n < 0) c.fail(fmt::format("group_size {} is negative", n));
  return n;
}

// x's type with dimension 0 multiplied (gather) or divided (scatter) by group_size, or
// unknown where group_size or the dimension is.
void blocks_along_0(inference_context& c, bool gather) {
  tensor_type t = c.input(0);
  if (t.shape && t.shape->rank() == 0) c.fail("needs a tensor of rank 1 or more");
  const std::int64_t n = group_size(c);
  if (t.shape) {
    shape s = *t.shape;
    if (n == 0 || s[0] < 0) {
      s[0] = -1;
    } else if (gather) {
      s[0] *= n;
    } else {
      if (s[0] % n != 0) {
        c.fail(fmt::format("dimension 0 of {} is not a multiple of the group's {} ranks",
                           to_string(*t.shape), n));
      }
      s[0] /= n;
    }
    t.shape = s;
  }
  c.set_output(0, t);
}

op_def collective(std::string name, std::string summary) {
  op_def d;
  d.name = std::move(name);
  d.summary = std::move(summary);
  d.inputs = {typed("input")};
  d.outputs = {typed("output")};
  d.attrs = {type_attr("T"), attr("group", attr_type::string, attr_value(std::string("world")))};
  d.is_stateful = true;  // its value depends on the other ranks: never folded or merged
  d.ordered_across_processes = true;  // Note [collective order] in src/graph/graph.cpp
  return d;
}

}  // namespace

void register_collective_ops(op_registry& r) {
  {
    op_def d = collective("all_reduce", "op over every rank's input (loom::distributed)");
    d.attrs.push_back(attr("reduction", attr_type::string, attr_value(std::string("sum"))));
    d.infer = [](inference_context& c) {
      check_reduction(c);
      c.set_output(0, c.input(0));
    };
    r.add(std::move(d));
  }
  {
    op_def d = collective("broadcast", "the root rank's input on every rank");
    d.attrs.push_back(attr("root", attr_type::integer, attr_value(std::int64_t{0})));
    d.infer = [](inference_context& c) {
      if (c.attr<std::int64_t>("root") < 0) c.fail("root is negative");
      c.set_output(0, c.input(0));
    };
    r.add(std::move(d));
  }
  {
    op_def d = collective("all_gather", "the ranks' inputs concatenated along dimension 0");
    d.attrs.push_back(attr("group_size", attr_type::integer, attr_value(std::int64_t{0})));
    d.infer = [](inference_context& c) { blocks_along_0(c, true); };
    r.add(std::move(d));
  }
  {
    op_def d = collective("reduce_scatter", "this rank's block of op over the ranks' inputs");
    d.attrs.push_back(attr("reduction", attr_type::string, attr_value(std::string("sum"))));
    d.attrs.push_back(attr("group_size", attr_type::integer, attr_value(std::int64_t{0})));
    d.infer = [](inference_context& c) {
      check_reduction(c);
      blocks_along_0(c, false);
    };
    r.add(std::move(d));
  }
}

namespace ops {
namespace {

// The graph chains the collectives (Note [collective order] in src/graph/graph.cpp).
output add_collective(output x, std::string_view op, attr_map attrs, const node_options& o) {
  return x.builder().add1(op, {x}, std::move(attrs), o);
}

}  // namespace

output all_reduce(output x, const std::string& reduction, const std::string& group,
                  const node_options& o) {
  return add_collective(x, "all_reduce", {{"reduction", reduction}, {"group", group}}, o);
}

output broadcast(output x, std::int64_t root, const std::string& group, const node_options& o) {
  return add_collective(x, "broadcast", {{"root", root}, {"group", group}}, o);
}

output all_gather(output x, std::int64_t group_size, const std::string& group,
                  const node_options& o) {
  return add_collective(x, "all_gather", {{"group_size", group_size}, {"group", group}}, o);
}

output reduce_scatter(output x, const std::string& reduction, std::int64_t group_size,
                      const std::string& group, const node_options& o) {
  return add_collective(
      x, "reduce_scatter",
      {{"reduction", reduction}, {"group_size", group_size}, {"group", group}}, o);
}

}  // namespace ops
}  // namespace loom
