// Graph (de)serialization: Note [graph json format] (include/loom/graph/serialization.hpp).
#include "loom/core/input.hpp"
#include "loom/graph/serialization.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <unordered_map>
#include <vector>

// Tensor attributes need a buffer, so reading a graph reaches the memory room here (as
// ops::scalar does in state_ops.cpp).
#include "loom/memory/tensor_allocation.hpp"

namespace loom {
namespace {

using json = nlohmann::json;
// The writer keeps keys in the order written ("name", "op", "inputs", ...).
using ojson = nlohmann::ordered_json;

constexpr std::string_view format_name = "loom.graph";

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw parse_error(fmt::format("graph json: {}: {}", where, what), 0);
}

// A JSON value for an error message: a scalar as written (a string cut short), a container
// by its type (dumping it could recurse as deep as the input nests).
std::string describe(const json& v) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    const auto shown = json(s.size() <= 40 ? s : s.substr(0, 40))
                           .dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() <= 40 ? shown : shown + "...";
  }
  if (v.is_primitive()) return v.dump();
  return v.type_name();
}

// ---- floating-point values ---------------------------------------------------------------

// The bit layout of a floating-point dtype (or of the double of a float attribute).
struct float_layout {
  int width;  // bits
  std::uint64_t sign;
  std::uint64_t exponent;
  std::uint64_t mantissa;
  std::uint64_t quiet_nan;  // the default NaN, as std::numeric_limits gives it
};

float_layout layout_of(dtype t) {
  switch (t) {
    case dtype::f64:
      return {64, std::uint64_t{1} << 63, 0x7ff0000000000000u, 0x000fffffffffffffu,
              0x7ff8000000000000u};
    case dtype::f16:
      return {16, 0x8000u, 0x7c00u, 0x03ffu, 0x7e00u};
    case dtype::bf16:
      return {16, 0x8000u, 0x7f80u, 0x007fu, 0x7fc0u};
    default:
      return {32, 0x80000000u, 0x7f800000u, 0x007fffffu, 0x7fc00000u};
  }
}

// The double that the reader converts back to `bits` of dtype `t` (f32, f16, bf16): the one
// with the shortest decimal form, so files stay readable ("0.1", not "0.10000000149011612").
double shortest_double(std::uint64_t bits, dtype t) {
  auto back = [t](double d) -> std::uint64_t {
    const auto f = static_cast<float>(d);
    switch (t) {
      case dtype::f16:
        return half::from_float(f);
      case dtype::bf16:
        return bfloat16::from_float(f);
      default:
        return std::bit_cast<std::uint32_t>(f);
    }
  };
  float exact = 0;
  switch (t) {
    case dtype::f16:
      exact = half::to_float(static_cast<std::uint16_t>(bits));
      break;
    case dtype::bf16:
      exact = static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(bits)));
      break;
    default:
      exact = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
      break;
  }
  auto try_text = [&](const std::string& text) -> std::optional<double> {
    double d = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
    if (ec == std::errc() && p == text.data() + text.size() && back(d) == bits) return d;
    return std::nullopt;
  };
  // float32: fmt's shortest form of the float (almost always the answer).
  if (t == dtype::f32) {
    if (auto d = try_text(fmt::format("{}", exact))) return *d;
  }
  for (int digits = 1; digits <= 9; ++digits) {
    if (auto d = try_text(fmt::format("{:.{}g}", exact, digits))) return *d;
  }
  return static_cast<double>(exact);  // converts back exactly
}

// One floating-point value of dtype `t`, given by its bits, as JSON.
ojson encode_float(std::uint64_t bits, dtype t) {
  const float_layout l = layout_of(t);
  const bool negative = (bits & l.sign) != 0;
  if ((bits & l.exponent) == l.exponent) {
    if ((bits & l.mantissa) == 0) return negative ? "-inf" : "inf";
    if (bits == l.quiet_nan) return "nan";
    if (bits == (l.quiet_nan | l.sign)) return "-nan";
    return fmt::format("nan(0x{:0{}x})", bits, l.width / 4);
  }
  if (t == dtype::f64) return std::bit_cast<double>(bits);
  return shortest_double(bits, t);
}

// The bits of dtype `t` that JSON value `v` (a number or one of encode_float's strings)
// stands for; `what` names the value in errors.
std::uint64_t decode_float(const json& v, dtype t, const std::string& where,
                           const std::string& what) {
  const float_layout l = layout_of(t);
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "inf") return l.exponent;
    if (s == "-inf") return l.sign | l.exponent;
    if (s == "nan") return l.quiet_nan;
    if (s == "-nan") return l.sign | l.quiet_nan;
    const std::string_view sv = s;
    if (sv.starts_with("nan(0x") && sv.ends_with(")") && sv.size() > 7) {
      const auto hex = sv.substr(6, sv.size() - 7);
      std::uint64_t bits = 0;
      auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), bits, 16);
      const bool fits = l.width == 64 || bits < (std::uint64_t{1} << l.width);
      if (ec == std::errc() && p == hex.data() + hex.size() && fits &&
          (bits & l.exponent) == l.exponent && (bits & l.mantissa) != 0) {
        return bits;
      }
      bad(where, fmt::format("{}: '{}' is not a {} NaN", what, s, to_string(t)));
    }
    bad(where, fmt::format("{}: '{}' is not a number (expected a JSON number, \"inf\", "
                           "\"-inf\", \"nan\", \"-nan\" or \"nan(0x<bits>)\")",
                           what, s));
  }
  if (!v.is_number()) {
    bad(where, fmt::format("{} must be a number, got {}", what, v.type_name()));
  }
  const double d = v.get<double>();
  if (t == dtype::f64) return std::bit_cast<std::uint64_t>(d);
  // Beyond 2^128 a double has no float32 to round to; below it, it rounds to a finite
  // float or to infinity, which the check after the conversion refuses.
  if (!(std::fabs(d) < 0x1p128)) {
    bad(where, fmt::format("{}: {} is out of range for {}", what, d, to_string(t)));
  }
  const auto f = static_cast<float>(d);
  std::uint64_t bits = 0;
  switch (t) {
    case dtype::f16:
      bits = half::from_float(f);
      break;
    case dtype::bf16:
      bits = bfloat16::from_float(f);
      break;
    default:
      bits = std::bit_cast<std::uint32_t>(f);
      break;
  }
  if ((bits & l.exponent) == l.exponent) {
    bad(where, fmt::format("{}: {} is out of range for {}", what, d, to_string(t)));
  }
  return bits;
}

ojson encode_real(double d) {
  return encode_float(std::bit_cast<std::uint64_t>(d), dtype::f64);
}

double decode_real(const json& v, const std::string& where, const std::string& what) {
  return std::bit_cast<double>(decode_float(v, dtype::f64, where, what));
}

std::int64_t decode_int(const json& v, std::int64_t lo, std::int64_t hi, const std::string& where,
                        const std::string& what) {
  if (!v.is_number_integer()) {
    bad(where, fmt::format("{} must be an integer, got {}", what, describe(v)));
  }
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi)) {
      bad(where, fmt::format("{} = {} is out of range [{}, {}]", what, u, lo, hi));
    }
    return static_cast<std::int64_t>(u);
  }
  const auto i = v.get<std::int64_t>();
  if (i < lo || i > hi)
    bad(where, fmt::format("{} = {} is out of range [{}, {}]", what, i, lo, hi));
  return i;
}

// ---- tensors -------------------------------------------------------------------------

// An element's bits, zero-extended (tensors hold little-endian elements, as the host does).
static_assert(std::endian::native == std::endian::little);
std::uint64_t load_bits(const std::byte* p, std::size_t size) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, size);
  return v;
}

void store_bits(std::byte* p, std::uint64_t bits, std::size_t size) {
  std::memcpy(p, &bits, size);
}

ojson encode_tensor(const tensor& t, const std::string& where) {
  if (!t.defined()) return nullptr;
  if (!is_host_accessible(t.device().type)) {
    throw invalid_argument(
        fmt::format("graph_to_json: {}: tensor {} is not in host-accessible "
                    "memory; copy it to the CPU first",
                    where, t.describe()));
  }
  ojson shape_json = ojson::array();
  for (auto d : t.shape().dims()) shape_json.push_back(d);
  const std::size_t size = size_of(t.type());
  const auto n = static_cast<std::size_t>(t.num_elements());
  std::vector<std::byte> dense;
  const std::byte* data = nullptr;
  if (t.is_contiguous()) {
    data = static_cast<const std::byte*>(t.raw_data());
  } else {
    dense.resize(n * size);
    copy_to_dense(t, dense.data());
    data = dense.data();
  }
  ojson values = ojson::array();
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* p = data + i * size;
    if (is_floating(t.type())) {
      values.push_back(encode_float(load_bits(p, size), t.type()));
    } else if (t.type() == dtype::boolean) {
      values.push_back(std::to_integer<std::uint8_t>(*p) != 0);  // any non-zero byte is true
    } else {
      visit_dtype(t.type(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          T v;
          std::memcpy(&v, p, sizeof v);
          values.push_back(v);
        }
      });
    }
  }
  ojson out = ojson::object();
  out["dtype"] = to_string(t.type());
  out["shape"] = std::move(shape_json);
  out["data"] = std::move(values);
  return out;
}

// Checks that `v` is an object whose keys are all in `allowed`.
void check_keys(const json& v, std::initializer_list<std::string_view> allowed,
                const std::string& where, const std::string& what) {
  if (!v.is_object()) bad(where, fmt::format("{} must be an object, got {}", what, v.type_name()));
  for (const auto& [key, value] : v.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      bad(where, fmt::format("{} has an unknown key '{}' (expected {})", what, key,
                             fmt::join(allowed, ", ")));
    }
  }
}

const json& require(const json& obj, const char* key, const std::string& where,
                    const std::string& what) {
  auto it = obj.find(key);
  if (it == obj.end()) bad(where, fmt::format("{} has no \"{}\"", what, key));
  return *it;
}

dtype decode_dtype(const json& v, const std::string& where, const std::string& what) {
  if (!v.is_string())
    bad(where, fmt::format("{} must be a dtype name, got {}", what, v.type_name()));
  try {
    return parse_dtype(v.get_ref<const std::string&>());
  } catch (const invalid_argument& e) {
    bad(where, fmt::format("{}: {}", what, e.what()));
  }
}

// Dimensions from a JSON array; each >= `lowest` (0 for tensors).
shape decode_dims(const json& v, std::int64_t lowest, const std::string& where,
                  const std::string& what) {
  if (!v.is_array()) bad(where, fmt::format("{} must be an array, got {}", what, v.type_name()));
  std::vector<std::int64_t> dims;
  dims.reserve(v.size());
  for (const auto& d : v) {
    dims.push_back(decode_int(d, lowest, std::numeric_limits<std::int64_t>::max(), where,
                              what + " dimension"));
  }
  return shape(dims);
}

tensor decode_tensor(const json& v, const std::string& where, const std::string& what) {
  if (v.is_null()) return {};
  check_keys(v, {"dtype", "shape", "data"}, where, what);
  const dtype t = decode_dtype(require(v, "dtype", where, what), where, what + " dtype");
  const shape s = decode_dims(require(v, "shape", where, what), 0, where, what + " shape");
  // As NumPy does: the product of the non-zero dimensions times the element size must fit,
  // so that every stride and byte offset does.
  std::int64_t product = static_cast<std::int64_t>(size_of(t));
  for (auto d : s.dims()) {
    if (d != 0 && __builtin_mul_overflow(product, d, &product)) {
      bad(where, fmt::format("{} shape {} is too large", what, to_string(s)));
    }
  }
  const json& data = require(v, "data", where, what);
  if (!data.is_array())
    bad(where, fmt::format("{} data must be an array, got {}", what, data.type_name()));
  const auto n = s.num_elements();
  if (static_cast<std::int64_t>(data.size()) != n) {
    bad(where,
        fmt::format("{} of shape {} needs {} values, got {}", what, to_string(s), n, data.size()));
  }
  tensor out = memory::host_tensor(t, s);
  auto* p = static_cast<std::byte*>(out.raw_data());
  const std::size_t size = size_of(t);
  const std::string element = what + " element";
  std::size_t i = 0;
  for (const auto& e : data) {
    std::byte* dst = p + i * size;
    try {
      if (is_floating(t)) {
        store_bits(dst, decode_float(e, t, where, element), size);
      } else if (t == dtype::boolean) {
        if (!e.is_boolean()) {
          bad(where, fmt::format("{} must be true or false, got {}", element, describe(e)));
        }
        *dst = std::byte{e.get<bool>() ? std::uint8_t{1} : std::uint8_t{0}};
      } else {
        visit_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
            const auto value = static_cast<T>(decode_int(
                e, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), where, element));
            std::memcpy(dst, &value, sizeof value);
          }
        });
      }
    } catch (const parse_error& err) {
      throw parse_error(fmt::format("{} (at index {})", err.what(), i), 0);
    }
    ++i;
  }
  return out;
}

// ---- attributes --------------------------------------------------------------------------

ojson encode_attr(const attr_value& a, const std::string& where) {
  ojson value = std::visit(
      [&](const auto& v) -> ojson {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) {
          return encode_real(v);
        } else if constexpr (std::is_same_v<T, dtype>) {
          return to_string(v);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          ojson list = ojson::array();
          for (double d : v) list.push_back(encode_real(d));
          return list;
        } else if constexpr (std::is_same_v<T, shape>) {
          return v.to_vector();
        } else if constexpr (std::is_same_v<T, tensor>) {
          return encode_tensor(v, where);
        } else {
          return v;  // int64, bool, string, vector<int64>
        }
      },
      a.get());
  ojson out = ojson::object();
  out[to_string(a.type())] = std::move(value);
  return out;
}

attr_value decode_attr(const json& v, const std::string& where, const std::string& attr) {
  const std::string what = fmt::format("attribute '{}'", attr);
  if (!v.is_object() || v.size() != 1) {
    bad(where, fmt::format("{} must be an object with one key naming its type ({{\"int\": 3}}, "
                           "{{\"float\": 0.5}}, ...), got {}",
                           what, v.is_object() ? fmt::format("{} keys", v.size()) : v.type_name()));
  }
  const auto item = v.items().begin();
  const std::string kind = item.key();
  const json& value = item.value();
  const std::string value_what = fmt::format("{} ({})", what, kind);
  if (kind == "int") {
    return decode_int(value, INT64_MIN, INT64_MAX, where, value_what);
  }
  if (kind == "float") return decode_real(value, where, value_what);
  if (kind == "bool") {
    if (!value.is_boolean()) bad(where, fmt::format("{} must be true or false", value_what));
    return value.get<bool>();
  }
  if (kind == "string") {
    if (!value.is_string()) bad(where, fmt::format("{} must be a string", value_what));
    return value.get<std::string>();
  }
  if (kind == "dtype") return decode_dtype(value, where, value_what);
  if (kind == "ints" || kind == "floats") {
    if (!value.is_array()) bad(where, fmt::format("{} must be an array", value_what));
    if (kind == "ints") {
      std::vector<std::int64_t> list;
      for (const auto& e : value)
        list.push_back(decode_int(e, INT64_MIN, INT64_MAX, where, value_what));
      return list;
    }
    std::vector<double> list;
    for (const auto& e : value) list.push_back(decode_real(e, where, value_what));
    return list;
  }
  // Any int64: graph::add_node checks shape attributes (check_shape_attr), for the builder
  // and the loader alike.
  if (kind == "shape") {
    return decode_dims(value, std::numeric_limits<std::int64_t>::min(), where, value_what);
  }
  if (kind == "tensor") return decode_tensor(value, where, value_what);
  bad(where, fmt::format("{} has unknown type '{}' (expected int, float, bool, string, dtype, "
                         "ints, floats, shape or tensor)",
                         what, kind));
}

// ---- nodes ---------------------------------------------------------------------------

// A node as read from the file, before it is added.
struct parsed_node {
  std::string name;
  std::string op;
  std::vector<std::pair<std::string, std::int32_t>> inputs;  // (node, output index)
  std::vector<std::string> control_inputs;
  std::string device;
  attr_map attrs;
  std::vector<std::size_t> deps;  // indices of the nodes it needs, data then control
};

std::string node_where(const json& n, std::size_t index) {
  if (n.is_object()) {
    auto it = n.find("name");
    if (it != n.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      return fmt::format("node '{}'", it->get_ref<const std::string&>());
    }
  }
  return fmt::format("node #{}", index);
}

parsed_node parse_node(const json& n, std::size_t index) {
  const std::string where = node_where(n, index);
  check_keys(n, {"name", "op", "inputs", "device", "attrs"}, where, "the node");
  parsed_node out;
  const json& name = require(n, "name", where, "the node");
  if (!name.is_string()) bad(where, fmt::format("\"name\" must be a string, got {}", describe(name)));
  try {
    check_node_name(name.get_ref<const std::string&>());
  } catch (const invalid_argument& e) {
    bad(where, e.what());
  }
  out.name = name.get<std::string>();
  const json& op = require(n, "op", where, "the node");
  if (!op.is_string()) bad(where, fmt::format("\"op\" must be a string, got {}", op.type_name()));
  out.op = op.get<std::string>();
  if (auto it = n.find("device"); it != n.end()) {
    if (!it->is_string())
      bad(where, fmt::format("\"device\" must be a string, got {}", it->type_name()));
    out.device = it->get<std::string>();
  }
  if (auto it = n.find("inputs"); it != n.end()) {
    if (!it->is_array())
      bad(where, fmt::format("\"inputs\" must be an array, got {}", it->type_name()));
    for (const auto& in : *it) {
      if (!in.is_string())
        bad(where, fmt::format("an input must be a string, got {}", describe(in)));
      const std::string_view text = in.get_ref<const std::string&>();
      if (text.starts_with('^')) {
        const auto control = text.substr(1);
        try {
          check_node_name(control);
        } catch (const invalid_argument& e) {
          bad(where, fmt::format("control input '{}': {}", text, e.what()));
        }
        out.control_inputs.emplace_back(control);
        continue;
      }
      if (!out.control_inputs.empty()) {
        bad(where, fmt::format("data input '{}' comes after a control input", text));
      }
      try {
        const auto [node_name, k] = split_tensor_name(text);
        out.inputs.emplace_back(std::string(node_name), k);
      } catch (const invalid_argument& e) {
        bad(where, fmt::format("input: {}", e.what()));
      }
    }
  }
  if (auto it = n.find("attrs"); it != n.end()) {
    if (!it->is_object())
      bad(where, fmt::format("\"attrs\" must be an object, got {}", it->type_name()));
    for (const auto& [key, value] : it->items())
      out.attrs.emplace(key, decode_attr(value, where, key));
  }
  return out;
}

// The order to add the nodes in (a depth-first search from each node in file order): the
// file's, except that the later nodes a node needs come just before it. Throws
// invalid_argument naming the nodes of a cycle.
std::vector<std::size_t> topological_order(const std::vector<parsed_node>& nodes) {
  enum : std::uint8_t { unseen, open, done };
  std::vector<std::uint8_t> state(nodes.size(), unseen);
  std::vector<std::size_t> order;
  order.reserve(nodes.size());
  std::vector<std::pair<std::size_t, std::size_t>> stack;  // (node, next dependency)
  for (std::size_t root = 0; root < nodes.size(); ++root) {
    if (state[root] != unseen) continue;
    state[root] = open;
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      const std::size_t v = stack.back().first;
      const std::size_t k = stack.back().second++;
      const auto& deps = nodes[v].deps;
      if (k == deps.size()) {
        state[v] = done;
        order.push_back(v);
        stack.pop_back();
        continue;
      }
      const std::size_t w = deps[k];
      if (state[w] == unseen) {
        state[w] = open;
        stack.emplace_back(w, 0);
      } else if (state[w] == open) {
        // The stack from w up needs w: data flows w -> top -> ... -> w.
        std::vector<std::string> cycle{nodes[w].name};
        for (std::size_t j = stack.size(); j-- > 0 && stack[j].first != w;) {
          cycle.push_back(nodes[stack[j].first].name);
        }
        cycle.push_back(nodes[w].name);
        throw invalid_argument(
            fmt::format("graph json: the nodes form a cycle: {}", fmt::join(cycle, " -> ")));
      }
    }
  }
  return order;
}

// The 1-based line of byte `offset` of `text`.
std::size_t line_at(std::string_view text, std::size_t offset) {
  const auto end = text.begin() + static_cast<std::ptrdiff_t>(std::min(offset, text.size()));
  return static_cast<std::size_t>(std::count(text.begin(), end, '\n')) + 1;
}

json parse_document(std::string_view text) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // e.byte is the 1-based index of the byte where parsing stopped (size + 1 at the end).
    const std::size_t line = line_at(text, e.byte == 0 ? 0 : e.byte - 1);
    std::string what = e.what();
    // "[json.exception.parse_error.101] parse error at line 2, column 5: ..." → what follows.
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    throw parse_error(fmt::format("graph json: line {}: {}", line, what), line);
  } catch (const json::out_of_range& e) {
    // "[json.exception.out_of_range.406] number overflow parsing '1e999'": no position, so
    // the line is the first one holding the number.
    std::string what = e.what();
    if (auto bracket = what.find("] "); bracket != std::string::npos)
      what = what.substr(bracket + 2);
    std::size_t line = 0;
    const auto open = what.find('\'');
    const auto close = what.rfind('\'');
    if (open != std::string::npos && close > open + 1) {
      const auto at = text.find(std::string_view(what).substr(open + 1, close - open - 1));
      if (at != std::string_view::npos) line = line_at(text, at);
    }
    throw parse_error(line != 0 ? fmt::format("graph json: line {}: {}", line, what)
                                : fmt::format("graph json: {}", what),
                      line);
  } catch (const json::exception& e) {
    throw parse_error(fmt::format("graph json: {}", e.what()), 0);
  }
}

}  // namespace

std::string graph_to_json(const graph& g, int indent) {
  ojson nodes = ojson::array();
  for (const node& n : g.nodes()) {
    const std::string where = fmt::format("node {}", n.describe());
    ojson obj = ojson::object();
    obj["name"] = n.name;
    obj["op"] = n.op();
    ojson inputs = ojson::array();
    for (const endpoint& e : n.inputs) inputs.push_back(g.endpoint_name(e));
    for (node_id c : n.control_inputs) inputs.push_back("^" + g.at(c).name);
    obj["inputs"] = std::move(inputs);
    if (!n.requested_device.empty()) obj["device"] = n.requested_device;
    ojson attrs = ojson::object();
    for (const auto& [attr, value] : n.attrs) {
      attrs[attr] = encode_attr(value, fmt::format("{}, attribute '{}'", where, attr));
    }
    obj["attrs"] = std::move(attrs);
    nodes.push_back(std::move(obj));
  }
  ojson doc = ojson::object();
  doc["format"] = format_name;
  doc["version"] = graph_json_version;
  doc["nodes"] = std::move(nodes);
  try {
    return doc.dump(indent) + "\n";
  } catch (const ojson::type_error& e) {
    // Strings that are not valid UTF-8; find the node to name it.
    for (std::size_t i = 0; i < doc["nodes"].size(); ++i) {
      try {
        (void)doc["nodes"][i].dump();
      } catch (const ojson::type_error&) {
        throw invalid_argument(
            fmt::format("graph_to_json: node {}: a name or string is not "
                        "valid UTF-8 ({})",
                        g.at(static_cast<node_id>(i)).describe(), e.what()));
      }
    }
    throw invalid_argument(fmt::format("graph_to_json: {}", e.what()));
  }
}

graph graph_from_json(std::string_view text, const op_registry& ops) {
  std::vector<parsed_node> nodes;
  try {
    const json doc = parse_document(text);
    check_keys(doc, {"format", "version", "nodes"}, "the document", "the document");
    const json& format = require(doc, "format", "the document", "the document");
    if (!format.is_string() || format.get_ref<const std::string&>() != format_name) {
      bad("the document",
          fmt::format("\"format\" must be \"{}\", got {}", format_name, describe(format)));
    }
    const json& version = require(doc, "version", "the document", "the document");
    if (!version.is_number_integer() || version.get<std::int64_t>() != graph_json_version) {
      bad("the document", fmt::format("unsupported \"version\" {} (this build reads version {})",
                                      describe(version), graph_json_version));
    }
    const json& list = require(doc, "nodes", "the document", "the document");
    if (!list.is_array()) bad("the document", "\"nodes\" must be an array");
    nodes.reserve(list.size());
    for (std::size_t i = 0; i < list.size(); ++i) nodes.push_back(parse_node(list[i], i));
  } catch (const json::exception& e) {
    // Not expected (every value's type is checked before it is read); a safety net, so that
    // only loom errors leave.
    throw parse_error(fmt::format("graph json: {}", e.what()), 0);
  }

  std::unordered_map<std::string_view, std::size_t> index;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto [it, inserted] = index.emplace(nodes[i].name, i);
    if (!inserted) {
      throw invalid_argument(fmt::format("graph json: nodes #{} and #{} are both named '{}'",
                                         it->second, i, nodes[i].name));
    }
  }
  for (auto& n : nodes) {
    if (ops.find(n.op) == nullptr) {
      try {
        (void)ops.get(n.op);
      } catch (const not_found& e) {
        throw not_found(fmt::format("graph json: node '{}': {}", n.name, e.what()));
      }
    }
    auto dep = [&](const std::string& name, const std::string& as_written) {
      auto it = index.find(name);
      if (it == index.end()) {
        throw not_found(
            fmt::format("graph json: node '{}' ({}): input '{}' names node '{}', "
                        "which is not in the graph",
                        n.name, n.op, as_written, name));
      }
      n.deps.push_back(it->second);
    };
    for (const auto& [name, k] : n.inputs) dep(name, k == 0 ? name : fmt::format("{}:{}", name, k));
    for (const auto& name : n.control_inputs) dep(name, "^" + name);
  }

  graph g(ops);
  for (std::size_t i : topological_order(nodes)) {
    parsed_node& n = nodes[i];
    node_spec spec;
    spec.name = n.name;
    spec.op = n.op;
    for (const auto& [name, k] : n.inputs) spec.inputs.push_back({g.get(name).id, k});
    for (const auto& name : n.control_inputs) spec.control_inputs.push_back(g.get(name).id);
    spec.attrs = std::move(n.attrs);
    spec.device = std::move(n.device);
    (void)g.add_node(std::move(spec));
  }
  return g;
}

void save_graph(const graph& g, const std::string& path) {
  const std::string text = graph_to_json(g);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw error(fmt::format("save_graph: cannot open '{}' for writing: {}", path,
                            std::generic_category().message(errno)));
  }
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) throw error(fmt::format("save_graph: writing '{}' failed", path));
}

graph load_graph(const std::string& path, const op_registry& ops) {
  const std::string text = read_input_file(path, "load_graph: graph file");
  try {
    return graph_from_json(text, ops);
  } catch (const parse_error& e) {
    throw parse_error(fmt::format("{}: {}", path, e.what()), e.line());
  } catch (const not_found& e) {
    throw not_found(fmt::format("{}: {}", path, e.what()));
  } catch (const invalid_argument& e) {
    throw invalid_argument(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace loom
