// Graph (de)serialization: round trips (every attribute type, tensors of every dtype bit for
// bit, forward control edges), the documented format (Note [graph json format]), and every
// error the reader reports.
#include "loom/graph/serialization.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace {

using loom::attr_type;
using loom::attr_value;
using loom::dtype;
using loom::graph;
using loom::graph_builder;
using loom::shape;
using loom::tensor;
using loom::memory::host_tensor;
using nlohmann::json;

// ---- a registry with test ops ------------------------------------------------------------

loom::attr_def attr(std::string name, attr_type t, attr_value def) {
  loom::attr_def a;
  a.name = std::move(name);
  a.type = t;
  a.default_value = std::move(def);
  return a;
}

// The state ops, plus:
//   attr_zoo: no inputs, one float32 output, one attribute of every type (all defaulted);
//   pair:     one input of type T, two outputs of type T (for "node:1" inputs).
const loom::op_registry& test_ops() {
  static const loom::op_registry* registry = [] {
    auto* r = new loom::op_registry;
    loom::register_state_ops(*r);
    {
      loom::op_def d;
      d.name = "attr_zoo";
      d.outputs = {loom::arg_def{"out", "", dtype::f32, ""}};
      d.attrs = {attr("i", attr_type::integer, std::int64_t{7}),
                 attr("f", attr_type::real, 0.5),
                 attr("b", attr_type::boolean, false),
                 attr("s", attr_type::string, "x"),
                 attr("d", attr_type::type, dtype::f32),
                 attr("is", attr_type::ints, std::vector<std::int64_t>{}),
                 attr("fs", attr_type::reals, std::vector<double>{}),
                 attr("sh", attr_type::shape, shape{}),
                 attr("t", attr_type::tensor, tensor())};
      r->add(std::move(d));
    }
    {
      loom::op_def d;
      d.name = "pair";
      d.inputs = {loom::arg_def{"x", "T", dtype::f32, ""}};
      d.outputs = {loom::arg_def{"a", "T", dtype::f32, ""},
                   loom::arg_def{"b", "T", dtype::f32, ""}};
      loom::attr_def t;
      t.name = "T";
      t.type = attr_type::type;
      d.attrs = {t};
      d.infer = [](loom::inference_context& c) {
        c.set_output(0, c.input(0));
        c.set_output(1, c.input(0));
      };
      r->add(std::move(d));
    }
    return r;
  }();
  return *registry;
}

// ---- comparing graphs --------------------------------------------------------------------

std::vector<std::byte> dense_bytes(const tensor& t) {
  std::vector<std::byte> out(t.nbytes());
  loom::copy_to_dense(t, out.data());
  return out;
}

// Attribute equality with tensors compared by value and doubles by their bits.
::testing::AssertionResult same_attr(const attr_value& a, const attr_value& b) {
  if (a.type() != b.type()) {
    return ::testing::AssertionFailure()
           << loom::to_string(a.type()) << " vs " << loom::to_string(b.type());
  }
  if (a.type() == attr_type::tensor) {
    const auto& ta = std::get<tensor>(a.get());
    const auto& tb = std::get<tensor>(b.get());
    if (ta.defined() != tb.defined()) return ::testing::AssertionFailure() << "defined differs";
    if (!ta.defined()) return ::testing::AssertionSuccess();
    if (ta.type() != tb.type() || ta.shape() != tb.shape()) {
      return ::testing::AssertionFailure() << ta.describe() << " vs " << tb.describe();
    }
    const auto ba = dense_bytes(ta);
    const auto bb = dense_bytes(tb);
    for (std::size_t i = 0; i < ba.size(); ++i) {
      if (ba[i] != bb[i]) {
        return ::testing::AssertionFailure() << ta.describe() << ": byte " << i << " (element "
                                             << i / loom::size_of(ta.type()) << ") differs";
      }
    }
    return ::testing::AssertionSuccess();
  }
  if (a.type() == attr_type::real) {
    const auto da = std::bit_cast<std::uint64_t>(std::get<double>(a.get()));
    const auto db = std::bit_cast<std::uint64_t>(std::get<double>(b.get()));
    if (da == db) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << std::hex << da << " vs " << db;
  }
  if (a.type() == attr_type::reals) {
    const auto& la = std::get<std::vector<double>>(a.get());
    const auto& lb = std::get<std::vector<double>>(b.get());
    if (la.size() != lb.size()) return ::testing::AssertionFailure() << "lengths differ";
    for (std::size_t i = 0; i < la.size(); ++i) {
      if (std::bit_cast<std::uint64_t>(la[i]) != std::bit_cast<std::uint64_t>(lb[i])) {
        return ::testing::AssertionFailure() << "element " << i << " differs";
      }
    }
    return ::testing::AssertionSuccess();
  }
  if (a == b) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a.to_string() << " vs " << b.to_string();
}

std::vector<std::string> input_names(const graph& g, const loom::node& n) {
  std::vector<std::string> out;
  for (auto e : n.inputs) out.push_back(g.endpoint_name(e));
  for (auto c : n.control_inputs) out.push_back("^" + g.at(c).name);
  return out;
}

// Same nodes, matched by name: op, inputs, control inputs, device, attributes, outputs.
void expect_same_graph(const graph& a, const graph& b) {
  ASSERT_EQ(a.num_nodes(), b.num_nodes());
  for (const auto& na : a.nodes()) {
    SCOPED_TRACE(na.name);
    const loom::node* nb = b.find(na.name);
    ASSERT_NE(nb, nullptr);
    EXPECT_EQ(na.op(), nb->op());
    EXPECT_EQ(input_names(a, na), input_names(b, *nb));
    EXPECT_EQ(na.requested_device, nb->requested_device);
    EXPECT_EQ(na.outputs, nb->outputs);
    ASSERT_EQ(na.attrs.size(), nb->attrs.size());
    for (const auto& [name, value] : na.attrs) {
      auto it = nb->attrs.find(name);
      ASSERT_NE(it, nb->attrs.end()) << name;
      EXPECT_TRUE(same_attr(value, it->second)) << "attribute " << name;
    }
  }
}

// Long texts compared without gtest's diff (quadratic in the length): the first difference.
void expect_same_text(const std::string& a, const std::string& b) {
  if (a == b) return;
  const auto at = static_cast<std::size_t>(
      std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  const std::size_t from = at < 80 ? 0 : at - 80;
  ADD_FAILURE() << "texts differ at byte " << at << ":\n  " << a.substr(from, 160) << "\nvs\n  "
                << b.substr(from, 160);
}

// ---- tensors of every dtype ----------------------------------------------------------------

template <class Bits>
tensor tensor_of_bits(dtype t, const std::vector<Bits>& bits) {
  static_assert(sizeof(Bits) <= 8);
  tensor out = host_tensor(t, shape{static_cast<std::int64_t>(bits.size())});
  EXPECT_EQ(sizeof(Bits), loom::size_of(t));
  if (!bits.empty()) std::memcpy(out.raw_data(), bits.data(), bits.size() * sizeof(Bits));
  return out;
}

template <class Bits>
std::vector<Bits> random_bits(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Bits> out(n);
  for (auto& v : out) v = static_cast<Bits>(rng());
  return out;
}

// Tensors that cover the hard cases of each dtype: the special values and random bit
// patterns (NaN payloads included); with `exhaustive`, every bit pattern of the 16-bit
// types and 20000 random ones of float32 and float64.
std::vector<tensor> tensors_of_every_dtype(bool exhaustive) {
  const std::size_t random_count = exhaustive ? 20000 : 500;
  std::vector<tensor> out;
  std::vector<std::uint32_t> f32{0x00000000, 0x80000000, 0x3dcccccd, 0x7f7fffff, 0xff7fffff,
                                 0x00000001, 0x80000001, 0x00800000, 0x007fffff, 0x7f800000,
                                 0xff800000, 0x7fc00000, 0xffc00000, 0x7fc00001, 0x7f800001,
                                 0xffffffff, 0xbf800000, 0x4b000001, 0x3eaaaaab, 0x33800000};
  for (auto b : random_bits<std::uint32_t>(random_count, 1)) f32.push_back(b);
  out.push_back(tensor_of_bits(dtype::f32, f32));
  std::vector<std::uint64_t> f64{0,
                                 0x8000000000000000u,
                                 0x3fb999999999999au,
                                 0x7fefffffffffffffu,
                                 1,
                                 0x0010000000000000u,
                                 0x7ff0000000000000u,
                                 0xfff0000000000000u,
                                 0x7ff8000000000000u,
                                 0xfff8000000000000u,
                                 0x7ff0000000000001u,
                                 0x7ff8dead00000000u,
                                 0x3fd5555555555555u};
  for (auto b : random_bits<std::uint64_t>(random_count, 2)) f64.push_back(b);
  out.push_back(tensor_of_bits(dtype::f64, f64));
  std::vector<std::uint16_t> all16(exhaustive ? 65536 : 0);
  for (std::size_t i = 0; i < all16.size(); ++i) all16[i] = static_cast<std::uint16_t>(i);
  for (std::uint16_t b :
       {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x2e66, 0x3c00, 0x7bff, 0x7c00, 0xfc00,
        0x7e00, 0xfe00, 0x7c01, 0x7fff, 0x7f80, 0x7fc0, 0x7f81, 0x3dcd, 0x7f7f, 0xff7f}) {
    all16.push_back(b);
  }
  for (auto b : random_bits<std::uint16_t>(random_count, 5)) all16.push_back(b);
  out.push_back(tensor_of_bits(dtype::f16, all16));
  out.push_back(tensor_of_bits(dtype::bf16, all16));
  std::vector<std::int32_t> i32{0, -1, 1, INT32_MIN, INT32_MAX};
  for (auto b : random_bits<std::int32_t>(1000, 3)) i32.push_back(b);
  out.push_back(tensor_of_bits(dtype::i32, i32));
  std::vector<std::int64_t> i64{
      0, -1, 1, INT64_MIN, INT64_MAX, std::int64_t{1} << 53, (std::int64_t{1} << 53) + 1};
  for (auto b : random_bits<std::int64_t>(1000, 4)) i64.push_back(b);
  out.push_back(tensor_of_bits(dtype::i64, i64));
  std::vector<std::uint8_t> all8(256);
  for (std::size_t i = 0; i < 256; ++i) all8[i] = static_cast<std::uint8_t>(i);
  out.push_back(tensor_of_bits(dtype::i8, all8));
  out.push_back(tensor_of_bits(dtype::u8, all8));
  out.push_back(tensor_of_bits(dtype::boolean, std::vector<std::uint8_t>{1, 0, 0, 1, 1}));
  // Shapes: a 2-d one, a scalar, an empty one, and a non-contiguous view (transposed).
  out.push_back(host_tensor(shape{2, 3}, {1, 2, 3, 4, 5, 6}));
  tensor s = host_tensor(dtype::i64, shape{});
  *s.data<std::int64_t>() = -42;
  out.push_back(s);
  out.push_back(host_tensor(dtype::f16, shape{3, 0}));
  const tensor base = host_tensor(shape{2, 3}, {1, 2, 3, 4, 5, 6});
  out.push_back(tensor::strided(base.buf(), dtype::f32, shape{3, 2}, shape{1, 3}, 0));
  return out;
}

// ---- round trips ---------------------------------------------------------------------------

graph make_test_graph(bool forward_control_edge = true) {
  graph g(test_ops());
  graph_builder b(g);
  auto x = loom::ops::placeholder(b, "x", dtype::f32, {2, -1});
  int k = 0;
  for (const tensor& t : tensors_of_every_dtype(/*exhaustive=*/false)) {
    std::string name = "c";  // (not "c" + ...: GCC 12's -Wrestrict misfires on it)
    name += std::to_string(k++);
    (void)loom::ops::constant(b, t, {.name = name});
  }
  auto init = host_tensor(shape{2, 2}, {0.25f, -0.5f, 1e-8f, 3e38f});
  auto v = loom::ops::variable(b, "v", dtype::f32, {2, 2});  // no initial value
  auto w = loom::ops::variable(b, "w", init);
  auto c = loom::ops::constant(b, init, {.name = "init_value"});
  auto assign = loom::ops::assign(v, c, {.name = "assign_v", .device = "cpu:0"});
  auto p = b.add("pair", {x}, {}, {.name = "p"});
  auto id = loom::ops::identity(p[1], {.name = "id", .device = "/device:CPU:0"});
  auto id0 = loom::ops::identity(p[0], {.name = "id0"});
  auto zoo = b.add1("attr_zoo", {},
                    {{"i", std::int64_t{-3}},
                     {"f", -std::numeric_limits<double>::infinity()},
                     {"b", true},
                     {"s", "quote \" backslash \\ newline \n unicode \xc3\xa9"},
                     {"d", dtype::bf16},
                     {"is", std::vector<std::int64_t>{INT64_MIN, 0, INT64_MAX}},
                     {"fs", std::vector<double>{0.1, std::nan(""), -0.0, 1e308, 5e-324,
                                                std::numeric_limits<double>::infinity()}},
                     {"sh", shape{-1, 3, 0}},
                     {"t", host_tensor(shape{2}, {1.5f, -2.5f})}},
                    {.name = "zoo"});
  (void)loom::ops::no_op(b, {assign, id, id0, w}, {.name = "step"});
  // A control edge to an earlier node: c0 now waits for zoo, added after it.
  if (forward_control_edge) g.add_control_input(g.get("c0").id, zoo.ep().node);
  return g;
}

TEST(GraphJson, RoundTripKeepsEveryNodeAndAttributeBitExact) {
  const graph g = make_test_graph();
  const std::string text = loom::graph_to_json(g);
  const graph back = loom::graph_from_json(text, test_ops());
  expect_same_graph(g, back);
  // Written again, the text is the same (once the nodes are in topological order: here c0
  // moves after zoo, Note [graph json format]).
  const std::string again = loom::graph_to_json(back);
  expect_same_text(loom::graph_to_json(loom::graph_from_json(again, test_ops())), again);
  const graph plain = make_test_graph(/*forward_control_edge=*/false);
  const std::string plain_text = loom::graph_to_json(plain);
  expect_same_text(loom::graph_to_json(loom::graph_from_json(plain_text, test_ops())), plain_text);
  // One-line form reads back the same too.
  const std::string compact = loom::graph_to_json(g, -1);
  EXPECT_EQ(std::count(compact.begin(), compact.end(), '\n'), 1);
  expect_same_graph(g, loom::graph_from_json(compact, test_ops()));
}

TEST(GraphJson, EveryBitPatternRoundTrips) {
  // Every float16 and bfloat16, and many float32 and float64 bit patterns, through the
  // shortest decimal forms and the NaN and infinity strings.
  graph g(test_ops());
  graph_builder b(g);
  int k = 0;
  for (const tensor& t : tensors_of_every_dtype(/*exhaustive=*/true)) {
    std::string name = "c";
    name += std::to_string(k++);
    (void)loom::ops::constant(b, t, {.name = name});
  }
  expect_same_graph(g, loom::graph_from_json(loom::graph_to_json(g, -1), test_ops()));
}

TEST(GraphJson, NodeOrderIsKeptWhereItIsTopological) {
  const graph g = make_test_graph();
  const graph back = loom::graph_from_json(loom::graph_to_json(g), test_ops());
  // The file's order, except that zoo, which c0 needs, is pulled ahead of c0.
  std::vector<std::string> expected;
  for (const auto& n : g.nodes()) {
    if (n.name == "zoo") continue;
    if (n.name == "c0") expected.emplace_back("zoo");
    expected.push_back(n.name);
  }
  std::vector<std::string> got;
  for (const auto& n : back.nodes()) got.push_back(n.name);
  EXPECT_EQ(got, expected);
}

TEST(GraphJson, FileHelpers) {
  const graph g = make_test_graph();
  const auto path = std::filesystem::temp_directory_path() /
                    ("loom_graph_test_" + std::to_string(::getpid()) + ".json");
  loom::save_graph(g, path.string());
  expect_same_graph(g, loom::load_graph(path.string(), test_ops()));
  {
    std::ofstream out(path, std::ios::trunc);
    out << "{\n  \"format\": \"loom.graph\",\n  \"version\": 1,\n  \"nodes\": [,]\n}\n";
  }
  try {
    (void)loom::load_graph(path.string(), test_ops());
    ADD_FAILURE() << "malformed file loaded";
  } catch (const loom::parse_error& e) {
    EXPECT_EQ(e.line(), 4u);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW((void)loom::load_graph(path.string()), loom::not_found);
  EXPECT_THROW(loom::save_graph(g, "/nonexistent/dir/g.json"), loom::error);
}

// ---- the format ------------------------------------------------------------------------------

TEST(GraphJson, WritesTheDocumentedFormat) {
  graph g(test_ops());
  graph_builder b(g);
  auto x = loom::ops::placeholder(b, "x", dtype::f32, {2, -1});
  auto p = b.add("pair", {x}, {}, {.name = "p"});
  (void)loom::ops::identity(p[1], {.name = "id", .device = "cpu:0"});
  const std::string first = loom::ops::no_op(b, {x}, {.name = "ctl"});
  (void)loom::ops::constant(
      b,
      tensor_of_bits(dtype::f32, std::vector<std::uint32_t>{0x3dcccccd, 0x7fc00000, 0xffc00000,
                                                            0x7fc00001, 0xff800000, 0x80000000}),
      {.name = "c"});
  (void)loom::ops::constant(
      b, tensor_of_bits(dtype::f16, std::vector<std::uint16_t>{0x2e66, 0x3c00, 0x7e00}),
      {.name = "h"});
  (void)loom::ops::variable(b, "v", dtype::i32, {3});
  (void)first;

  const json doc = json::parse(loom::graph_to_json(g));
  EXPECT_EQ(doc["format"], "loom.graph");
  EXPECT_EQ(doc["version"], 1);
  const json& nodes = doc["nodes"];
  ASSERT_EQ(nodes.size(), 7u);
  EXPECT_EQ(nodes[0]["name"], "x");
  EXPECT_EQ(nodes[0]["op"], "placeholder");
  EXPECT_EQ(nodes[0]["inputs"], json::array());
  EXPECT_FALSE(nodes[0].contains("device"));
  EXPECT_EQ(nodes[0]["attrs"]["dtype"], json({{"dtype", "float32"}}));
  EXPECT_EQ(nodes[0]["attrs"]["shape"], json({{"shape", {2, -1}}}));
  EXPECT_EQ(nodes[2]["inputs"], json({"p:1"}));
  EXPECT_EQ(nodes[2]["device"], "cpu:0");
  EXPECT_EQ(nodes[2]["attrs"]["T"], json({{"dtype", "float32"}}));
  EXPECT_EQ(nodes[3]["inputs"], json({"^x"}));
  const json& c = nodes[4]["attrs"]["value"]["tensor"];
  EXPECT_EQ(c["dtype"], "float32");
  EXPECT_EQ(c["shape"], json({6}));
  // Shortest forms: 0.1f is written 0.1, not 0.10000000149011612.
  EXPECT_EQ(c["data"].dump(), R"j([0.1,"nan","-nan","nan(0x7fc00001)","-inf",-0.0])j");
  // float16 0x2e66 is 0.0999755859375; "0.1" reads back to it.
  EXPECT_EQ(nodes[5]["attrs"]["value"]["tensor"]["data"].dump(), R"([0.1,1.0,"nan"])");
  EXPECT_EQ(nodes[6]["attrs"]["initial_value"], json({{"tensor", nullptr}}));
}

TEST(GraphJson, ReadsNodesInAnyOrderAndFillsDefaultsAndTypes) {
  // Consumers before producers, no "T" (inferred), no defaults, a float attribute given as
  // an integer and an ints list for a shape attribute.
  const std::string text = R"({"format": "loom.graph", "version": 1, "nodes": [
    {"name": "step", "op": "no_op", "inputs": ["^id", "^zoo"]},
    {"name": "id", "op": "identity", "inputs": ["p:1"], "device": "cpu:0"},
    {"name": "p", "op": "pair", "inputs": ["x"]},
    {"name": "zoo", "op": "attr_zoo", "attrs": {"f": {"float": 2}, "sh": {"ints": [4, -1]}}},
    {"name": "x", "op": "placeholder",
     "attrs": {"dtype": {"dtype": "f64"}, "shape": {"shape": [3]}}}
  ]})";
  const graph g = loom::graph_from_json(text, test_ops());
  std::vector<std::string> order;
  for (const auto& n : g.nodes()) order.push_back(n.name);
  EXPECT_EQ(order, (std::vector<std::string>{"x", "p", "id", "zoo", "step"}));
  const auto& id = g.get("id");
  EXPECT_EQ(input_names(g, id), (std::vector<std::string>{"p:1"}));
  EXPECT_EQ(id.attr<dtype>("T"), dtype::f64);
  EXPECT_EQ(id.requested_device, "cpu:0");
  EXPECT_EQ(id.outputs[0].shape, (shape{3}));
  EXPECT_EQ(input_names(g, g.get("step")), (std::vector<std::string>{"^id", "^zoo"}));
  const auto& zoo = g.get("zoo");
  EXPECT_EQ(zoo.attr<double>("f"), 2.0);
  EXPECT_EQ(zoo.attr<shape>("sh"), (shape{4, -1}));
  EXPECT_EQ(zoo.attr<std::int64_t>("i"), 7);  // the default
  EXPECT_EQ(zoo.attr<std::string>("s"), "x");
}

TEST(GraphJson, ReadsValuesAtTheEdgesOfTheirRanges) {
  auto value = [](const std::string& dtype_name, const std::string& data) {
    const std::string text =
        R"({"format": "loom.graph", "version": 1, "nodes": [{"name": "c", "op": "const",
        "attrs": {"dtype": {"dtype": ")" +
        dtype_name + R"("}, "value": {"tensor": {"dtype": ")" + dtype_name +
        R"(", "shape": [2], "data": )" + data + "}}}}]}";
    return loom::graph_from_json(text, test_ops()).get("c").attr<tensor>("value");
  };
  // 3.4028235e38 (the shortest form of FLT_MAX) is above FLT_MAX as a double but rounds to it.
  const tensor big = value("float32", "[3.4028235e38, -3.4028235e38]");
  EXPECT_EQ(big.data<float>()[0], std::numeric_limits<float>::max());
  EXPECT_EQ(big.data<float>()[1], -std::numeric_limits<float>::max());
  const tensor h = value("float16", "[65504, 6e-8]");
  EXPECT_EQ(h.data<loom::half>()[0].bits, 0x7bff);
  EXPECT_EQ(h.data<loom::half>()[1].bits, 0x0001);  // the smallest subnormal
  const tensor nans = value("float32", R"j(["nan(0x7f800001)", "-nan"])j");
  std::uint32_t bits[2];
  std::memcpy(bits, nans.raw_data(), sizeof bits);
  EXPECT_EQ(bits[0], 0x7f800001u);
  EXPECT_EQ(bits[1], 0xffc00000u);
  const tensor ints = value("int64", "[-9223372036854775808, 9223372036854775807]");
  EXPECT_EQ(ints.data<std::int64_t>()[0], INT64_MIN);
  EXPECT_EQ(ints.data<std::int64_t>()[1], INT64_MAX);
  const tensor u8 = value("uint8", "[0, 255]");
  EXPECT_EQ(u8.data<std::uint8_t>()[1], 255);
}

// ---- errors --------------------------------------------------------------------------------

std::string doc_with(const std::string& nodes) {
  return R"({"format": "loom.graph", "version": 1, "nodes": [)" + nodes + "]}";
}

// Expects graph_from_json(text) to throw E whose message contains every part.
template <class E>
void expect_error(const std::string& text, std::initializer_list<std::string> parts) {
  try {
    (void)loom::graph_from_json(text, test_ops());
    ADD_FAILURE() << "no error for " << text;
  } catch (const E& e) {
    for (const auto& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(GraphJsonErrors, CyclesNameTheNodesOnThem) {
  // upstream -> a -> b -> c -> a; upstream and tail are not on the cycle.
  const std::string text = doc_with(R"(
    {"name": "upstream", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [1]}}},
    {"name": "tail", "op": "identity", "inputs": ["b"]},
    {"name": "a", "op": "pair", "inputs": ["c:1", "^upstream"]},
    {"name": "b", "op": "identity", "inputs": ["a"]},
    {"name": "c", "op": "pair", "inputs": ["b"]})");
  try {
    (void)loom::graph_from_json(text, test_ops());
    ADD_FAILURE() << "cycle accepted";
  } catch (const loom::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cycle"), std::string::npos) << what;
    // Data flows b -> c -> a -> b; the message starts at the node the search met twice.
    EXPECT_NE(what.find("b -> c -> a -> b"), std::string::npos) << what;
    EXPECT_EQ(what.find("upstream"), std::string::npos) << what;
    EXPECT_EQ(what.find("tail"), std::string::npos) << what;
  }
  expect_error<loom::invalid_argument>(
      doc_with(R"({"name": "self", "op": "identity", "inputs": ["self"]})"),
      {"cycle", "self -> self"});
  // Through control edges only.
  expect_error<loom::invalid_argument>(doc_with(R"({"name": "n1", "op": "no_op", "inputs": ["^n2"]},
                  {"name": "n2", "op": "no_op", "inputs": ["^n1"]})"),
                                       {"cycle", "n1", "n2"});
}

TEST(GraphJsonErrors, UnknownOpsAndInputsNameTheNode) {
  expect_error<loom::not_found>(doc_with(R"({"name": "n", "op": "identiti", "inputs": []})"),
                                {"node 'n'", "identiti", "identity"});
  expect_error<loom::not_found>(
      doc_with(R"({"name": "n", "op": "identity", "inputs": ["ghost:2"]})"),
      {"node 'n'", "'ghost:2'", "'ghost'", "not in the graph"});
  expect_error<loom::not_found>(doc_with(R"({"name": "n", "op": "no_op", "inputs": ["^ghost"]})"),
                                {"node 'n'", "'^ghost'"});
  // An output index the producer does not have: graph::add_node's error, naming the node.
  expect_error<loom::not_found>(
      doc_with(
          R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"dtype": "float32"}, "shape": {"shape": [1]}}},
                  {"name": "n", "op": "identity", "inputs": ["x:1"]})"),
      {"node 'n'", "output 1"});
}

TEST(GraphJsonErrors, MalformedJsonGivesTheLine) {
  const std::pair<std::string, std::size_t> cases[] = {
      {"{\n  \"format\": \"loom.graph\",\n  \"version\": 1\n  \"nodes\": []\n}", 4},
      {"{\"format\": \"loom.graph\",\n\"version\": 1,\n\"nodes\": [\n", 4},
      {"", 1},
      {"{\"a\":\n\n\n tru}", 4},
      {"\n\n\"\x01\"", 3},
      // nlohmann reports a number too large for a double as out_of_range, with no position.
      {"{\"format\": \"loom.graph\",\n\"version\": 1e99999}", 2},
  };
  for (const auto& [text, line] : cases) {
    SCOPED_TRACE(text);
    try {
      (void)loom::graph_from_json(text, test_ops());
      ADD_FAILURE() << "accepted";
    } catch (const loom::parse_error& e) {
      EXPECT_EQ(e.line(), line) << e.what();
      EXPECT_NE(std::string(e.what()).find("line " + std::to_string(line)), std::string::npos)
          << e.what();
    }
  }
}

TEST(GraphJsonErrors, DocumentStructure) {
  expect_error<loom::parse_error>("[]", {"must be an object"});
  expect_error<loom::parse_error>(R"({"format": "onnx", "version": 1, "nodes": []})",
                                  {"\"format\""});
  expect_error<loom::parse_error>(R"({"version": 1, "nodes": []})", {"no \"format\""});
  expect_error<loom::parse_error>(R"({"format": "loom.graph", "version": 2, "nodes": []})",
                                  {"unsupported \"version\" 2"});
  expect_error<loom::parse_error>(R"({"format": "loom.graph", "version": "1", "nodes": []})",
                                  {"version"});
  expect_error<loom::parse_error>(R"({"format": "loom.graph", "version": 1})", {"no \"nodes\""});
  expect_error<loom::parse_error>(R"({"format": "loom.graph", "version": 1, "nodes": {}})",
                                  {"\"nodes\" must be an array"});
  expect_error<loom::parse_error>(R"({"format": "loom.graph", "version": 1, "nodes": [], "x": 1})",
                                  {"unknown key 'x'"});
  // An empty graph is fine.
  EXPECT_EQ(loom::graph_from_json(doc_with(""), test_ops()).num_nodes(), 0u);
}

TEST(GraphJsonErrors, NodeStructureNamesTheNode) {
  expect_error<loom::parse_error>(doc_with("3"), {"node #0", "must be an object"});
  expect_error<loom::parse_error>(doc_with(R"({"op": "no_op"})"), {"node #0", "no \"name\""});
  expect_error<loom::parse_error>(doc_with(R"({"name": "", "op": "no_op"})"), {"may not be empty"});
  expect_error<loom::parse_error>(doc_with(R"({"name": 3, "op": "no_op"})"), {"node #0", "name"});
  expect_error<loom::parse_error>(doc_with(R"({"name": "^x", "op": "no_op"})"),
                                  {"node '^x'", "may not begin with '^'"});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n"})"), {"node 'n'", "no \"op\""});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": 1})"), {"node 'n'", "\"op\""});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "input": []})"),
                                  {"node 'n'", "unknown key 'input'"});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "device": 0})"),
                                  {"node 'n'", "\"device\""});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "inputs": "x"})"),
                                  {"node 'n'", "\"inputs\" must be an array"});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "inputs": [1]})"),
                                  {"node 'n'", "input must be a string"});
  for (const char* bad : {"x:", "x:a", "x:-1", ":1", "x:99999999999", ""}) {
    expect_error<loom::parse_error>(
        doc_with(R"({"name": "n", "op": "identity", "inputs": [")" + std::string(bad) + "\"]}"),
        {"node 'n'", "is not a tensor name"});
  }
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "inputs": ["^x:1"]})"),
                                  {"node 'n'", "control input"});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "inputs": ["^"]})"),
                                  {"node 'n'", "control input"});
  expect_error<loom::parse_error>(
      doc_with(R"({"name": "n", "op": "identity", "inputs": ["^a", "b"]})"),
      {"node 'n'", "comes after a control input"});
  expect_error<loom::parse_error>(doc_with(R"({"name": "n", "op": "no_op", "attrs": []})"),
                                  {"node 'n'", "\"attrs\" must be an object"});
  expect_error<loom::invalid_argument>(
      doc_with(R"({"name": "n", "op": "no_op"}, {"name": "n", "op": "no_op"})"),
      {"nodes #0 and #1", "'n'"});
}

TEST(GraphJsonErrors, AttributeValuesNameNodeAndAttribute) {
  auto zoo = [](const std::string& attrs) {
    return doc_with(R"({"name": "z", "op": "attr_zoo", "attrs": {)" + attrs + "}}");
  };
  const std::pair<std::string, std::string> cases[] = {
      {R"("i": 3)", "one key naming its type"},
      {R"("i": {"int": 1, "float": 2})", "one key naming its type"},
      {R"("i": {"complex": 1})", "unknown type 'complex'"},
      {R"("i": {"int": 0.5})", "must be an integer"},
      {R"("i": {"int": "3"})", "must be an integer"},
      {R"("i": {"int": 9223372036854775808})", "out of range"},
      {R"("f": {"float": "half"})", "is not a number"},
      {R"("f": {"float": true})", "must be a number"},
      {R"("b": {"bool": 1})", "true or false"},
      {R"("s": {"string": 1})", "must be a string"},
      {R"("d": {"dtype": "float128"})", "unknown dtype 'float128'"},
      {R"("is": {"ints": [1, 2.5]})", "must be an integer"},
      {R"("is": {"ints": 1})", "must be an array"},
      {R"("fs": {"floats": [1, null]})", "must be a number"},
      {R"("t": {"tensor": 1})", "must be an object"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [2]}})", "no \"data\""},
      {R"("t": {"tensor": {"dtype": "float32", "data": []}})", "no \"shape\""},
      {R"("t": {"tensor": {"shape": [], "data": [1]}})", "no \"dtype\""},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [2], "data": [1], "x": 0}})",
       "unknown key 'x'"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [2], "data": [1]}})",
       "needs 2 values, got 1"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [-1], "data": []}})", "out of range"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [0, 4611686018427387904, 2], "data": []}})",
       "too large"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [1], "data": 1}})",
       "data must be an array"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [2], "data": [1, "x"]}})", "at index 1"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [1], "data": [1e39]}})",
       "out of range for float32"},
      {R"("t": {"tensor": {"dtype": "float32", "shape": [1], "data": [1e300]}})",
       "out of range for float32"},
      {R"("t": {"tensor": {"dtype": "float16", "shape": [1], "data": [65520]}})",
       "out of range for float16"},
      {R"("t": {"tensor": {"dtype": "bfloat16", "shape": [1], "data": [3.4e38]}})",
       "out of range for bfloat16"},
      {R"j("t": {"tensor": {"dtype": "float32", "shape": [1], "data": ["nan(0x7f800000)"]}})j",
       "not a float32 NaN"},
      {R"j("t": {"tensor": {"dtype": "float16", "shape": [1], "data": ["nan(0x17e01)"]}})j",
       "not a float16 NaN"},
      {R"j("t": {"tensor": {"dtype": "float64", "shape": [1], "data": ["nan(0x)"]}})j",
       "not a number"},
      {R"("t": {"tensor": {"dtype": "int8", "shape": [1], "data": [128]}})",
       "out of range [-128, 127]"},
      {R"("t": {"tensor": {"dtype": "uint8", "shape": [1], "data": [-1]}})",
       "out of range [0, 255]"},
      {R"("t": {"tensor": {"dtype": "int32", "shape": [1], "data": [2147483648]}})",
       "out of range"},
      {R"("t": {"tensor": {"dtype": "int64", "shape": [1], "data": [9223372036854775808]}})",
       "out of range"},
      {R"("t": {"tensor": {"dtype": "int64", "shape": [1], "data": [1.0]}})", "must be an integer"},
      {R"("t": {"tensor": {"dtype": "bool", "shape": [1], "data": [1]}})", "true or false"},
  };
  for (const auto& [attrs, part] : cases) {
    SCOPED_TRACE(attrs);
    expect_error<loom::parse_error>(zoo(attrs), {"node 'z'", part});
  }
}

TEST(GraphJsonErrors, AddNodeErrorsPropagateNamingTheNode) {
  // An attribute of the wrong type for its op.
  expect_error<loom::invalid_argument>(
      doc_with(
          R"({"name": "x", "op": "placeholder", "attrs": {"dtype": {"int": 3}, "shape": {"shape": [1]}}})"),
      {"node 'x'", "attribute 'dtype'"});
  // An attribute the op does not have.
  expect_error<loom::invalid_argument>(
      doc_with(R"({"name": "x", "op": "no_op", "attrs": {"bogus": {"int": 3}}})"),
      {"node 'x'", "bogus"});
  // A missing required attribute.
  expect_error<loom::invalid_argument>(doc_with(R"({"name": "x", "op": "placeholder"})"),
                                       {"node 'x'", "missing required attribute"});
  // The wrong number of inputs.
  expect_error<loom::invalid_argument>(
      doc_with(R"({"name": "a", "op": "no_op"}, {"name": "x", "op": "identity"})"),
      {"node 'x'", "expects 1 input"});
  // A const whose dtype attribute disagrees with its value.
  expect_error<loom::invalid_argument>(
      doc_with(R"({"name": "c", "op": "const", "attrs": {"dtype": {"dtype": "int32"},
                   "value": {"tensor": {"dtype": "float32", "shape": [], "data": [1]}}}})"),
      {"node 'c'"});
}

TEST(GraphJsonErrors, WriterRefusesWhatItCannotWrite) {
  {
    // A tensor in memory the CPU cannot read (a borrowed buffer that claims to be on CUDA).
    std::vector<float> memory(2);
    tensor device_tensor(
        loom::buffer::adopt(memory.data(), sizeof(float) * 2, alignof(float),
                            loom::device_id{loom::device_type::cuda, 0}, {}, nullptr, nullptr),
        dtype::f32, shape{2});
    graph g(test_ops());
    graph_builder b(g);
    (void)b.add1("attr_zoo", {}, {{"t", device_tensor}}, {.name = "z"});
    try {
      (void)loom::graph_to_json(g);
      ADD_FAILURE() << "wrote a device tensor";
    } catch (const loom::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'z'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
  }
  {
    graph g(test_ops());
    graph_builder b(g);
    // The builder refuses a name the JSON form could not read back (check_node_name).
    try {
      (void)loom::ops::placeholder(b, "^x", dtype::f32, {1});
      ADD_FAILURE() << "built a node whose name begins with ^";
    } catch (const loom::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'^x'"), std::string::npos) << e.what();
    }
  }
  {
    graph g(test_ops());
    graph_builder b(g);
    (void)b.add1("attr_zoo", {}, {{"s", "\xff\xfe"}}, {.name = "z"});
    try {
      (void)loom::graph_to_json(g);
      ADD_FAILURE() << "wrote invalid UTF-8";
    } catch (const loom::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'z'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
    }
  }
}

// One validation: the builder and the JSON loader accept the same placeholders. For each
// name and shape, the builder accepts iff the loader accepts the same node written by hand,
// with the same message; what the builder accepts is written and read back unchanged.
TEST(GraphJsonErrors, BuilderAndLoaderAgreeOnNamesAndShapes) {
  const std::vector<std::string> names = {"x", "x/y", "x_1", "\xc3\xa9", "^x", "a:0", "a b",
                                          "a\tb", "a\nb", "x\x7f"};
  const std::vector<std::vector<std::int64_t>> shapes = {
      {}, {3}, {-1, 3}, {0, 5}, {-2, 3}, {3, std::numeric_limits<std::int64_t>::min()},
      {std::int64_t{1} << 62, std::int64_t{1} << 62}, {std::int64_t{1} << 62, 0, 4},
      {std::numeric_limits<std::int64_t>::max()}};
  for (const auto& name : names) {
    for (const auto& dims : shapes) {
      SCOPED_TRACE(json(name).dump() + " " + json(dims).dump());
      std::string built_error;
      graph g(test_ops());
      graph_builder b(g);
      try {
        (void)loom::ops::placeholder(b, name, dtype::f32, shape(dims));
      } catch (const loom::invalid_argument& e) {
        built_error = e.what();
      }
      const json node = {{"name", name},
                         {"op", "placeholder"},
                         {"attrs", {{"dtype", {{"dtype", "float32"}}}, {"shape", {{"shape", dims}}}}}};
      const std::string text = doc_with(node.dump());
      std::string loaded_error;
      try {
        const graph h = loom::graph_from_json(text, test_ops());
        ASSERT_TRUE(built_error.empty()) << "the loader accepts what the builder refuses: "
                                         << built_error;
        EXPECT_EQ(loom::graph_to_json(h), loom::graph_to_json(g));
        const graph back = loom::graph_from_json(loom::graph_to_json(g), test_ops());
        EXPECT_EQ(back.get(name).attrs.at("shape").as<shape>(), shape(dims));
      } catch (const loom::error& e) {
        loaded_error = e.what();
        ASSERT_FALSE(built_error.empty()) << "the loader refuses what the builder accepts: "
                                          << loaded_error;
        // The same rule, so the same words (the loader adds where it was).
        const auto rule = built_error.substr(built_error.find(": ") + 2);
        EXPECT_NE(loaded_error.find(rule), std::string::npos)
            << "builder: " << built_error << "\nloader: " << loaded_error;
      }
    }
  }
}

}  // namespace
