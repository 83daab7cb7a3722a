// loom.Table, the Arrow PyCapsule protocol, and AoS <-> SoA for Python.
//
//   t = loom.Table({"x": np.arange(3.0), "id": np.arange(3)})   # columns shared, no copy
//   schema, array = t.__arrow_c_array__()                       # what Arrow consumers call
//   u = loom.Table.from_arrow(batch)        # anything with __arrow_c_array__ (a struct array)
//   v = loom.from_arrow(arrow_array)        # a primitive array -> loom.Tensor
//   cols = loom.deinterleave(xyz)           # [N, k] -> k Tensors;  loom.interleave(cols)
//   t = loom.Table.from_records(structured) # NumPy structured array -> columns; t.to_records()
//
// The C++ behind it is loom/interop/arrow.hpp (Note [arrow interop]) and layout.hpp; this
// file adds the capsules, the Python exception kinds, and NumPy's structured dtypes.
//
// Note [arrow capsules]
// The Arrow PyCapsule interface (https://arrow.apache.org/docs/format/CDataInterface/
// PyCapsuleInterface.html): an ArrowSchema travels in a capsule named "arrow_schema", an
// ArrowArray in one named "arrow_array"; the capsule owns the heap struct, and its destructor
// calls the struct's release when that is not NULL, then frees the struct. A consumer
// *moves* the struct out (copies it and sets the original's release to NULL), so a consumed
// capsule frees only the struct, and an unconsumed one releases what it holds. Capsules are
// never renamed (unlike DLPack's "used_dltensor"): a released struct (release == NULL) is
// how a consumed capsule is recognised, and consuming one again is a BufferError.
// Importing follows the C++ import's contract: on success the array is moved into loom and
// the schema released; on failure neither is touched, so the capsules' destructors (or
// their producer) still release them.
//
// requested_schema is accepted and ignored: the specification lets a producer that cannot
// cast return its own schema, and loom exports each dtype as exactly one Arrow type.
//
// Errors, as NumPy users expect them: a type loom has no dtype for (an Arrow format, a
// NumPy field dtype, bfloat16 going out, nested fields) is a TypeError; bad values or shapes
// (nulls, ragged columns, a tensor that is not 1-D) a ValueError; a capsule that was already
// consumed a BufferError; a capsule of the wrong name a ValueError.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "loom/core/error.hpp"
#include "loom/interop/arrow.hpp"
#include "loom/interop/layout.hpp"
#include "loom/interop/table.hpp"
#include "loom/memory/npy.hpp"

namespace loom::python {
namespace {

using interop::table;

constexpr const char* schema_capsule_name = "arrow_schema";
constexpr const char* array_capsule_name = "arrow_array";

// Copies of at least this many bytes run with the GIL released: below it, releasing and
// taking the GIL back costs more than the copy.
constexpr std::size_t release_gil_bytes = std::size_t{1} << 16;

// The dtypes Arrow has a type for (all but bfloat16).
constexpr dtype arrow_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::i32,
                                  dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};

constexpr std::string_view loom_dtypes_text =
    "float16/32/64, int8/32/64, uint8 and bool, little-endian";

// ---- capsules (Note [arrow capsules]) ----------------------------------------------------

// Owners of a heap ArrowSchema/ArrowArray: release it if still live, then free it.
struct schema_deleter {
  void operator()(ArrowSchema* s) const noexcept {
    if (s->release != nullptr) s->release(s);
    delete s;
  }
};
struct array_deleter {
  void operator()(ArrowArray* a) const noexcept {
    if (a->release != nullptr) a->release(a);
    delete a;
  }
};
using schema_ptr = std::unique_ptr<ArrowSchema, schema_deleter>;
using array_ptr = std::unique_ptr<ArrowArray, array_deleter>;

// A struct to export into: zeroed, so release is NULL until an export fills it.
schema_ptr new_schema() {
  return schema_ptr(new ArrowSchema{});
}
array_ptr new_array() {
  return array_ptr(new ArrowArray{});
}

template <class T, class Deleter>
void destroy_capsule(PyObject* capsule, const char* name) {
  // Called with an exception possibly set: keep it.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (auto* p = static_cast<T*>(PyCapsule_GetPointer(capsule, name))) {
    Deleter{}(p);
  } else {
    PyErr_Clear();  // renamed by someone else: not ours to free any more
  }
  PyErr_Restore(type, value, traceback);
}

void destroy_schema_capsule(PyObject* capsule) {
  destroy_capsule<ArrowSchema, schema_deleter>(capsule, schema_capsule_name);
}
void destroy_array_capsule(PyObject* capsule) {
  destroy_capsule<ArrowArray, array_deleter>(capsule, array_capsule_name);
}

// A capsule owning `p` (on failure `p` is released and freed by its owner).
template <class T, class Deleter>
py::object make_capsule(std::unique_ptr<T, Deleter> p, const char* name,
                        PyCapsule_Destructor destructor) {
  PyObject* capsule = PyCapsule_New(p.get(), name, destructor);
  if (capsule == nullptr) throw py::error_already_set();
  p.release();  // the capsule owns it now
  return py::reinterpret_steal<py::object>(capsule);
}

py::tuple to_capsules(schema_ptr schema, array_ptr array) {
  py::object s = make_capsule(std::move(schema), schema_capsule_name, &destroy_schema_capsule);
  py::object a = make_capsule(std::move(array), array_capsule_name, &destroy_array_capsule);
  return py::make_tuple(std::move(s), std::move(a));
}

// ---- export ------------------------------------------------------------------------------

// bfloat16 has no Arrow type: a TypeError here (the C++ export's invalid_argument would be
// a ValueError), as NumPy raises for a dtype it cannot represent.
void check_arrow_dtype(const tensor& t, std::string_view what) {
  if (t.defined() && t.type() == dtype::bf16) {
    throw_python(PyExc_TypeError,
                 fmt::format("cannot export {} ({}) to Arrow: Arrow has no bfloat16 type; cast "
                             "it to float32 first",
                             what, t.describe()));
  }
}

std::pair<schema_ptr, array_ptr> export_tensor(const tensor& t) {
  if (!t.defined() || t.rank() != 1) {
    throw_python(
        PyExc_ValueError,
        fmt::format("only 1-D tensors export as Arrow arrays (which have no shape); this one is {}",
                    t.defined() ? t.describe() : std::string("undefined")));
  }
  check_arrow_dtype(t, "the tensor");
  schema_ptr s = new_schema();
  array_ptr a = new_array();
  interop::export_tensor(t, s.get(), a.get());
  return {std::move(s), std::move(a)};
}

std::pair<schema_ptr, array_ptr> export_table(const table& t) {
  t.validate();
  for (std::size_t i = 0; i < t.num_columns(); ++i) {
    check_arrow_dtype(t.columns[i], fmt::format("column '{}'", t.names[i]));
  }
  schema_ptr s = new_schema();
  array_ptr a = new_array();
  interop::export_table(t, s.get(), a.get());
  return {std::move(s), std::move(a)};
}

// ---- import ------------------------------------------------------------------------------

// Both capsules, kept alive for the import, and the structs in them.
struct capsule_pair {
  py::object schema_capsule;
  py::object array_capsule;
  ArrowSchema* schema = nullptr;
  ArrowArray* array = nullptr;
};

void* capsule_pointer(const py::handle& capsule, const char* expected, std::string_view who) {
  if (PyCapsule_CheckExact(capsule.ptr()) == 0) {
    throw_python(PyExc_TypeError, fmt::format("{}: expected a PyCapsule named '{}', got a {}", who,
                                              expected, type_name(capsule)));
  }
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (name == nullptr || std::strcmp(name, expected) != 0) {
    throw_python(
        PyExc_ValueError,
        fmt::format("{}: a capsule named {} is not an Arrow {} (expected the name '{}')", who,
                    name == nullptr ? "NULL" : fmt::format("'{}'", name),
                    std::strcmp(expected, schema_capsule_name) == 0 ? "ArrowSchema" : "ArrowArray",
                    expected));
  }
  void* p = PyCapsule_GetPointer(capsule.ptr(), expected);
  if (p == nullptr) throw py::error_already_set();
  return p;
}

// The capsules of `obj`: a (schema capsule, array capsule) pair, or what its
// __arrow_c_array__() returns.
capsule_pair capsules_of(const py::handle& obj, std::string_view who) {
  py::object pair;
  if (py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) {
    pair = py::reinterpret_borrow<py::object>(obj);
  } else if (py::hasattr(obj, "__arrow_c_array__")) {
    pair = obj.attr("__arrow_c_array__")();
    if (!py::isinstance<py::tuple>(pair)) {
      throw_python(PyExc_TypeError,
                   fmt::format("{}: {}.__arrow_c_array__() returned a {}, not a (schema, array) "
                               "tuple of capsules",
                               who, type_name(obj), type_name(pair)));
    }
  } else {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: a {} has no __arrow_c_array__ method and is not a (schema, "
                             "array) pair of Arrow PyCapsules",
                             who, type_name(obj)));
  }
  if (py::len(pair) != 2) {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: expected a (schema, array) pair of capsules, got {} items", who,
                             py::len(pair)));
  }
  capsule_pair c;
  c.schema_capsule = pair[py::int_(0)];
  c.array_capsule = pair[py::int_(1)];
  c.schema = static_cast<ArrowSchema*>(capsule_pointer(c.schema_capsule, schema_capsule_name, who));
  c.array = static_cast<ArrowArray*>(capsule_pointer(c.array_capsule, array_capsule_name, who));
  if (c.schema->release == nullptr || c.array->release == nullptr) {
    throw_python(PyExc_BufferError,
                 fmt::format("{}: the Arrow {} capsule was already consumed (its release is "
                             "NULL); a capsule can be imported once",
                             who, c.schema->release == nullptr ? "schema" : "array"));
  }
  return c;
}

bool is_supported_format(const char* format) {
  if (format == nullptr) return false;
  for (const dtype t : arrow_dtypes) {
    if (std::strcmp(interop::arrow_format(t), format) == 0) return true;
  }
  return false;
}

std::string supported_formats_text() {
  std::string s;
  for (const dtype t : arrow_dtypes) {
    s += fmt::format("{}'{}' ({})", s.empty() ? "" : ", ", interop::arrow_format(t), to_string(t));
  }
  return s;
}

// A TypeError when a live, well-formed schema node has a type loom has no dtype for; other
// faults are left to the C++ import, which names them (ValueError).
void check_primitive_type(const ArrowSchema* s, std::string_view who, std::string_view what) {
  if (s == nullptr || s->release == nullptr || s->format == nullptr) return;
  if (s->dictionary != nullptr) {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: {} is dictionary-encoded (format '{}'); loom imports plain "
                             "arrays only: decode it first",
                             who, what, s->format));
  }
  if (!is_supported_format(s->format)) {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: {} has Arrow format '{}', which loom has no dtype for{}; loom "
                             "imports {}",
                             who, what, s->format,
                             std::string_view(s->format) == "+s"
                                 ? " (a struct array: import it with loom.Table.from_arrow)"
                                 : "",
                             supported_formats_text()));
  }
}

// After a successful import the schema was released by its own callback, which must set
// release to NULL; clearing it again guards the capsule against a producer that forgot.
void mark_consumed(capsule_pair& c) noexcept {
  c.schema->release = nullptr;
}

tensor tensor_from_arrow(const py::handle& obj) {
  constexpr std::string_view who = "loom.from_arrow";
  capsule_pair c = capsules_of(obj, who);
  check_primitive_type(c.schema, who, "the array");
  tensor t = interop::import_tensor(c.schema, c.array);
  mark_consumed(c);
  return t;
}

table table_from_arrow(const py::handle& obj) {
  constexpr std::string_view who = "loom.Table.from_arrow";
  capsule_pair c = capsules_of(obj, who);
  const ArrowSchema* s = c.schema;
  if (s->format != nullptr && std::string_view(s->format) != "+s") {
    throw_python(PyExc_TypeError,
                 fmt::format("{}: a table is an Arrow struct array (format '+s', a record "
                             "batch); this one has format '{}' (import a single array with "
                             "loom.from_arrow)",
                             who, s->format));
  }
  if (s->children != nullptr) {
    for (std::int64_t i = 0; i < s->n_children; ++i) {
      const ArrowSchema* child = s->children[i];
      const char* name = child != nullptr && child->name != nullptr ? child->name : "";
      check_primitive_type(child, who, fmt::format("column '{}' (child {})", name, i));
    }
  }
  table t = interop::import_table(c.schema, c.array);
  mark_consumed(c);
  return t;
}

// ---- NumPy structured dtypes -------------------------------------------------------------

// The loom dtype of a NumPy scalar dtype in this machine's (little-endian) byte order.
std::optional<dtype> dtype_of_numpy(const py::handle& dt) {
  const std::string byteorder = dt.attr("byteorder").cast<std::string>();
  if (byteorder == ">") return std::nullopt;
  const std::string kind = dt.attr("kind").cast<std::string>();
  const auto size = dt.attr("itemsize").cast<std::size_t>();
  if (kind == "f" && size == 2) return dtype::f16;
  if (kind == "f" && size == 4) return dtype::f32;
  if (kind == "f" && size == 8) return dtype::f64;
  if (kind == "i" && size == 1) return dtype::i8;
  if (kind == "i" && size == 4) return dtype::i32;
  if (kind == "i" && size == 8) return dtype::i64;
  if (kind == "u" && size == 1) return dtype::u8;
  if (kind == "b" && size == 1) return dtype::boolean;
  return std::nullopt;
}

const char* numpy_typestr(dtype t, std::string_view column) {
  if (const char* s = memory::numpy_typestr(t)) return s;
  throw_python(PyExc_TypeError,
               fmt::format("to_records: column '{}' is bfloat16, which NumPy has no dtype for; "
                           "cast it to float32 first",
                           column));
}

// The fields of a structured dtype, in its order, with their byte offsets.
std::vector<interop::field> fields_of(const py::handle& dt) {
  const py::object names = dt.attr("names");
  const py::object fields = dt.attr("fields");
  std::vector<interop::field> out;
  for (const py::handle name : names) {
    const py::tuple entry = fields[name];  // (dtype, offset) or (dtype, offset, title)
    const py::object fdt = entry[0];
    const auto fname = name.cast<std::string>();
    if (!fdt.attr("fields").is_none() || !fdt.attr("subdtype").is_none()) {
      throw_python(PyExc_TypeError,
                   fmt::format("from_records: field '{}' has dtype {}, a nested (structured or "
                               "sub-array) field; loom columns hold one scalar per record, so "
                               "flatten it first",
                               fname, py::str(fdt).cast<std::string>()));
    }
    const std::optional<dtype> t = dtype_of_numpy(fdt);
    if (!t) {
      throw_python(PyExc_TypeError,
                   fmt::format("from_records: field '{}' has NumPy dtype {}, which loom has no "
                               "dtype for (loom reads {})",
                               fname, py::str(fdt).cast<std::string>(), loom_dtypes_text));
    }
    out.push_back(interop::field{fname, *t, entry[1].cast<std::size_t>()});
  }
  return out;
}

table table_from_records(const py::object& obj) {
  const py::module_ np = py::module_::import("numpy");
  if (!py::isinstance(obj, np.attr("ndarray"))) {
    throw_python(
        PyExc_TypeError,
        fmt::format("from_records takes a NumPy structured array, not a {}", type_name(obj)));
  }
  const py::object dt = obj.attr("dtype");
  if (dt.attr("fields").is_none()) {
    throw_python(PyExc_TypeError,
                 fmt::format("from_records takes a NumPy structured array; dtype {} has no "
                             "fields",
                             py::str(dt).cast<std::string>()));
  }
  const std::vector<interop::field> fields = fields_of(dt);
  // Records are read in place when they sit at a positive stride of at least one record
  // (a contiguous array or a slice with a step): that stride is the record size, and the
  // bytes between records are never read. Anything else is first made contiguous.
  py::array records = py::reinterpret_borrow<py::array>(obj);
  if (records.ndim() != 1) {  // records in row-major order
    records = py::reinterpret_steal<py::array>(obj.attr("reshape")(-1).release());
  }
  const auto itemsize = static_cast<std::size_t>(records.itemsize());
  const auto n = static_cast<std::int64_t>(records.shape(0));
  std::size_t record_size = itemsize;
  if (n > 1) {
    if (records.strides(0) < records.itemsize()) {
      records = py::reinterpret_steal<py::array>(np.attr("ascontiguousarray")(records).release());
    }
    record_size = static_cast<std::size_t>(records.strides(0));
  }
  const void* data = records.data();
  if (static_cast<std::size_t>(n) * record_size >= release_gil_bytes) {
    without_gil unlocked;
    return interop::records_to_columns(data, n, record_size, fields);
  }
  return interop::records_to_columns(data, n, record_size, fields);
}

py::object table_to_records(const table& t) {
  t.validate();
  const py::module_ np = py::module_::import("numpy");
  py::list spec;
  for (std::size_t i = 0; i < t.num_columns(); ++i) {
    spec.append(py::make_tuple(t.names[i], numpy_typestr(t.columns[i].type(), t.names[i])));
  }
  const py::object dt = np.attr("dtype")(spec);  // packed, as NumPy makes it
  py::array out = py::reinterpret_steal<py::array>(np.attr("empty")(t.num_rows(), dt).release());
  if (t.num_columns() == 0) return out;
  // Offsets from NumPy's dtype, in column order; the names are the table's (NumPy renames
  // an empty name to "f<i>", and columns_to_records finds columns by name).
  std::vector<interop::field> fields = fields_of(dt);
  for (std::size_t i = 0; i < fields.size(); ++i) fields[i].name = t.names[i];
  void* data = out.mutable_data();
  const auto itemsize = static_cast<std::size_t>(out.itemsize());
  if (static_cast<std::size_t>(t.num_rows()) * itemsize >= release_gil_bytes) {
    without_gil unlocked;
    interop::columns_to_records(t, data, itemsize, fields);
  } else {
    interop::columns_to_records(t, data, itemsize, fields);
  }
  return out;
}

// ---- AoS <-> SoA -------------------------------------------------------------------------

py::list deinterleave(const py::object& x) {
  const tensor aos = to_tensor(x, "deinterleave(x)");
  std::vector<tensor> columns;
  if (aos.defined() && aos.nbytes() >= release_gil_bytes) {
    without_gil unlocked;
    columns = interop::deinterleave(aos);
  } else {
    columns = interop::deinterleave(aos);
  }
  py::list out;
  for (tensor& c : columns) out.append(from_tensor(std::move(c)));
  return out;
}

tensor interleave(const py::iterable& cols) {
  std::vector<tensor> columns;
  std::size_t bytes = 0;
  for (const py::handle c : cols) {
    columns.push_back(to_tensor(c, fmt::format("interleave: column {}", columns.size())));
    if (columns.back().defined()) bytes += columns.back().nbytes();
  }
  if (bytes >= release_gil_bytes) {
    without_gil unlocked;
    return interop::interleave(columns);
  }
  return interop::interleave(columns);
}

// ---- loom.Table --------------------------------------------------------------------------

table table_from_mapping(const py::object& columns) {
  if (!py::hasattr(columns, "items")) {
    throw_python(PyExc_TypeError,
                 fmt::format("loom.Table takes a mapping of column names to 1-D arrays (a dict), "
                             "not a {}",
                             type_name(columns)));
  }
  table t;
  for (const py::handle item : columns.attr("items")()) {
    const py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
    if (!py::isinstance<py::str>(kv[0])) {
      throw_python(PyExc_TypeError,
                   fmt::format("loom.Table: column names are str, not {}", type_name(kv[0])));
    }
    auto name = kv[0].cast<std::string>();
    tensor column = to_tensor(kv[1], fmt::format("column '{}'", name));
    t.add(std::move(name), std::move(column));
  }
  t.validate();
  return t;
}

std::string table_repr(const table& t) {
  std::string cols;
  for (std::size_t i = 0; i < t.num_columns(); ++i) {
    cols += fmt::format("{}{}: {}", i == 0 ? "" : ", ", t.names[i],
                        t.columns[i].defined() ? to_string(t.columns[i].type()) : "undefined");
  }
  return fmt::format("loom.Table({} rows; {})", t.num_rows(), cols.empty() ? "no columns" : cols);
}

}  // namespace

void bind_arrow(py::module_& m) {
  py::class_<table>(m, "Table",
                    "Named 1-D columns of one length (an Arrow record batch), each a loom.Tensor")
      .def(py::init(&table_from_mapping), py::arg("columns") = py::dict(),
           "A table of the columns in a dict {name: 1-D array}, in its order; each column is "
           "taken without a copy where possible (as loom.as_tensor). ValueError for columns "
           "that are not 1-D or differ in length.")
      .def_readonly("names", &table::names, "The column names, in order")
      .def_readonly("columns", &table::columns, "The columns (loom.Tensors sharing the table's)")
      .def_property_readonly("num_rows", &table::num_rows)
      .def_property_readonly("num_columns", &table::num_columns)
      .def("__len__", &table::num_rows, "The number of rows")
      .def("__getitem__", &table::column, py::arg("name"),
           "The column called `name` (KeyError if none is)")
      .def("__contains__",
           [](const table& t, const std::string& name) {
             for (const auto& n : t.names) {
               if (n == name) return true;
             }
             return false;
           })
      .def("__repr__", &table_repr)
      .def(
          "__arrow_c_schema__",
          [](const table& t) {
            auto [schema, array] = export_table(t);
            return make_capsule(std::move(schema), schema_capsule_name, &destroy_schema_capsule);
          },
          "An 'arrow_schema' PyCapsule: a struct with one child per column")
      .def(
          "__arrow_c_array__",
          [](const table& t, const py::object& /*requested_schema*/) {
            auto [schema, array] = export_table(t);
            return to_capsules(std::move(schema), std::move(array));
          },
          py::arg("requested_schema") = py::none(),
          "('arrow_schema', 'arrow_array') PyCapsules of a struct array, one child per column, "
          "sharing the columns' memory (bool columns are packed into bits, a copy). "
          "requested_schema is ignored: loom has one Arrow type per dtype (Note [arrow "
          "capsules]).")
      .def_static("from_arrow", &table_from_arrow, py::arg("obj"),
                  "A table from an Arrow struct array (a record batch): an object with "
                  "__arrow_c_array__, or a (schema, array) pair of PyCapsules, which this "
                  "consumes. Zero copy for fixed-width columns without nulls; TypeError for "
                  "Arrow types loom has no dtype for, ValueError for nulls.")
      .def_static("from_records", &table_from_records, py::arg("array"),
                  "A table with one new column per field of a NumPy structured array (packed "
                  "or aligned, any strides; more than one dimension is read in row-major "
                  "order); TypeError for nested fields and dtypes loom lacks")
      .def("to_records", &table_to_records,
           "A new NumPy structured array with one field per column, packed as "
           "numpy.dtype([(name, dtype), ...]) lays it out");

  // loom.Tensor is registered by bind_tensor; this adds the Arrow protocol to it.
  auto tensor_class = py::reinterpret_borrow<py::class_<tensor>>(py::type::of<tensor>());
  tensor_class
      .def(
          "__arrow_c_schema__",
          [](const tensor& t) {
            auto [schema, array] = export_tensor(t);
            return make_capsule(std::move(schema), schema_capsule_name, &destroy_schema_capsule);
          },
          "An 'arrow_schema' PyCapsule of this 1-D tensor's Arrow type")
      .def(
          "__arrow_c_array__",
          [](const tensor& t, const py::object& /*requested_schema*/) {
            auto [schema, array] = export_tensor(t);
            return to_capsules(std::move(schema), std::move(array));
          },
          py::arg("requested_schema") = py::none(),
          "('arrow_schema', 'arrow_array') PyCapsules of this 1-D tensor as a primitive array "
          "sharing its memory (bool is packed into bits, a copy). requested_schema is ignored.");

  m.def("from_arrow", &tensor_from_arrow, py::arg("obj"),
        "A loom.Tensor from a primitive Arrow array: an object with __arrow_c_array__, or a "
        "(schema, array) pair of PyCapsules, which this consumes. Zero copy for fixed-width "
        "arrays without nulls; TypeError for Arrow types loom has no dtype for, ValueError "
        "for nulls.");
  m.def("deinterleave", &deinterleave, py::arg("x"),
        "Splits an [N, k] array (any dtype, any strides) into k new contiguous 1-D Tensors: "
        "column j is x[:, j]");
  m.def("interleave", &interleave, py::arg("columns"),
        "Joins k 1-D arrays of one dtype and length N into a new contiguous [N, k] Tensor "
        "whose column j is columns[j]");
}

}  // namespace loom::python
