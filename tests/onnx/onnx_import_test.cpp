// ONNX import: models built here with ONNX's protobuf classes, imported, run, and checked
// against float64 references; shape tracking; external data; every kind of bad model.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/onnx/import.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
using P = ::onnx::TensorProto;

// A model under construction.
struct model_builder {
  ::onnx::ModelProto m;
  ::onnx::GraphProto* g;

  explicit model_builder(std::int64_t opset = 17) {
    m.set_ir_version(8);
    m.set_producer_name("loom-test");
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    g = m.mutable_graph();
    g->set_name("test");
  }

  // A graph input of `type` with dims (-1: symbolic, named "batch").
  void input(const std::string& name, std::vector<std::int64_t> dims, int type = P::FLOAT) {
    auto* v = g->add_input();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    auto* s = t->mutable_shape();
    for (auto d : dims) {
      auto* dim = s->add_dim();
      if (d < 0) dim->set_dim_param("batch");
      else dim->set_dim_value(d);
    }
  }
  void output(const std::string& name, int type = P::FLOAT) {
    auto* v = g->add_output();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    t->mutable_shape();  // rank unknown to the model: loom infers it
  }
  ::onnx::TensorProto* init_floats(const std::string& name, std::vector<std::int64_t> dims,
                                   const std::vector<float>& v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(P::FLOAT);
    for (auto d : dims) t->add_dims(d);
    for (float x : v) t->add_float_data(x);
    return t;
  }
  void init_ints(const std::string& name, const std::vector<std::int64_t>& v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(P::INT64);
    t->add_dims(static_cast<std::int64_t>(v.size()));
    for (auto x : v) t->add_int64_data(x);
  }
  ::onnx::NodeProto* node(const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out, const std::string& name = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto& i : in) n->add_input(i);
    for (auto& o : out) n->add_output(o);
    return n;
  }
  std::string bytes() const { return m.SerializeAsString(); }
};

void attr_int(::onnx::NodeProto* n, const std::string& name, std::int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(v);
}
void attr_float(::onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> run1(onnx::imported_model& m, const std::vector<std::pair<std::string, tensor>>& feeds) {
  session s(std::move(m.graph));
  std::vector<feed> f;
  for (const auto& [name, t] : feeds) {
    for (const auto& in : m.inputs) {
      if (in.onnx_name == name) f.emplace_back(in.tensor, t);
    }
  }
  auto out = s.run(f, {m.outputs.at(0).tensor});
  auto span = out.at(0).span<float>();
  return {span.begin(), span.end()};
}

TEST(OnnxImport, GemmWithAlphaBetaMatchesFloat64) {
  model_builder mb;
  mb.input("a", {-1, 3});
  mb.init_floats("b", {4, 3}, random_floats(12, 1));  // transB: [N, K]
  mb.init_floats("c", {4}, random_floats(4, 2));
  auto* n = mb.node("Gemm", {"a", "b", "c"}, {"y"}, "fc");
  attr_int(n, "transB", 1);
  attr_float(n, "alpha", 0.5F);
  attr_float(n, "beta", 2.0F);
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  EXPECT_EQ(m.inputs.at(0).dims, (shape{-1, 3}));
  EXPECT_EQ(m.inputs.at(0).dim_names.at(0), "batch");
  const auto a = random_floats(6, 3);
  const auto b = random_floats(12, 1);
  const auto c = random_floats(4, 2);
  const auto y = run1(m, {{"a", memory::host_tensor<float>({2, 3}, a)}});
  ASSERT_EQ(y.size(), 8U);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      double acc = 0;
      for (int k = 0; k < 3; ++k) acc += double(a[i * 3 + k]) * b[j * 3 + k];
      EXPECT_NEAR(y[i * 4 + j], 0.5 * acc + 2.0 * c[j], 1e-5);
    }
  }
}

TEST(OnnxImport, BatchNormalizationMatchesFloat64) {
  model_builder mb;
  mb.input("x", {1, 2, 2, 2});
  mb.init_floats("s", {2}, {1.5F, -0.5F});
  mb.init_floats("b", {2}, {0.25F, 1.0F});
  mb.init_floats("m", {2}, {0.1F, -0.2F});
  mb.init_floats("v", {2}, {0.5F, 2.0F});
  auto* n = mb.node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y"}, "bn");
  attr_float(n, "epsilon", 1e-3F);
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  const auto x = random_floats(8, 4);
  const auto y = run1(m, {{"x", memory::host_tensor<float>({1, 2, 2, 2}, x)}});
  const double s[] = {1.5, -0.5}, bb[] = {0.25, 1.0}, mm[] = {0.1, -0.2}, vv[] = {0.5, 2.0};
  for (int i = 0; i < 8; ++i) {
    const int ch = i / 4;
    const double ref = (x[i] - double(float(mm[ch]))) / std::sqrt(double(float(vv[ch])) + double(1e-3F)) *
                           double(float(s[ch])) + double(float(bb[ch]));
    EXPECT_NEAR(y[i], ref, 1e-5) << i;
  }
}

// MaxPool's Indices output over a 1-D window (loom's 2-D op over a height of 1): values and
// int64 indices into the flattened input, plane · L + l in either storage order; the first
// maximum wins ties.
TEST(OnnxImport, MaxPoolIndicesMatchFloat64) {
  for (const std::int64_t order : {0, 1}) {
    model_builder mb;
    mb.input("x", {2, 2, 7});
    auto* n = mb.node("MaxPool", {"x"}, {"y", "i"}, "pool");
    auto* k = n->add_attribute();
    k->set_name("kernel_shape");
    k->set_type(::onnx::AttributeProto::INTS);
    k->add_ints(3);
    auto* st = n->add_attribute();
    st->set_name("strides");
    st->set_type(::onnx::AttributeProto::INTS);
    st->add_ints(2);
    auto* pads = n->add_attribute();
    pads->set_name("pads");
    pads->set_type(::onnx::AttributeProto::INTS);
    pads->add_ints(1);
    pads->add_ints(1);
    attr_int(n, "storage_order", order);
    mb.output("y");
    mb.output("i", P::INT64);
    auto m = onnx::import_bytes(mb.bytes());
    std::vector<float> x = random_floats(28, 7);
    for (auto& v : x) v = std::round(v);  // ties
    session s(std::move(m.graph));
    const auto out = s.run({feed(m.inputs.at(0).tensor, memory::host_tensor<float>({2, 2, 7}, x))},
                           {m.outputs.at(0).tensor, m.outputs.at(1).tensor});
    ASSERT_EQ(out.at(0).shape(), (shape{2, 2, 4}));
    ASSERT_EQ(out.at(1).shape(), (shape{2, 2, 4}));
    ASSERT_EQ(out.at(1).type(), dtype::i64);
    const auto y = out.at(0).span<float>();
    const auto idx = out.at(1).span<std::int64_t>();
    for (std::int64_t plane = 0; plane < 4; ++plane) {
      for (std::int64_t o = 0; o < 4; ++o) {
        double best = -INFINITY;
        std::int64_t at = -1;
        for (std::int64_t t = o * 2 - 1; t < o * 2 + 2; ++t) {
          if (t < 0 || t >= 7) continue;
          const double v = x[static_cast<std::size_t>(plane * 7 + t)];
          if (v > best) {
            best = v;
            at = plane * 7 + t;
          }
        }
        const auto j = static_cast<std::size_t>(plane * 4 + o);
        EXPECT_EQ(y[j], best) << j;
        EXPECT_EQ(idx[j], at) << j;
      }
    }
  }
}

// Shape -> Gather -> Unsqueeze -> Concat -> Reshape over a symbolic batch: the import knows
// every element but the batch, so the Reshape is loom's static reshape with -1.
// ONNX's Conv B is a term of the convolution's sum: one fused_conv2d with bias_in_sum (the
// bias where the kernel adds it, as ONNX Runtime and PyTorch have it), which the session's
// epilogue fusion then extends with the Relu after it. 2-D and 1-D.
TEST(OnnxImport, ConvBiasIsATermOfTheConvolutionsSum) {
  for (const bool one_d : {false, true}) {
    SCOPED_TRACE(one_d ? "1-D" : "2-D");
    const std::int64_t n = 2, c = 3, o = 4, h = one_d ? 1 : 5, w = 6, k = 3;
    model_builder mb;
    mb.input("x", one_d ? std::vector<std::int64_t>{n, c, w} : std::vector<std::int64_t>{n, c, h, w});
    const auto wv = random_floats(static_cast<std::size_t>(o * c * (one_d ? 1 : k) * k), 21);
    const auto bv = random_floats(static_cast<std::size_t>(o), 22);
    mb.init_floats("w", one_d ? std::vector<std::int64_t>{o, c, k} : std::vector<std::int64_t>{o, c, k, k}, wv);
    mb.init_floats("b", {o}, bv);
    auto* conv = mb.node("Conv", {"x", "w", "b"}, {"c"}, "conv");
    auto* pads = conv->add_attribute();
    pads->set_name("pads");
    pads->set_type(::onnx::AttributeProto::INTS);
    for (int i = 0; i < (one_d ? 2 : 4); ++i) pads->add_ints(1);
    mb.node("Relu", {"c"}, {"y"}, "act");
    mb.output("y");
    auto m = onnx::import_bytes(mb.bytes());
    const node* fused = m.graph.find(one_d ? "conv/conv" : "conv");
    ASSERT_NE(fused, nullptr);
    EXPECT_EQ(fused->op(), "fused_conv2d");
    EXPECT_TRUE(fused->attr<bool>("bias_in_sum"));
    const auto x = random_floats(static_cast<std::size_t>(n * c * h * w), 23);
    const std::vector<std::int64_t> xdims = one_d ? std::vector<std::int64_t>{n, c, w} : std::vector<std::int64_t>{n, c, h, w};
    const auto y = run1(m, {{"x", memory::host_tensor<float>(shape(xdims), x)}});
    ASSERT_EQ(y.size(), static_cast<std::size_t>(n * o * h * w));
    const std::int64_t kh = one_d ? 1 : k, ph = one_d ? 0 : 1;
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t oc = 0; oc < o; ++oc) {
        for (std::int64_t r = 0; r < h; ++r) {
          for (std::int64_t q = 0; q < w; ++q) {
            double sum = bv[static_cast<std::size_t>(oc)];
            double scale = std::fabs(sum);
            for (std::int64_t ch = 0; ch < c; ++ch) {
              for (std::int64_t u = 0; u < kh; ++u) {
                for (std::int64_t v = 0; v < k; ++v) {
                  const std::int64_t yy = r + u - ph, xx = q + v - 1;
                  if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
                  const double p = double(x[static_cast<std::size_t>(((i * c + ch) * h + yy) * w + xx)]) *
                                   wv[static_cast<std::size_t>(((oc * c + ch) * kh + u) * k + v)];
                  sum += p;
                  scale += std::fabs(p);
                }
              }
            }
            const double got = y[static_cast<std::size_t>(((i * o + oc) * h + r) * w + q)];
            EXPECT_NEAR(got, std::max(sum, 0.0), 1e-5 * scale) << i << "," << oc << "," << r << "," << q;
          }
        }
      }
    }
  }
}

TEST(OnnxImport, BatchNormalizationAfterGemmIsFoldedIntoItsWeights) {
  model_builder mb;
  mb.input("x", {-1, 3});
  const auto w = random_floats(6, 11);  // [K=3, N=2]
  mb.init_floats("w", {3, 2}, w);
  mb.init_floats("c", {2}, {0.5F, -1.0F});
  mb.node("Gemm", {"x", "w", "c"}, {"h"}, "fc");
  mb.init_floats("s", {2}, {2.0F, 0.5F});
  mb.init_floats("b", {2}, {0.1F, 0.2F});
  mb.init_floats("m", {2}, {-0.3F, 0.4F});
  mb.init_floats("v", {2}, {1.5F, 0.25F});
  mb.node("BatchNormalization", {"h", "s", "b", "m", "v"}, {"y"}, "bn");
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  ASSERT_EQ(m.rewrites.size(), 1U);
  EXPECT_NE(m.rewrites[0].find("'bn' into Gemm 'fc'"), std::string::npos) << m.rewrites[0];
  EXPECT_EQ(m.graph.find("bn"), nullptr);
  const auto x = random_floats(6, 12);
  const auto y = run1(m, {{"x", memory::host_tensor<float>({2, 3}, x)}});
  const double c[] = {0.5, -1.0}, s[] = {2.0, 0.5}, b[] = {0.1, 0.2}, mm[] = {-0.3, 0.4}, vv[] = {1.5, 0.25};
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      double h = c[j];
      for (int k = 0; k < 3; ++k) h += double(x[i * 3 + k]) * w[k * 2 + j];
      const double ref = (h - double(float(mm[j]))) / std::sqrt(double(float(vv[j])) + double(1e-5F)) *
                             double(float(s[j])) + double(float(b[j]));
      EXPECT_NEAR(y[i * 2 + j], ref, 1e-5) << i << "," << j;
    }
  }
  // Without the rewrite: the same values, BatchNormalization imported as it is.
  onnx::import_options o;
  o.fuse_patterns = false;
  auto plain = onnx::import_bytes(mb.bytes(), o);
  EXPECT_TRUE(plain.rewrites.empty());
  const auto y2 = run1(plain, {{"x", memory::host_tensor<float>({2, 3}, x)}});
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y2[i], 1e-5);
}

TEST(OnnxImport, GeluWrittenInPiecesBecomesGelu) {
  model_builder mb;
  mb.input("x", {5});
  auto scalar = [&](const std::string& name, float v) { mb.init_floats(name, {}, {v}); };
  scalar("sqrt2", 1.4142135F);
  scalar("one", 1.0F);
  scalar("half", 0.5F);
  mb.node("Div", {"x", "sqrt2"}, {"d"}, "div");
  mb.node("Erf", {"d"}, {"e"}, "erf");
  mb.node("Add", {"e", "one"}, {"a"}, "add");
  mb.node("Mul", {"x", "a"}, {"m"}, "mul");
  mb.node("Mul", {"m", "half"}, {"y"}, "gelu_out");
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  ASSERT_EQ(m.rewrites.size(), 1U);
  ASSERT_NE(m.graph.find("gelu_out"), nullptr);
  EXPECT_EQ(m.graph.find("gelu_out")->op(), "gelu");
  const std::vector<float> x{-3.0F, -0.5F, 0.0F, 1.0F, 4.0F};
  const auto y = run1(m, {{"x", memory::host_tensor<float>({5}, x)}});
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(y[i], 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0))), 1e-6) << x[i];
  }
}

TEST(OnnxImport, ShapeComputationsFoldWhereDimensionsAreKnown) {
  model_builder mb;
  mb.input("x", {-1, 4, 6});
  mb.node("Shape", {"x"}, {"s"}, "shape");
  mb.init_ints("i1", {1});
  mb.init_ints("i2", {2});
  mb.node("Gather", {"s", "i1"}, {"d1"}, "g1");
  mb.node("Gather", {"s", "i2"}, {"d2"}, "g2");
  mb.node("Mul", {"d1", "d2"}, {"n"}, "mul");
  mb.init_ints("minus1", {-1});
  mb.node("Concat", {"minus1", "n"}, {"target"}, "concat")->add_attribute()->CopyFrom([] {
    ::onnx::AttributeProto a;
    a.set_name("axis");
    a.set_type(::onnx::AttributeProto::INT);
    a.set_i(0);
    return a;
  }());
  mb.node("Reshape", {"x", "target"}, {"y"}, "reshape");
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  const node* r = nullptr;
  for (node_id id = 0; id < static_cast<node_id>(m.graph.num_nodes()); ++id) {
    if (m.graph.at(id).name == "reshape") r = &m.graph.at(id);
  }
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->op(), "reshape");
  EXPECT_EQ(r->attr<std::vector<std::int64_t>>("shape"), (std::vector<std::int64_t>{-1, 24}));
  session s(std::move(m.graph));
  for (std::int64_t batch : {1, 3}) {
    const auto x = random_floats(static_cast<std::size_t>(batch * 24), 5);
    auto out = s.run({{"x", memory::host_tensor<float>({batch, 4, 6}, x)}}, {"y"});
    EXPECT_EQ(out[0].shape(), (shape{batch, 24}));
    auto span = out[0].span<float>();
    EXPECT_EQ(std::vector<float>(span.begin(), span.end()), x);
  }
}

TEST(OnnxImport, ConstantSubgraphsAreEvaluatedAtImport) {
  model_builder mb;
  mb.input("x", {2});
  mb.init_floats("a", {2}, {1, 2});
  mb.init_floats("b", {2}, {10, 20});
  mb.node("Add", {"a", "b"}, {"ab"}, "const_add");
  mb.node("Mul", {"x", "ab"}, {"y"}, "scale");
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  bool folded = false;
  for (node_id id = 0; id < static_cast<node_id>(m.graph.num_nodes()); ++id) {
    const node& n = m.graph.at(id);
    if (n.name == "const_add") folded = n.op() == "const";
  }
  EXPECT_TRUE(folded);
  const auto y = run1(m, {{"x", memory::host_tensor<float>({2}, {2.0F, 3.0F})}});
  EXPECT_EQ(y, (std::vector<float>{22, 66}));
}

// A small model that expands to a large constant: computed at run time, not held as a
// constant by the import.
TEST(OnnxImport, LargeResultsOfKnownInputsAreLeftToRunTime) {
  model_builder mb;
  mb.init_ints("small", {4});
  mb.init_ints("large", {2048, 4096});  // 32 MiB of float32
  mb.node("ConstantOfShape", {"small"}, {"a"}, "small_fill");
  mb.node("ConstantOfShape", {"large"}, {"b"}, "large_fill");
  auto* r = mb.node("ReduceSum", {"b"}, {"y"}, "sum");
  attr_int(r, "keepdims", 0);
  mb.output("y");
  mb.output("a");
  auto m = onnx::import_bytes(mb.bytes());
  EXPECT_EQ(m.graph.find("small_fill")->op(), "const");
  EXPECT_EQ(m.graph.find("large_fill")->op(), "fill");
  session s(std::move(m.graph));
  auto out = s.run({}, {m.outputs.at(0).tensor});
  EXPECT_EQ(out.at(0).span<float>()[0], 0.0F);  // ConstantOfShape's default value is 0
}

TEST(OnnxImport, NodeNamesAreKeptAndMadeValid) {
  model_builder mb;
  mb.input("in:0", {2});
  mb.node("Relu", {"in:0"}, {"r"}, "block 1/relu:a");
  mb.node("Neg", {"r"}, {"out"}, "");
  mb.output("out");
  auto m = onnx::import_bytes(mb.bytes());
  EXPECT_EQ(m.inputs.at(0).tensor, "in_0");
  std::vector<std::string> names;
  for (node_id id = 0; id < static_cast<node_id>(m.graph.num_nodes()); ++id) names.push_back(m.graph.at(id).name);
  EXPECT_NE(std::find(names.begin(), names.end(), "block_1/relu_a"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "Neg_1"), names.end());
  const auto y = run1(m, {{"in:0", memory::host_tensor<float>({2}, {-1.0F, 2.0F})}});
  EXPECT_EQ(y, (std::vector<float>{0.0F, -2.0F}));
}

TEST(OnnxImport, InitializersBecomeVariablesOnRequest) {
  model_builder mb;
  mb.input("x", {2});
  mb.init_floats("w", {2}, {3, 4});
  mb.node("Mul", {"x", "w"}, {"y"}, "mul");
  mb.output("y");
  onnx::import_options o;
  o.initializers_as_variables = true;
  auto m = onnx::import_bytes(mb.bytes(), o);
  ASSERT_EQ(m.variables, (std::vector<std::string>{"w"}));
  ASSERT_NE(m.graph.find("w"), nullptr);
  EXPECT_EQ(m.graph.find("w")->op(), "variable");
  const auto y = run1(m, {{"x", memory::host_tensor<float>({2}, {1.0F, 2.0F})}});
  EXPECT_EQ(y, (std::vector<float>{3, 8}));
}

TEST(OnnxImport, OldOpsetsAreConverted) {
  model_builder mb(9);
  mb.input("x", {3});
  mb.node("Relu", {"x"}, {"y"}, "relu");
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  EXPECT_EQ(m.opset, 13);
  const auto y = run1(m, {{"x", memory::host_tensor<float>({3}, {-1.0F, 0.5F, 2.0F})}});
  EXPECT_EQ(y, (std::vector<float>{0.0F, 0.5F, 2.0F}));
}

class OnnxExternalData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_onnx_ext_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A model whose weight lives in `location` at `offset`; the file holds `file_floats`.
  std::string model(const std::string& location, std::int64_t offset, std::size_t file_floats) {
    std::vector<float> data(file_floats);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
    std::ofstream(dir_ / "weights.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * 4));
    model_builder mb;
    mb.input("x", {2});
    auto* t = mb.g->add_initializer();
    t->set_name("w");
    t->set_data_type(P::FLOAT);
    t->add_dims(2);
    t->set_data_location(P::EXTERNAL);
    auto kv = [&](const std::string& k, const std::string& v) {
      auto* e = t->add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    kv("location", location);
    kv("offset", std::to_string(offset));
    kv("length", "8");
    mb.node("Add", {"x", "w"}, {"y"}, "add");
    mb.output("y");
    const fs::path path = dir_ / "model.onnx";
    std::ofstream(path, std::ios::binary) << mb.bytes();
    return path.string();
  }
  fs::path dir_;
};

TEST_F(OnnxExternalData, IsReadFromTheModelsDirectory) {
  auto m = onnx::import_file(model("weights.bin", 8, 4));
  const auto y = run1(m, {{"x", memory::host_tensor<float>({2}, {10.0F, 20.0F})}});
  EXPECT_EQ(y, (std::vector<float>{12, 23}));
}

TEST_F(OnnxExternalData, MissingOrShortFilesAreNamed) {
  try {
    (void)onnx::import_file(model("nowhere.bin", 0, 4));
    FAIL();
  } catch (const not_found& e) {
    EXPECT_NE(std::string(e.what()).find("nowhere.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  try {
    (void)onnx::import_file(model("weights.bin", 8, 3));
    FAIL();
  } catch (const not_found& e) {
    EXPECT_NE(std::string(e.what()).find("holds 12 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)onnx::import_file(model("../weights.bin", 0, 4)), invalid_argument);
}

TEST(OnnxImportErrors, UnsupportedOpsAreListedTogether) {
  model_builder mb;
  mb.input("x", {2});
  mb.node("Relu", {"x"}, {"a"}, "ok");
  mb.node("Einsteinify", {"a"}, {"b"}, "n1");  // not an ONNX op: the checker refuses it
  mb.output("b");
  onnx::import_options o;
  o.check_model = false;
  try {
    (void)onnx::import_bytes(mb.bytes(), o, "m.onnx");
    FAIL();
  } catch (const unsupported_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ai.onnx Einsteinify (opset 17): 1 node 'n1'"), std::string::npos) << what;
  }
  model_builder custom;
  auto* o2 = custom.m.add_opset_import();
  o2->set_domain("com.example");
  o2->set_version(1);
  custom.input("x", {2});
  custom.node("Frobnicate", {"x"}, {"a"}, "f1")->set_domain("com.example");
  custom.node("Frobnicate", {"a"}, {"b"}, "f2")->set_domain("com.example");
  custom.output("b");
  try {
    (void)onnx::import_bytes(custom.bytes(), o);
    FAIL();
  } catch (const unsupported_error& e) {
    EXPECT_NE(std::string(e.what()).find("com.example Frobnicate (opset 1): 2 nodes 'f1', 'f2'"),
              std::string::npos)
        << e.what();
  }
}

TEST(OnnxImportErrors, BadFilesAndModelsAreTypedErrors) {
  model_builder mb;
  mb.input("x", {2});
  mb.node("Relu", {"x"}, {"y"}, "relu");
  mb.output("y");
  const std::string good = mb.bytes();
  EXPECT_THROW((void)onnx::import_bytes(good.substr(0, good.size() / 2)), error);
  EXPECT_THROW((void)onnx::import_bytes("\xff\xff\xff\xff garbage"), parse_error);
  EXPECT_THROW((void)onnx::import_file("/nonexistent/model.onnx"), not_found);

  model_builder future(18);
  future.input("x", {2});
  future.node("Relu", {"x"}, {"y"});
  future.output("y");
  EXPECT_THROW((void)onnx::import_bytes(future.bytes()), unsupported_error);

  model_builder dangling;
  dangling.input("x", {2});
  dangling.node("Add", {"x", "nowhere"}, {"y"}, "add");
  dangling.output("y");
  EXPECT_THROW((void)onnx::import_bytes(dangling.bytes()), invalid_argument);

  // A node whose inputs do not fit: named in the error.
  model_builder mismatch;
  mismatch.input("a", {2, 3});
  mismatch.input("b", {4, 5});
  mismatch.node("MatMul", {"a", "b"}, {"y"}, "mm");
  mismatch.output("y");
  try {
    (void)onnx::import_bytes(mismatch.bytes());
    FAIL();
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'mm'"), std::string::npos) << e.what();
  }
}

TEST(OnnxImportErrors, FeedsThatContradictTheModelFailAndTheSessionGoesOn) {
  model_builder mb;
  mb.input("x", {-1, 3});
  mb.node("Relu", {"x"}, {"y"}, "relu");
  mb.output("y");
  auto m = onnx::import_bytes(mb.bytes());
  session s(std::move(m.graph));
  EXPECT_THROW((void)s.run({{"x", memory::host_tensor<float>({2, 4}, std::vector<float>(8))}}, {"y"}),
               invalid_argument);
  EXPECT_THROW((void)s.run({{"x", memory::host_tensor<double>({2, 3}, std::vector<double>(6))}}, {"y"}),
               invalid_argument);
  auto out = s.run({{"x", memory::host_tensor<float>({1, 3}, {-1.0F, 0.0F, 1.0F})}}, {"y"});
  auto v = out[0].span<float>();
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()), (std::vector<float>{0, 0, 1}));
}

}  // namespace
}  // namespace loom
