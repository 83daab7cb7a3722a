// matmul against a float64 loop: rank 2 and batched shapes with broadcasting, transposes,
// empty operands, non-contiguous and broadcast views, every float dtype; batches folded into
// one 2-D product; a constant weight kept in oneDNN's layout across runs and shapes, a
// changing one read on every run; one kernel reused across shapes and threads (its primitive
// cache); bad input; the nn builders' inference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

struct product {
  shape s;
  std::vector<double> v;
  std::vector<double> scale;  // Σ|a·b| per element: what rounding errors scale with
};

// Row-major index of the element of `x`'s batch that broadcasts to output batch index `idx`.
std::int64_t batch_offset(const shape& xs, const shape& out_batch, std::int64_t idx) {
  const std::size_t xb = xs.rank() - 2;
  std::int64_t off = 0;
  std::int64_t stride = 1;
  for (std::size_t i = out_batch.rank(); i-- > 0;) {
    const std::int64_t d = idx % out_batch[i];
    idx /= out_batch[i];
    const std::size_t lead = out_batch.rank() - xb;
    if (i >= lead) {
      const std::int64_t xd = xs[i - lead];
      off += (xd == 1 ? 0 : d) * stride;
      stride *= xd;
    }
  }
  return off;
}

// NumPy's matmul in float64 of the values a and b hold.
product reference(const tensor& a, const tensor& b, bool ta, bool tb) {
  const shape& as = a.shape();
  const shape& bs = b.shape();
  const std::size_t ra = as.rank();
  const std::size_t rb = bs.rank();
  const std::int64_t m = ta ? as[ra - 1] : as[ra - 2];
  const std::int64_t k = ta ? as[ra - 2] : as[ra - 1];
  const std::int64_t n = tb ? bs[rb - 2] : bs[rb - 1];
  shape batch = broadcast_shapes(shape(as.dims().first(ra - 2)), shape(bs.dims().first(rb - 2)));
  const std::int64_t batches = batch.num_elements();
  const auto av = values(a);
  const auto bv = values(b);
  product p;
  p.s = batch;
  p.s.push_back(m);
  p.s.push_back(n);
  p.v.assign(static_cast<std::size_t>(batches * m * n), 0.0);
  p.scale.assign(p.v.size(), 0.0);
  const std::int64_t a_mat = as[ra - 1] * as[ra - 2];
  const std::int64_t b_mat = bs[rb - 1] * bs[rb - 2];
  for (std::int64_t bi = 0; bi < batches; ++bi) {
    const std::int64_t ao = batch_offset(as, batch, bi) * a_mat;
    const std::int64_t bo = batch_offset(bs, batch, bi) * b_mat;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0;
        double mag = 0;
        for (std::int64_t kk = 0; kk < k; ++kk) {
          const double x = av[static_cast<std::size_t>(ao + (ta ? kk * m + i : i * k + kk))];
          const double y = bv[static_cast<std::size_t>(bo + (tb ? j * k + kk : kk * n + j))];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        const auto o = static_cast<std::size_t>((bi * m + i) * n + j);
        p.v[o] = sum;
        p.scale[o] = mag;
      }
    }
  }
  return p;
}

// Relative error allowed against Σ|a·b| (the output is rounded to the dtype once).
double tolerance(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-13;
    case dtype::f32:
      return 1e-5;
    case dtype::f16:
      return 2e-3;
    default:
      return 1e-2;  // bfloat16
  }
}

void expect_product(const tensor& got, const product& want, dtype t) {
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(to_string(got.shape()), to_string(want.s));
  EXPECT_EQ(got.type(), t);
  const auto g = values(got);
  int reported = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = tolerance(t) * want.scale[i] + 1e-30;
    if (!(std::fabs(g[i] - want.v[i]) <= tol) && reported++ < 8) {
      ADD_FAILURE() << "element " << i << ": got " << g[i] << ", expected " << want.v[i]
                    << " (tolerance " << tol << ", " << got.describe() << ")";
    }
  }
}

void check(const tensor& a, const tensor& b, bool ta = false, bool tb = false) {
  SCOPED_TRACE("a " + a.describe() + (ta ? " (T)" : "") + ", b " + b.describe() +
               (tb ? " (T)" : ""));
  const tensor got = run_op1("matmul", {a, b}, {{"transpose_a", ta}, {"transpose_b", tb}});
  expect_product(got, reference(a, b, ta, tb), a.type());
}

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

TEST(NnMatmul, Rank2Sizes) {
  struct mkn {
    std::int64_t m, k, n;
  };
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& s : {mkn{1, 1, 1}, mkn{7, 13, 5}, mkn{1, 64, 1}, mkn{5, 1, 9}, mkn{64, 32, 48},
                          mkn{130, 70, 257}}) {
      const tensor a = random(t, {s.m, s.k}, seed++);
      check(a, random(t, {s.k, s.n}, seed++));
    }
  }
}

TEST(NnMatmul, Transposes) {
  for (const dtype t : float_types) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        const shape as = ta ? shape{13, 7} : shape{7, 13};
        const shape bs = tb ? shape{5, 13} : shape{13, 5};
        check(random(t, as, 3), random(t, bs, 4), ta, tb);
        const shape as2 = ta ? shape{2, 40, 33} : shape{2, 33, 40};
        const shape bs2 = tb ? shape{17, 40} : shape{40, 17};
        check(random(t, as2, 5), random(t, bs2, 6), ta, tb);
      }
    }
  }
}

TEST(NnMatmul, EmptyOperands) {
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16}) {
    // K = 0: every element is an empty sum.
    const tensor z = run_op1("matmul", {random(t, {3, 0}, 1), random(t, {0, 4}, 2)});
    expect_close(z, {3, 4}, std::vector<double>(12, 0.0), 0, 0);
    const tensor zb = run_op1("matmul", {random(t, {2, 3, 0}, 1), random(t, {0, 4}, 2)});
    expect_close(zb, {2, 3, 4}, std::vector<double>(24, 0.0), 0, 0);
    expect_close(run_op1("matmul", {random(t, {0, 5}, 1), random(t, {5, 3}, 2)}), {0, 3}, {});
    expect_close(run_op1("matmul", {random(t, {4, 5}, 1), random(t, {5, 0}, 2)}), {4, 0}, {});
    expect_close(run_op1("matmul", {random(t, {0, 4, 5}, 1), random(t, {5, 3}, 2)}), {0, 4, 3}, {});
  }
}

TEST(NnMatmul, BatchedBroadcast) {
  for (const dtype t : float_types) {
    check(random(t, {3, 4, 5}, 1), random(t, {5, 6}, 2));
    check(random(t, {4, 5}, 1), random(t, {3, 5, 6}, 2));
    check(random(t, {3, 4, 5}, 1), random(t, {3, 5, 6}, 2));
    check(random(t, {1, 4, 5}, 1), random(t, {3, 5, 6}, 2));
    check(random(t, {2, 1, 4, 5}, 1), random(t, {1, 3, 5, 6}, 2));
    check(random(t, {2, 3, 4, 5}, 1), random(t, {3, 6, 5}, 2), false, true);
    check(random(t, {2, 1, 5, 4}, 1), random(t, {2, 5, 6}, 2), true, false);
    check(random(t, {2, 2, 3, 7, 5}, 1), random(t, {3, 5, 6}, 2));
  }
}

TEST(NnMatmul, NonContiguousInputs) {
  for (const dtype t : float_types) {
    // Column-major views (what a transpose produces): taken by oneDNN without a copy.
    const tensor a = random(t, {9, 11}, 1);
    const tensor b = random(t, {11, 6}, 2);
    check(non_contiguous(a), b);
    check(a, non_contiguous(b));
    check(non_contiguous(a), non_contiguous(b));
    check(non_contiguous(random(t, {11, 9}, 3)), non_contiguous(random(t, {6, 11}, 4)), true, true);
    check(non_contiguous(random(t, {3, 9, 11}, 5)), b);
    // A batch broadcast through a zero stride.
    const tensor one = random(t, {1, 9, 11}, 6);
    check(broadcast_view(one, {4, 9, 11}), random(t, {4, 11, 6}, 7));
    check(random(t, {4, 9, 11}, 8), broadcast_view(random(t, {11, 6}, 9), {4, 11, 6}));
    // Every other column: no unit stride, made dense first.
    const tensor wide = random(t, {9, 22}, 10);
    const tensor cols = tensor::strided(wide.buf(), t, {9, 11}, {22, 2}, 1);
    check(cols, b);
    // A row-major view with a padded leading dimension and an offset.
    const tensor padded = tensor::strided(wide.buf(), t, {9, 11}, {22, 1}, 3);
    check(padded, b);
    check(random(t, {9, 5}, 11), tensor::strided(wide.buf(), t, {6, 9}, {22, 1}, 2), true, true);
  }
}

TEST(NnMatmul, LargerFloat64UsesAllThreads) {
  check(random(dtype::f64, {3, 70, 90}, 1), random(dtype::f64, {90, 300}, 2));
}

// One kernel object across shapes (its cache keys must tell them apart), layouts and
// threads; for float16 the first call finds that oneDNN lacks it and later calls go
// straight to the reference loop.
TEST(NnMatmul, KernelReusedAcrossShapesAndThreads) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, {-1, -1});
    auto y = ops::placeholder(b, "y", t, {-1, -1});
    const node& n = g.get(ops::matmul(x, y, false, false, {.name = "under_test"}).producer().name);
    auto kernel = kernel_registry::global()
                      .get(n, device_type::cpu)
                      .create(kernel_construction(n, test_device(), &g));
    const auto run = [&](const tensor& a, const tensor& bm) {
      std::vector<tensor> in{a, bm};
      std::vector<tensor> out(1);
      variable_store vars;
      kernel_context ctx(n, test_device(), in, out, &vars, nullptr);
      kernel->compute(ctx);
      return out[0];
    };
    for (int round = 0; round < 2; ++round) {
      for (const auto& [m, k, nn] :
           std::vector<std::tuple<int, int, int>>{{4, 5, 6}, {8, 3, 2}, {4, 5, 7}, {33, 17, 9}}) {
        const tensor a = random(t, {m, k}, 11 + m);
        const tensor bm = random(t, {k, nn}, 12 + nn);
        expect_product(run(a, bm), reference(a, bm, false, false), t);
        expect_product(run(non_contiguous(a), bm), reference(a, bm, false, false), t);
      }
    }
    std::vector<std::thread> threads;
    std::vector<int> failures(4, 0);
    for (int th = 0; th < 4; ++th) {
      threads.emplace_back([&, th] {
        for (int i = 0; i < 10; ++i) {
          const tensor a = random(t, {16 + th, 24}, 100 + th);
          const tensor bm = random(t, {24, 20}, 200 + th);
          const auto got = values(run(a, bm));
          const auto want = reference(a, bm, false, false);
          for (std::size_t j = 0; j < got.size(); ++j) {
            if (!(std::fabs(got[j] - want.v[j]) <= tolerance(t) * want.scale[j])) ++failures[th];
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int th = 0; th < 4; ++th) EXPECT_EQ(failures[th], 0) << "thread " << th;
  }
}

// Note [folded batch]: a B without a batch of its own and A's rows evenly spaced across its
// batches make one 2-D product; A broadcast over the batch, A transposed and rows spaced
// unevenly do not fold. Every case against the float64 reference.
TEST(NnMatmul, FoldedBatch) {
  for (const dtype t : float_types) {
    SCOPED_TRACE(to_string(t));
    check(random(t, {16, 1, 24}, 1), random(t, {24, 40}, 2));       // [seq, 1, d] x [d, n]
    check(random(t, {2, 3, 4, 5}, 3), random(t, {1, 1, 5, 6}, 4));  // B's batch dims all 1
    check(random(t, {1, 4, 5}, 5), random(t, {1, 5, 6}, 6));
    check(random(t, {3, 4, 5}, 7), random(t, {6, 5}, 8), false, true);   // B transposed
    check(random(t, {3, 5, 4}, 9), random(t, {5, 6}, 10), true, false);  // A transposed
    check(random(t, {5, 1, 1}, 11), random(t, {1, 3}, 12));              // K = 1, M = 1
    check(broadcast_view(random(t, {1, 9, 11}, 13), {4, 9, 11}), random(t, {11, 6}, 14));
    const tensor buf = random(t, {6, 22}, 15);
    const tensor b = random(t, {11, 6}, 16);
    // Rows of 11 in a row stride of 22, batches of 3 rows: evenly spaced, folds.
    check(tensor::strided(buf.buf(), t, {2, 3, 11}, {66, 22, 1}, 0), b);
    // Batches 2 rows apart (they overlap): not evenly spaced.
    check(tensor::strided(buf.buf(), t, {2, 3, 11}, {44, 22, 1}, 1), b);
    // M = 1: the rows are the batch, 22 apart.
    check(tensor::strided(buf.buf(), t, {6, 1, 11}, {22, 11, 1}, 2), b);
    check(tensor::strided(buf.buf(), t, {2, 3, 1, 11}, {66, 22, 5, 1}, 3), b);
  }
}

// A graph y = x @ w with w a `const` node, and the same with w fed.
struct weight_graphs {
  session with_constant;
  session fed;
};

weight_graphs make_weight_graphs(const tensor& w, const shape& xs, bool tb) {
  const dtype t = w.type();
  graph constant_graph;
  {
    graph_builder b(constant_graph);
    auto x = ops::placeholder(b, "x", t, xs);
    (void)ops::matmul(x, ops::constant(b, w, {.name = "w", .device = {}}), false, tb,
                      {.name = "y", .device = {}});
  }
  graph fed_graph;
  {
    graph_builder b(fed_graph);
    auto x = ops::placeholder(b, "x", t, xs);
    (void)ops::matmul(x, ops::placeholder(b, "w", t, w.shape()), false, tb,
                      {.name = "y", .device = {}});
  }
  session_options so;
  so.passes.enabled = false;  // the const stays a const input of the matmul
  return {session(std::move(constant_graph), so), session(std::move(fed_graph), so)};
}

void expect_same_bits(const tensor& a, const tensor& b) {
  ASSERT_EQ(to_string(a.shape()), to_string(b.shape()));
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

// Note [constant weights]: a `const` B is reordered into oneDNN's layout once and kept;
// run after run, for new inputs, the answers are the reference's and bit for bit those of
// the same B fed at run time.
TEST(NnMatmul, ConstantWeightKeptAcrossRuns) {
  struct problem {
    shape xs, ws;
    bool tb;
  };
  for (const dtype t : {dtype::f32, dtype::bf16, dtype::f64}) {
    for (const auto& p :
         {problem{{16, 1, 32}, {32, 48}, false}, problem{{2, 17, 40}, {40, 33}, false},
          problem{{9, 70}, {130, 70}, true}, problem{{3, 4, 5}, {3, 5, 6}, false},
          problem{{2, 64, 96}, {96, 80}, false}}) {
      SCOPED_TRACE(std::string(to_string(t)) + " " + to_string(p.xs) + " x " + to_string(p.ws));
      const tensor w = random(t, p.ws, 7);
      auto [with_constant, fed] = make_weight_graphs(w, p.xs, p.tb);
      for (std::uint64_t seed : {1U, 2U, 3U}) {
        const tensor x = random(t, p.xs, seed);
        const auto a = with_constant.run({{"x", x}}, {"y"});
        const auto b = fed.run({{"x", x}, {"w", w}}, {"y"});
        expect_product(a.at(0), reference(x, w, false, p.tb), t);
        expect_same_bits(a.at(0), b.at(0));
      }
    }
  }
}

// One kernel with a `const` B meets new shapes (a sequence length that changes from run to
// run): each shape's plan takes the reordered B of its own layout, shared where the layouts
// agree (Note [constant reorders]), and every answer is the reference's and the fed B's.
TEST(NnMatmul, ConstantWeightAcrossShapes) {
  for (const dtype t : {dtype::f32, dtype::bf16}) {
    SCOPED_TRACE(to_string(t));
    const tensor w = random(t, {96, 40}, 1);
    auto [with_constant, fed] = make_weight_graphs(w, {-1, 96}, false);
    std::uint64_t seed = 2;
    for (const std::int64_t m : {16, 1, 128, 7, 16, 300, 1, 128}) {
      SCOPED_TRACE(m);
      const tensor x = random(t, {m, 96}, seed++);
      const auto a = with_constant.run({{"x", x}}, {"y"});
      expect_product(a.at(0), reference(x, w, false, false), t);
      expect_same_bits(a.at(0), fed.run({{"x", x}, {"w", w}}, {"y"}).at(0));
    }
  }
}

// A B that is not constant is read on every run: a fed B that changes between runs, and a
// variable updated in place (the same buffer, new values).
TEST(NnMatmul, ChangingWeightHonoured) {
  for (const dtype t : {dtype::f32, dtype::bf16}) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {2, 8, 24}, 1);
    const tensor w1 = random(t, {24, 40}, 2);
    const tensor w2 = random(t, {24, 40}, 3);
    auto graphs = make_weight_graphs(w1, x.shape(), false);
    expect_product(graphs.fed.run({{"x", x}, {"w", w1}}, {"y"}).at(0),
                   reference(x, w1, false, false), t);
    expect_product(graphs.fed.run({{"x", x}, {"w", w2}}, {"y"}).at(0),
                   reference(x, w2, false, false), t);

    graph g;
    graph_builder b(g);
    auto px = ops::placeholder(b, "x", t, x.shape());
    auto v = ops::variable(b, "w", w1);
    (void)ops::matmul(px, v, false, false, {.name = "y", .device = {}});
    (void)ops::assign_add(v, ops::placeholder(b, "delta", t, w1.shape()),
                          {.name = "update", .device = {}});
    session s(std::move(g));
    expect_product(s.run({{"x", x}}, {"y"}).at(0), reference(x, w1, false, false), t);
    const tensor delta = random(t, w1.shape(), 4, -0.5, 0.5);
    (void)s.run({{"delta", delta}}, {}, {"update"});
    // The variable now holds w1 + delta, rounded to t as assign_add stores it.
    const tensor w_now = s.run({}, {"w"}).at(0);
    EXPECT_NE(std::memcmp(w_now.raw_data(), w1.raw_data(), w1.nbytes()), 0);
    expect_product(s.run({{"x", x}}, {"y"}).at(0), reference(x, w_now, false, false), t);
  }
}

// With the passes, matmul + bias_add + relu on a `const` weight becomes one fused_matmul,
// which gives the unfused graph's bits (Note [fused epilogue]), the weight kept in oneDNN's
// layout by both.
TEST(NnMatmul, ConstantWeightFusedSameBitsAsUnfused) {
  const dtype t = dtype::f32;
  const tensor w = random(t, {32, 48}, 1);
  const tensor bias = random(t, {48}, 2);
  const auto make = [&] {
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", t, {16, 1, 32});
    auto z = ops::matmul(x, ops::constant(b, w, {.name = "w", .device = {}}));
    (void)ops::relu(ops::bias_add(z, ops::constant(b, bias, {.name = "bias", .device = {}})),
                    {.name = "y", .device = {}});
    return g;
  };
  session fused(make());
  session_options so;
  so.passes.enabled = false;
  session unfused(make(), so);
  std::size_t fused_nodes = 0;
  for (const auto& n : fused.planned_graph({"x"}, {"y"}).nodes())
    fused_nodes += n.op() == "fused_matmul";
  EXPECT_EQ(fused_nodes, 1U);
  for (std::uint64_t seed : {1U, 2U}) {
    const tensor x = random(t, {16, 1, 32}, seed);
    expect_same_bits(fused.run({{"x", x}}, {"y"}).at(0), unfused.run({{"x", x}}, {"y"}).at(0));
  }
}

TEST(NnMatmul, BadInput) {
  const auto f = [](shape as, shape bs, attr_map attrs = {}, dtype tb = dtype::f32) {
    return [=] { run_op1("matmul", {random(dtype::f32, as, 1), random(tb, bs, 2)}, attrs); };
  };
  expect_invalid_argument(f({2, 3}, {4, 5}), {"under_test", "[2, 3]", "[4, 5]", "inner"});
  expect_invalid_argument(f({2, 3}, {2, 5}, {{"transpose_a", true}, {"transpose_b", true}}),
                 {"under_test", "[2, 3]", "[2, 5]"});
  expect_invalid_argument(f({3}, {3, 5}), {"under_test", "rank"});
  expect_invalid_argument(f({2, 3, 4}, {3, 4, 5}), {"under_test", "[2, 3, 4]", "[3, 4, 5]", "broadcast"});
  expect_invalid_argument(f({2, 3}, {3, 5}, {}, dtype::f64), {"under_test"});
  expect_invalid_argument(
      [] {
        run_op1("matmul", {random(dtype::i32, {2, 2}, 1), random(dtype::i32, {2, 2}, 2)});
      },
      {"under_test", "int32"});
}

// The nn builders: a small graph and the types inference gives it.
TEST(NnBuilders, InferredTypes) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {-1, 784});
  auto w = ops::placeholder(b, "w", dtype::f32, {784, 10});
  auto bias = ops::placeholder(b, "bias", dtype::f32, {10});
  auto logits = ops::bias_add(ops::matmul(x, w), bias, "NHWC", {.name = "logits"});
  EXPECT_EQ(to_string(logits.type()), "float32[?, 10]");
  auto wt = ops::placeholder(b, "wt", dtype::f32, {10, 784});
  EXPECT_EQ(to_string(ops::matmul(x, wt, false, true).type()), "float32[?, 10]");
  auto batched = ops::placeholder(b, "batched", dtype::f64, {8, -1, 3, 4});
  auto rhs = ops::placeholder(b, "rhs", dtype::f64, {1, 5, 4});
  EXPECT_EQ(to_string(ops::matmul(batched, rhs, false, true).type()), "float64[8, ?, 3, 5]");

  auto img = ops::placeholder(b, "img", dtype::f32, {-1, 3, 32, 32});
  auto filt = ops::placeholder(b, "filt", dtype::f32, {16, 3, 3, 3});
  auto c = ops::conv2d(img, filt, {.strides = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(to_string(c.type()), "float32[?, 16, 16, 16]");
  auto dw = ops::placeholder(b, "dw", dtype::f32, {16, 1, 5, 5});
  auto d = ops::conv2d(c, dw, {.padding = {2, 2, 2, 2}, .dilations = {1, 1}, .groups = 16});
  EXPECT_EQ(to_string(d.type()), "float32[?, 16, 16, 16]");
  auto cb = ops::bias_add(d, ops::placeholder(b, "cb", dtype::f32, {16}), "NCHW");
  EXPECT_EQ(to_string(cb.type()), "float32[?, 16, 16, 16]");
  auto mp = ops::max_pool2d(cb, {.kernel = {2, 2}});
  EXPECT_EQ(to_string(mp.type()), "float32[?, 16, 8, 8]");
  auto ap = ops::avg_pool2d(
      mp, {.kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1}, .count_include_pad = true});
  EXPECT_EQ(to_string(ap.type()), "float32[?, 16, 4, 4]");
  EXPECT_EQ(ap.producer().attr<bool>("count_include_pad"), true);
  auto unknown = ops::placeholder(b, "unknown", dtype::f32, {-1, -1, -1, -1});
  EXPECT_EQ(to_string(ops::conv2d(unknown, filt).type()), "float32[?, 16, ?, ?]");
  EXPECT_EQ(to_string(ops::max_pool2d(unknown, {.kernel = {2, 2}}).type()), "float32[?, ?, ?, ?]");
}

}  // namespace
}  // namespace loom::testing
