// The Arrow C Data Interface, against arrays built by hand the way an independent producer
// builds them (malloc'd buffers, release callbacks that count their calls) and exports read
// back by walking the structs by hand. Values are spelled out or computed by naive loops
// here; half-precision bit patterns are IEEE 754's (0x3C00 = 1.0, 0xC000 = -2.0, ...).
#include "loom/interop/arrow.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace {

using loom::dtype;
using loom::shape;
using loom::tensor;
using loom::interop::export_table;
using loom::interop::export_tensor;
using loom::interop::import_table;
using loom::interop::import_tensor;
using loom::interop::table;
using loom::memory::host_tensor;

// ---- an independent producer -----------------------------------------------------------

struct producer_array {
  std::vector<void*> owned;  // malloc'd memory the buffers point into
  std::vector<const void*> buffers;
  std::vector<ArrowArray*> children;  // malloc'd structs
  int* releases = nullptr;
};

void producer_release_array(ArrowArray* a) {
  auto* p = static_cast<producer_array*>(a->private_data);
  for (ArrowArray* c : p->children) {
    if (c->release != nullptr) c->release(c);
    std::free(c);
  }
  for (void* b : p->owned) std::free(b);
  ++*p->releases;
  delete p;
  a->release = nullptr;
}

// An ArrowArray over `buffers` (pointers into `owned`, or null), owning `owned` and
// `children`; its release counts into *releases.
ArrowArray raw_array(std::int64_t length, std::int64_t null_count, std::int64_t offset,
                     std::vector<const void*> buffers, std::vector<void*> owned, int* releases,
                     std::vector<ArrowArray> children = {}) {
  auto* p = new producer_array;
  p->owned = std::move(owned);
  p->buffers = std::move(buffers);
  p->releases = releases;
  for (const ArrowArray& c : children) {
    auto* s = static_cast<ArrowArray*>(std::malloc(sizeof(ArrowArray)));
    *s = c;
    p->children.push_back(s);
  }
  ArrowArray a{};
  a.length = length;
  a.null_count = null_count;
  a.offset = offset;
  a.n_buffers = static_cast<std::int64_t>(p->buffers.size());
  a.n_children = static_cast<std::int64_t>(p->children.size());
  a.buffers = p->buffers.empty() ? nullptr : p->buffers.data();
  a.children = p->children.empty() ? nullptr : p->children.data();
  a.dictionary = nullptr;
  a.release = &producer_release_array;
  a.private_data = p;
  return a;
}

void* malloc_copy(const void* src, std::size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (bytes != 0) std::memcpy(p, src, bytes);
  return p;
}

// A primitive array of `values` (no validity buffer), viewed from `offset` for `length`
// values (-1: to the end).
template <class T>
ArrowArray primitive(const std::vector<T>& values, int* releases, std::int64_t offset = 0,
                     std::int64_t length = -1, std::int64_t null_count = 0) {
  void* data = malloc_copy(values.data(), values.size() * sizeof(T));
  if (length < 0) length = static_cast<std::int64_t>(values.size()) - offset;
  return raw_array(length, null_count, offset, {nullptr, data}, {data}, releases);
}

// Arrow's bit order: value i is bit (i % 8) of byte i / 8.
void* pack_bits(const std::vector<bool>& bits) {
  auto* p = static_cast<std::uint8_t*>(std::calloc(bits.size() / 8 + 1, 1));
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (bits[i]) p[i / 8] = static_cast<std::uint8_t>(p[i / 8] | (1u << (i % 8)));
  }
  return p;
}

struct producer_schema {
  std::string format;
  std::string name;
  std::vector<ArrowSchema*> children;
  int* releases = nullptr;
};

void producer_release_schema(ArrowSchema* s) {
  auto* p = static_cast<producer_schema*>(s->private_data);
  for (ArrowSchema* c : p->children) {
    if (c->release != nullptr) c->release(c);
    std::free(c);
  }
  ++*p->releases;
  delete p;
  s->release = nullptr;
}

ArrowSchema make_schema(std::string format, std::string name, int* releases,
                        std::vector<ArrowSchema> children = {}) {
  auto* p = new producer_schema;
  p->format = std::move(format);
  p->name = std::move(name);
  p->releases = releases;
  for (const ArrowSchema& c : children) {
    auto* s = static_cast<ArrowSchema*>(std::malloc(sizeof(ArrowSchema)));
    *s = c;
    p->children.push_back(s);
  }
  ArrowSchema s{};
  s.format = p->format.c_str();
  s.name = p->name.c_str();
  s.metadata = nullptr;
  s.flags = ARROW_FLAG_NULLABLE;
  s.n_children = static_cast<std::int64_t>(p->children.size());
  s.children = p->children.empty() ? nullptr : p->children.data();
  s.dictionary = nullptr;
  s.release = &producer_release_schema;
  s.private_data = p;
  return s;
}

// Counts of release calls a test's producer saw.
struct arrow_import : ::testing::Test {
  int array_releases = 0;
  int schema_releases = 0;
};

// Imports must refuse and leave both structs with the caller; the caller then releases them.
template <class F>
void expect_refused(ArrowSchema& s, ArrowArray& a, F&& import, const std::string& needle) {
  const ArrowSchema schema_before = s;
  const ArrowArray array_before = a;
  try {
    import();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to mention: " << needle;
  }
  EXPECT_EQ(std::memcmp(&s, &schema_before, sizeof s), 0) << "schema changed";
  EXPECT_EQ(std::memcmp(&a, &array_before, sizeof a), 0) << "array changed";
}

void release_both(ArrowSchema& s, ArrowArray& a) {
  if (s.release != nullptr) s.release(&s);
  if (a.release != nullptr) a.release(&a);
}

// ---- import: single arrays -------------------------------------------------------------

TEST_F(arrow_import, f32_is_zero_copy_and_released_after_the_last_tensor) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  ArrowArray a = primitive(values, &array_releases);
  ArrowSchema s = make_schema("f", "x", &schema_releases);
  const void* data = a.buffers[1];
  tensor t = import_tensor(&s, &a);
  EXPECT_EQ(a.release, nullptr);  // moved into loom
  EXPECT_EQ(s.release, nullptr);  // released by the import
  EXPECT_EQ(schema_releases, 1);
  EXPECT_EQ(array_releases, 0);
  ASSERT_EQ(t.type(), dtype::f32);
  ASSERT_EQ(t.shape(), (shape{5}));
  EXPECT_EQ(t.raw_data(), data);
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(t.data<float>()[i], values[i]);
  // A write through the tensor is seen in the producer's memory, and back.
  t.data<float>()[2] = 42.0f;
  EXPECT_EQ(static_cast<const float*>(data)[2], 42.0f);
  const_cast<float*>(static_cast<const float*>(data))[0] = -9.0f;
  EXPECT_EQ(t.data<float>()[0], -9.0f);

  tensor view = t.reshaped(shape{5, 1});
  t = tensor();
  EXPECT_EQ(array_releases, 0) << "released while a view still uses the memory";
  EXPECT_EQ(view.data<float>()[4], 7.0f);
  view = tensor();
  EXPECT_EQ(array_releases, 1);
}

TEST_F(arrow_import, every_format_loom_has) {
  {
    ArrowArray a = primitive(std::vector<std::int8_t>{-128, -1, 0, 127}, &array_releases);
    ArrowSchema s = make_schema("c", "", &schema_releases);
    tensor t = import_tensor(&s, &a);
    ASSERT_EQ(t.type(), dtype::i8);
    EXPECT_EQ(t.data<std::int8_t>()[0], -128);
    EXPECT_EQ(t.data<std::int8_t>()[3], 127);
  }
  {
    ArrowArray a = primitive(std::vector<std::uint8_t>{0, 200, 255}, &array_releases);
    ArrowSchema s = make_schema("C", "", &schema_releases);
    tensor t = import_tensor(&s, &a);
    ASSERT_EQ(t.type(), dtype::u8);
    EXPECT_EQ(t.data<std::uint8_t>()[1], 200);
    EXPECT_EQ(t.data<std::uint8_t>()[2], 255);
  }
  {
    ArrowArray a =
        primitive(std::vector<std::int32_t>{-2147483647 - 1, 5, 2147483647}, &array_releases);
    ArrowSchema s = make_schema("i", "", &schema_releases);
    tensor t = import_tensor(&s, &a);
    ASSERT_EQ(t.type(), dtype::i32);
    EXPECT_EQ(t.data<std::int32_t>()[0], -2147483647 - 1);
    EXPECT_EQ(t.data<std::int32_t>()[2], 2147483647);
  }
  {
    ArrowArray a = primitive(std::vector<std::int64_t>{std::int64_t{1} << 40, -3}, &array_releases);
    ArrowSchema s = make_schema("l", "", &schema_releases);
    tensor t = import_tensor(&s, &a);
    ASSERT_EQ(t.type(), dtype::i64);
    EXPECT_EQ(t.data<std::int64_t>()[0], std::int64_t{1} << 40);
    EXPECT_EQ(t.data<std::int64_t>()[1], -3);
  }
  {
    // IEEE binary16: 1.0, -2.0, 0.5, 65504 (the largest finite).
    ArrowArray a =
        primitive(std::vector<std::uint16_t>{0x3C00, 0xC000, 0x3800, 0x7BFF}, &array_releases);
    ArrowSchema s = make_schema("e", "", &schema_releases);
    tensor t = import_tensor(&s, &a);
    ASSERT_EQ(t.type(), dtype::f16);
    const double expect[] = {1.0, -2.0, 0.5, 65504.0};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(static_cast<double>(static_cast<float>(t.data<loom::half>()[i])), expect[i]);
    }
  }
  {
    ArrowArray a = primitive(std::vector<double>{1e300, -0.125}, &array_releases);
    ArrowSchema s = make_schema("g", "", &schema_releases);
    tensor t = import_tensor(&s, &a);
    ASSERT_EQ(t.type(), dtype::f64);
    EXPECT_EQ(t.data<double>()[0], 1e300);
    EXPECT_EQ(t.data<double>()[1], -0.125);
  }
  EXPECT_EQ(array_releases, 6);
  EXPECT_EQ(schema_releases, 6);
}

TEST_F(arrow_import, honours_the_offset) {
  std::vector<std::int64_t> values(10);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int64_t>(i * i);
  ArrowArray a = primitive(values, &array_releases, /*offset=*/3, /*length=*/4);
  ArrowSchema s = make_schema("l", "", &schema_releases);
  const auto* data = static_cast<const std::int64_t*>(a.buffers[1]);
  tensor t = import_tensor(&s, &a);
  ASSERT_EQ(t.shape(), (shape{4}));
  EXPECT_EQ(t.raw_data(), data + 3);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.data<std::int64_t>()[i], (i + 3) * (i + 3));
  t = tensor();
  EXPECT_EQ(array_releases, 1);
}

TEST_F(arrow_import, bool_is_unpacked_and_the_array_released_at_once) {
  // 13 values from bit offset 5, so the range starts mid-byte and ends mid-byte.
  std::vector<bool> bits(20);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = (i * 7) % 3 == 1;
  void* data = pack_bits(bits);
  ArrowArray a = raw_array(13, 0, 5, {nullptr, data}, {data}, &array_releases);
  ArrowSchema s = make_schema("b", "flag", &schema_releases);
  tensor t = import_tensor(&s, &a);
  EXPECT_EQ(array_releases, 1) << "a copied column needs nothing of the producer";
  ASSERT_EQ(t.type(), dtype::boolean);
  ASSERT_EQ(t.shape(), (shape{13}));
  for (std::size_t i = 0; i < 13; ++i) EXPECT_EQ(t.data<bool>()[i], bits[i + 5]) << i;
}

TEST_F(arrow_import, an_unknown_null_count_with_an_all_valid_bitmap_imports) {
  std::vector<bool> valid(9, true);
  void* validity = pack_bits(valid);
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  void* data = malloc_copy(values.data(), values.size() * sizeof(float));
  ArrowArray a = raw_array(6, -1, 2, {validity, data}, {validity, data}, &array_releases);
  ArrowSchema s = make_schema("f", "", &schema_releases);
  tensor t = import_tensor(&s, &a);
  ASSERT_EQ(t.num_elements(), 6);
  EXPECT_EQ(t.data<float>()[0], 3.0f);
  EXPECT_EQ(t.data<float>()[5], 8.0f);
}

TEST_F(arrow_import, empty_arrays) {
  ArrowArray a = raw_array(0, 0, 0, {nullptr, nullptr}, {}, &array_releases);
  ArrowSchema s = make_schema("g", "", &schema_releases);
  tensor t = import_tensor(&s, &a);
  EXPECT_EQ(t.shape(), (shape{0}));
  EXPECT_EQ(t.type(), dtype::f64);
  EXPECT_EQ(array_releases, 1);

  ArrowArray b = raw_array(0, 0, 0, {nullptr, nullptr}, {}, &array_releases);
  ArrowSchema sb = make_schema("b", "", &schema_releases);
  tensor tb = import_tensor(&sb, &b);
  EXPECT_EQ(tb.shape(), (shape{0}));
  EXPECT_EQ(tb.type(), dtype::boolean);
  EXPECT_EQ(array_releases, 2);
}

TEST_F(arrow_import, misaligned_data_is_copied) {
  const std::int32_t values[] = {11, -22, 33};
  auto* block = static_cast<std::uint8_t*>(std::malloc(sizeof values + 1));
  std::memcpy(block + 1, values, sizeof values);
  ArrowArray a = raw_array(3, 0, 0, {nullptr, block + 1}, {block}, &array_releases);
  ArrowSchema s = make_schema("i", "", &schema_releases);
  tensor t = import_tensor(&s, &a);
  EXPECT_EQ(array_releases, 1);
  ASSERT_EQ(t.num_elements(), 3);
  EXPECT_EQ(t.data<std::int32_t>()[0], 11);
  EXPECT_EQ(t.data<std::int32_t>()[1], -22);
  EXPECT_EQ(t.data<std::int32_t>()[2], 33);
}

TEST_F(arrow_import, refuses_bad_arrays_and_leaves_them_to_the_caller) {
  const auto importer = [](ArrowSchema& s, ArrowArray& a) {
    return [&] { (void)import_tensor(&s, &a); };
  };
  struct bad {
    const char* format;
    std::string needle;
    std::function<void(ArrowArray&)> spoil;
  };
  const std::vector<bad> cases = {
      {"f", "2 nulls", [](ArrowArray& a) { a.null_count = 2; }},
      {"f", "null_count is -5", [](ArrowArray& a) { a.null_count = -5; }},
      {"s", "'s' (int16)", nullptr},
      {"S", "'S' (uint16)", nullptr},
      {"I", "'I' (uint32)", nullptr},
      {"L", "'L' (uint64)", nullptr},
      {"u", "'u' (utf8 string)", nullptr},
      {"tsu:UTC", "'tsu:UTC' (timestamp)", nullptr},
      {"d:10,2", "'d:10,2' (decimal)", nullptr},
      {"+s", "'+s' (struct)", nullptr},
      {"f", "2 buffers (validity, data), this one has 3", [](ArrowArray& a) { a.n_buffers = 3; }},
      {"f", "this one has 1", [](ArrowArray& a) { a.n_buffers = 1; }},
      {"f", "NULL buffers pointer", [](ArrowArray& a) { a.buffers = nullptr; }},
      {"f", "negative length (-1)", [](ArrowArray& a) { a.length = -1; }},
      {"f", "offset (-2)", [](ArrowArray& a) { a.offset = -2; }},
      {"f", "ArrowArray is released", [](ArrowArray& a) { a.release = nullptr; }},
      {"f", "no children, but the schema has 0 and the array 1",
       [](ArrowArray& a) { a.n_children = 1; }},
      {"f", "dictionary-encoded", [](ArrowArray& a) { a.dictionary = &a; }},
  };
  for (const bad& c : cases) {
    SCOPED_TRACE(c.needle);
    ArrowArray a = primitive(std::vector<float>{1, 2, 3}, &array_releases);
    ArrowSchema s = make_schema(c.format, "", &schema_releases);
    if (c.spoil) c.spoil(a);
    ArrowArray original = a;
    expect_refused(s, a, importer(s, a), c.needle);
    // Undo the spoiling so that the producer's release can run, as the caller would.
    original.release = &producer_release_array;
    original.buffers = static_cast<producer_array*>(original.private_data)->buffers.data();
    original.n_buffers = 2;
    original.n_children = 0;
    original.dictionary = nullptr;
    release_both(s, original);
  }
  EXPECT_EQ(array_releases, static_cast<int>(cases.size()));
  EXPECT_EQ(schema_releases, static_cast<int>(cases.size()));
}

TEST_F(arrow_import, refuses_nulls_in_the_validity_bitmap_when_the_count_is_unknown) {
  std::vector<bool> valid(8, true);
  valid[6] = false;  // within [offset 2, 2 + 5): value 4 of the view
  void* validity = pack_bits(valid);
  const std::vector<float> values(8, 1.0f);
  void* data = malloc_copy(values.data(), values.size() * sizeof(float));
  ArrowArray a = raw_array(5, -1, 2, {validity, data}, {validity, data}, &array_releases);
  ArrowSchema s = make_schema("f", "", &schema_releases);
  expect_refused(
      s, a, [&] { (void)import_tensor(&s, &a); }, "validity bit 4 is 0");
  release_both(s, a);

  // A null outside the view is not a null of the view.
  valid[6] = true;
  valid[0] = false;
  void* validity2 = pack_bits(valid);
  void* data2 = malloc_copy(values.data(), values.size() * sizeof(float));
  ArrowArray b = raw_array(5, -1, 2, {validity2, data2}, {validity2, data2}, &array_releases);
  ArrowSchema sb = make_schema("f", "", &schema_releases);
  EXPECT_EQ(import_tensor(&sb, &b).num_elements(), 5);
  EXPECT_EQ(array_releases, 2);
}

TEST_F(arrow_import, refuses_null_or_released_structs_and_missing_data) {
  ArrowArray a = primitive(std::vector<float>{1, 2}, &array_releases);
  ArrowSchema s = make_schema("f", "", &schema_releases);
  EXPECT_THROW((void)import_tensor(nullptr, &a), loom::invalid_argument);
  EXPECT_THROW((void)import_tensor(&s, nullptr), loom::invalid_argument);
  ArrowSchema released = s;
  released.release = nullptr;
  expect_refused(
      released, a, [&] { (void)import_tensor(&released, &a); }, "ArrowSchema is released");
  ArrowSchema no_format = s;
  no_format.format = nullptr;
  expect_refused(
      no_format, a, [&] { (void)import_tensor(&no_format, &a); }, "format string is NULL");
  const void* data = a.buffers[1];
  a.buffers[1] = nullptr;
  expect_refused(
      s, a, [&] { (void)import_tensor(&s, &a); }, "data buffer is NULL");
  a.buffers[1] = data;
  release_both(s, a);
  EXPECT_EQ(array_releases, 1);
  EXPECT_EQ(schema_releases, 1);
}

// ---- import: tables --------------------------------------------------------------------

// A struct array {t: f64, id: i32, ok: bool} of 6 rows, viewed from row `offset`.
struct record_batch {
  ArrowSchema schema;
  ArrowArray array;
  const double* t;
  const std::int32_t* id;
  std::vector<bool> ok;
};

record_batch make_batch(int* array_releases, int* schema_releases, std::int64_t offset,
                        std::int64_t length) {
  record_batch b{};
  std::vector<double> t = {0.5, 1.5, 2.5, 3.5, 4.5, 5.5};
  std::vector<std::int32_t> id = {10, 20, 30, 40, 50, 60};
  b.ok = {true, false, true, true, false, false};
  void* bits = pack_bits(b.ok);
  ArrowArray ct = primitive(t, array_releases);
  ArrowArray cid = primitive(id, array_releases);
  ArrowArray cok = raw_array(6, 0, 0, {nullptr, bits}, {bits}, array_releases);
  b.t = static_cast<const double*>(ct.buffers[1]);
  b.id = static_cast<const std::int32_t*>(cid.buffers[1]);
  b.array = raw_array(length, 0, offset, {nullptr}, {}, array_releases, {ct, cid, cok});
  b.schema =
      make_schema("+s", "", schema_releases,
                  {make_schema("g", "t", schema_releases), make_schema("i", "id", schema_releases),
                   make_schema("b", "ok", schema_releases)});
  return b;
}

TEST_F(arrow_import, table_columns_share_the_parent_until_the_last_one_goes) {
  record_batch b = make_batch(&array_releases, &schema_releases, 1, 4);
  table tab = import_table(&b.schema, &b.array);
  EXPECT_EQ(b.array.release, nullptr);
  EXPECT_EQ(schema_releases, 4);  // the struct's schema and its three children
  ASSERT_EQ(tab.names, (std::vector<std::string>{"t", "id", "ok"}));
  ASSERT_EQ(tab.num_rows(), 4);
  EXPECT_EQ(tab.columns[0].raw_data(), b.t + 1);
  EXPECT_EQ(tab.columns[1].raw_data(), b.id + 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(tab.columns[0].data<double>()[i], 0.5 + (i + 1));
    EXPECT_EQ(tab.columns[1].data<std::int32_t>()[i], 10 * (i + 2));
    EXPECT_EQ(tab.columns[2].data<bool>()[i], b.ok[static_cast<std::size_t>(i + 1)]);
  }
  tensor id = tab.columns[1];
  tab = table();
  EXPECT_EQ(array_releases, 0) << "column 'id' still shares the parent";
  EXPECT_EQ(id.data<std::int32_t>()[3], 50);
  id = tensor();
  EXPECT_EQ(array_releases, 4);  // the parent, which releases its three children
}

TEST_F(arrow_import, table_errors_leave_the_structs_to_the_caller) {
  {
    record_batch b = make_batch(&array_releases, &schema_releases, 0, 6);
    b.array.null_count = 1;
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "the table (format '+s'): it has 1 null");
    b.array.null_count = 0;
    release_both(b.schema, b.array);
  }
  {
    record_batch b = make_batch(&array_releases, &schema_releases, 0, 6);
    b.array.n_children = 2;
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "the schema has 3 children but the array has 2");
    b.array.n_children = 3;
    release_both(b.schema, b.array);
  }
  {
    // A child shorter than the struct's offset + length.
    record_batch b = make_batch(&array_releases, &schema_releases, 3, 4);
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "column 't' (child 0) (format 'g'): it has 6 values but the struct needs 7");
    release_both(b.schema, b.array);
  }
  {
    // The fault is in the last column: nothing of the first two may stick.
    record_batch b = make_batch(&array_releases, &schema_releases, 0, 6);
    b.array.children[2]->null_count = 2;
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "column 'ok' (child 2) (format 'b'): it has 2 nulls");
    b.array.children[2]->null_count = 0;
    release_both(b.schema, b.array);
  }
  {
    record_batch b = make_batch(&array_releases, &schema_releases, 0, 6);
    ArrowArray released_child = *b.array.children[1];
    b.array.children[1]->release = nullptr;
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "column 'id' (child 1): its ArrowArray is released");
    *b.array.children[1] = released_child;
    release_both(b.schema, b.array);
  }
  {
    record_batch b = make_batch(&array_releases, &schema_releases, 0, 6);
    auto* names = static_cast<producer_schema*>(b.schema.children[2]->private_data);
    names->name = "t";
    b.schema.children[2]->name = names->name.c_str();
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "children 0 and 2 are both named 't'");
    release_both(b.schema, b.array);
  }
  {
    record_batch b = make_batch(&array_releases, &schema_releases, 0, 6);
    b.array.n_buffers = 2;
    expect_refused(
        b.schema, b.array, [&] { (void)import_table(&b.schema, &b.array); },
        "a struct array has 1 buffer (validity), this one has 2");
    b.array.n_buffers = 1;
    release_both(b.schema, b.array);
  }
  {
    ArrowArray a = primitive(std::vector<float>{1, 2}, &array_releases);
    ArrowSchema s = make_schema("f", "", &schema_releases);
    expect_refused(
        s, a, [&] { (void)import_table(&s, &a); },
        "a table is a struct array (format '+s'), this is format 'f'");
    release_both(s, a);
  }
  EXPECT_EQ(array_releases, 7 * 4 + 1);
  EXPECT_EQ(schema_releases, 7 * 4 + 1);
}

// ---- export ----------------------------------------------------------------------------

template <class T>
tensor filled(dtype t, std::int64_t n, T first, T step) {
  tensor out = host_tensor(t, shape{n});
  T v = first;
  for (std::int64_t i = 0; i < n; ++i, v = static_cast<T>(v + step)) {
    std::memcpy(static_cast<std::byte*>(out.raw_data()) + i * static_cast<std::int64_t>(sizeof(T)),
                &v, sizeof(T));
  }
  return out;
}

TEST(arrow_export, f32_is_zero_copy_and_keeps_the_memory_until_released) {
  tensor t = filled<float>(dtype::f32, 5, 1.0f, 0.5f);
  ArrowSchema s;
  ArrowArray a;
  export_tensor(t, &s, &a, "x");
  EXPECT_STREQ(s.format, "f");
  EXPECT_STREQ(s.name, "x");
  EXPECT_EQ(s.n_children, 0);
  EXPECT_EQ(s.dictionary, nullptr);
  ASSERT_NE(s.release, nullptr);
  EXPECT_EQ(a.length, 5);
  EXPECT_EQ(a.null_count, 0);
  EXPECT_EQ(a.offset, 0);
  ASSERT_EQ(a.n_buffers, 2);
  EXPECT_EQ(a.n_children, 0);
  EXPECT_EQ(a.buffers[0], nullptr);
  ASSERT_EQ(a.buffers[1], t.raw_data());
  ASSERT_NE(a.release, nullptr);
  const auto* values = static_cast<const float*>(a.buffers[1]);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(values[i], 1.0f + 0.5f * static_cast<float>(i));
  t.data<float>()[1] = -7.0f;
  EXPECT_EQ(values[1], -7.0f);

  const loom::buffer_ptr buf = t.buf();
  t = tensor();
  EXPECT_FALSE(buf->unique()) << "the export holds a reference";
  EXPECT_EQ(values[4], 3.0f);
  s.release(&s);
  EXPECT_EQ(s.release, nullptr);
  a.release(&a);
  EXPECT_EQ(a.release, nullptr);
  EXPECT_TRUE(buf->unique());
}

TEST(arrow_export, every_dtype_and_flattened_ranks) {
  struct one {
    tensor t;
    const char* format;
  };
  tensor m = host_tensor(dtype::f64, shape{2, 3});
  for (int i = 0; i < 6; ++i) m.data<double>()[i] = 0.25 * i;
  const std::vector<one> cases = {
      {filled<std::int8_t>(dtype::i8, 4, -2, 1), "c"},
      {filled<std::uint8_t>(dtype::u8, 4, 250, 1), "C"},
      {filled<std::int32_t>(dtype::i32, 4, -100000, 70000), "i"},
      {filled<std::int64_t>(dtype::i64, 4, std::int64_t{1} << 40, -3), "l"},
      {filled<std::uint16_t>(dtype::f16, 4, 0x3C00, 1), "e"},
      {filled<float>(dtype::f32, 4, -1.0f, 0.75f), "f"},
      {m, "g"},
  };
  for (const one& c : cases) {
    SCOPED_TRACE(c.format);
    ArrowSchema s;
    ArrowArray a;
    export_tensor(c.t, &s, &a);
    EXPECT_STREQ(s.format, c.format);
    EXPECT_STREQ(s.name, "");
    EXPECT_EQ(a.length, c.t.num_elements());
    EXPECT_EQ(a.buffers[1], c.t.raw_data());
    EXPECT_EQ(std::memcmp(a.buffers[1], c.t.raw_data(), c.t.nbytes()), 0);
    release_both(s, a);
  }
}

TEST(arrow_export, bool_is_packed_into_bits) {
  const bool values[] = {true, false, true, true, false, false, false, true, true, false, true};
  tensor t = host_tensor(dtype::boolean, shape{11});
  for (int i = 0; i < 11; ++i) t.data<bool>()[i] = values[i];
  ArrowSchema s;
  ArrowArray a;
  export_tensor(t, &s, &a);
  EXPECT_STREQ(s.format, "b");
  EXPECT_EQ(a.length, 11);
  EXPECT_NE(a.buffers[1], t.raw_data());
  const auto* bits = static_cast<const std::uint8_t*>(a.buffers[1]);
  // 0b10001101 and 0b101 (bits past the length are zero).
  EXPECT_EQ(bits[0], 0x8D);
  EXPECT_EQ(bits[1], 0x05);
  release_both(s, a);
}

TEST(arrow_export, non_contiguous_tensors_are_copied_in_row_major_order) {
  tensor base = host_tensor(dtype::i32, shape{3, 4});
  for (int i = 0; i < 12; ++i) base.data<std::int32_t>()[i] = i;
  // The transpose: [4, 3], element (r, c) = base(c, r) = 4c + r.
  tensor tr = tensor::strided(base.buf(), dtype::i32, shape{4, 3}, shape{1, 4}, 0);
  ASSERT_FALSE(tr.is_contiguous());
  ArrowSchema s;
  ArrowArray a;
  export_tensor(tr, &s, &a);
  ASSERT_EQ(a.length, 12);
  const auto* v = static_cast<const std::int32_t*>(a.buffers[1]);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(v[r * 3 + c], 4 * c + r);
  }
  release_both(s, a);
}

TEST(arrow_export, empty_tensors_have_a_non_null_data_buffer) {
  tensor t = host_tensor(dtype::f32, shape{0});
  ArrowSchema s;
  ArrowArray a;
  export_tensor(t, &s, &a);
  EXPECT_EQ(a.length, 0);
  EXPECT_NE(a.buffers[1], nullptr);
  release_both(s, a);
}

TEST(arrow_export, refusals_leave_the_out_structs_untouched) {
  ArrowSchema s;
  ArrowArray a;
  std::memset(&s, 0xAB, sizeof s);
  std::memset(&a, 0xCD, sizeof a);
  const ArrowSchema s0 = s;
  const ArrowArray a0 = a;
  const auto expect_message = [&](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const loom::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(&s, &s0, sizeof s), 0);
    EXPECT_EQ(std::memcmp(&a, &a0, sizeof a), 0);
  };
  expect_message([&] { export_tensor(host_tensor(dtype::bf16, shape{3}), &s, &a); },
                 "no bfloat16 type");
  expect_message([&] { export_tensor(tensor(), &s, &a); }, "undefined");
  expect_message([&] { export_tensor(host_tensor(dtype::f32, shape{3}), nullptr, &a); },
                 "null ArrowSchema");
  // Memory the CPU cannot read (a CUDA buffer, faked: never dereferenced).
  float fake[4] = {};
  tensor on_gpu(loom::buffer::adopt(fake, sizeof fake, 16, {loom::device_type::cuda, 0}, {},
                                    nullptr, nullptr),
                dtype::f32, shape{4});
  expect_message([&] { export_tensor(on_gpu, &s, &a); }, "the CPU cannot read");

  table bad;
  bad.add("a", host_tensor(dtype::f32, shape{3}));
  bad.add("b", host_tensor(dtype::bf16, shape{3}));
  expect_message([&] { export_table(bad, &s, &a); }, "column 'b'");
  table ragged;
  ragged.add("a", host_tensor(dtype::f32, shape{3}));
  ragged.add("b", host_tensor(dtype::f32, shape{4}));
  expect_message([&] { export_table(ragged, &s, &a); }, "column 'b' (#1) has 4 rows");
  table twice;
  twice.add("a", host_tensor(dtype::f32, shape{3}));
  twice.add("a", host_tensor(dtype::i32, shape{3}));
  expect_message([&] { export_table(twice, &s, &a); }, "two columns named 'a'");
  table flat;
  flat.add("m", host_tensor(dtype::f32, shape{2, 2}));
  expect_message([&] { export_table(flat, &s, &a); }, "columns must be 1-D");
  table unnamed;
  unnamed.columns.push_back(host_tensor(dtype::f32, shape{2}));
  expect_message([&] { export_table(unnamed, &s, &a); }, "0 names for 1 columns");
}

TEST(arrow_export, table_as_a_struct_array_and_moved_children) {
  table tab;
  tab.add("x", filled<float>(dtype::f32, 4, 1.0f, 1.0f));
  tab.add("n", filled<std::int64_t>(dtype::i64, 4, 100, -10));
  tab.add("b", host_tensor(dtype::boolean, shape{4}));
  for (int i = 0; i < 4; ++i) tab.columns[2].data<bool>()[i] = i % 2 == 0;
  ArrowSchema s;
  ArrowArray a;
  export_table(tab, &s, &a);
  EXPECT_STREQ(s.format, "+s");
  ASSERT_EQ(s.n_children, 3);
  EXPECT_STREQ(s.children[0]->name, "x");
  EXPECT_STREQ(s.children[0]->format, "f");
  EXPECT_STREQ(s.children[1]->name, "n");
  EXPECT_STREQ(s.children[1]->format, "l");
  EXPECT_STREQ(s.children[2]->name, "b");
  EXPECT_STREQ(s.children[2]->format, "b");
  EXPECT_EQ(a.length, 4);
  EXPECT_EQ(a.null_count, 0);
  ASSERT_EQ(a.n_buffers, 1);
  EXPECT_EQ(a.buffers[0], nullptr);
  ASSERT_EQ(a.n_children, 3);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(a.children[j]->length, 4);
    EXPECT_EQ(a.children[j]->n_buffers, 2);
    EXPECT_NE(a.children[j]->release, nullptr);
  }
  EXPECT_EQ(a.children[0]->buffers[1], tab.columns[0].raw_data());
  EXPECT_EQ(a.children[1]->buffers[1], tab.columns[1].raw_data());
  EXPECT_EQ(static_cast<const std::uint8_t*>(a.children[2]->buffers[1])[0], 0x05);
  EXPECT_EQ(static_cast<const std::int64_t*>(a.children[1]->buffers[1])[3], 70);

  // Move child 1 (and its schema) out, as a consumer may, then release the parents.
  ArrowArray moved = *a.children[1];
  a.children[1]->release = nullptr;
  ArrowSchema moved_schema = *s.children[1];
  s.children[1]->release = nullptr;
  const loom::buffer_ptr x = tab.columns[0].buf();
  const loom::buffer_ptr n = tab.columns[1].buf();
  tab = table();
  a.release(&a);
  s.release(&s);
  EXPECT_EQ(a.release, nullptr);
  EXPECT_TRUE(x->unique()) << "the parent's release releases the children it still holds";
  EXPECT_FALSE(n->unique()) << "a moved child keeps its memory";
  EXPECT_STREQ(moved_schema.name, "n");
  EXPECT_EQ(static_cast<const std::int64_t*>(moved.buffers[1])[0], 100);
  moved.release(&moved);
  moved_schema.release(&moved_schema);
  EXPECT_TRUE(n->unique());
}

// ---- round trips -----------------------------------------------------------------------

TEST(arrow_round_trip, tensors_of_every_dtype) {
  for (dtype t : {dtype::i8, dtype::u8, dtype::i32, dtype::i64, dtype::f16, dtype::f32, dtype::f64,
                  dtype::boolean}) {
    SCOPED_TRACE(loom::to_string(t));
    tensor x = host_tensor(t, shape{37});
    auto* bytes = static_cast<std::uint8_t*>(x.raw_data());
    for (std::size_t i = 0; i < x.nbytes(); ++i) {
      bytes[i] =
          t == dtype::boolean ? (i % 3 == 0 ? 1 : 0) : static_cast<std::uint8_t>(i * 37 + 11);
    }
    ArrowSchema s;
    ArrowArray a;
    export_tensor(x, &s, &a);
    tensor y = import_tensor(&s, &a);
    EXPECT_EQ(s.release, nullptr);
    EXPECT_EQ(a.release, nullptr);
    ASSERT_EQ(y.type(), t);
    ASSERT_EQ(y.shape(), x.shape());
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0);
    if (t != dtype::boolean) {
      EXPECT_EQ(y.raw_data(), x.raw_data()) << "zero-copy both ways";
      const loom::buffer_ptr b = x.buf();
      x = tensor();
      EXPECT_FALSE(b->unique());
      y = tensor();  // releases the exported array, which drops its reference
      EXPECT_TRUE(b->unique());
    }
  }
}

TEST(arrow_round_trip, a_sliced_table) {
  table tab;
  tab.add("a", filled<double>(dtype::f64, 10, 0.0, 1.5));
  tab.add("b", filled<std::int8_t>(dtype::i8, 10, -5, 1));
  tab.add("c", host_tensor(dtype::boolean, shape{10}));
  for (int i = 0; i < 10; ++i) tab.columns[2].data<bool>()[i] = i % 3 == 1;
  ArrowSchema s;
  ArrowArray a;
  export_table(tab, &s, &a);
  // Slice rows [3, 8) the way Arrow does: the struct's offset and length.
  a.offset = 3;
  a.length = 5;
  table back = import_table(&s, &a);
  ASSERT_EQ(back.names, tab.names);
  ASSERT_EQ(back.num_rows(), 5);
  EXPECT_EQ(back.columns[0].raw_data(), tab.columns[0].data<double>() + 3);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(back.columns[0].data<double>()[i], 1.5 * (i + 3));
    EXPECT_EQ(back.columns[1].data<std::int8_t>()[i], i + 3 - 5);
    EXPECT_EQ(back.columns[2].data<bool>()[i], (i + 3) % 3 == 1);
  }
}

TEST(arrow_round_trip, empty_tables) {
  table tab;
  tab.add("a", host_tensor(dtype::f32, shape{0}));
  tab.add("b", host_tensor(dtype::boolean, shape{0}));
  ArrowSchema s;
  ArrowArray a;
  export_table(tab, &s, &a);
  table back = import_table(&s, &a);
  ASSERT_EQ(back.num_columns(), 2u);
  EXPECT_EQ(back.num_rows(), 0);
  EXPECT_EQ(back.columns[1].type(), dtype::boolean);

  table none;
  export_table(none, &s, &a);
  EXPECT_EQ(a.n_children, 0);
  table back_none = import_table(&s, &a);
  EXPECT_EQ(back_none.num_columns(), 0u);
}

TEST(interop_table, lookup_by_name) {
  table tab;
  tab.add("a", host_tensor(dtype::f32, shape{2}));
  tab.add("b", host_tensor(dtype::i32, shape{2}));
  EXPECT_EQ(tab.column("b").type(), dtype::i32);
  try {
    (void)tab.column("zz");
    ADD_FAILURE();
  } catch (const loom::not_found& e) {
    EXPECT_NE(std::string(e.what()).find("no column 'zz'; its columns are: a, b"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
