// Numeric gradient checks: for every differentiable op, the symbolic gradient (gradients())
// run through a session in float64 against central differences of the loss
// L = sum(op(x...) * w), w a fixed random tensor (so dL/dy is not all ones).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

using builder_fn = std::function<output(graph_builder&, const std::vector<output>&)>;

// Values in ±[lo, hi], away from 0 and from each other (kinks of abs, relu, max).
std::vector<double> values(std::size_t n, std::mt19937& rng, double lo = 0.2, double hi = 1.5,
                           bool positive = false) {
  std::uniform_real_distribution<double> mag(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) {
    x = mag(rng);
    if (!positive && rng() % 2 == 0) x = -x;
  }
  return v;
}

struct input_spec {
  shape s;
  bool positive = false;  // strictly positive values (log, sqrt, pow's base ...)
};

// Checks every element's gradient (at most `max_checked` per input, spread evenly).
void check(const std::string& what, const std::vector<input_spec>& specs, const builder_fn& build,
           double rtol = 1e-6, std::size_t max_checked = 48) {
  SCOPED_TRACE(what);
  std::mt19937 rng(1234);
  graph g;
  graph_builder b(g);
  std::vector<output> xs;
  std::vector<tensor> feeds;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string name = fmt::format("x{}", i);
    xs.push_back(ops::placeholder(b, name, dtype::f64, specs[i].s));
    const auto n = static_cast<std::size_t>(specs[i].s.num_elements());
    feeds.push_back(memory::host_tensor<double>(specs[i].s, values(n, rng, 0.2, 1.5, specs[i].positive)));
  }
  const output y = build(b, xs);
  ASSERT_TRUE(y.type().shape.has_value());
  const shape ys = *y.type().shape;
  const auto w = memory::host_tensor<double>(
      ys, values(static_cast<std::size_t>(ys.num_elements()), rng, 0.5, 1.0));
  const output loss = ops::reduce_sum(y * ops::constant(b, w));
  const std::vector<output> grads = gradients(loss, xs);
  std::vector<std::string> fetches{loss.name()};
  for (const output& d : grads) fetches.push_back(d.name());
  session s(std::move(g));

  auto run_loss = [&](const std::vector<tensor>& f) {
    std::vector<feed> fs;
    for (std::size_t i = 0; i < f.size(); ++i) fs.push_back({fmt::format("x{}", i), f[i]});
    return s.run(fs, {fetches[0]})[0].span<double>()[0];
  };
  std::vector<feed> fs;
  for (std::size_t i = 0; i < feeds.size(); ++i) fs.push_back({fmt::format("x{}", i), feeds[i]});
  const auto out = s.run(fs, fetches);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    ASSERT_EQ(out[i + 1].shape(), specs[i].s) << "input " << i;
    // Gradients may be views (a broadcast one has stride 0).
    std::vector<double> analytic(static_cast<std::size_t>(out[i + 1].num_elements()));
    copy_to_dense(out[i + 1], analytic.data());
    const std::size_t n = analytic.size();
    const std::size_t step = std::max<std::size_t>(1, n / max_checked);
    for (std::size_t j = 0; j < n; j += step) {
      std::vector<tensor> f = feeds;
      f[i] = memory::contiguous_copy(feeds[i], memory::host_resource::instance(), device_id{});
      double* p = f[i].data<double>();
      const double x0 = p[j];
      const double h = 1e-6 * std::max(1.0, std::fabs(x0));
      p[j] = x0 + h;
      const double up = run_loss(f);
      p[j] = x0 - h;
      const double down = run_loss(f);
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[j], numeric, 1e-7 + rtol * std::fabs(numeric))
          << "input " << i << " element " << j;
    }
  }
}

using in = input_spec;

TEST(GradientCheck, UnaryOps) {
  const shape s{3, 4};
  const std::vector<std::pair<std::string, std::function<output(output)>>> cases = {
      {"neg", [](output x) { return ops::neg(x); }},
      {"abs", [](output x) { return ops::abs(x); }},
      {"exp", [](output x) { return ops::exp(x); }},
      {"tanh", [](output x) { return ops::tanh(x); }},
      {"sigmoid", [](output x) { return ops::sigmoid(x); }},
      {"relu", [](output x) { return ops::relu(x); }},
      {"gelu", [](output x) { return ops::gelu(x); }},
      {"gelu_tanh", [](output x) { return ops::gelu(x, "tanh"); }},
      {"erf", [](output x) { return ops::erf(x); }},
      {"square", [](output x) { return ops::square(x); }},
      {"reciprocal", [](output x) { return ops::reciprocal(x); }},
      {"identity", [](output x) { return ops::identity(x); }},
  };
  for (const auto& [name, f] : cases) {
    check(name, {in{s}}, [&f](graph_builder&, const std::vector<output>& x) { return f(x[0]); });
  }
  for (const auto& [name, f] : std::vector<std::pair<std::string, std::function<output(output)>>>{
           {"log", [](output x) { return ops::log(x); }},
           {"sqrt", [](output x) { return ops::sqrt(x); }},
           {"rsqrt", [](output x) { return ops::rsqrt(x); }}}) {
    check(name, {in{s, true}}, [&f](graph_builder&, const std::vector<output>& x) { return f(x[0]); });
  }
}

TEST(GradientCheck, ElementwiseMathAndActivations) {
  const shape s{3, 4};
  using fn = std::function<output(output)>;
  // x in ±[0.2, 1.5]; scaled or shifted into each function's domain, and away from kinks.
  const std::vector<std::pair<std::string, fn>> cases = {
      {"sin", [](output x) { return ops::sin(x * 2.0); }},
      {"cos", [](output x) { return ops::cos(x * 2.0); }},
      {"tan", [](output x) { return ops::tan(x); }},
      {"asin", [](output x) { return ops::asin(x * 0.6); }},
      {"acos", [](output x) { return ops::acos(x * 0.6); }},
      {"atan", [](output x) { return ops::atan(x * 3.0); }},
      {"sinh", [](output x) { return ops::sinh(x * 2.0); }},
      {"cosh", [](output x) { return ops::cosh(x * 2.0); }},
      {"asinh", [](output x) { return ops::asinh(x * 3.0); }},
      {"acosh", [](output x) { return ops::acosh(ops::abs(x) * 2.0 + 1.0); }},
      {"atanh", [](output x) { return ops::atanh(x * 0.6); }},
      {"log1p", [](output x) { return ops::log1p(x * 0.6); }},
      {"expm1", [](output x) { return ops::expm1(x * 2.0); }},
      {"softplus", [](output x) { return ops::softplus(x * 4.0); }},
      {"softsign", [](output x) { return ops::softsign(x * 4.0); }},
      {"silu", [](output x) { return ops::silu(x * 4.0); }},
      {"mish", [](output x) { return ops::mish(x * 4.0); }},
      {"hard_swish", [](output x) { return ops::hard_swish(x * 4.0); }},
      {"elu", [](output x) { return ops::elu(x * 2.0); }},
      {"elu alpha", [](output x) { return ops::elu(x * 2.0, 0.7); }},
      {"selu", [](output x) { return ops::selu(x * 2.0); }},
      {"celu", [](output x) { return ops::celu(x * 2.0, 1.5); }},
      {"leaky_relu", [](output x) { return ops::leaky_relu(x, 0.1); }},
      {"hard_sigmoid", [](output x) { return ops::hard_sigmoid(x * 4.0); }},
      {"thresholded_relu", [](output x) { return ops::thresholded_relu(x * 2.0, 0.5); }},
      {"clamp", [](output x) { return ops::clamp(x, -0.7, 0.9); }},
      // No gradient flows through the rounding functions and sign: only x's own.
      {"floor + x", [](output x) { return ops::floor(x * 3.0) + x; }},
      {"ceil + x", [](output x) { return ops::ceil(x * 3.0) * x; }},
      {"round + x", [](output x) { return ops::round(x * 3.0) - x; }},
      {"sign * x", [](output x) { return ops::sign(x) * x; }},
  };
  for (const auto& [name, f] : cases) {
    check(name, {in{s}}, [&f](graph_builder&, const std::vector<output>& x) { return f(x[0]); });
  }
  for (const auto& [sa, sb] :
       std::vector<std::pair<shape, shape>>{{{3, 4}, {3, 4}}, {{3, 4}, {4}}}) {
    for (bool fmod : {false, true}) {
      check(fmt::format("mod fmod={} {} {}", fmod, to_string(sa), to_string(sb)), {in{sa}, in{sb}},
            [fmod](graph_builder&, const std::vector<output>& x) {
              return ops::mod(x[0] * 5.0, x[1], fmod);
            });
    }
  }
}

TEST(GradientCheck, BinaryOpsWithBroadcasting) {
  const std::vector<std::pair<shape, shape>> shapes = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 3, 4}, {3, 1}}, {{3, 1}, {1, 4}}, {{}, {2, 3}}};
  for (const auto& [sa, sb] : shapes) {
    const std::string tag = fmt::format("{} {}", to_string(sa), to_string(sb));
    check(fmt::format("add {}", tag), {in{sa}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return x[0] + x[1]; });
    check(fmt::format("sub {}", tag), {in{sa}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return x[0] - x[1]; });
    check(fmt::format("mul {}", tag), {in{sa}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return x[0] * x[1]; });
    check(fmt::format("div {}", tag), {in{sa}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return x[0] / x[1]; });
    check(fmt::format("pow {}", tag), {in{sa, true}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return ops::pow(x[0], x[1]); });
    check(fmt::format("maximum {}", tag), {in{sa}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return ops::maximum(x[0], x[1]); });
    check(fmt::format("minimum {}", tag), {in{sa}, in{sb}},
          [](graph_builder&, const std::vector<output>& x) { return ops::minimum(x[0], x[1]); });
  }
  check("where", {in{{3, 4}}, in{{4}}}, [](graph_builder& b, const std::vector<output>& x) {
    const auto signs = memory::host_tensor<double>(
        {3, 4}, std::vector<double>{1, -1, -1, 1, 1, 1, -1, -1, -1, 1, -1, 1});
    const output cond = ops::greater(ops::constant(b, signs), ops::scalar(b, 0.0, dtype::f64));
    return ops::where(cond, x[0], x[1]);
  });
}

TEST(GradientCheck, FanOutIsSummed) {
  check("x*x + exp(x) - x", {in{{5}}}, [](graph_builder&, const std::vector<output>& x) {
    return x[0] * x[0] + ops::exp(x[0]) - x[0];
  });
}

TEST(GradientCheck, Matmul) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const shape sa = ta ? shape{4, 3} : shape{3, 4};
      const shape sb = tb ? shape{5, 4} : shape{4, 5};
      check(fmt::format("matmul {}{}", ta, tb), {in{sa}, in{sb}},
            [ta, tb](graph_builder&, const std::vector<output>& x) {
              return ops::matmul(x[0], x[1], ta, tb);
            });
    }
  }
  check("batched", {in{{2, 3, 4}}, in{{2, 4, 5}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::matmul(x[0], x[1]); });
  check("broadcast batch", {in{{3, 4}}, in{{2, 4, 5}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::matmul(x[0], x[1]); });
  check("broadcast batch, transposed", {in{{2, 1, 4, 3}}, in{{3, 5, 4}}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::matmul(x[0], x[1], true, true);
        });
}

TEST(GradientCheck, BiasAdd) {
  check("NHWC", {in{{2, 3, 4}}, in{{4}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::bias_add(x[0], x[1]); });
  check("NCHW", {in{{2, 3, 2, 2}}, in{{3}}}, [](graph_builder&, const std::vector<output>& x) {
    return ops::bias_add(x[0], x[1], "NCHW");
  });
}

TEST(GradientCheck, Reductions) {
  const shape s{2, 3, 4};
  const std::vector<std::vector<std::int64_t>> axes_list = {{}, {0}, {1, -1}, {2}};
  for (const auto& axes : axes_list) {
    for (bool keep : {false, true}) {
      const std::string tag = fmt::format("axes [{}] keepdims {}", fmt::join(axes, ","), keep);
      check(fmt::format("sum {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_sum(x[0], axes, keep);
      });
      check(fmt::format("mean {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_mean(x[0], axes, keep);
      });
      check(fmt::format("max {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_max(x[0], axes, keep);
      });
      check(fmt::format("min {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_min(x[0], axes, keep);
      });
      check(fmt::format("prod {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_prod(x[0], axes, keep);
      });
    }
  }
}

TEST(GradientCheck, SoftmaxFamily) {
  for (std::int64_t axis : {-1, 0, 1}) {
    check("softmax", {in{{3, 5}}},
          [axis](graph_builder&, const std::vector<output>& x) { return ops::softmax(x[0], axis); });
    check("log_softmax", {in{{3, 5}}}, [axis](graph_builder&, const std::vector<output>& x) {
      return ops::log_softmax(x[0], axis);
    });
  }
  check("softmax_cross_entropy", {in{{4, 5}}}, [](graph_builder& b, const std::vector<output>& x) {
    const auto labels = memory::host_tensor<std::int32_t>({4}, std::vector<std::int32_t>{0, 3, 4, 1});
    return ops::softmax_cross_entropy(x[0], ops::constant(b, labels)).loss;
  });
}

TEST(GradientCheck, LayerNorm) {
  for (std::int64_t axis : {-1, 1}) {
    const shape s{2, 3, 4};
    const shape p = axis == -1 ? shape{4} : shape{3, 4};
    check(fmt::format("layer_norm axis {}", axis), {in{s}, in{p}, in{p}},
          [axis](graph_builder&, const std::vector<output>& x) {
            return ops::layer_norm(x[0], x[1], x[2], axis).y;
          });
  }
}

TEST(GradientCheck, ShapeOps) {
  check("reshape", {in{{2, 6}}}, [](graph_builder&, const std::vector<output>& x) {
    return ops::reshape(x[0], {3, 4});
  });
  check("transpose", {in{{2, 3, 4}}}, [](graph_builder&, const std::vector<output>& x) {
    return ops::transpose(x[0], {2, 0, 1});
  });
  check("transpose reversed", {in{{2, 3, 4}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::transpose(x[0]); });
  check("squeeze", {in{{2, 1, 3}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::squeeze(x[0], {1}); });
  check("expand_dims", {in{{2, 3}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::expand_dims(x[0], 1); });
  check("concat", {in{{2, 1}}, in{{2, 3}}, in{{2, 2}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::concat(x, 1); });
  check("split, one part unused", {in{{5, 2}}}, [](graph_builder&, const std::vector<output>& x) {
    const auto parts = ops::split_sizes(x[0], {2, 1, 2}, 0);
    return ops::concat({parts[2], parts[0]}, 0);
  });
}

TEST(GradientCheck, LayoutOps) {
  using xs_t = std::vector<output>;
  check("tile", {in{{2, 3}}}, [](graph_builder&, const xs_t& x) {
    return ops::tile(x[0], {3, 2});
  });
  check("tile with ones", {in{{2, 1, 3}}}, [](graph_builder&, const xs_t& x) {
    return ops::tile(x[0], {1, 4, 1});
  });
  check("flip", {in{{2, 3, 4}}}, [](graph_builder&, const xs_t& x) {
    return ops::flip(x[0], {0, -1});
  });
  check("flip all", {in{{3, 4}}}, [](graph_builder&, const xs_t& x) { return ops::flip(x[0]); });
  check("strided_slice", {in{{5, 6, 3}}}, [](graph_builder&, const xs_t& x) {
    return ops::strided_slice(x[0], {4, 1}, {0, 100}, {0, -2}, {-2, 2});
  });
  check("strided_slice_grad", {in{{2, 3}}}, [](graph_builder&, const xs_t& x) {
    return ops::strided_slice_grad(x[0], shape{5, 6}, {4, 1}, {0, 6}, {}, {-2, 2});
  });
  for (const bool exclusive : {false, true}) {
    for (const bool reverse : {false, true}) {
      check(
          fmt::format("cumsum exclusive={} reverse={}", exclusive, reverse), {in{{3, 4}}},
          [&](graph_builder&, const xs_t& x) { return ops::cumsum(x[0], -1, exclusive, reverse); });
    }
  }
}

TEST(GradientCheck, NormReductions) {
  const shape s{2, 3, 4};
  for (const auto& axes : std::vector<std::vector<std::int64_t>>{{}, {1}, {0, -1}}) {
    for (bool keep : {false, true}) {
      const std::string tag = fmt::format("axes [{}] keepdims {}", fmt::join(axes, ","), keep);
      check(fmt::format("l1 {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_l1(x[0], axes, keep);
      });
      check(fmt::format("l2 {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::reduce_l2(x[0], axes, keep);
      });
      check(fmt::format("sum_square {}", tag), {in{s}},
            [&](graph_builder&, const std::vector<output>& x) {
              return ops::reduce_sum_square(x[0], axes, keep);
            });
      check(fmt::format("log_sum {}", tag), {in{s, true}},
            [&](graph_builder&, const std::vector<output>& x) {
              return ops::reduce_log_sum(x[0], axes, keep);
            });
      check(fmt::format("log_sum_exp {}", tag), {in{s}},
            [&](graph_builder&, const std::vector<output>& x) {
              return ops::reduce_log_sum_exp(x[0], axes, keep);
            });
      check(fmt::format("var {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::var(x[0], axes, keep, 1.0);
      });
      check(fmt::format("std {}", tag), {in{s}}, [&](graph_builder&, const std::vector<output>& x) {
        return ops::std(x[0], axes, keep);
      });
    }
  }
}

TEST(GradientCheck, BatchNormAndComposedNorms) {
  check("batch_norm, every input", {in{{2, 3, 2, 2}}, in{{3}}, in{{3}}, in{{3}}, in{{3}, true}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::batch_norm(x[0], x[1], x[2], x[3], x[4], 1e-3);
        });
  check("batch_norm rank 2", {in{{4, 3}}, in{{3}}, in{{3}}, in{{3}}, in{{3}, true}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::batch_norm(x[0], x[1], x[2], x[3], x[4]);
        });
  check("batch_norm_training", {in{{3, 2, 2, 2}}, in{{2}}, in{{2}}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::batch_norm_training(x[0], x[1], x[2]);
        }, 1e-5);
  check("group_norm", {in{{2, 4, 3}}, in{{4}}, in{{4}}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::group_norm(x[0], x[1], x[2], 2);
        }, 1e-5);
  check("instance_norm", {in{{2, 3, 5}}, in{{3}}, in{{3}}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::instance_norm(x[0], x[1], x[2]);
        }, 1e-5);
  check("rms_norm", {in{{2, 3, 4}}, in{{3, 4}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::rms_norm(x[0], x[1], 1); });
}

TEST(GradientCheck, ConvTranspose2dAndConv1d) {
  check("conv_transpose2d", {in{{2, 2, 3, 3}}, in{{2, 3, 2, 2}}},
        [](graph_builder&, const std::vector<output>& x) {
          return ops::conv_transpose2d(x[0], x[1]);
        });
  check("conv_transpose2d strided, padded, grouped, output_padding",
        {in{{1, 4, 3, 2}}, in{{4, 1, 3, 2}}}, [](graph_builder&, const std::vector<output>& x) {
          ops::conv2d_options c;
          c.strides = {2, 3};
          c.padding = {1, 0, 0, 1};
          c.dilations = {1, 2};
          c.groups = 2;
          return ops::conv_transpose2d(x[0], x[1], c, {1, 2});
        });
  check("conv2d NHWC strided, padded, grouped", {in{{2, 5, 4, 4}}, in{{6, 2, 3, 2}}},
        [](graph_builder&, const std::vector<output>& x) {
          ops::conv2d_options c;
          c.strides = {2, 1};
          c.padding = {1, 0, 1, 1};
          c.dilations = {1, 2};
          c.groups = 2;
          c.data_format = "NHWC";
          return ops::conv2d(x[0], x[1], c);
        });
  check("fused_conv2d NHWC with bias, residual and gelu",
        {in{{1, 4, 3, 2}}, in{{3, 2, 2, 2}}, in{{3}}, in{{1, 3, 2, 3}}},
        [](graph_builder&, const std::vector<output>& x) {
          ops::conv2d_options c;
          c.data_format = "NHWC";
          return ops::fused_conv2d(x[0], x[1], {.bias = x[2], .residual = x[3], .activation = "gelu"},
                                   c);
        });
  check("conv1d", {in{{2, 2, 7}}, in{{3, 2, 3}}}, [](graph_builder&, const std::vector<output>& x) {
    return ops::conv1d(x[0], x[1], 2, {1, 2});
  });
  check("depth_to_space CRD", {in{{1, 8, 2, 3}}}, [](graph_builder&, const std::vector<output>& x) {
    return ops::depth_to_space(x[0], 2, "CRD");
  });
  check("max_pool2d ceil_mode", {in{{1, 2, 5, 5}}}, [](graph_builder&, const std::vector<output>& x) {
    ops::pool_options p;
    p.kernel = {2, 2};
    p.ceil_mode = true;
    return ops::max_pool2d(x[0], p);
  });
  check("max_pool2d dilated", {in{{1, 2, 6, 5}}}, [](graph_builder&, const std::vector<output>& x) {
    ops::pool_options p;
    p.kernel = {2, 2};
    p.strides = {1, 2};
    p.padding = {1, 0, 0, 1};
    p.dilations = {2, 2};
    return ops::max_pool2d(x[0], p);
  });
  check("max_pool2d_with_indices", {in{{1, 2, 6, 5}}}, [](graph_builder&, const std::vector<output>& x) {
    ops::pool_options p;
    p.kernel = {3, 2};
    p.strides = {2, 1};
    p.padding = {1, 1, 0, 1};
    return ops::max_pool2d_with_indices(x[0], p, 1).values;
  });
  check("avg_pool2d ceil_mode", {in{{1, 2, 5, 4}}}, [](graph_builder&, const std::vector<output>& x) {
    ops::pool_options p;
    p.kernel = {3, 2};
    p.strides = {2, 3};
    p.ceil_mode = true;
    return ops::avg_pool2d(x[0], p);
  });
  check("lp_pool2d p=2", {in{{1, 2, 4, 4}}}, [](graph_builder&, const std::vector<output>& x) {
    ops::pool_options p;
    p.kernel = {2, 2};
    p.strides = {1, 2};
    return ops::lp_pool2d(x[0], 2.0, p);
  });
  check("global_avg_pool", {in{{2, 3, 2, 2}}},
        [](graph_builder&, const std::vector<output>& x) { return ops::global_avg_pool(x[0]); });
}

TEST(GradientCheck, IndexOps) {
  using xs_t = std::vector<output>;
  const auto indices = [](graph_builder& b, const shape& s, const std::vector<std::int64_t>& v) {
    return ops::constant(b, memory::host_tensor<std::int64_t>(s, v));
  };
  check("topk values", {in{{3, 5}}},
        [](graph_builder&, const xs_t& x) { return ops::topk(x[0], 2, -1)[0]; });
  check("topk smallest along 0", {in{{4, 3}}},
        [](graph_builder&, const xs_t& x) { return ops::topk(x[0], 3, 0, false)[0]; });
  check("gather_elements", {in{{3, 4}}}, [&](graph_builder& b, const xs_t& x) {
    return ops::gather_elements(x[0], indices(b, {3, 2}, {0, 3, -1, 1, 2, 2}), 1);
  });
  for (const std::string r : {"none", "add"}) {
    check("scatter_elements " + r, {in{{4, 3}}, in{{2, 3}}}, [&](graph_builder& b, const xs_t& x) {
      return ops::scatter_elements(x[0], indices(b, {2, 3}, {1, 0, 3, -1, 2, 0}), x[1], 0, r);
    });
    check("scatter_nd " + r, {in{{4, 3}}, in{{2, 3}}}, [&](graph_builder& b, const xs_t& x) {
      return ops::scatter_nd(x[0], indices(b, {2, 1}, {2, -4}), x[1], r);
    });
  }
  check("gather_nd", {in{{4, 3, 2}}}, [&](graph_builder& b, const xs_t& x) {
    return ops::gather_nd(x[0], indices(b, {3, 2}, {0, 1, 3, 2, 0, 1}));
  });
  check("einsum bij,bjk->bik", {in{{2, 3, 4}}, in{{2, 4, 2}}},
        [](graph_builder&, const xs_t& x) { return ops::einsum("bij,bjk->bik", x); });
  check("einsum ijk,jl->kil", {in{{2, 3, 2}}, in{{3, 2}}},
        [](graph_builder&, const xs_t& x) { return ops::einsum("ijk,jl->kil", x); });
  check("einsum bii,bij->bj (a diagonal)", {in{{2, 3, 3}}, in{{2, 3, 2}}},
        [](graph_builder&, const xs_t& x) { return ops::einsum("bii,bij->bj", x); });
  check("stack", {in{{2, 3}}, in{{2, 3}}},
        [](graph_builder&, const xs_t& x) { return ops::stack(x, -1); });
  check("gather wrap_negative", {in{{4, 3}}}, [&](graph_builder& b, const xs_t& x) {
    return ops::gather(x[0], indices(b, {4}, {-1, 0, -4, -1}), 0, true);
  });
  check("gather_nd batch_dims 1", {in{{4, 3, 2}}}, [&](graph_builder& b, const xs_t& x) {
    return ops::gather_nd(x[0], indices(b, {4, 1}, {2, 0, 1, 2}), 1);
  });
}

TEST(GradientCheck, SmallMlpEndToEnd) {
  check("mlp", {in{{4, 6}}, in{{6, 5}}, in{{5}}, in{{5, 3}}},
        [](graph_builder& b, const std::vector<output>& x) {
          const auto labels = memory::host_tensor<std::int32_t>({4}, std::vector<std::int32_t>{2, 0, 1, 2});
          const output h = ops::relu(ops::bias_add(ops::matmul(x[0], x[1]), x[2]));
          const output logits = ops::matmul(h, x[3]);
          return ops::reduce_mean(ops::softmax_cross_entropy(logits, ops::constant(b, labels)).loss);
        });
}

}  // namespace
}  // namespace loom
