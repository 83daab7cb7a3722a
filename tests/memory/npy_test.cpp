// .npy reading and writing, against files NumPy 1.24 wrote (tests/data/npy, made once with
// np.save / numpy.lib.format.write_array; the values are spelled out below) and against
// naive index loops for non-contiguous tensors.
#include "loom/memory/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace {

using loom::dtype;
using loom::shape;
using loom::tensor;
using loom::memory::host_tensor;
using loom::memory::parse_npy;
using loom::memory::read_npy;
using loom::memory::to_npy;
using loom::memory::write_npy;

std::string data_path(const std::string& name) {
  return std::string(LOOM_TEST_DATA_DIR) + "/npy/" + name;
}

std::vector<std::byte> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

std::vector<std::byte> as_bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

template <class T>
std::vector<T> values_of(const tensor& t) {
  EXPECT_TRUE(t.is_contiguous());
  const T* p = t.data<T>();
  return std::vector<T>(p, p + t.num_elements());
}

// The elements of `t` in row-major order, by walking every index (independent of
// copy_to_dense).
std::vector<std::byte> dense_reference(const tensor& t) {
  const std::size_t size = loom::size_of(t.type());
  const auto n = t.num_elements();
  std::vector<std::byte> out(static_cast<std::size_t>(n) * size);
  std::vector<std::int64_t> index(t.rank(), 0);
  const auto* base = static_cast<const std::byte*>(t.buf()->data());
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = t.offset();
    for (std::size_t k = 0; k < t.rank(); ++k) off += index[k] * t.strides()[k];
    std::memcpy(out.data() + static_cast<std::size_t>(i) * size,
                base + off * static_cast<std::int64_t>(size), size);
    for (std::size_t k = t.rank(); k-- > 0;) {
      if (++index[k] < t.dim(k)) break;
      index[k] = 0;
    }
  }
  return out;
}

// A host tensor of `t` and `s` with pseudo-random bytes (bool: 0 or 1).
tensor random_tensor(dtype t, const shape& s, std::uint32_t seed) {
  tensor out = host_tensor(t, s);
  std::mt19937 rng(seed);
  auto* p = static_cast<unsigned char*>(out.raw_data());
  for (std::size_t i = 0; i < out.nbytes(); ++i) {
    p[i] = static_cast<unsigned char>(t == dtype::boolean ? rng() & 1u : rng() & 0xffu);
  }
  return out;
}

// A .npy image with the given header dict text (padded as NumPy pads), version and data.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t len = header.size();
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  if (major != 1) out += std::string(2, '\0');
  return out + header + data;
}

std::string f32_data(std::initializer_list<float> v) {
  std::string out(v.size() * 4, '\0');
  std::memcpy(out.data(), v.begin(), out.size());
  return out;
}

// Expects parse_npy(bytes) to throw loom::parse_error (line 0) whose message contains `part`.
void expect_parse_error(const std::string& bytes, const std::string& part) {
  try {
    (void)parse_npy(as_bytes(bytes));
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const loom::parse_error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_EQ(e.line(), 0u);
  }
}

constexpr dtype npy_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::i32,
                               dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};

// ---- files NumPy wrote -------------------------------------------------------------------

TEST(NpyRead, Float32WithSpecialValues) {
  const tensor t = read_npy(data_path("f32_2x3.npy"));
  EXPECT_EQ(t.type(), dtype::f32);
  EXPECT_EQ(t.shape(), (shape{2, 3}));
  const auto v = values_of<float>(t);
  EXPECT_EQ(v[0], -1.5f);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[1]), 0u);
  EXPECT_EQ(v[2], 0.1f);
  EXPECT_TRUE(std::isnan(v[3]));
  EXPECT_EQ(v[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[5]), 0x80000000u);  // -0.0
}

TEST(NpyRead, EveryOtherDtype) {
  {
    const tensor t = read_npy(data_path("f64_5.npy"));
    EXPECT_EQ(t.type(), dtype::f64);
    EXPECT_EQ(values_of<double>(t),
              (std::vector<double>{1e-300, -2.5, 3.141592653589793,
                                   -std::numeric_limits<double>::infinity(), 1e300}));
  }
  {
    const tensor t = read_npy(data_path("f16_4.npy"));
    EXPECT_EQ(t.type(), dtype::f16);
    std::vector<std::uint16_t> bits;
    for (auto h : values_of<loom::half>(t)) bits.push_back(h.bits);
    EXPECT_EQ(bits, (std::vector<std::uint16_t>{0x3c00, 0xc000, 0x3800, 0x7bff}));
  }
  {
    const tensor t = read_npy(data_path("i32_3x2.npy"));
    EXPECT_EQ(t.shape(), (shape{3, 2}));
    EXPECT_EQ(values_of<std::int32_t>(t),
              (std::vector<std::int32_t>{INT32_MIN, -1, 0, 1, 2, INT32_MAX}));
  }
  EXPECT_EQ(values_of<std::int64_t>(read_npy(data_path("i64_4.npy"))),
            (std::vector<std::int64_t>{INT64_MIN, -1, 0, INT64_MAX}));
  EXPECT_EQ(values_of<std::int8_t>(read_npy(data_path("i8_4.npy"))),
            (std::vector<std::int8_t>{-128, -1, 0, 127}));
  {
    const tensor t = read_npy(data_path("u8_2x2.npy"));
    EXPECT_EQ(t.shape(), (shape{2, 2}));
    EXPECT_EQ(values_of<std::uint8_t>(t), (std::vector<std::uint8_t>{0, 1, 254, 255}));
  }
  EXPECT_EQ(values_of<bool>(read_npy(data_path("bool_5.npy"))),
            (std::vector<bool>{true, false, false, true, true}));
}

TEST(NpyRead, ScalarEmptyAndRank3) {
  const tensor scalar = read_npy(data_path("f64_scalar.npy"));
  EXPECT_EQ(scalar.rank(), 0u);
  EXPECT_EQ(*scalar.data<double>(), 2.5);

  const tensor empty = read_npy(data_path("f32_empty_0x3.npy"));
  EXPECT_EQ(empty.type(), dtype::f32);
  EXPECT_EQ(empty.shape(), (shape{0, 3}));
  EXPECT_EQ(empty.num_elements(), 0);

  const tensor t = read_npy(data_path("f32_2x3x4.npy"));
  EXPECT_EQ(t.shape(), (shape{2, 3, 4}));
  const auto v = values_of<float>(t);
  for (std::size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], static_cast<float>(i) * 0.25f - 3.0f) << i;
  }
}

TEST(NpyRead, FortranOrderIsReadIntoCOrder) {
  // np.asfortranarray(np.arange(6).reshape(2, 3)): the file holds 0 3 1 4 2 5.
  const tensor t = read_npy(data_path("i32_fortran_2x3.npy"));
  EXPECT_EQ(t.shape(), (shape{2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(values_of<std::int32_t>(t), (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(NpyRead, Versions2And3) {
  const tensor v2 = read_npy(data_path("f32_v2.npy"));
  EXPECT_EQ(values_of<float>(v2), (std::vector<float>{0, 1, 2, 3}));
  const tensor v3 = read_npy(data_path("u8_v3.npy"));
  EXPECT_EQ(values_of<std::uint8_t>(v3), (std::vector<std::uint8_t>{7, 8, 9}));
}

TEST(NpyRead, RefusesBigEndianAndUnsupportedDtypes) {
  try {
    (void)read_npy(data_path("f32_big_endian.npy"));
    ADD_FAILURE() << "big-endian file accepted";
  } catch (const loom::parse_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("big-endian"), std::string::npos) << what;
    EXPECT_NE(what.find("f32_big_endian.npy"), std::string::npos) << what;  // names the file
  }
  try {
    (void)read_npy(data_path("c64_2.npy"));
    ADD_FAILURE() << "complex file accepted";
  } catch (const loom::parse_error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype '<c8'"), std::string::npos) << e.what();
  }
}

TEST(NpyRead, MissingFileIsNotFound) {
  EXPECT_THROW((void)read_npy(data_path("no_such_file.npy")), loom::not_found);
}

// ---- writing -----------------------------------------------------------------------------

TEST(NpyWrite, BytesMatchNumpy) {
  // Every C-order version-1.0 file above, read and written back, is byte for byte what
  // np.save wrote (header text, padding, growth space, data).
  for (const char* name :
       {"f32_2x3.npy", "f64_5.npy", "f16_4.npy", "i32_3x2.npy", "i64_4.npy", "i8_4.npy",
        "u8_2x2.npy", "bool_5.npy", "f64_scalar.npy", "f32_empty_0x3.npy", "f32_2x3x4.npy"}) {
    const auto expected = file_bytes(data_path(name));
    EXPECT_EQ(to_npy(read_npy(data_path(name))), expected) << name;
  }
  // The Fortran-order file is written in C order: the same as NumPy's C-order file of the
  // same values would be.
  const tensor f = read_npy(data_path("i32_fortran_2x3.npy"));
  const auto bytes = to_npy(f);
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  EXPECT_NE(text.find("'fortran_order': False, 'shape': (2, 3), }"), std::string::npos);
}

TEST(NpyWrite, RoundTripsEveryDtypeAndShape) {
  std::uint32_t seed = 1;
  for (dtype t : npy_types) {
    for (const shape& s : {shape{}, shape{0}, shape{7}, shape{3, 0, 2}, shape{2, 3, 5},
                           shape{1, 1, 1, 1, 1, 1, 1, 2}}) {
      const tensor src = random_tensor(t, s, seed++);
      const auto bytes = to_npy(src);
      EXPECT_EQ((bytes.size() - src.nbytes()) % 64, 0u) << "data starts 64-byte aligned";
      const tensor back = parse_npy(bytes);
      EXPECT_EQ(back.type(), t);
      EXPECT_EQ(back.shape(), s);
      ASSERT_EQ(back.nbytes(), src.nbytes());
      EXPECT_EQ(std::memcmp(back.raw_data(), src.raw_data(), src.nbytes()), 0)
          << loom::to_string(t) << loom::to_string(s);
    }
  }
}

TEST(NpyWrite, NonContiguousTensorsAreWrittenDense) {
  std::uint32_t seed = 100;
  for (dtype t : npy_types) {
    const tensor base = random_tensor(t, shape{4, 6}, seed++);
    const std::vector<tensor> views = {
        // transpose
        tensor::strided(base.buf(), t, shape{6, 4}, shape{1, 6}, 0),
        // every other column of rows 1..3, from an offset
        tensor::strided(base.buf(), t, shape{3, 3}, shape{6, 2}, 7),
        // a broadcast row (stride 0)
        tensor::strided(base.buf(), t, shape{5, 6}, shape{0, 1}, 6),
        // reversed rows (negative stride)
        tensor::strided(base.buf(), t, shape{4, 6}, shape{-6, 1}, 18),
    };
    for (const tensor& v : views) {
      ASSERT_FALSE(v.is_contiguous());
      const auto expected = dense_reference(v);
      const tensor back = parse_npy(to_npy(v));
      EXPECT_EQ(back.shape(), v.shape());
      ASSERT_EQ(back.nbytes(), expected.size());
      EXPECT_EQ(std::memcmp(back.raw_data(), expected.data(), expected.size()), 0)
          << loom::to_string(t) << " strides " << loom::to_string(v.strides());

      const auto path = std::filesystem::temp_directory_path() /
                        ("loom_npy_test_" + std::to_string(::getpid()) + ".npy");
      write_npy(v, path.string());
      EXPECT_EQ(file_bytes(path.string()), to_npy(v));
      const tensor from_file = read_npy(path.string());
      EXPECT_EQ(std::memcmp(from_file.raw_data(), expected.data(), expected.size()), 0);
      std::filesystem::remove(path);
    }
  }
}

TEST(NpyWrite, RefusesBfloat16AndUndefinedTensors) {
  try {
    (void)to_npy(host_tensor(dtype::bf16, shape{2}));
    ADD_FAILURE() << "bfloat16 written";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cast"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)to_npy(tensor()), loom::invalid_argument);
  std::vector<float> memory(2);
  const tensor on_device(
      loom::buffer::adopt(memory.data(), sizeof(float) * 2, alignof(float),
                          loom::device_id{loom::device_type::cuda, 0}, {}, nullptr, nullptr),
      dtype::f32, shape{2});
  try {
    (void)to_npy(on_device);
    ADD_FAILURE() << "wrote a device tensor";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("host-accessible"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_npy(tensor(), "/nonexistent/x.npy"), loom::invalid_argument);
  EXPECT_THROW(write_npy(host_tensor(dtype::f32, shape{1}), "/nonexistent/dir/x.npy"), loom::error);
}

// ---- malformed input ---------------------------------------------------------------------

constexpr const char* good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";

TEST(NpyMalformed, TheHandMadeBaselineParses) {
  const tensor t = parse_npy(as_bytes(make_npy(good_dict, f32_data({1.5f, -2.0f}))));
  EXPECT_EQ(values_of<float>(t), (std::vector<float>{1.5f, -2.0f}));
  // Other spellings NumPy's reader takes: double quotes, no trailing comma, line breaks,
  // keys in any order, '?' for bool, Python 2's 3L in versions 1 and 2.
  EXPECT_EQ(parse_npy(as_bytes(make_npy("{\"shape\": (2,),\n \"fortran_order\": False, "
                                        "\"descr\": \"<f4\"}",
                                        f32_data({1, 2}))))
                .shape(),
            (shape{2}));
  EXPECT_EQ(parse_npy(as_bytes(make_npy("{'descr': '?', 'fortran_order': False, 'shape': (3,)}",
                                        std::string("\1\0\1", 3))))
                .type(),
            dtype::boolean);
  EXPECT_EQ(parse_npy(as_bytes(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1L, "
                                        "2L), }",
                                        f32_data({1, 2}), 2)))
                .shape(),
            (shape{1, 2}));
}

TEST(NpyRead, EmptyFortranOrderArraysWithHugeDimensionsAreEmpty) {
  // No data, so any dimension is legal next to a 0; the Fortran-order strides of such a shape
  // must not overflow on the way to the (empty) C-order copy.
  const tensor t = parse_npy(as_bytes(make_npy(
      "{'descr': '<i4', 'fortran_order': True, 'shape': (2223636840222363684, 1, 0, 0, 1, 0), }",
      "")));
  EXPECT_EQ(t.shape(), (shape{2223636840222363684, 1, 0, 0, 1, 0}));
  EXPECT_EQ(t.num_elements(), 0);
}

TEST(NpyMalformed, Preamble) {
  expect_parse_error("", "not a .npy file");
  expect_parse_error("\x93NUMPZ\x01\x00", "not a .npy file");
  expect_parse_error("PK\x03\x04 a zip", "not a .npy file");
  expect_parse_error("\x93NUMPY\x01", "truncated");
  expect_parse_error(std::string("\x93NUMPY\x01\x00\x10", 9), "header length");
  std::string v4 = make_npy(good_dict, f32_data({1, 2}));
  v4[6] = 4;
  expect_parse_error(v4, "version 4.0");
  std::string v11 = make_npy(good_dict, f32_data({1, 2}));
  v11[7] = 1;
  expect_parse_error(v11, "version 1.1");
  // The header length says more than the file holds.
  std::string long_header = make_npy(good_dict, "");
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  expect_parse_error(long_header, "truncated header");
}

TEST(NpyMalformed, HeaderSyntax) {
  const std::string data = f32_data({1, 2});
  const std::pair<const char*, const char*> cases[] = {
      {"'descr': '<f4'", "must be a dict"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':'"},
      {"{'descr': '<f4", "unterminated string"},
      {"{'descr': <f4, 'fortran_order': False, 'shape': (2,)}", "a quoted string"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "text after the header"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "'shape' as a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "expected a dimension"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,,)}", "expected a dimension"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "too large"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "expected ',' or '}'"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2,)}", "escapes"},
      {"{'fortran_order': False, 'shape': (2,)}", "no 'descr'"},
      {"{'descr': '<f4', 'shape': (2,)}", "no 'fortran_order'"},
      {"{'descr': '<f4', 'fortran_order': False}", "no 'shape'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "unexpected key"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured"},
      {"{'descr': '|f4', 'fortran_order': False, 'shape': (2,)}", "no byte order"},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype '<i2'"},
      {"{'descr': '<U1', 'fortran_order': False, 'shape': (2,)}", "unsupported dtype"},
  };
  for (const auto& [dict, part] : cases) {
    SCOPED_TRACE(dict);
    expect_parse_error(make_npy(dict, data), part);
  }
  // 3L is Python 2; version 3.0 headers are Python 3.
  expect_parse_error(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2L,)}", data, 3),
                     "expected ',' or ')'");
}

TEST(NpyMalformed, DataSizeAndValues) {
  const std::string data = f32_data({1, 2});
  expect_parse_error(make_npy(good_dict, data.substr(0, 7)), "truncated");
  expect_parse_error(make_npy(good_dict, ""), "needs 8 bytes of data, the file has 0");
  expect_parse_error(make_npy(good_dict, data + "x"), "needs 8 bytes of data, the file has 9");
  expect_parse_error(
      make_npy("{'descr': '|b1', 'fortran_order': False, 'shape': (3,)}", std::string("\1\2\0", 3)),
      "bool element 1 is 2");
  // No elements, but dimensions whose product would overflow: refused as NumPy refuses.
  expect_parse_error(make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (0, "
                              "4611686018427387904, 4)}",
                              ""),
                     "too large");
  // An empty array of a huge but representable shape is fine.
  EXPECT_EQ(parse_npy(as_bytes(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, "
                                        "1099511627776)}",
                                        "")))
                .shape(),
            (shape{0, 1099511627776}));
}

TEST(NpyMalformed, ReadNpyNamesTheFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("loom_npy_bad_" + std::to_string(::getpid()) + ".npy");
  {
    std::ofstream out(path, std::ios::binary);
    const std::string bytes = make_npy(good_dict, "abc");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    (void)read_npy(path.string());
    ADD_FAILURE() << "truncated file read";
  } catch (const loom::parse_error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
