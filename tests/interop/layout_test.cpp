// AoS <-> SoA against naive index loops written here: each element of the result is
// compared, byte for byte, with the element the definition says it comes from, read by
// walking the input's strides (or record offsets) by hand.
#include "loom/interop/layout.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/device/thread_pool.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace {

using loom::dtype;
using loom::shape;
using loom::tensor;
using loom::thread_pool;
using loom::interop::columns_to_records;
using loom::interop::deinterleave;
using loom::interop::field;
using loom::interop::interleave;
using loom::interop::records_to_columns;
using loom::interop::table;
using loom::memory::host_tensor;

// One dtype of each element size, and bool (whose bytes must stay 0 or 1).
const dtype dtypes[] = {dtype::i8,  dtype::boolean, dtype::f16, dtype::f32,
                        dtype::i32, dtype::f64,     dtype::i64};

// Random bytes for every element of a contiguous tensor (0/1 for bool).
void randomize(const tensor& t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto* p = static_cast<std::uint8_t*>(t.raw_data());
  for (std::size_t i = 0; i < t.buf()->bytes(); ++i) {
    p[i] = t.type() == dtype::boolean ? static_cast<std::uint8_t>(rng() & 1u)
                                      : static_cast<std::uint8_t>(rng());
  }
}

// The address of element `index` of `t`, by its strides.
const std::uint8_t* element(const tensor& t, std::initializer_list<std::int64_t> index) {
  std::int64_t off = t.offset();
  std::size_t d = 0;
  for (std::int64_t i : index) off += i * t.strides()[d++];
  return static_cast<const std::uint8_t*>(t.buf()->data()) +
         off * static_cast<std::int64_t>(loom::size_of(t.type()));
}

// Checks that column j of `cols` is aos[:, j], element by element.
void expect_columns_of(const tensor& aos, const std::vector<tensor>& cols) {
  const std::int64_t n = aos.dim(0);
  const std::int64_t k = aos.dim(1);
  const std::size_t elem = loom::size_of(aos.type());
  ASSERT_EQ(static_cast<std::int64_t>(cols.size()), k);
  for (std::int64_t j = 0; j < k; ++j) {
    const tensor& c = cols[static_cast<std::size_t>(j)];
    ASSERT_EQ(c.type(), aos.type());
    ASSERT_EQ(c.shape(), (shape{n}));
    ASSERT_TRUE(c.is_contiguous());
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(element(c, {i}), element(aos, {i, j}), elem), 0)
          << "row " << i << " column " << j;
    }
  }
}

// Checks that `aos` is [N, k], contiguous, with aos[i, j] == cols[j][i].
void expect_interleaved(const std::vector<tensor>& cols, const tensor& aos) {
  const std::int64_t n = cols[0].dim(0);
  const auto k = static_cast<std::int64_t>(cols.size());
  const std::size_t elem = loom::size_of(cols[0].type());
  ASSERT_EQ(aos.shape(), (shape{n, k}));
  ASSERT_TRUE(aos.is_contiguous());
  const auto* out = static_cast<const std::uint8_t*>(aos.raw_data());
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(std::memcmp(out + static_cast<std::size_t>(i * k + j) * elem,
                            element(cols[static_cast<std::size_t>(j)], {i}), elem),
                0)
          << "row " << i << " column " << j;
    }
  }
}

TEST(deinterleave, every_size_k_1_to_9_and_odd_lengths) {
  for (dtype t : dtypes) {
    for (std::int64_t k = 1; k <= 9; ++k) {
      for (std::int64_t n : {0, 1, 2, 7, 1001, 5003}) {
        SCOPED_TRACE(testing::Message() << loom::to_string(t) << " k=" << k << " n=" << n);
        tensor aos = host_tensor(t, shape{n, k});
        randomize(aos, static_cast<std::uint32_t>(n * 31 + k));
        expect_columns_of(aos, deinterleave(aos));
        // And back.
        expect_interleaved(deinterleave(aos), interleave(deinterleave(aos)));
        if (n > 0) {
          const tensor back = interleave(deinterleave(aos));
          EXPECT_EQ(std::memcmp(back.raw_data(), aos.raw_data(), aos.nbytes()), 0);
        }
      }
    }
  }
}

TEST(deinterleave, non_contiguous_views) {
  for (dtype t : {dtype::u8, dtype::f16, dtype::f32, dtype::f64}) {
    for (std::int64_t k : {1, 2, 3, 4, 5, 8}) {
      const std::int64_t n = 777;
      SCOPED_TRACE(testing::Message() << loom::to_string(t) << " k=" << k);
      // A transposed view: base is [k, n], the view [n, k] with strides {1, n}.
      tensor base = host_tensor(t, shape{k, n});
      randomize(base, 7);
      const tensor transposed = tensor::strided(base.buf(), t, shape{n, k}, shape{1, n}, 0);
      expect_columns_of(transposed, deinterleave(transposed));
      // Columns 1..k of a wider [n, k + 3] buffer (rows strided, columns dense).
      tensor wide = host_tensor(t, shape{n, k + 3});
      randomize(wide, 8);
      const tensor slice = tensor::strided(wide.buf(), t, shape{n, k}, shape{k + 3, 1}, 1);
      expect_columns_of(slice, deinterleave(slice));
      // Rows reversed (a negative stride) and every other column.
      tensor two = host_tensor(t, shape{n, 2 * k});
      randomize(two, 9);
      const tensor reversed =
          tensor::strided(two.buf(), t, shape{n, k}, shape{-2 * k, 2}, (n - 1) * 2 * k);
      expect_columns_of(reversed, deinterleave(reversed));
      // One row broadcast to n (row stride 0).
      tensor row = host_tensor(t, shape{k});
      randomize(row, 10);
      const tensor broadcast = tensor::strided(row.buf(), t, shape{n, k}, shape{0, 1}, 0);
      expect_columns_of(broadcast, deinterleave(broadcast));
    }
  }
}

TEST(deinterleave, on_a_thread_pool) {
  thread_pool pool(3, "layout-test");
  for (dtype t : {dtype::i8, dtype::f16, dtype::f32, dtype::f64}) {
    for (std::int64_t k : {2, 3, 4, 5, 8, 9}) {
      SCOPED_TRACE(testing::Message() << loom::to_string(t) << " k=" << k);
      const std::int64_t n = 300001;
      tensor aos = host_tensor(t, shape{n, k});
      randomize(aos, 11);
      const auto cols = deinterleave(aos, &pool);
      expect_columns_of(aos, cols);
      const tensor back = interleave(cols, &pool);
      EXPECT_EQ(std::memcmp(back.raw_data(), aos.raw_data(), aos.nbytes()), 0);
    }
  }
}

TEST(interleave, strided_and_mixed_columns) {
  for (dtype t : {dtype::i8, dtype::f16, dtype::i32, dtype::i64}) {
    for (std::size_t k : {1u, 2u, 3u, 4u, 7u, 8u}) {
      const std::int64_t n = 513;
      SCOPED_TRACE(testing::Message() << loom::to_string(t) << " k=" << k);
      std::vector<tensor> cols;
      for (std::size_t j = 0; j < k; ++j) {
        if (j % 2 == 0) {
          tensor c = host_tensor(t, shape{n});
          randomize(c, static_cast<std::uint32_t>(j));
          cols.push_back(c);
        } else {
          // Every third element of a longer buffer.
          tensor b = host_tensor(t, shape{3 * n});
          randomize(b, static_cast<std::uint32_t>(j));
          cols.push_back(tensor::strided(b.buf(), t, shape{n}, shape{3}, 2));
        }
      }
      expect_interleaved(cols, interleave(cols));
      // All strided (no column dense).
      std::vector<tensor> strided;
      for (std::size_t j = 0; j < k; ++j) {
        tensor b = host_tensor(t, shape{2 * n});
        randomize(b, static_cast<std::uint32_t>(100 + j));
        strided.push_back(tensor::strided(b.buf(), t, shape{n}, shape{2}, 0));
      }
      expect_interleaved(strided, interleave(strided));
    }
  }
}

TEST(interleave, empty_and_single_rows) {
  for (std::int64_t n : {0, 1}) {
    std::vector<tensor> cols = {host_tensor(dtype::f32, shape{n}),
                                host_tensor(dtype::f32, shape{n}),
                                host_tensor(dtype::f32, shape{n})};
    for (auto& c : cols) randomize(c, 3);
    const tensor out = interleave(cols);
    EXPECT_EQ(out.shape(), (shape{n, 3}));
    expect_interleaved(cols, out);
  }
  // [N, 0] splits into no columns.
  EXPECT_TRUE(deinterleave(host_tensor(dtype::f32, shape{5, 0})).empty());
}

template <class F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to mention: " << needle;
  }
}

tensor on_fake_gpu(dtype t, shape s) {
  static std::uint8_t fake[256];
  return tensor(loom::buffer::adopt(fake, sizeof fake, 16, {loom::device_type::cuda, 0}, {},
                                    nullptr, nullptr),
                t, std::move(s));
}

TEST(deinterleave, errors) {
  expect_invalid([] { (void)deinterleave(tensor()); }, "undefined");
  expect_invalid([] { (void)deinterleave(host_tensor(dtype::f32, shape{6})); },
                 "needs an [N, k] tensor, got float32[6]");
  expect_invalid(
      [] {
        (void)deinterleave(host_tensor(dtype::f32, shape{2, 3, 4}));
      },
      "got float32[2, 3, 4]");
  expect_invalid(
      [] {
        (void)deinterleave(on_fake_gpu(dtype::f32, shape{4, 2}));
      },
      "the CPU cannot read");
}

TEST(interleave, errors) {
  expect_invalid([] { (void)interleave({}); }, "no columns");
  expect_invalid(
      [] {
        (void)interleave({host_tensor(dtype::f32, shape{3}), tensor()});
      },
      "column 1 is undefined");
  expect_invalid(
      [] {
        (void)interleave({host_tensor(dtype::f32, shape{3}), host_tensor(dtype::f32, shape{3, 1})});
      },
      "column 1 is float32[3, 1]");
  expect_invalid(
      [] {
        (void)interleave({host_tensor(dtype::f32, shape{3}), host_tensor(dtype::f64, shape{3})});
      },
      "column 1 is float64[3] on cpu:0 but column 0 is float32[3]");
  expect_invalid(
      [] {
        (void)interleave({host_tensor(dtype::f32, shape{3}), host_tensor(dtype::f32, shape{4})});
      },
      "column 1 has 4 values but column 0 has 3");
  expect_invalid(
      [] {
        (void)interleave({host_tensor(dtype::f32, shape{4}), on_fake_gpu(dtype::f32, shape{4})});
      },
      "column 1: float32[4] on cuda:0 is in memory the CPU cannot read");
}

// ---- records ----------------------------------------------------------------------------

// Random records (bool fields 0/1), and the expected columns read by hand.
std::vector<std::uint8_t> random_records(std::int64_t n, std::size_t record_size,
                                         const std::vector<field>& fields, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> rec(static_cast<std::size_t>(n) * record_size + 1);
  for (auto& b : rec) b = static_cast<std::uint8_t>(rng());
  for (const field& f : fields) {
    if (f.type != dtype::boolean) continue;
    for (std::int64_t i = 0; i < n; ++i)
      rec[static_cast<std::size_t>(i) * record_size + f.offset] &= 1;
  }
  return rec;
}

void expect_table_of_records(const table& tab, const std::uint8_t* rec, std::int64_t n,
                             std::size_t record_size, const std::vector<field>& fields) {
  ASSERT_EQ(tab.num_columns(), fields.size());
  for (std::size_t j = 0; j < fields.size(); ++j) {
    const field& f = fields[j];
    const tensor& c = tab.columns[j];
    EXPECT_EQ(tab.names[j], f.name);
    ASSERT_EQ(c.type(), f.type);
    ASSERT_EQ(c.shape(), (shape{n}));
    const std::size_t size = loom::size_of(f.type);
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(element(c, {i}),
                            rec + static_cast<std::size_t>(i) * record_size + f.offset, size),
                0)
          << f.name << " row " << i;
    }
  }
}

struct record_layout {
  const char* label;
  std::size_t record_size;
  std::vector<field> fields;
};

// NumPy's layouts: packed ('<f8', '<f4', '<i4' = 16 bytes), aligned with padding
// (align=True, as a C struct), and packed with unaligned fields.
const std::vector<record_layout>& layouts() {
  static const std::vector<record_layout> l = {
      {"packed 16", 16, {{"t", dtype::f64, 0}, {"x", dtype::f32, 8}, {"id", dtype::i32, 12}}},
      {"aligned 24 with padding",
       24,
       {{"t", dtype::f64, 0},
        {"c", dtype::i8, 8},
        {"x", dtype::f32, 12},
        {"ok", dtype::boolean, 16},
        {"h", dtype::f16, 18},
        {"id", dtype::i32, 20}}},
      {"packed unaligned 13",
       13,
       {{"c", dtype::u8, 0}, {"t", dtype::f64, 1}, {"id", dtype::i32, 9}}},
      {"fields out of order, trailing padding",
       32,
       {{"b", dtype::i64, 16}, {"a", dtype::bf16, 2}, {"z", dtype::f32, 8}}},
  };
  return l;
}

TEST(records_to_columns, layouts_and_lengths) {
  for (const auto& l : layouts()) {
    for (std::int64_t n : {0, 1, 2, 999, 4097}) {
      SCOPED_TRACE(testing::Message() << l.label << " n=" << n);
      const auto rec = random_records(n, l.record_size, l.fields, static_cast<std::uint32_t>(n));
      const table tab = records_to_columns(rec.data(), n, l.record_size, l.fields);
      expect_table_of_records(tab, rec.data(), n, l.record_size, l.fields);

      // Back into records over a buffer of 0xEE: field bytes written, padding untouched.
      std::vector<std::uint8_t> out(rec.size(), 0xEE);
      columns_to_records(tab, out.data(), l.record_size, l.fields);
      std::vector<bool> covered(l.record_size, false);
      for (const field& f : l.fields) {
        for (std::size_t b = 0; b < loom::size_of(f.type); ++b) covered[f.offset + b] = true;
      }
      for (std::size_t i = 0; i < static_cast<std::size_t>(n) * l.record_size; ++i) {
        const std::size_t in_record = i % l.record_size;
        ASSERT_EQ(out[i], covered[in_record] ? rec[i] : 0xEE) << "byte " << i;
      }
      EXPECT_EQ(out.back(), 0xEE) << "wrote past the last record";
    }
  }
}

TEST(records_to_columns, on_a_thread_pool) {
  thread_pool pool(3, "layout-test");
  for (const auto& l : layouts()) {
    SCOPED_TRACE(l.label);
    const std::int64_t n = 400003;
    const auto rec = random_records(n, l.record_size, l.fields, 5);
    const table tab = records_to_columns(rec.data(), n, l.record_size, l.fields, &pool);
    expect_table_of_records(tab, rec.data(), n, l.record_size, l.fields);
    std::vector<std::uint8_t> out(rec.size(), 0);
    columns_to_records(tab, out.data(), l.record_size, l.fields, &pool);
    const table again = records_to_columns(out.data(), n, l.record_size, l.fields);
    for (std::size_t j = 0; j < l.fields.size(); ++j) {
      EXPECT_EQ(std::memcmp(again.columns[j].raw_data(), tab.columns[j].raw_data(),
                            tab.columns[j].nbytes()),
                0);
    }
  }
}

TEST(columns_to_records, strided_columns_extra_columns_and_any_order) {
  const std::int64_t n = 301;
  tensor base = host_tensor(dtype::f64, shape{2 * n});
  randomize(base, 1);
  tensor ids = host_tensor(dtype::i32, shape{n});
  randomize(ids, 2);
  table tab;
  tab.add("unused", host_tensor(dtype::i8, shape{n}));
  tab.add("id", ids);
  tab.add("t", tensor::strided(base.buf(), dtype::f64, shape{n}, shape{2}, 1));
  const std::vector<field> fields = {{"t", dtype::f64, 0}, {"id", dtype::i32, 8}};
  std::vector<std::uint8_t> out(static_cast<std::size_t>(n) * 12);
  columns_to_records(tab, out.data(), 12, fields);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(out.data() + i * 12, element(tab.columns[2], {i}), 8), 0);
    EXPECT_EQ(std::memcmp(out.data() + i * 12 + 8, element(ids, {i}), 4), 0);
  }
}

TEST(records_to_columns, errors) {
  std::vector<std::uint8_t> rec(64);
  const std::vector<field> ok = {{"a", dtype::f32, 0}, {"b", dtype::i32, 4}};
  expect_invalid([&] { (void)records_to_columns(rec.data(), -1, 8, ok); },
                 "negative record count -1");
  expect_invalid([&] { (void)records_to_columns(rec.data(), 2, 0, ok); }, "record_size is 0");
  expect_invalid([&] { (void)records_to_columns(nullptr, 2, 8, ok); }, "data is null but n is 2");
  expect_invalid([&] { (void)records_to_columns(rec.data(), 2, 8, {}); }, "no fields");
  expect_invalid(
      [&] {
        (void)records_to_columns(rec.data(), 2, 8, {{"a", dtype::f32, 0}, {"b", dtype::f64, 4}});
      },
      "field 'b' (float64 at byte offset 4) ends at byte 12, past the end of the 8-byte record");
  expect_invalid(
      [&] {
        (void)records_to_columns(rec.data(), 2, 8, {{"a", dtype::f32, 9}});
      },
      "field 'a' (float32 at byte offset 9) ends at byte 13");
  expect_invalid(
      [&] {
        (void)records_to_columns(
            rec.data(), 2, 16, {{"a", dtype::f64, 0}, {"z", dtype::i8, 12}, {"b", dtype::i32, 6}});
      },
      "fields 'a' (float64, bytes [0, 8)) and 'b' (int32, bytes [6, 10)) overlap");
  expect_invalid(
      [&] {
        (void)records_to_columns(rec.data(), 2, 8, {{"a", dtype::f32, 0}, {"a", dtype::i32, 4}});
      },
      "two fields are named 'a'");
}

TEST(columns_to_records, errors_write_nothing) {
  std::vector<std::uint8_t> rec(64, 0x5A);
  const std::vector<std::uint8_t> before = rec;
  table tab;
  tab.add("a", host_tensor(dtype::f32, shape{3}));
  tab.add("b", host_tensor(dtype::i32, shape{3}));
  randomize(tab.columns[0], 1);
  randomize(tab.columns[1], 2);
  const std::vector<field> ok = {{"a", dtype::f32, 0}, {"b", dtype::i32, 4}};
  expect_invalid(
      [&] {
        columns_to_records(tab, rec.data(), 8, {{"a", dtype::f32, 0}, {"c", dtype::i32, 4}});
      },
      "field 'c' has no column of that name; the table has a, b");
  expect_invalid(
      [&] {
        columns_to_records(tab, rec.data(), 8, {{"a", dtype::f32, 0}, {"b", dtype::f32, 4}});
      },
      "field 'b' is float32 but its column is int32[3]");
  expect_invalid([&] { columns_to_records(tab, nullptr, 8, ok); },
                 "data is null but the table has 3 rows");
  expect_invalid([&] { columns_to_records(tab, rec.data(), 6, ok); },
                 "past the end of the 6-byte record");
  table ragged = tab;
  ragged.add("c", host_tensor(dtype::f32, shape{4}));
  expect_invalid([&] { columns_to_records(ragged, rec.data(), 8, ok); },
                 "column 'c' (#2) has 4 rows but column 'a' has 3");
  table gpu;
  gpu.add("a", on_fake_gpu(dtype::f32, shape{3}));
  expect_invalid(
      [&] {
        columns_to_records(gpu, rec.data(), 8, {{"a", dtype::f32, 0}});
      },
      "column 'a': float32[3] on cuda:0 is in memory the CPU cannot read");
  EXPECT_EQ(rec, before);
}

}  // namespace
