// dtype: the element type of a tensor.
//
// The set loom's kernels cover. Names follow NumPy ("float32", "int64", "bool"); the short
// forms ("f32", "i64") parse too. Conversion to DLPack's DLDataType lives in interop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loom/core/half.hpp"

namespace loom {

enum class dtype : std::uint8_t {
  f32 = 0,
  f64,
  f16,
  bf16,
  i32,
  i64,
  i8,
  u8,
  boolean,
};

inline constexpr int dtype_count = 9;

/// Bytes per element.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean: return 1;
  }
  return 0;
}

constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}
constexpr bool is_integer(dtype t) noexcept {
  return t == dtype::i32 || t == dtype::i64 || t == dtype::i8 || t == dtype::u8;
}

/// NumPy's name: "float32", "float64", "float16", "bfloat16", "int32", "int64", "int8",
/// "uint8", "bool".
const char* to_string(dtype t) noexcept;

/// The dtype sets op definitions and kernels name, written once: every dtype (in enum
/// order), the floating ones, and the numeric ones (every dtype but bool).
const std::vector<dtype>& all_types();
const std::vector<dtype>& float_types();
const std::vector<dtype>& numeric_types();

/// Parses a NumPy name or a short form ("f32", "f64", "f16", "bf16", "i32", "i64", "i8", "u8").
/// Throws loom::invalid_argument naming the text and the accepted names.
dtype parse_dtype(std::string_view name);

/// The C++ type of each dtype, and back.
template <class T>
struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of<half> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::int8_t> { static constexpr dtype value = dtype::i8; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <> struct dtype_of<bool> { static constexpr dtype value = dtype::boolean; };
template <class T>
inline constexpr dtype dtype_v = dtype_of<T>::value;

/// Calls f(T{}) with the C++ type of `t` (a value of it, default-constructed), so a kernel
/// is written once as a template and dispatched at run time:
///   visit_dtype(t, [&](auto tag) { using T = decltype(tag); ... });
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::f16: return f(half{});
    case dtype::bf16: return f(bfloat16{});
    case dtype::i32: return f(std::int32_t{});
    case dtype::i64: return f(std::int64_t{});
    case dtype::i8: return f(std::int8_t{});
    case dtype::u8: return f(std::uint8_t{});
    case dtype::boolean: return f(bool{});
  }
  return f(float{});
}

}  // namespace loom
