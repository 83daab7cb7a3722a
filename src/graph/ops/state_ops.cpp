// placeholder, const, variable, assign, assign_add, assign_sub, identity, no_op.
#include <fmt/format.h>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/state.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

void check_update_shapes(inference_context& c) {
  const auto& var = c.input(0);
  const auto& value = c.input(1);
  if (var.shape && value.shape && var.shape->rank() == value.shape->rank()) {
    for (std::size_t i = 0; i < var.shape->rank(); ++i) {
      const auto a = (*var.shape)[i];
      const auto b = (*value.shape)[i];
      if (a >= 0 && b >= 0 && a != b) {
        c.fail(fmt::format("value of shape {} does not fit variable of shape {}",
                           to_string(*value.shape), to_string(*var.shape)));
      }
    }
  } else if (var.shape && value.shape) {
    c.fail(fmt::format("value of shape {} does not fit variable of shape {}",
                       to_string(*value.shape), to_string(*var.shape)));
  }
  c.set_output(0, var);
}

}  // namespace

void register_state_ops(op_registry& r) {
  {
    op_def d;
    d.name = "placeholder";
    d.summary = "a value fed at run time";
    d.outputs = {typed("output", "dtype")};
    d.attrs = {type_attr("dtype"), attr("shape", attr_type::shape)};
    d.infer = [](inference_context& c) {
      c.set_output(0, c.attr<dtype>("dtype"), c.attr<shape>("shape"));
    };
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "const";
    d.summary = "a constant tensor";
    d.outputs = {typed("output", "dtype")};
    d.attrs = {attr("value", attr_type::tensor), type_attr("dtype")};
    d.derive_attrs = [](attr_map& a) {
      auto v = a.find("value");
      if (v != a.end() && v->second.type() == attr_type::tensor && !a.contains("dtype")) {
        const tensor t = v->second.as<tensor>();
        if (t.defined()) a.emplace("dtype", t.type());
      }
    };
    d.infer = [](inference_context& c) {
      const tensor v = c.attr<tensor>("value");
      if (!v.defined()) c.fail("const needs a value");
      if (v.type() != c.attr<dtype>("dtype")) c.fail("value's dtype differs from the dtype attribute");
      c.set_output(0, v.type(), v.shape());
    };
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "variable";
    d.summary = "state that lives on its device across runs";
    d.outputs = {typed("value", "dtype")};
    d.attrs = {type_attr("dtype"), attr("shape", attr_type::shape),
               attr("initial_value", attr_type::tensor, attr_value(tensor()))};
    d.derive_attrs = [](attr_map& a) {
      auto v = a.find("initial_value");
      if (v == a.end() || v->second.type() != attr_type::tensor) return;
      const tensor t = v->second.as<tensor>();
      if (!t.defined()) return;
      if (!a.contains("dtype")) a.emplace("dtype", t.type());
      if (!a.contains("shape")) a.emplace("shape", t.shape());
    };
    d.infer = [](inference_context& c) {
      const auto t = c.attr<dtype>("dtype");
      const auto s = c.attr<shape>("shape");
      if (!s.is_fully_defined()) c.fail("a variable's shape must be fully defined");
      const tensor init = c.attr<tensor>("initial_value");
      if (init.defined() && (init.type() != t || init.shape() != s)) {
        c.fail(fmt::format("initial value {} does not match the variable's {}{}", init.describe(),
                           to_string(t), to_string(s)));
      }
      c.set_output(0, t, s);
    };
    d.is_stateful = true;
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "assign";
    d.summary = "sets a variable (named by the attribute) to a value; outputs the value";
    d.inputs = {typed("value")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), attr("variable", attr_type::string)};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
    d.is_stateful = true;
    d.colocate_with_attr = "variable";
    r.add(std::move(d));
  }
  for (const char* name : {"assign_add", "assign_sub"}) {
    op_def d;
    d.name = name;
    d.summary = "updates a variable (its input 0) in place; outputs the new value";
    d.inputs = {typed("variable"), typed("value")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T", {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32,
                               dtype::i64})};
    d.infer = check_update_shapes;
    d.is_stateful = true;
    d.colocate_with_input = 0;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "identity";
    d.summary = "the same tensor";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T")};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "no_op";
    d.summary = "nothing: a target that groups its control inputs";
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    // Note [fed values in rewritten graphs]: the passes work on a copy of what one
    // signature needs, in which every fed endpoint is an _arg of the endpoint's type (its
    // rank may be unknown, which a placeholder cannot say). The executor fills it from the
    // feed; it is never computed (its kernels fail like a placeholder's if it were).
    op_def d;
    d.name = "_arg";
    d.summary = "a fed value in a graph rewritten by the passes";
    d.outputs = {typed("output", "dtype")};
    d.attrs = {type_attr("dtype"), attr("shape", attr_type::shape, attr_value(shape{})),
               attr("known_rank", attr_type::boolean, attr_value(true))};
    d.infer = [](inference_context& c) {
      std::optional<shape> s;
      if (c.attr<bool>("known_rank")) s = c.attr<shape>("shape");
      c.set_output(0, c.attr<dtype>("dtype"), std::move(s));
    };
    d.is_cheap = true;
    r.add(std::move(d));
  }
}

void register_transfer_ops(op_registry& r) {
  {
    op_def d;
    d.name = "_send";
    d.summary = "the source side of a copy between devices (inserted by the partitioner)";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), attr("recv_device", attr_type::string)};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
    d.is_cheap = true;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "_recv";
    d.summary = "the destination side of a copy between devices (inserted by the partitioner)";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), attr("send_device", attr_type::string)};
    d.infer = [](inference_context& c) { c.set_output(0, c.input(0)); };
    r.add(std::move(d));
  }
  // Between the processes of a session (Note [tasks] in src/runtime/partitioner.cpp):
  // point-to-point messages over the communicator registered as `group`, matched by `tag`.
  {
    op_def d;
    d.name = "_send_task";
    d.summary = "sends a value to the tasks that read it (inserted by the partitioner)";
    d.inputs = {typed("input")};
    d.attrs = {type_attr("T"), attr("group", attr_type::string), attr("to", attr_type::ints),
               attr("tag", attr_type::integer)};
    d.is_stateful = true;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "_recv_task";
    d.summary = "receives a value from the task that made it (inserted by the partitioner)";
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T"), attr("group", attr_type::string), attr("from", attr_type::integer),
               attr("tag", attr_type::integer)};
    d.is_stateful = true;
    r.add(std::move(d));
  }
}

namespace ops {

output placeholder(graph_builder& b, std::string name, dtype t, shape s) {
  return b.add1("placeholder", {}, {{"dtype", t}, {"shape", std::move(s)}}, {.name = std::move(name)});
}

output constant(graph_builder& b, tensor value, const node_options& o) {
  const dtype t = value.type();
  return b.add1("const", {}, {{"value", std::move(value)}, {"dtype", t}}, o);
}

output variable(graph_builder& b, std::string name, dtype t, shape s) {
  return b.add1("variable", {}, {{"dtype", t}, {"shape", std::move(s)}}, {.name = std::move(name)});
}

output variable(graph_builder& b, std::string name, tensor initial_value) {
  const dtype t = initial_value.type();
  shape s = initial_value.shape();
  return b.add1("variable", {},
                {{"dtype", t}, {"shape", std::move(s)}, {"initial_value", std::move(initial_value)}},
                {.name = std::move(name)});
}

output assign(output var, output value, const node_options& o) {
  const node& v = var.producer();
  if (v.op() != "variable") {
    throw invalid_argument("ops::assign: the first argument must be a variable, not " +
                           v.describe());
  }
  const tensor_type& want = var.type();
  const tensor_type& have = value.type();
  if (want.type != have.type || (want.shape && have.shape && *have.shape != *want.shape &&
                                 have.shape->is_fully_defined())) {
    throw invalid_argument("ops::assign: value " + to_string(have) + " does not fit variable '" +
                           v.name + "' of " + to_string(want));
  }
  return var.builder().add1("assign", {value}, {{"variable", v.name}}, o);
}
output assign_add(output var, output value, const node_options& o) {
  return var.builder().add1("assign_add", {var, value}, {}, o);
}
output assign_sub(output var, output value, const node_options& o) {
  return var.builder().add1("assign_sub", {var, value}, {}, o);
}
output identity(output x, const node_options& o) { return x.builder().add1("identity", {x}, {}, o); }

std::string no_op(graph_builder& b, const std::vector<output>& deps, const node_options& o) {
  node_spec spec;
  spec.name = o.name;
  spec.op = "no_op";
  spec.device = o.device;
  for (const auto& d : deps) spec.control_inputs.push_back(d.ep().node);
  return b.g().add_node(std::move(spec)).name;
}

}  // namespace ops
}  // namespace loom

// scalar() builds its value in host memory, so the graph room reaches the memory room here
// (and only here): constants need a buffer.
#include "loom/memory/tensor_allocation.hpp"

namespace loom::ops {

output scalar(graph_builder& b, double value, dtype t, const node_options& o) {
  tensor v = memory::host_tensor(t, shape{});
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      *v.data<T>() = T(static_cast<float>(value));
    } else {
      *v.data<T>() = static_cast<T>(value);
    }
  });
  return constant(b, std::move(v), o);
}

}  // namespace loom::ops
