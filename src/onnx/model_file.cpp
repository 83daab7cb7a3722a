// Reading an ONNX model with ONNX's own library: parsing, checking, version conversion and
// tensor data (inline, typed fields or external files).
#include "model_file.hpp"

#include <fmt/format.h>
#include <onnx/checker.h>
#include <onnx/version_converter/convert.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "loom/core/error.hpp"
#include "loom/core/input.hpp"
#include "loom/graph/graph.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::onnx::detail {
namespace {

const char* onnx_type_name(std::int32_t t) {
  if (::onnx::TensorProto_DataType_IsValid(t)) {
    return ::onnx::TensorProto_DataType_Name(static_cast<::onnx::TensorProto_DataType>(t)).c_str();
  }
  return "an unknown data type";
}

// The value of key `key` of an external tensor's location list ("" when absent).
std::string external_field(const ::onnx::TensorProto& t, std::string_view key) {
  for (const auto& e : t.external_data()) {
    if (e.key() == key) return e.value();
  }
  return {};
}

std::int64_t external_number(const ::onnx::TensorProto& t, std::string_view key) {
  const std::string v = external_field(t, key);
  if (v.empty()) return -1;
  try {
    const auto n = parse_number<std::int64_t>(v, key);
    if (n < 0) throw parse_error(v, 0);
    return n;
  } catch (const parse_error&) {
    throw invalid_argument(fmt::format("tensor '{}': external data {} '{}' is not a byte count",
                                       t.name(), key, v));
  }
}

// Reads the bytes of an external tensor: `location` relative to `dir` (never outside it).
std::string read_external(const ::onnx::TensorProto& t, const std::filesystem::path& dir) {
  const std::string location = external_field(t, "location");
  if (location.empty()) {
    throw invalid_argument(
        fmt::format("tensor '{}': external data without a 'location'", t.name()));
  }
  const std::filesystem::path rel(location);
  if (rel.is_absolute() || rel.lexically_normal().string().starts_with("..")) {
    throw invalid_argument(fmt::format(
        "tensor '{}': external data location '{}' is outside the model's directory", t.name(),
        location));
  }
  const std::filesystem::path file = dir / rel;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw not_found(fmt::format("tensor '{}': external data file '{}' cannot be opened",
                                t.name(), file.string()));
  }
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::int64_t>(in.tellg());
  const std::int64_t offset = std::max<std::int64_t>(external_number(t, "offset"), 0);
  std::int64_t length = external_number(t, "length");
  if (length < 0) length = file_size - offset;
  if (offset > file_size || length > file_size - offset) {
    throw not_found(fmt::format(
        "tensor '{}': external data file '{}' holds {} bytes; the tensor needs {} at offset {}",
        t.name(), file.string(), file_size, length, offset));
  }
  std::string bytes(static_cast<std::size_t>(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (!in) {
    throw not_found(fmt::format("tensor '{}': reading external data file '{}' failed",
                                t.name(), file.string()));
  }
  return bytes;
}

template <class Field>
void copy_field(const Field& values, tensor& out, std::string_view name) {
  const auto n = static_cast<std::size_t>(out.num_elements());
  if (static_cast<std::size_t>(values.size()) != n) {
    throw invalid_argument(fmt::format("tensor '{}': {} values for shape {}", name,
                                       values.size(), to_string(out.shape())));
  }
  auto copy_as = [&]<class T>(T*) {
    T* dst = static_cast<T*>(out.raw_data());
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(values[static_cast<int>(i)]);
  };
  switch (out.type()) {
    case dtype::f32: copy_as(static_cast<float*>(nullptr)); break;
    case dtype::f64: copy_as(static_cast<double*>(nullptr)); break;
    case dtype::i32: copy_as(static_cast<std::int32_t*>(nullptr)); break;
    case dtype::i64: copy_as(static_cast<std::int64_t*>(nullptr)); break;
    case dtype::i8: copy_as(static_cast<std::int8_t*>(nullptr)); break;
    case dtype::u8:
    case dtype::boolean: copy_as(static_cast<std::uint8_t*>(nullptr)); break;
    case dtype::f16:
    case dtype::bf16: copy_as(static_cast<std::uint16_t*>(nullptr)); break;  // the bits
  }
}

// What ONNX's checker is given: the model, or, when initializers live in external files,
// a copy where those are graph inputs of their type and shape. The checker would look for
// the files relative to the working directory; loom reads them relative to the model's
// directory itself, and names a missing one (tensor_of).
const ::onnx::ModelProto& checkable(const ::onnx::ModelProto& m, ::onnx::ModelProto& copy) {
  bool external = false;
  for (const auto& t : m.graph().initializer()) {
    external = external || t.data_location() == ::onnx::TensorProto::EXTERNAL;
  }
  if (!external) return m;
  copy = m;
  auto* g = copy.mutable_graph();
  g->clear_initializer();
  std::set<std::string> inputs;
  for (const auto& in : m.graph().input()) inputs.insert(in.name());
  for (const auto& t : m.graph().initializer()) {
    if (t.data_location() != ::onnx::TensorProto::EXTERNAL) {
      *g->add_initializer() = t;
      continue;
    }
    if (inputs.contains(t.name())) continue;  // listed as an input already (IR 3)
    auto* in = g->add_input();
    in->set_name(t.name());
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(t.data_type());
    auto* s = tt->mutable_shape();
    for (auto d : t.dims()) s->add_dim()->set_dim_value(d);
  }
  return copy;
}

}  // namespace

::onnx::ModelProto parse_model(std::string_view bytes, std::string_view origin) {
  ::onnx::ModelProto m;
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    throw parse_error(fmt::format("'{}' is not an ONNX model: its {} bytes do not parse as an "
                                  "ONNX ModelProto (truncated or corrupted)",
                                  origin, bytes.size()),
                      0);
  }
  if (!m.has_graph()) {
    throw parse_error(fmt::format("'{}' is not an ONNX model: it has no graph ({} bytes; "
                                  "truncated or not a model file)",
                                  origin, bytes.size()),
                      0);
  }
  return m;
}

std::int64_t default_opset(const ::onnx::ModelProto& m) {
  for (const auto& o : m.opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  }
  return 0;
}

void check_and_convert(::onnx::ModelProto& m, bool check, std::string_view origin) {
  const std::int64_t opset = default_opset(m);
  if (opset > max_opset) {
    throw unsupported_error(fmt::format(
        "'{}' uses opset {} of the default ONNX domain; loom imports opsets {} to {}", origin,
        opset, min_opset, max_opset));
  }
  if (check) {
    try {
      ::onnx::ModelProto copy;
      ::onnx::checker::check_model(checkable(m, copy));
    } catch (const std::exception& e) {
      throw invalid_argument(fmt::format("'{}' fails ONNX's model checker: {}", origin, e.what()));
    }
  }
  if (opset > 0 && opset < min_opset) {
    try {
      m = ::onnx::version_conversion::ConvertVersion(m, 13);
    } catch (const std::exception& e) {
      throw unsupported_error(fmt::format(
          "'{}' uses opset {}; ONNX's version converter could not bring it to opset 13: {}",
          origin, opset, e.what()));
    }
  }
}

dtype dtype_of(std::int32_t onnx_type, std::string_view what) {
  using P = ::onnx::TensorProto;
  switch (onnx_type) {
    case P::FLOAT: return dtype::f32;
    case P::DOUBLE: return dtype::f64;
    case P::FLOAT16: return dtype::f16;
    case P::BFLOAT16: return dtype::bf16;
    case P::INT32: return dtype::i32;
    case P::INT64: return dtype::i64;
    case P::INT8: return dtype::i8;
    case P::UINT8: return dtype::u8;
    case P::BOOL: return dtype::boolean;
    default:
      throw unsupported_error(fmt::format("{} has ONNX data type {} ({}), which loom has no dtype for",
                                          what, onnx_type_name(onnx_type), onnx_type));
  }
}

std::optional<double> element_as_double(const tensor& t, std::int64_t i) {
  switch (t.type()) {
    case dtype::f32: return t.data<float>()[i];
    case dtype::f64: return t.data<double>()[i];
    case dtype::i64: return static_cast<double>(t.data<std::int64_t>()[i]);
    case dtype::i32: return t.data<std::int32_t>()[i];
    case dtype::i8: return t.data<std::int8_t>()[i];
    case dtype::u8: return t.data<std::uint8_t>()[i];
    case dtype::boolean: return static_cast<const std::uint8_t*>(t.raw_data())[i];
    case dtype::f16:
    case dtype::bf16: break;
  }
  return std::nullopt;
}

tensor tensor_of(const ::onnx::TensorProto& t, const std::filesystem::path& dir) {
  const std::string what = fmt::format("tensor '{}'", t.name());
  const dtype type = dtype_of(t.data_type(), what);
  shape dims;
  for (std::int64_t d : t.dims()) {
    if (d < 0) throw invalid_argument(fmt::format("{}: negative dimension {}", what, d));
    dims.push_back(d);
  }
  try {
    check_shape_attr(dims);
  } catch (const invalid_argument& e) {
    throw invalid_argument(fmt::format("{}: {}", what, e.what()));
  }
  tensor out = memory::host_tensor(type, dims);
  const std::size_t bytes = out.nbytes();
  const bool external = t.data_location() == ::onnx::TensorProto::EXTERNAL;
  if (external || t.has_raw_data()) {
    const std::string data = external ? read_external(t, dir) : t.raw_data();
    if (data.size() != bytes) {
      throw invalid_argument(fmt::format("{}: {} bytes of data for {}{} ({} bytes)", what,
                                         data.size(), to_string(type), to_string(dims), bytes));
    }
    if (bytes > 0) std::memcpy(out.raw_data(), data.data(), bytes);  // little-endian, as loom
    return out;
  }
  using P = ::onnx::TensorProto;
  switch (t.data_type()) {
    case P::FLOAT: copy_field(t.float_data(), out, t.name()); break;
    case P::DOUBLE: copy_field(t.double_data(), out, t.name()); break;
    case P::INT64: copy_field(t.int64_data(), out, t.name()); break;
    default: copy_field(t.int32_data(), out, t.name()); break;  // int32 and narrower, halves
  }
  return out;
}

}  // namespace loom::onnx::detail
