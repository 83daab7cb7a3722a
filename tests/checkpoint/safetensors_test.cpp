// safetensors reading and writing: round trips of every dtype and layout, the header as
// the format specifies it (read back with nlohmann-json, not with loom's reader), a file
// written by tests/data/safetensors/make_reference.py (values re-computed here from the
// script's formulas), every malformed input as a parse_error naming the problem, and the
// atomic replacement of files.
#include "loom/checkpoint/safetensors.hpp"

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_test_support.hpp"
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace {

namespace fs = std::filesystem;
using loom::dtype;
using loom::shape;
using loom::tensor;
using loom::checkpoint::load_safetensors;
using loom::checkpoint::parse_safetensors;
using loom::checkpoint::safetensors_file;
using loom::checkpoint::save_safetensors;
using loom::checkpoint::to_safetensors;
using loom::memory::host_tensor;
using named = std::vector<std::pair<std::string, tensor>>;

constexpr dtype all_dtypes[] = {dtype::f64, dtype::f32, dtype::f16, dtype::bf16,   dtype::i64,
                                dtype::i32, dtype::i8,  dtype::u8,  dtype::boolean};

std::vector<std::byte> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_bytes(const fs::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out) << path;
}

// A file image: the 8-byte little-endian length of `header`, `header`, `data`.
std::vector<std::byte> image(const std::string& header, const std::vector<std::byte>& data = {},
                             std::uint64_t length_override = 0, bool override_length = false) {
  const std::uint64_t n = override_length ? length_override : header.size();
  std::vector<std::byte> out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

std::vector<std::byte> zeros(std::size_t n) {
  return std::vector<std::byte>(n);
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

std::vector<std::byte> bytes_of(const tensor& t) {
  EXPECT_TRUE(t.is_contiguous());
  std::vector<std::byte> out(t.nbytes());
  if (!out.empty()) std::memcpy(out.data(), t.raw_data(), out.size());
  return out;
}

// A host tensor of `t` and `s` with pseudo-random bytes (bool: 0 or 1).
tensor random_tensor(dtype t, const shape& s, std::uint32_t seed) {
  tensor out = host_tensor(t, s);
  std::mt19937 gen(seed);
  auto* p = static_cast<unsigned char*>(out.raw_data());
  for (std::size_t i = 0; i < out.nbytes(); ++i) {
    p[i] = static_cast<unsigned char>(t == dtype::boolean ? gen() % 2 : gen() % 256);
  }
  return out;
}

// The message of the parse_error parsing `bytes` throws ("" and a failure when none).
std::string parse_failure(const std::vector<std::byte>& bytes) {
  try {
    (void)parse_safetensors(bytes, "test.safetensors");
  } catch (const loom::parse_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a parse_error";
  return "";
}

#define EXPECT_MESSAGE(bytes, ...)                                                            \
  do {                                                                                        \
    const std::string msg_ = parse_failure(bytes);                                            \
    for (const char* part_ : {__VA_ARGS__}) {                                                 \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << msg_; \
    }                                                                                         \
    EXPECT_EQ(msg_.rfind("test.safetensors: ", 0), 0u) << msg_;                               \
  } while (0)

void expect_same(const safetensors_file& f, const named& want) {
  ASSERT_EQ(f.tensors.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(f.tensors[i].first, want[i].first);
    const tensor& got = f.tensors[i].second;
    const tensor& w = want[i].second;
    EXPECT_EQ(got.type(), w.type());
    EXPECT_EQ(got.shape(), w.shape());
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(got.device(), (loom::device_id{loom::device_type::cpu, 0}));
    EXPECT_EQ(bytes_of(got), dense_reference(w));
  }
}

// A directory of its own under the temporary directory, removed at the end.
using loom::testing::temp_dir;
using loom::testing::temporaries;

// ---- round trips -------------------------------------------------------------------------

TEST(Safetensors, RoundTripsEveryDtype) {
  named tensors;
  std::uint32_t seed = 1;
  for (dtype t : all_dtypes) {
    tensors.emplace_back(std::string(loom::to_string(t)) + "_2x3",
                         random_tensor(t, {2, 3}, seed++));
  }
  const std::map<std::string, std::string> metadata{{"format", "loom"}, {"step", "1200"}};
  const auto bytes = to_safetensors(tensors, metadata);
  const auto f = parse_safetensors(bytes);
  expect_same(f, tensors);
  EXPECT_EQ(f.metadata, metadata);

  temp_dir dir;
  save_safetensors(dir.path() / "all.safetensors", tensors, metadata);
  EXPECT_EQ(file_bytes(dir.path() / "all.safetensors"), bytes);
  const auto loaded = load_safetensors(dir.path() / "all.safetensors");
  expect_same(loaded, tensors);
  EXPECT_EQ(loaded.metadata, metadata);
}

TEST(Safetensors, RoundTripsScalarsEmptyTensorsRank8AndNoTensors) {
  const named tensors{
      {"scalar", random_tensor(dtype::f64, {}, 1)},
      {"empty", host_tensor(dtype::f32, {0, 3})},
      {"empty_middle", host_tensor(dtype::i64, {4, 0, 2})},
      {"size1", random_tensor(dtype::i8, {1}, 2)},
      {"rank8", random_tensor(dtype::f32, {1, 2, 1, 2, 3, 1, 2, 2}, 3)},
      {"bool_scalar", random_tensor(dtype::boolean, {}, 4)},
      {"", random_tensor(dtype::u8, {3}, 5)},  // the format allows an empty name
  };
  expect_same(parse_safetensors(to_safetensors(tensors)), tensors);

  const auto none = parse_safetensors(to_safetensors({}));
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_TRUE(none.metadata.empty());
  const auto only_metadata = parse_safetensors(to_safetensors({}, {{"k", "v"}}));
  EXPECT_EQ(only_metadata.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
}

TEST(Safetensors, NonContiguousViewsAreWrittenDense) {
  const tensor base = random_tensor(dtype::f32, {3, 4}, 7);
  // The transpose (4x3, strides 1, 4), every other column (3x2, strides 4, 2, offset 1),
  // and a broadcast row (5x4 over 4 elements, strides 0, 1).
  const tensor transposed = tensor::strided(base.buf(), dtype::f32, {4, 3}, {1, 4}, 0);
  const tensor columns = tensor::strided(base.buf(), dtype::f32, {3, 2}, {4, 2}, 1);
  const tensor broadcast = tensor::strided(base.buf(), dtype::f32, {5, 4}, {0, 1}, 4);
  const tensor bf = random_tensor(dtype::bf16, {2, 3}, 8);
  const tensor bf_t = tensor::strided(bf.buf(), dtype::bf16, {3, 2}, {1, 3}, 0);
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_FALSE(columns.is_contiguous());
  ASSERT_FALSE(broadcast.is_contiguous());
  const named tensors{{"t", transposed}, {"c", columns}, {"b", broadcast}, {"bf", bf_t}};
  expect_same(parse_safetensors(to_safetensors(tensors)), tensors);
  temp_dir dir;
  save_safetensors(dir.path() / "views.safetensors", tensors);
  expect_same(load_safetensors(dir.path() / "views.safetensors"), tensors);
}

// The layout the format specifies, checked by reading the bytes with nlohmann-json.
TEST(Safetensors, WritesTheLayoutTheFormatSpecifies) {
  const tensor a = random_tensor(dtype::f16, {2, 2}, 1);  // 8 bytes
  const tensor b = random_tensor(dtype::i32, {3}, 2);     // 12 bytes
  const tensor c = host_tensor(dtype::boolean, {0});
  const auto bytes = to_safetensors({{"b", b}, {"a", a}, {"c", c}}, {{"format", "pt"}});
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<std::uint8_t>(bytes[static_cast<std::size_t>(i)]);
  ASSERT_EQ(n % 8, 0u) << "the header is padded to a multiple of 8";
  ASSERT_EQ(bytes.size(), 8 + n + 20);
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  const auto last = text.find_last_not_of(' ');
  EXPECT_EQ(text[last], '}');
  EXPECT_LT(text.size() - last - 1, 8u) << "padding is spaces, fewer than 8";
  const auto header = nlohmann::json::parse(text);
  EXPECT_EQ(header["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  EXPECT_EQ(header["b"]["dtype"], "I32");
  EXPECT_EQ(header["b"]["shape"], (nlohmann::json{3}));
  EXPECT_EQ(header["b"]["data_offsets"], (nlohmann::json{0, 12}));
  EXPECT_EQ(header["a"]["dtype"], "F16");
  EXPECT_EQ(header["a"]["shape"], (nlohmann::json{2, 2}));
  EXPECT_EQ(header["a"]["data_offsets"], (nlohmann::json{12, 20}));
  EXPECT_EQ(header["c"]["dtype"], "BOOL");
  EXPECT_EQ(header["c"]["data_offsets"], (nlohmann::json{20, 20}));
  // The data: b then a, as given.
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, b.raw_data(), 12), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 12, a.raw_data(), 8), 0);
  // The order given is the order read back.
  const auto f = parse_safetensors(bytes);
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].first, "b");
  EXPECT_EQ(f.tensors[1].first, "a");
  EXPECT_EQ(f.tensors[2].first, "c");
}

TEST(Safetensors, NamesAreEscapedJson) {
  const std::string odd = "layer.0/w \"q\"\\\n\x01 caf\xc3\xa9";
  const named tensors{{odd, random_tensor(dtype::f32, {2}, 1)}};
  const auto f = parse_safetensors(to_safetensors(tensors, {{"note\"", "a\nb"}}));
  expect_same(f, tensors);
  EXPECT_EQ(f.metadata.at("note\""), "a\nb");
}

// ---- a file from Python ------------------------------------------------------------------

template <class T>
std::vector<T> values_of(const tensor& t) {
  const T* p = t.data<T>();
  return std::vector<T>(p, p + t.num_elements());
}

TEST(Safetensors, ReadsTheReferenceFileFromPython) {
  const fs::path path = fs::path(LOOM_TEST_DATA_DIR) / "safetensors" / "reference.safetensors";
  const auto f = load_safetensors(path);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"},
                                                            {"source", "make_reference.py"}}));
  const std::vector<std::string> names{"f32_2x3", "f64_4",      "f16_5",     "bf16_3",
                                       "i64_3",   "i32_2x2",    "i8_4",      "u8_3",
                                       "bool_4",  "scalar_f32", "empty_0x2", "i32_2x3x4"};
  ASSERT_EQ(f.tensors.size(), names.size());
  std::map<std::string, tensor> by_name;
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, names[i]) << "header order";
    by_name[f.tensors[i].first] = f.tensors[i].second;
  }
  {
    const tensor& t = by_name["f32_2x3"];
    EXPECT_EQ(t.shape(), (shape{2, 3}));
    std::vector<float> want;
    for (int i = 0; i < 6; ++i) want.push_back(static_cast<float>(i) * 0.5f - 1.0f);
    EXPECT_EQ(values_of<float>(t), want);
  }
  {
    std::vector<double> want;
    for (int i = 0; i < 4; ++i) want.push_back(static_cast<double>(i) / 3.0);
    EXPECT_EQ(values_of<double>(by_name["f64_4"]), want);
  }
  {
    const tensor& t = by_name["f16_5"];
    ASSERT_EQ(t.type(), dtype::f16);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(static_cast<float>(t.data<loom::half>()[i]), static_cast<float>(i - 2) * 0.25f);
    }
  }
  {
    const tensor& t = by_name["bf16_3"];
    ASSERT_EQ(t.type(), dtype::bf16);
    const float want[] = {1.0f, -2.5f, 3.140625f};
    for (int i = 0; i < 3; ++i) {
      const std::uint16_t bits =
          static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(want[i]) >> 16);
      EXPECT_EQ(t.data<loom::bfloat16>()[i].bits, bits);
    }
  }
  EXPECT_EQ(values_of<std::int64_t>(by_name["i64_3"]),
            (std::vector<std::int64_t>{-(std::int64_t{1} << 40), 0, (std::int64_t{1} << 40) + 7}));
  EXPECT_EQ(by_name["i32_2x2"].shape(), (shape{2, 2}));
  EXPECT_EQ(values_of<std::int32_t>(by_name["i32_2x2"]),
            (std::vector<std::int32_t>{0, -3, -6, -9}));
  EXPECT_EQ(values_of<std::int8_t>(by_name["i8_4"]), (std::vector<std::int8_t>{-128, -1, 0, 127}));
  EXPECT_EQ(values_of<std::uint8_t>(by_name["u8_3"]), (std::vector<std::uint8_t>{0, 128, 255}));
  EXPECT_EQ(values_of<bool>(by_name["bool_4"]), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(by_name["scalar_f32"].shape(), shape{});
  EXPECT_EQ(values_of<float>(by_name["scalar_f32"]), (std::vector<float>{3.5f}));
  EXPECT_EQ(by_name["empty_0x2"].shape(), (shape{0, 2}));
  EXPECT_EQ(by_name["empty_0x2"].type(), dtype::f32);
  {
    const tensor& t = by_name["i32_2x3x4"];
    EXPECT_EQ(t.shape(), (shape{2, 3, 4}));
    std::vector<std::int32_t> want;
    for (int i = 0; i < 24; ++i) want.push_back(100 + i);
    EXPECT_EQ(values_of<std::int32_t>(t), want);
  }
  // The in-memory parser agrees with the file reader.
  const auto g = parse_safetensors(file_bytes(path));
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (std::size_t i = 0; i < g.tensors.size(); ++i) {
    EXPECT_EQ(bytes_of(g.tensors[i].second), bytes_of(f.tensors[i].second)) << names[i];
  }
}

// ---- malformed input ---------------------------------------------------------------------

TEST(Safetensors, EveryTruncationIsAParseError) {
  std::vector<std::vector<std::byte>> files{
      file_bytes(fs::path(LOOM_TEST_DATA_DIR) / "safetensors" / "reference.safetensors"),
      to_safetensors({{"a", random_tensor(dtype::f32, {2, 2}, 1)},
                      {"e", host_tensor(dtype::f32, {0})},
                      {"b", random_tensor(dtype::u8, {3}, 2)}},
                     {{"k", "v"}})};
  for (const auto& full : files) {
    for (std::size_t n = 0; n < full.size(); ++n) {
      const std::vector<std::byte> prefix(full.begin(),
                                          full.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_THROW((void)parse_safetensors(prefix), loom::parse_error)
          << n << " of " << full.size();
    }
    EXPECT_NO_THROW((void)parse_safetensors(full));
  }
  EXPECT_MESSAGE(std::vector<std::byte>(5), "truncated: 5 bytes");
}

TEST(Safetensors, CorruptedHeaderBytesNeverCrash) {
  const auto good = to_safetensors(
      {{"w", random_tensor(dtype::f32, {2, 3}, 1)}, {"b", random_tensor(dtype::boolean, {4}, 2)}},
      {{"step", "7"}});
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<std::uint8_t>(good[static_cast<std::size_t>(i)]);
  int refused = 0;
  for (std::size_t pos = 0; pos < 8 + n; ++pos) {
    for (int c : {0x00, 0x22, 0x7b, 0x5d, 0x2d, 0x39, 0xff, 0x80}) {
      auto bad = good;
      bad[pos] = static_cast<std::byte>(c);
      try {
        const auto f = parse_safetensors(bad);
        // What still parses must be self-consistent.
        for (const auto& [name, t] : f.tensors) EXPECT_LE(t.nbytes(), bad.size());
      } catch (const loom::parse_error&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 0);
  // A stray byte in place of the JSON.
  auto bad = good;
  bad[8] = std::byte{'x'};
  EXPECT_MESSAGE(bad, "not valid JSON");
}

TEST(Safetensors, BadHeaderLengthsNameTheLength) {
  EXPECT_MESSAGE(image("{}", {}, ~std::uint64_t{0}, true), "header length is 18446744073709551615",
                 "past the end");
  EXPECT_MESSAGE(image("{}", {}, std::uint64_t{1} << 63, true), "past the end");
  EXPECT_MESSAGE(image("{}", {}, 3, true), "past the end");
  EXPECT_MESSAGE(image("", {}), "not valid JSON");
  EXPECT_MESSAGE(image("{}  ", {}, 1, true), "not valid JSON");
}

TEST(Safetensors, MalformedHeadersNameTheProblem) {
  const std::string ok_entry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_NO_THROW((void)parse_safetensors(image("{\"w\":" + ok_entry + "}", zeros(8))));

  EXPECT_MESSAGE(image(R"({"w":)"), "not valid JSON");
  EXPECT_MESSAGE(image(R"([1,2])"), "JSON array, not an object");
  EXPECT_MESSAGE(image(R"("text")"), "not an object");
  EXPECT_MESSAGE(image(R"({"w":[1]})"), "tensor \"w\"", "must be an object");
  EXPECT_MESSAGE(image(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", zeros(8)), "tensor \"w\"",
                 "no \"dtype\"");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", zeros(8)), "no \"shape\"");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2]}})", zeros(8)), "no \"data_offsets\"");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", zeros(8)),
                 "\"dtype\" must be a string");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", zeros(8)),
                 "\"shape\" must be an array");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", zeros(8)),
                 "dimension 0", "not an integer");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", zeros(8)),
                 "not an integer");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})", zeros(8)),
                 "tensor \"w\"", "dimension 1", "negative (-1)");
  EXPECT_MESSAGE(
      image(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})"),
      "too large");
  EXPECT_MESSAGE(
      image(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}})"),
      "too large");
  EXPECT_MESSAGE(
      image(R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,8]}})"),
      "not an integer");
  // An empty tensor whose other dimensions would overflow is refused too.
  EXPECT_MESSAGE(
      image(R"({"w":{"dtype":"F64","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"),
      "too large");
  EXPECT_MESSAGE(
      image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", zeros(8)),
      "unexpected key \"extra\"");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", zeros(8)),
                 "\"data_offsets\" must be two non-negative integers");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", zeros(8)),
                 "\"data_offsets\" must be two non-negative integers");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":"0,8"}})", zeros(8)),
                 "\"data_offsets\"");
  EXPECT_MESSAGE(image(R"({"__metadata__":[1]})"), "\"__metadata__\" must be an object");
  EXPECT_MESSAGE(image(R"({"__metadata__":{"step":12}})"), "\"step\" is a number");
  EXPECT_MESSAGE(image(R"({"__metadata__":{"a":"1"},"__metadata__":{"a":"1"}})"),
                 "\"__metadata__\" appears twice");
  EXPECT_MESSAGE(image("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]"
                       "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"),
                 "deeper");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", zeros(8)),
                 "deeper", "\"w\"");
  // Not UTF-8 inside a string.
  EXPECT_MESSAGE(image("{\"w\xff\":" + ok_entry + "}", zeros(8)), "not valid JSON");
}

TEST(Safetensors, UnsupportedDtypesNameTheTensorAndTheDtype) {
  for (const char* t : {"F8_E4M3", "F8_E5M2", "U16", "I16", "U32", "U64", "C64", "f32", ""}) {
    SCOPED_TRACE(t);
    const std::string header =
        std::string(R"({"weights":{"dtype":")") + t + R"(","shape":[1],"data_offsets":[0,1]}})";
    const std::string expected = std::string("dtype \"") + t + "\" is not supported";
    EXPECT_MESSAGE(image(header, zeros(8)), "tensor \"weights\"", expected.c_str());
  }
}

TEST(Safetensors, OffsetsMustMatchTheDataAndNotOverlap) {
  // Outside the data.
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", zeros(7)),
                 "tensor \"w\"", "data_offsets [0, 8] are outside the data (7 bytes)");
  EXPECT_MESSAGE(
      image(
          R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}})",
          zeros(8)),
      "outside the data");
  // End before begin.
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", zeros(8)),
                 "end before they begin");
  // A byte count that is not numel * element size.
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})", zeros(16)),
                 "tensor \"w\"", "float32", "shape [2, 2] takes 16 bytes", "hold 8");
  EXPECT_MESSAGE(image(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", zeros(8)),
                 "takes 6 bytes");
  // Overlapping tensors name both.
  EXPECT_MESSAGE(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})",
                       zeros(12)),
                 "tensors \"a\"", "\"b\"", "overlap");
  EXPECT_MESSAGE(image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                       R"("b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
                       zeros(8)),
                 "overlap");
  // Duplicate names, and duplicate keys in an entry.
  EXPECT_MESSAGE(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       zeros(8)),
                 "tensor \"a\" appears twice");
  EXPECT_MESSAGE(
      image(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", zeros(4)),
      "key \"dtype\" appears twice in the entry of \"a\"");
  // Allowed: a gap, bytes after the last tensor, an empty tensor inside another's range.
  const auto f =
      parse_safetensors(image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                              R"("e":{"dtype":"F64","shape":[0,3],"data_offsets":[5,5]}})",
                              {std::byte{9}, std::byte{9}, std::byte{9}, std::byte{9}, std::byte{1},
                               std::byte{2}, std::byte{9}}));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(values_of<std::uint8_t>(f.tensors[0].second), (std::vector<std::uint8_t>{1, 2}));
  EXPECT_EQ(f.tensors[1].second.shape(), (shape{0, 3}));
}

TEST(Safetensors, BoolElementsMustBeZeroOrOne) {
  EXPECT_MESSAGE(image(R"({"mask":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                       {std::byte{1}, std::byte{0}, std::byte{2}}),
                 "tensor \"mask\"", "bool element 2 is 2");
}

// ---- writing errors ----------------------------------------------------------------------

template <class E>
std::string write_failure(const named& tensors,
                          const std::map<std::string, std::string>& metadata = {}) {
  try {
    (void)to_safetensors(tensors, metadata);
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(Safetensors, WriteRefusesWhatItCannotWrite) {
  const tensor ok = random_tensor(dtype::f32, {2}, 1);
  EXPECT_NE(
      write_failure<loom::invalid_argument>({{"w", tensor()}}).find("tensor \"w\" is undefined"),
      std::string::npos);
  EXPECT_NE(write_failure<loom::invalid_argument>({{"w", ok}, {"w", ok}})
                .find("tensor \"w\" is given twice"),
            std::string::npos);
  EXPECT_NE(write_failure<loom::invalid_argument>({{"__metadata__", ok}}).find("\"__metadata__\""),
            std::string::npos);
  EXPECT_NE(write_failure<loom::invalid_argument>({{"w\xff", ok}}).find("not valid UTF-8"),
            std::string::npos);
  EXPECT_NE(
      write_failure<loom::invalid_argument>({{"w", ok}}, {{"k", "\xc3"}}).find("not valid UTF-8"),
      std::string::npos);
}

// ---- files -------------------------------------------------------------------------------

TEST(Safetensors, SaveReplacesTheFileAndLeavesNoTemporaries) {
  temp_dir dir;
  const fs::path path = dir.path() / "model.safetensors";
  const named v1{{"w", random_tensor(dtype::f32, {4}, 1)}};
  const named v2{{"w", random_tensor(dtype::f32, {4}, 2)},
                 {"b", random_tensor(dtype::i64, {2}, 3)}};
  save_safetensors(path, v1);
  expect_same(load_safetensors(path), v1);
  save_safetensors(path, v2, {{"step", "2"}});
  expect_same(load_safetensors(path), v2);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"model.safetensors"}));
  // A relative path (the current directory) works too.
  const fs::path old_cwd = fs::current_path();
  fs::current_path(dir.path());
  save_safetensors("relative.safetensors", v1);
  fs::current_path(old_cwd);
  expect_same(load_safetensors(dir.path() / "relative.safetensors"), v1);
}

TEST(Safetensors, FailedSaveLeavesTheOldFileAndNoTemporaries) {
  temp_dir dir;
  const fs::path path = dir.path() / "model.safetensors";
  const named v1{{"w", random_tensor(dtype::f32, {4}, 1)}};
  save_safetensors(path, v1);
  const auto before = file_bytes(path);

  // A tensor that cannot be written: refused before anything touches the disk.
  EXPECT_THROW(save_safetensors(path, {{"w", tensor()}}), loom::invalid_argument);
  EXPECT_EQ(file_bytes(path), before);
  EXPECT_TRUE(temporaries(dir).empty());

  // The target is a directory: the rename fails after the temporary file was written.
  const fs::path as_dir = dir.path() / "taken";
  fs::create_directory(as_dir);
  std::ofstream(as_dir / "inside.txt") << "keep";
  try {
    save_safetensors(as_dir, v1);
    ADD_FAILURE() << "expected loom::error";
  } catch (const loom::error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(as_dir.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("renaming"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::is_directory(as_dir));
  EXPECT_TRUE(fs::exists(as_dir / "inside.txt"));
  EXPECT_TRUE(temporaries(dir).empty()) << temporaries(dir).front();

  // A directory that does not exist.
  try {
    save_safetensors(dir.path() / "missing" / "m.safetensors", v1);
    ADD_FAILURE() << "expected loom::error";
  } catch (const loom::error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing/m.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  EXPECT_EQ(file_bytes(path), before);
}

TEST(Safetensors, SaveIntoAReadOnlyDirectoryKeepsTheOldFile) {
  temp_dir dir;
  const fs::path sub = dir.path() / "ro";
  fs::create_directory(sub);
  const fs::path path = sub / "model.safetensors";
  save_safetensors(path, {{"w", random_tensor(dtype::f32, {4}, 1)}});
  const auto before = file_bytes(path);
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(sub.c_str(), W_OK) == 0) {
    fs::permissions(sub, fs::perms::owner_all);
    GTEST_SKIP() << "running with privileges that ignore directory permissions (root?)";
  }
  try {
    save_safetensors(path, {{"w", random_tensor(dtype::f32, {4}, 2)}});
    ADD_FAILURE() << "expected loom::error";
  } catch (const loom::error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
  }
  fs::permissions(sub, fs::perms::owner_all);
  EXPECT_EQ(file_bytes(path), before);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(sub)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, (std::vector<std::string>{"model.safetensors"}));
}

TEST(Safetensors, LoadErrorsNameThePath) {
  temp_dir dir;
  const fs::path missing = dir.path() / "nope.safetensors";
  try {
    (void)load_safetensors(missing);
    ADD_FAILURE() << "expected not_found";
  } catch (const loom::not_found& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
  try {
    (void)load_safetensors(dir.path());
    ADD_FAILURE() << "expected loom::invalid_argument";
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory; expected a file"), std::string::npos)
        << e.what();
  }
  const fs::path broken = dir.path() / "broken.safetensors";
  auto bytes = to_safetensors({{"w", random_tensor(dtype::f32, {4}, 1)}});
  bytes.pop_back();
  write_bytes(broken, bytes);
  try {
    (void)load_safetensors(broken);
    ADD_FAILURE() << "expected parse_error";
  } catch (const loom::parse_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(broken.string() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find("outside the data"), std::string::npos) << msg;
  }
  write_bytes(broken, {std::byte{1}, std::byte{2}});
  EXPECT_THROW((void)load_safetensors(broken), loom::parse_error);
  write_bytes(broken, image("{}", {}, 100, true));
  EXPECT_THROW((void)load_safetensors(broken), loom::parse_error);
}

}  // namespace
