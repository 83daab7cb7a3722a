#include "loom/core/dtype.hpp"

#include <fmt/format.h>

#include <array>
#include <utility>

#include "loom/core/error.hpp"

namespace loom {

const char* to_string(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "float32";
    case dtype::f64: return "float64";
    case dtype::f16: return "float16";
    case dtype::bf16: return "bfloat16";
    case dtype::i32: return "int32";
    case dtype::i64: return "int64";
    case dtype::i8: return "int8";
    case dtype::u8: return "uint8";
    case dtype::boolean: return "bool";
  }
  return "unknown";
}

const std::vector<dtype>& all_types() {
  static const std::vector<dtype> t{dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32,
                                    dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
  return t;
}

const std::vector<dtype>& float_types() {
  static const std::vector<dtype> t{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
  return t;
}

const std::vector<dtype>& numeric_types() {
  static const std::vector<dtype> t{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                    dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  return t;
}

dtype parse_dtype(std::string_view name) {
  static constexpr std::array<std::pair<std::string_view, dtype>, 18> names{{
      {"float32", dtype::f32}, {"f32", dtype::f32},   {"float64", dtype::f64},
      {"f64", dtype::f64},     {"float16", dtype::f16}, {"f16", dtype::f16},
      {"bfloat16", dtype::bf16}, {"bf16", dtype::bf16}, {"int32", dtype::i32},
      {"i32", dtype::i32},     {"int64", dtype::i64},   {"i64", dtype::i64},
      {"int8", dtype::i8},     {"i8", dtype::i8},       {"uint8", dtype::u8},
      {"u8", dtype::u8},       {"bool", dtype::boolean}, {"boolean", dtype::boolean},
  }};
  for (const auto& [text, t] : names) {
    if (text == name) return t;
  }
  throw invalid_argument(fmt::format(
      "unknown dtype '{}' (expected one of float32, float64, float16, bfloat16, int32, int64, "
      "int8, uint8, bool, or f32, f64, f16, bf16, i32, i64, i8, u8)",
      name));
}

}  // namespace loom
