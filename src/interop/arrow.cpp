// The Arrow C Data Interface (Note [arrow interop] in loom/interop/arrow.hpp).
//
// Export builds everything that can throw (copies, private data, child storage) into owning
// pointers first, then fills the caller's structs without throwing, so a failed export
// leaves them untouched. Import checks the whole array first (no side effects), then builds
// the tensors around a holder that has copied the ArrowArray but does not own it yet
// ("unarmed"); only when every tensor exists does it arm the holder, mark the caller's
// array moved and release the schema. A failure while building unwinds without calling any
// of the producer's callbacks.
#include "loom/interop/arrow.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/memory/device_resources.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::interop {
namespace {

constexpr device_id cpu0{device_type::cpu, 0};

// What buffers[1] of an empty exported array points at: the specification asks for
// non-null buffers, and some consumers dereference nothing but still check.
alignas(64) const std::uint8_t empty_data[64] = {};

// ---- formats ---------------------------------------------------------------------------

struct format_entry {
  std::string_view format;
  dtype type;
};

constexpr format_entry supported_formats[] = {
    {"c", dtype::i8},  {"C", dtype::u8},  {"i", dtype::i32}, {"l", dtype::i64},
    {"e", dtype::f16}, {"f", dtype::f32}, {"g", dtype::f64}, {"b", dtype::boolean},
};
constexpr std::string_view supported_list =
    "c (int8), C (uint8), i (int32), l (int64), "
    "e (float16), f (float32), g (float64), b (bool)";

// What an unsupported format is, for the message.
std::string_view format_meaning(std::string_view f) {
  struct entry {
    std::string_view prefix;
    std::string_view meaning;
    bool exact;
  };
  static constexpr entry known[] = {
      {"n", "null", true},
      {"s", "int16", true},
      {"S", "uint16", true},
      {"I", "uint32", true},
      {"L", "uint64", true},
      {"z", "binary", true},
      {"Z", "large binary", true},
      {"u", "utf8 string", true},
      {"U", "large utf8 string", true},
      {"vz", "binary view", true},
      {"vu", "string view", true},
      {"+s", "struct", true},
      {"+l", "list", true},
      {"+L", "large list", true},
      {"+m", "map", true},
      {"+w:", "fixed-size list", false},
      {"+u", "union", false},
      {"+r", "run-end encoded", true},
      {"d:", "decimal", false},
      {"w:", "fixed-size binary", false},
      {"td", "date", false},
      {"tt", "time", false},
      {"ts", "timestamp", false},
      {"tD", "duration", false},
      {"ti", "interval", false},
  };
  for (const auto& e : known) {
    if (e.exact ? f == e.prefix : f.starts_with(e.prefix)) return e.meaning;
  }
  return "unknown";
}

// ---- export ----------------------------------------------------------------------------

// private_data of an exported ArrowSchema. Children own their own private data, so a
// child moved out by the consumer outlives its parent (the specification's "moving child
// arrays").
struct exported_schema {
  std::string name;
  std::unique_ptr<ArrowSchema[]> child_structs;
  std::unique_ptr<ArrowSchema*[]> child_ptrs;
};

void release_exported_schema(ArrowSchema* s) noexcept {
  if (s == nullptr || s->release == nullptr) return;
  for (std::int64_t i = 0; i < s->n_children; ++i) {
    ArrowSchema* c = s->children[i];
    if (c->release != nullptr) c->release(c);  // a moved child has release == NULL
  }
  delete static_cast<exported_schema*>(s->private_data);
  s->release = nullptr;
  s->private_data = nullptr;
}

// private_data of an exported ArrowArray: a reference to the memory buffers[1] points into
// (the tensor's own buffer, or the copy made for it), and the buffer pointer array.
struct exported_array {
  buffer_ptr data;
  const void* buffers[2] = {nullptr, nullptr};
  std::unique_ptr<ArrowArray[]> child_structs;
  std::unique_ptr<ArrowArray*[]> child_ptrs;
};

void release_exported_array(ArrowArray* a) noexcept {
  if (a == nullptr || a->release == nullptr) return;
  for (std::int64_t i = 0; i < a->n_children; ++i) {
    ArrowArray* c = a->children[i];
    if (c->release != nullptr) c->release(c);
  }
  delete static_cast<exported_array*>(a->private_data);
  a->release = nullptr;
  a->private_data = nullptr;
}

// A primitive column, built (everything that can throw) but not yet in a struct.
struct pending_column {
  const char* format = nullptr;
  std::int64_t length = 0;
  std::unique_ptr<exported_schema> schema;
  std::unique_ptr<exported_array> array;
};

pending_column prepare_column(const tensor& t, std::string_view name, std::string_view what) {
  if (!t.defined()) throw invalid_argument(fmt::format("cannot export {}: it is undefined", what));
  if (t.type() == dtype::bf16) {
    throw invalid_argument(fmt::format(
        "cannot export {} ({}) to Arrow: Arrow has no bfloat16 type; cast it to float32 first",
        what, t.describe()));
  }
  if (!is_host_accessible(t.device().type)) {
    throw invalid_argument(fmt::format(
        "cannot export {} ({}) through the Arrow C data interface: the CPU cannot read its "
        "memory; copy it to the host first",
        what, t.describe()));
  }
  pending_column c;
  c.format = arrow_format(t.type());
  c.length = t.num_elements();
  c.schema = std::make_unique<exported_schema>();
  c.schema->name = name;
  c.array = std::make_unique<exported_array>();
  const auto n = static_cast<std::size_t>(c.length);
  if (n == 0) {
    c.array->buffers[1] = empty_data;
  } else if (t.type() == dtype::boolean) {
    // Arrow's booleans are bits, LSB first; loom's are bytes. Bits past the length are 0.
    tensor bits = memory::host_tensor(dtype::u8, shape{static_cast<std::int64_t>((n + 7) / 8)});
    tensor dense =
        t.is_contiguous() ? t : memory::contiguous_copy(t, memory::get_device_resource(cpu0), cpu0);
    const auto* src = static_cast<const std::uint8_t*>(dense.raw_data());
    auto* dst = static_cast<std::uint8_t*>(bits.raw_data());
    for (std::size_t byte = 0; byte < (n + 7) / 8; ++byte) {
      std::uint8_t v = 0;
      const std::size_t end = std::min<std::size_t>(8, n - byte * 8);
      for (std::size_t b = 0; b < end; ++b) {
        v = static_cast<std::uint8_t>(v | ((src[byte * 8 + b] != 0 ? 1u : 0u) << b));
      }
      dst[byte] = v;
    }
    c.array->buffers[1] = bits.raw_data();
    c.array->data = bits.buf();
  } else if (t.is_contiguous()) {
    c.array->buffers[1] = t.raw_data();  // zero-copy
    c.array->data = t.buf();
  } else {
    tensor dense = memory::contiguous_copy(t, memory::get_device_resource(cpu0), cpu0);
    c.array->buffers[1] = dense.raw_data();
    c.array->data = dense.buf();
  }
  return c;
}

// Fills the structs from a prepared column; takes ownership of its private data.
void fill_column(pending_column&& c, ArrowSchema* s, ArrowArray* a) noexcept {
  exported_schema* sp = c.schema.release();
  *s = ArrowSchema{};
  s->format = c.format;
  s->name = sp->name.c_str();
  s->metadata = nullptr;
  s->flags = 0;  // no nulls, so not nullable
  s->n_children = 0;
  s->children = nullptr;
  s->dictionary = nullptr;
  s->release = &release_exported_schema;
  s->private_data = sp;

  exported_array* ap = c.array.release();
  *a = ArrowArray{};
  a->length = c.length;
  a->null_count = 0;
  a->offset = 0;
  a->n_buffers = 2;
  a->n_children = 0;
  a->buffers = ap->buffers;
  a->children = nullptr;
  a->dictionary = nullptr;
  a->release = &release_exported_array;
  a->private_data = ap;
}

// ---- import ----------------------------------------------------------------------------

// Owns an imported ArrowArray (a bitwise copy: the specification's "move") once armed, and
// calls its release when the last tensor sharing its memory goes.
struct import_holder {
  ArrowArray array;
  std::atomic<std::int64_t> refs{1};
  bool armed = false;
};

void drop_holder(import_holder* h) noexcept {
  if (h->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (h->armed && h->array.release != nullptr) h->array.release(&h->array);
  delete h;
}

void release_imported(void* context, void* /*data*/, std::size_t /*bytes*/,
                      std::size_t /*alignment*/, stream /*s*/) noexcept {
  drop_holder(static_cast<import_holder*>(context));
}

// One column to import, checked: elements [start, start + length) of `data`.
struct column_plan {
  std::string name;
  dtype type = dtype::f32;
  const void* data = nullptr;
  std::int64_t start = 0;
  std::int64_t length = 0;
};

std::string quoted_format(const char* f) {
  return f == nullptr ? std::string("(null)") : fmt::format("'{}'", f);
}

void check_live(const ArrowSchema* s, const ArrowArray* a, std::string_view what) {
  if (s == nullptr || a == nullptr) {
    throw invalid_argument(fmt::format("cannot import {}: null {}", what,
                                       s == nullptr ? "ArrowSchema" : "ArrowArray"));
  }
  if (s->release == nullptr) {
    throw invalid_argument(
        fmt::format("cannot import {}: its ArrowSchema is released (release is NULL)", what));
  }
  if (a->release == nullptr) {
    throw invalid_argument(
        fmt::format("cannot import {}: its ArrowArray is released (release is NULL)", what));
  }
  if (s->format == nullptr) {
    throw invalid_argument(fmt::format("cannot import {}: its format string is NULL", what));
  }
}

void check_no_nulls(const ArrowArray* a, std::string_view what, const char* format) {
  if (a->null_count > 0) {
    throw invalid_argument(fmt::format(
        "cannot import {} (format '{}'): it has {} null{}, and loom tensors cannot hold nulls; "
        "fill them first (e.g. pyarrow.compute.fill_null)",
        what, format, a->null_count, a->null_count == 1 ? "" : "s"));
  }
  if (a->null_count < -1) {
    throw invalid_argument(fmt::format("cannot import {} (format '{}'): null_count is {}", what,
                                       format, a->null_count));
  }
  if (a->null_count == -1 && a->n_buffers >= 1 && a->buffers != nullptr &&
      a->buffers[0] != nullptr) {
    // Unknown count: look at the validity bits over the array's own range.
    const auto* bits = static_cast<const std::uint8_t*>(a->buffers[0]);
    for (std::int64_t i = a->offset; i < a->offset + a->length; ++i) {
      if (((bits[i >> 3] >> (i & 7)) & 1) == 0) {
        throw invalid_argument(fmt::format(
            "cannot import {} (format '{}'): it has nulls (null_count is -1 and validity bit {} "
            "is 0), and loom tensors cannot hold nulls",
            what, format, i - a->offset));
      }
    }
  }
}

void check_extent(const ArrowArray* a, std::string_view what, const char* format) {
  if (a->length < 0 || a->offset < 0) {
    throw invalid_argument(
        fmt::format("cannot import {} (format '{}'): negative length ({}) or offset ({})", what,
                    format, a->length, a->offset));
  }
  if (a->offset > INT64_MAX - a->length) {
    throw invalid_argument(
        fmt::format("cannot import {} (format '{}'): offset {} + length {} "
                    "overflows",
                    what, format, a->offset, a->length));
  }
}

// Checks a primitive column; `parent_offset` and `length` select its rows (a struct's
// offset applies to its children; a lone array has parent_offset 0 and its own length).
column_plan plan_column(const ArrowSchema* s, const ArrowArray* a, std::int64_t parent_offset,
                        std::int64_t length, bool lone, std::string_view what) {
  check_live(s, a, what);
  const std::string_view f = s->format;
  const format_entry* entry = nullptr;
  for (const auto& e : supported_formats) {
    if (e.format == f) entry = &e;
  }
  if (s->dictionary != nullptr || a->dictionary != nullptr) {
    throw invalid_argument(fmt::format(
        "cannot import {} (format '{}'): dictionary-encoded arrays are not supported; decode "
        "it first",
        what, f));
  }
  if (entry == nullptr) {
    throw invalid_argument(
        fmt::format("cannot import {}: unsupported Arrow format '{}' ({}); loom imports {}", what,
                    f, format_meaning(f), supported_list));
  }
  if (s->n_children != 0 || a->n_children != 0) {
    throw invalid_argument(fmt::format(
        "cannot import {} (format '{}'): a primitive array has no children, but the schema "
        "has {} and the array {}",
        what, f, s->n_children, a->n_children));
  }
  if (a->n_buffers != 2 || a->buffers == nullptr) {
    throw invalid_argument(fmt::format(
        "cannot import {} (format '{}'): a primitive array has 2 buffers (validity, data), "
        "this one has {}{}",
        what, f, a->n_buffers, a->buffers == nullptr ? " and a NULL buffers pointer" : ""));
  }
  check_extent(a, what, s->format);
  if (lone) length = a->length;
  if (a->length < parent_offset + length) {
    throw invalid_argument(fmt::format(
        "cannot import {} (format '{}'): it has {} values but the struct needs {} (offset {} + "
        "length {})",
        what, f, a->length, parent_offset + length, parent_offset, length));
  }
  check_no_nulls(a, what, s->format);
  column_plan p;
  p.name = s->name == nullptr ? "" : s->name;
  p.type = entry->type;
  p.data = a->buffers[1];
  p.start = a->offset + parent_offset;
  p.length = length;
  if (p.length > 0 && p.data == nullptr) {
    throw invalid_argument(
        fmt::format("cannot import {} (format '{}'): its data buffer is NULL but it has {} values",
                    what, f, p.length));
  }
  return p;
}

// The tensor for a planned column: a view of the holder's memory when it can be, a copy
// when it must be (bool, misaligned data, or nothing to share).
tensor build_column(const column_plan& p, import_holder* holder) {
  const auto n = static_cast<std::size_t>(p.length);
  if (p.type == dtype::boolean) {
    tensor out = memory::host_tensor(dtype::boolean, shape{p.length});
    const auto* bits = static_cast<const std::uint8_t*>(p.data);
    auto* dst = static_cast<std::uint8_t*>(out.raw_data());
    for (std::size_t i = 0; i < n; ++i) {
      const auto bit = static_cast<std::size_t>(p.start) + i;
      dst[i] = static_cast<std::uint8_t>((bits[bit >> 3] >> (bit & 7)) & 1u);
    }
    return out;
  }
  const std::size_t elem = size_of(p.type);
  if (n == 0) return memory::host_tensor(p.type, shape{0});
  const auto* first =
      static_cast<const std::byte*>(p.data) + static_cast<std::size_t>(p.start) * elem;
  const auto address = reinterpret_cast<std::uintptr_t>(first);
  if (address % elem != 0) {
    tensor out = memory::host_tensor(p.type, shape{p.length});
    std::memcpy(out.raw_data(), first, n * elem);
    return out;
  }
  std::size_t alignment = address & (~address + 1);  // the largest power of two dividing it
  if (alignment > 64) alignment = 64;
  // The specification makes the data const for consumers; loom tensors are writable, and
  // writing through one is the owner's business (it shares the producer's memory).
  buffer_ptr buf = buffer::adopt(const_cast<std::byte*>(first), n * elem, alignment, cpu0, stream{},
                                 &release_imported, holder);
  holder->refs.fetch_add(1, std::memory_order_relaxed);
  return tensor(std::move(buf), p.type, shape{p.length});
}

// Builds the tensors for `plans` around a holder of `array`; on success takes `array`
// (marks it moved) and releases `schema`. On throw neither is touched.
std::vector<tensor> build_columns(const std::vector<column_plan>& plans, ArrowSchema* schema,
                                  ArrowArray* array) {
  auto* holder = new import_holder{*array};
  std::vector<tensor> out;
  try {
    out.reserve(plans.size());
    for (const auto& p : plans) out.push_back(build_column(p, holder));
  } catch (...) {
    out.clear();  // unarmed: dropping the views calls none of the producer's callbacks
    drop_holder(holder);
    throw;
  }
  holder->armed = true;
  array->release = nullptr;  // moved into the holder
  array->private_data = nullptr;
  schema->release(schema);
  drop_holder(holder);  // the views keep it; with none, the array is released now
  return out;
}

}  // namespace

const char* arrow_format(dtype t) {
  switch (t) {
    case dtype::i8:
      return "c";
    case dtype::u8:
      return "C";
    case dtype::i32:
      return "i";
    case dtype::i64:
      return "l";
    case dtype::f16:
      return "e";
    case dtype::f32:
      return "f";
    case dtype::f64:
      return "g";
    case dtype::boolean:
      return "b";
    case dtype::bf16:
      break;
  }
  throw invalid_argument(
      fmt::format("{} has no Arrow type; cast it to float32 first", to_string(t)));
}

void export_tensor(const tensor& t, ArrowSchema* out_schema, ArrowArray* out_array,
                   const char* name) {
  if (out_schema == nullptr || out_array == nullptr) {
    throw invalid_argument("export_tensor: null ArrowSchema or ArrowArray to fill");
  }
  pending_column c = prepare_column(t, name == nullptr ? "" : name, "the tensor");
  fill_column(std::move(c), out_schema, out_array);
}

void export_table(const table& t, ArrowSchema* out_schema, ArrowArray* out_array) {
  if (out_schema == nullptr || out_array == nullptr) {
    throw invalid_argument("export_table: null ArrowSchema or ArrowArray to fill");
  }
  t.validate();
  const std::size_t k = t.num_columns();
  std::vector<pending_column> cols;
  cols.reserve(k);
  for (std::size_t i = 0; i < k; ++i) {
    cols.push_back(
        prepare_column(t.columns[i], t.names[i], fmt::format("column '{}'", t.names[i])));
  }
  auto schema = std::make_unique<exported_schema>();
  schema->child_structs = std::make_unique<ArrowSchema[]>(k);
  schema->child_ptrs = std::make_unique<ArrowSchema*[]>(k);
  auto array = std::make_unique<exported_array>();
  array->child_structs = std::make_unique<ArrowArray[]>(k);
  array->child_ptrs = std::make_unique<ArrowArray*[]>(k);
  array->buffers[0] = nullptr;  // struct validity: no nulls

  // Nothing below throws.
  for (std::size_t i = 0; i < k; ++i) {
    schema->child_ptrs[i] = &schema->child_structs[i];
    array->child_ptrs[i] = &array->child_structs[i];
    fill_column(std::move(cols[i]), schema->child_ptrs[i], array->child_ptrs[i]);
  }
  exported_schema* sp = schema.release();
  *out_schema = ArrowSchema{};
  out_schema->format = "+s";
  out_schema->name = "";
  out_schema->metadata = nullptr;
  out_schema->flags = 0;
  out_schema->n_children = static_cast<std::int64_t>(k);
  out_schema->children = sp->child_ptrs.get();
  out_schema->dictionary = nullptr;
  out_schema->release = &release_exported_schema;
  out_schema->private_data = sp;

  exported_array* ap = array.release();
  *out_array = ArrowArray{};
  out_array->length = t.num_rows();
  out_array->null_count = 0;
  out_array->offset = 0;
  out_array->n_buffers = 1;
  out_array->n_children = static_cast<std::int64_t>(k);
  out_array->buffers = ap->buffers;
  out_array->children = ap->child_ptrs.get();
  out_array->dictionary = nullptr;
  out_array->release = &release_exported_array;
  out_array->private_data = ap;
}

tensor import_tensor(ArrowSchema* schema, ArrowArray* array) {
  const std::vector<column_plan> plans = {
      plan_column(schema, array, 0, 0, /*lone=*/true, "the array")};
  return std::move(build_columns(plans, schema, array).front());
}

table import_table(ArrowSchema* schema, ArrowArray* array) {
  const std::string_view what = "the table";
  check_live(schema, array, what);
  const std::string_view f = schema->format;
  if (f != "+s") {
    throw invalid_argument(fmt::format(
        "cannot import {}: a table is a struct array (format '+s'), this is format {} ({})", what,
        quoted_format(schema->format), format_meaning(f)));
  }
  if (schema->dictionary != nullptr || array->dictionary != nullptr) {
    throw invalid_argument(fmt::format("cannot import {}: a dictionary-encoded struct", what));
  }
  if (schema->n_children != array->n_children) {
    throw invalid_argument(
        fmt::format("cannot import {}: the schema has {} children but the array has {}", what,
                    schema->n_children, array->n_children));
  }
  if (array->n_children < 0 ||
      (array->n_children > 0 && (schema->children == nullptr || array->children == nullptr))) {
    throw invalid_argument(fmt::format("cannot import {}: {} children but a NULL children pointer",
                                       what, array->n_children));
  }
  if (array->n_buffers != 1 || array->buffers == nullptr) {
    throw invalid_argument(fmt::format(
        "cannot import {}: a struct array has 1 buffer (validity), this one has {}{}", what,
        array->n_buffers, array->buffers == nullptr ? " and a NULL buffers pointer" : ""));
  }
  check_extent(array, what, schema->format);
  check_no_nulls(array, what, schema->format);

  std::vector<column_plan> plans;
  plans.reserve(static_cast<std::size_t>(array->n_children));
  for (std::int64_t i = 0; i < array->n_children; ++i) {
    const ArrowSchema* cs = schema->children[i];
    const char* cname = cs != nullptr && cs->name != nullptr ? cs->name : "";
    const std::string col = fmt::format("column '{}' (child {})", cname, i);
    plans.push_back(plan_column(cs, array->children[i], array->offset, array->length,
                                /*lone=*/false, col));
    for (std::int64_t j = 0; j < i; ++j) {
      if (plans[static_cast<std::size_t>(j)].name == plans.back().name) {
        throw invalid_argument(fmt::format(
            "cannot import {}: children {} and {} are both named '{}'; loom tables need "
            "distinct column names",
            what, j, i, cname));
      }
    }
  }
  table out;
  out.names.reserve(plans.size());
  for (const auto& p : plans) out.names.push_back(p.name);
  out.columns = build_columns(plans, schema, array);  // the last step that can throw
  return out;
}

}  // namespace loom::interop
