#include "loom/graph/attr_value.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loom {

const char* to_string(attr_type t) noexcept {
  switch (t) {
    case attr_type::integer: return "int";
    case attr_type::real: return "float";
    case attr_type::boolean: return "bool";
    case attr_type::string: return "string";
    case attr_type::type: return "dtype";
    case attr_type::ints: return "ints";
    case attr_type::reals: return "floats";
    case attr_type::shape: return "shape";
    case attr_type::tensor: return "tensor";
  }
  return "unknown";
}

namespace {
template <class T>
constexpr attr_type type_of() {
  if constexpr (std::is_same_v<T, std::int64_t>) return attr_type::integer;
  if constexpr (std::is_same_v<T, double>) return attr_type::real;
  if constexpr (std::is_same_v<T, bool>) return attr_type::boolean;
  if constexpr (std::is_same_v<T, std::string>) return attr_type::string;
  if constexpr (std::is_same_v<T, dtype>) return attr_type::type;
  if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) return attr_type::ints;
  if constexpr (std::is_same_v<T, std::vector<double>>) return attr_type::reals;
  if constexpr (std::is_same_v<T, shape>) return attr_type::shape;
  if constexpr (std::is_same_v<T, tensor>) return attr_type::tensor;
}
}  // namespace

template <class T>
T attr_value::as() const {
  if (const T* p = std::get_if<T>(&v_)) return *p;
  if constexpr (std::is_same_v<T, double>) {
    if (const auto* i = std::get_if<std::int64_t>(&v_)) return static_cast<double>(*i);
  }
  if constexpr (std::is_same_v<T, shape>) {
    if (const auto* l = std::get_if<std::vector<std::int64_t>>(&v_)) return shape(*l);
  }
  if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
    if (const auto* s = std::get_if<shape>(&v_)) return s->to_vector();
  }
  if constexpr (std::is_same_v<T, std::vector<double>>) {
    if (const auto* l = std::get_if<std::vector<std::int64_t>>(&v_)) {
      return std::vector<double>(l->begin(), l->end());
    }
  }
  throw invalid_argument(fmt::format("attribute is {} ({}), read as {}", loom::to_string(type()),
                                     to_string(), loom::to_string(type_of<T>())));
}

template std::int64_t attr_value::as<std::int64_t>() const;
template double attr_value::as<double>() const;
template bool attr_value::as<bool>() const;
template std::string attr_value::as<std::string>() const;
template dtype attr_value::as<dtype>() const;
template std::vector<std::int64_t> attr_value::as<std::vector<std::int64_t>>() const;
template std::vector<double> attr_value::as<std::vector<double>>() const;
template shape attr_value::as<shape>() const;
template tensor attr_value::as<tensor>() const;

std::string attr_value::to_string() const {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return fmt::format("\"{}\"", v);
        else if constexpr (std::is_same_v<T, dtype>) return loom::to_string(v);
        else if constexpr (std::is_same_v<T, shape>) return loom::to_string(v);
        else if constexpr (std::is_same_v<T, tensor>) return "tensor " + v.describe();
        else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::vector<std::int64_t>> ||
                           std::is_same_v<T, std::vector<double>>)
          return fmt::format("[{}]", fmt::join(v, ", "));
        else return fmt::format("{}", v);
      },
      v_);
}

bool operator==(const attr_value& a, const attr_value& b) {
  if (a.v_.index() != b.v_.index()) return false;
  if (const auto* ta = std::get_if<tensor>(&a.v_)) {
    const auto& tb = std::get<tensor>(b.v_);
    return ta->buf() == tb.buf() && ta->type() == tb.type() && ta->shape() == tb.shape() &&
           ta->offset() == tb.offset();
  }
  return std::visit(
      [&](const auto& va) {
        using T = std::decay_t<decltype(va)>;
        if constexpr (std::is_same_v<T, tensor>) {
          return false;  // handled above
        } else {
          return va == std::get<T>(b.v_);
        }
      },
      a.v_);
}

}  // namespace loom
