// Small helpers for writing op definitions (src/graph/ops/*_ops.cpp).
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/op_registry.hpp"

namespace loom::op_helpers {

/// A type attribute ("T"), optionally restricted to `allowed`.
inline attr_def type_attr(std::string name, std::vector<dtype> allowed = {}) {
  attr_def a;
  a.name = std::move(name);
  a.type = attr_type::type;
  a.allowed_types = std::move(allowed);
  return a;
}

/// An attribute of type `t`; required when `def` is empty.
inline attr_def attr(std::string name, attr_type t, std::optional<attr_value> def = std::nullopt) {
  attr_def a;
  a.name = std::move(name);
  a.type = t;
  a.default_value = std::move(def);
  return a;
}

/// An argument whose dtype is the type attribute `type` ("T").
inline arg_def typed(std::string name, std::string type = "T") {
  return arg_def{std::move(name), std::move(type), dtype::f32, {}};
}
/// An argument of a fixed dtype.
inline arg_def fixed(std::string name, dtype t) { return arg_def{std::move(name), {}, t, {}}; }
/// A list argument of `length_attr` tensors of type attribute `type`.
inline arg_def typed_list(std::string name, std::string length_attr, std::string type = "T") {
  return arg_def{std::move(name), std::move(type), dtype::f32, std::move(length_attr)};
}

/// A real attribute `name` that must be >= 0 (an epsilon), defaulting to `def`.
inline attr_def nonnegative_real_attr(std::string name, double def) {
  attr_def a = attr(name, attr_type::real, attr_value(def));
  a.validate = [name](const attr_value& v) {
    if (!(v.as<double>() >= 0.0)) throw invalid_argument(fmt::format("{} must be >= 0", name));
  };
  return a;
}

/// A "data_format" attribute, "NHWC" or "NCHW", defaulting to `default_format`.
inline attr_def data_format_attr(const char* default_format) {
  attr_def a = attr("data_format", attr_type::string, attr_value(std::string(default_format)));
  a.validate = [](const attr_value& v) {
    const auto s = v.as<std::string>();
    if (s != "NHWC" && s != "NCHW") throw invalid_argument("must be \"NHWC\" or \"NCHW\"");
  };
  return a;
}

// The dtype sets are core's (loom/core/dtype.hpp).
using loom::all_types;
using loom::float_types;
using loom::numeric_types;

}  // namespace loom::op_helpers
