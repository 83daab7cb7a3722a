// resize (ONNX Resize: nearest and linear) of the nn family: definition, inference (rules in
// loom/graph/ops/nn_rules.hpp) and builder.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

nn_rules::resize_params read_resize_attrs(const inference_context& c) {
  nn_rules::resize_params p = nn_rules::resize_params_of(
      c.attr<std::string>("mode"), c.attr<std::string>("coordinate_transformation_mode"),
      c.attr<std::string>("nearest_mode"), c.attr<std::vector<std::int64_t>>("sizes"),
      c.attr<std::vector<double>>("scales"));
  p.roi = c.attr<std::vector<double>>("roi");
  return p;
}

void infer_resize(inference_context& c) {
  const tensor_type& x = c.input(0);
  const nn_rules::resize_params p = read_resize_attrs(c);
  if (!x.shape) {
    c.set_output(0, x.type, shape(p.sizes));
    return;
  }
  c.set_output(0, x.type, nn_rules::resize_output(*x.shape, p));
}

// A string attribute that must be one of `names`.
template <std::size_t N>
attr_def choice_attr(const char* name, const std::array<std::string_view, N>& names) {
  attr_def a = attr(name, attr_type::string, attr_value(std::string(names[0])));
  a.validate = [names](const attr_value& v) {
    const auto s = v.as<std::string>();
    for (const auto n : names) {
      if (s == n) return;
    }
    throw invalid_argument(fmt::format("must be one of \"{}\", got \"{}\"",
                                       fmt::join(names, "\", \""), s));
  };
  return a;
}

}  // namespace

void register_nn_resize_ops(op_registry& r) {
  op_def d;
  d.name = "resize";
  d.summary = "ONNX Resize to sizes: nearest, linear or cubic, ONNX's coordinate transformations";
  d.inputs = {typed("input")};
  d.outputs = {typed("output")};
  attr_def sizes = attr("sizes", attr_type::ints);
  sizes.validate = [](const attr_value& v) {
    for (const auto n : v.as<std::vector<std::int64_t>>()) {
      if (n < 0) throw invalid_argument(fmt::format("sizes must be >= 0, got {}", n));
    }
  };
  d.attrs = {type_attr("T", float_types()),
             std::move(sizes),
             choice_attr("mode", nn_rules::resize_mode_names),
             choice_attr("coordinate_transformation_mode", nn_rules::resize_coord_names),
             choice_attr("nearest_mode", nn_rules::resize_rounding_names),
             attr("scales", attr_type::reals, attr_value(std::vector<double>{})),
             attr("cubic_coeff_a", attr_type::real, attr_value(-0.75)),
             attr("exclude_outside", attr_type::boolean, attr_value(false)),
             attr("roi", attr_type::reals, attr_value(std::vector<double>{})),
             attr("extrapolation_value", attr_type::real, attr_value(0.0))};
  d.infer = infer_resize;
  r.add(std::move(d));
}

namespace ops {

output resize(output x, const resize_options& options, const node_options& o) {
  return x.builder().add1(
      "resize", {x},
      {{"sizes", options.sizes},
       {"mode", options.mode},
       {"coordinate_transformation_mode", options.coordinate_transformation_mode},
       {"nearest_mode", options.nearest_mode},
       {"scales", options.scales},
       {"cubic_coeff_a", options.cubic_coeff_a},
       {"exclude_outside", options.exclude_outside},
       {"roi", options.roi},
       {"extrapolation_value", options.extrapolation_value}},
      o);
}

}  // namespace ops
}  // namespace loom
