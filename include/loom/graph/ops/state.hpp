// Graph inputs and state: placeholders, constants, variables and their updates, identity.
#pragma once

#include "loom/graph/builder.hpp"

namespace loom::ops {

/// A value fed at run time. Dimensions of -1 accept any size; feeds are checked against
/// the dtype and the known dimensions.
output placeholder(graph_builder& b, std::string name, dtype t, shape s);
/// A constant tensor (host memory; copied to the node's device once, when the plan is made).
output constant(graph_builder& b, tensor value, const node_options& o = {});
/// A scalar constant of dtype t.
output scalar(graph_builder& b, double value, dtype t = dtype::f32, const node_options& o = {});
/// A variable: state that lives on its device across runs. Reading it before the first
/// assignment fails unless it has an initial value.
output variable(graph_builder& b, std::string name, dtype t, shape s);
output variable(graph_builder& b, std::string name, tensor initial_value);
/// var = value; var += value; var -= value. `var` must be a variable's output. The result is
/// the new value. Placed with the variable. assign does not read the variable (so it may
/// give a variable its first value); assign_add and assign_sub do.
output assign(output var, output value, const node_options& o = {});
output assign_add(output var, output value, const node_options& o = {});
output assign_sub(output var, output value, const node_options& o = {});
/// The same tensor (no copy).
output identity(output x, const node_options& o = {});
/// Does nothing once all of `deps` ran: a target that groups others. Returns its name.
std::string no_op(graph_builder& b, const std::vector<output>& deps, const node_options& o = {});

}  // namespace loom::ops
