// attr_value: the value of a node attribute (an int, a float, a dtype, a list, a shape, a
// tensor for constants, ...). Attributes are fixed when the node is added.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom {

enum class attr_type : std::uint8_t { integer, real, boolean, string, type, ints, reals, shape, tensor };

/// "int", "float", "bool", "string", "dtype", "ints", "floats", "shape", "tensor".
const char* to_string(attr_type t) noexcept;

/// One attribute value. The variant's alternatives are in attr_type's order.
class attr_value {
 public:
  using storage = std::variant<std::int64_t, double, bool, std::string, dtype,
                               std::vector<std::int64_t>, std::vector<double>, loom::shape,
                               loom::tensor>;

  attr_value() = default;
  // One constructor per type, explicit about which alternative it holds (an int literal is
  // an integer, not a bool or a double).
  attr_value(std::int64_t v) : v_(v) {}                   // NOLINT
  attr_value(int v) : v_(std::int64_t{v}) {}              // NOLINT
  attr_value(double v) : v_(v) {}                         // NOLINT
  attr_value(float v) : v_(double{v}) {}                  // NOLINT
  attr_value(bool v) : v_(v) {}                           // NOLINT
  attr_value(std::string v) : v_(std::move(v)) {}         // NOLINT
  attr_value(const char* v) : v_(std::string(v)) {}       // NOLINT
  attr_value(dtype v) : v_(v) {}                          // NOLINT
  attr_value(std::vector<std::int64_t> v) : v_(std::move(v)) {}  // NOLINT
  attr_value(std::initializer_list<std::int64_t> v) : v_(std::vector<std::int64_t>(v)) {}  // NOLINT
  attr_value(std::vector<double> v) : v_(std::move(v)) {}  // NOLINT
  attr_value(loom::shape v) : v_(std::move(v)) {}          // NOLINT
  attr_value(loom::tensor v) : v_(std::move(v)) {}         // NOLINT

  [[nodiscard]] attr_type type() const noexcept { return static_cast<attr_type>(v_.index()); }
  [[nodiscard]] const storage& get() const noexcept { return v_; }

  /// The value as T (std::int64_t, double, bool, std::string, dtype, std::vector<std::int64_t>,
  /// std::vector<double>, shape, tensor). An integer reads as a double too, and a list of
  /// integers as a shape. Throws loom::invalid_argument naming both types on a mismatch.
  template <class T>
  [[nodiscard]] T as() const;

  /// A short readable form: "3", "0.5", "float32", "[1, 2]", "tensor float32[2]".
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const attr_value& a, const attr_value& b);

 private:
  storage v_;
};

using attr_map = std::map<std::string, attr_value, std::less<>>;

}  // namespace loom
