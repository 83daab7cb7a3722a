// The cross-backend test: every CUDA kernel against the CPU kernel of the same op, on random
// inputs, with tolerances per dtype (as ggml's test-backend-ops does).
//
// Each case builds its op twice on shared placeholders: once on cuda:0, once on cpu:0; one
// run fetches both and they are compared element by element. Without a GPU the comparisons
// skip, but CoverageOfTheKernelTable runs everywhere: every op that has a CUDA kernel must
// have a case here or be named in `covered_elsewhere` with the test that checks it, so a
// kernel cannot be added without being checked against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "backends/cuda/cuda_device.hpp"
#include "cuda_test_support.hpp"
#include "kernel/common/batch_norm_train_math.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom {
namespace {

/// How a case's inputs are drawn.
enum class fill_kind { normal, positive, unit, indices, boolean };

struct input_spec {
  dtype type;
  shape dims;
  fill_kind fill = fill_kind::normal;
  std::int64_t index_limit = 0;  // fill_kind::indices: values in [0, index_limit)
};

struct xcase {
  std::string op;    // the op under test (for the coverage check)
  std::string name;  // "add f16 broadcast"
  std::vector<input_spec> inputs;
  // Builds the op on `in` and returns the outputs to compare.
  std::function<std::vector<output>(graph_builder&, const std::vector<output>&)> build;
};

double tolerance(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-10;
    case dtype::f32:
      return 2e-5;
    case dtype::f16:
      return 4e-3;
    case dtype::bf16:
      return 3e-2;
    default:
      return 0;  // integers and booleans: exact
  }
}

// `t` (host memory) cast to `to` by loom's CPU cast kernel.
tensor cast_on_cpu(const tensor& t, dtype to) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", t.type(), t.shape());
  (void)ops::cast(x, to, {.name = "y"});
  session_options o;
  o.devices.cuda_device_count = 0;
  session cpu(std::move(g), o);
  // Out of the session's pool before the session goes (a device must outlive its tensors:
  // the 444-byte result of the first case was read after its pool was gone, and the copy
  // of it to the GPU crashed).
  const tensor y = cpu.run({{"x", t}}, {"y"})[0];
  return memory::contiguous_copy(y, memory::host_resource::instance(), y.device());
}

tensor random_tensor(const input_spec& s, std::mt19937_64& rng) {
  tensor host = memory::host_tensor(dtype::f64, s.dims);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<std::int64_t> index(0,
                                                    std::max<std::int64_t>(s.index_limit - 1, 0));
  for (double& v : host.span<double>()) {
    switch (s.fill) {
      case fill_kind::normal:
        v = normal(rng);
        break;
      case fill_kind::positive:
        v = 0.1 + std::abs(normal(rng));
        break;
      case fill_kind::unit:
        v = unit(rng);
        break;
      case fill_kind::indices:
        v = static_cast<double>(index(rng));
        break;
      case fill_kind::boolean:
        v = unit(rng) > 0 ? 1.0 : 0.0;
        break;
    }
  }
  // Converted by loom's own cast on the CPU, so both backends see the same rounded values.
  return s.type == dtype::f64 ? host : cast_on_cpu(host, s.type);
}

std::vector<double> as_doubles(const tensor& t) {
  const tensor d = cast_on_cpu(t, dtype::f64);
  const tensor dense = memory::contiguous_copy(d, memory::host_resource::instance(), d.device());
  return {dense.data<double>(), dense.data<double>() + dense.num_elements()};
}

const std::vector<dtype> floats{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

std::vector<xcase> cases() {
  std::vector<xcase> out;
  auto add_case =
      [&](std::string op, std::string name, std::vector<input_spec> in,
          std::function<std::vector<output>(graph_builder&, const std::vector<output>&)> f) {
        out.push_back({std::move(op), std::move(name), std::move(in), std::move(f)});
      };
  using unary_fn = output (*)(output, const node_options&);
  const std::vector<std::tuple<std::string, unary_fn, fill_kind>> unary = {
      {"neg", ops::neg, fill_kind::normal},
      {"abs", ops::abs, fill_kind::normal},
      {"exp", ops::exp, fill_kind::unit},
      {"log", ops::log, fill_kind::positive},
      {"sqrt", ops::sqrt, fill_kind::positive},
      {"rsqrt", ops::rsqrt, fill_kind::positive},
      {"tanh", ops::tanh, fill_kind::normal},
      {"sigmoid", ops::sigmoid, fill_kind::normal},
      {"relu", ops::relu, fill_kind::normal},
      {"erf", ops::erf, fill_kind::normal},
      {"square", ops::square, fill_kind::normal},
      {"reciprocal", ops::reciprocal, fill_kind::positive},
  };
  for (const auto& [op, fn, fill] : unary) {
    for (dtype t : floats) {
      add_case(op, op + " " + to_string(t), {{t, {3, 37}, fill}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0], {})};
               });
    }
  }
  for (dtype t : floats) {
    add_case("gelu", std::string("gelu ") + to_string(t), {{t, {5, 33}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::gelu(in[0])};
             });
    add_case("gelu", std::string("gelu tanh ") + to_string(t), {{t, {5, 33}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::gelu(in[0], "tanh", {})};
             });
  }
  // The math functions and activations; acosh's input is shifted into its domain.
  using one_fn = std::function<output(output)>;
  const std::vector<std::tuple<std::string, one_fn, fill_kind>> math = {
      {"sin", [](output x) { return ops::sin(x); }, fill_kind::normal},
      {"cos", [](output x) { return ops::cos(x); }, fill_kind::normal},
      {"tan", [](output x) { return ops::tan(x); }, fill_kind::unit},
      {"asin", [](output x) { return ops::asin(x); }, fill_kind::unit},
      {"acos", [](output x) { return ops::acos(x); }, fill_kind::unit},
      {"atan", [](output x) { return ops::atan(x); }, fill_kind::normal},
      {"sinh", [](output x) { return ops::sinh(x); }, fill_kind::normal},
      {"cosh", [](output x) { return ops::cosh(x); }, fill_kind::normal},
      {"asinh", [](output x) { return ops::asinh(x); }, fill_kind::normal},
      {"acosh", [](output x) { return ops::acosh(x + 1.0); }, fill_kind::positive},
      {"atanh", [](output x) { return ops::atanh(x * 0.9); }, fill_kind::unit},
      {"log1p", [](output x) { return ops::log1p(x); }, fill_kind::positive},
      {"expm1", [](output x) { return ops::expm1(x); }, fill_kind::normal},
      {"floor", [](output x) { return ops::floor(x * 4.0); }, fill_kind::normal},
      {"ceil", [](output x) { return ops::ceil(x * 4.0); }, fill_kind::normal},
      {"round", [](output x) { return ops::round(x * 4.0); }, fill_kind::normal},
      {"sign", [](output x) { return ops::sign(x); }, fill_kind::normal},
      {"softplus", [](output x) { return ops::softplus(x * 4.0); }, fill_kind::normal},
      {"softsign", [](output x) { return ops::softsign(x); }, fill_kind::normal},
      {"silu", [](output x) { return ops::silu(x * 4.0); }, fill_kind::normal},
      {"mish", [](output x) { return ops::mish(x * 4.0); }, fill_kind::normal},
      {"hard_swish", [](output x) { return ops::hard_swish(x * 4.0); }, fill_kind::normal},
      {"elu", [](output x) { return ops::elu(x, 0.7); }, fill_kind::normal},
      {"selu", [](output x) { return ops::selu(x); }, fill_kind::normal},
      {"celu", [](output x) { return ops::celu(x, 1.5); }, fill_kind::normal},
      {"leaky_relu", [](output x) { return ops::leaky_relu(x, 0.1); }, fill_kind::normal},
      {"hard_sigmoid", [](output x) { return ops::hard_sigmoid(x * 4.0, 0.3, 0.4); },
       fill_kind::normal},
      {"thresholded_relu", [](output x) { return ops::thresholded_relu(x, 0.2); },
       fill_kind::normal},
      // The predicates see NaN and infinities made from the input: floor(x) is 0 or -1, so
      // (x - x) / floor(x) is NaN or -0 and 1 / floor(x) is inf or -1.
      {"isnan", [](output x) { return ops::isnan((x - x) / ops::floor(x)); }, fill_kind::unit},
      {"isinf", [](output x) { return ops::isinf(1.0 / ops::floor(x), true, false); },
       fill_kind::unit},
      {"isfinite", [](output x) { return ops::isfinite(1.0 / ops::floor(x)); }, fill_kind::unit},
  };
  for (const auto& [op, fn, fill] : math) {
    for (dtype t : floats) {
      add_case(op, op + " " + to_string(t), {{t, {3, 37}, fill}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0])};
               });
    }
  }
  for (dtype t : {dtype::i32, dtype::i64}) {
    add_case("sign", std::string("sign ") + to_string(t), {{t, {5, 9}, fill_kind::indices, 7}},
             [](graph_builder& b, const std::vector<output>& in) {
               return std::vector{ops::sign(in[0] - ops::scalar(b, 3.0, in[0].dtype_of()))};
             });
  }
  for (bool fmod : {false, true}) {
    const std::string tag = fmod ? "fmod " : "mod ";
    for (dtype t : floats) {
      add_case("mod", tag + to_string(t), {{t, {4, 1, 7}}, {t, {3, 1}}},
               [fmod](graph_builder&, const std::vector<output>& in) {
                 return std::vector{ops::mod(in[0] * 8.0, in[1], fmod)};
               });
    }
    // Integer divisors from 1 to 7, the odd ones negative.
    for (dtype t : {dtype::i32, dtype::i64}) {
      add_case("mod", tag + to_string(t),
               {{t, {5, 9}, fill_kind::indices, 40}, {t, {1, 9}, fill_kind::indices, 7}},
               [fmod](graph_builder& b, const std::vector<output>& in) {
                 const output twenty = ops::scalar(b, 20.0, in[0].dtype_of());
                 const output one = ops::scalar(b, 1.0, in[0].dtype_of());
                 const output two = ops::scalar(b, 2.0, in[0].dtype_of());
                 const output divisor = (in[1] + one) * (one - two * ops::mod(in[1], two, false));
                 return std::vector{ops::mod(in[0] - twenty, divisor, fmod)};
               });
    }
  }

  using binary_fn = output (*)(output, output, const node_options&);
  const std::vector<std::tuple<std::string, binary_fn, fill_kind>> binary = {
      {"add", ops::add, fill_kind::normal},
      {"sub", ops::sub, fill_kind::normal},
      {"mul", ops::mul, fill_kind::normal},
      {"div", ops::div, fill_kind::positive},
      {"pow", ops::pow, fill_kind::positive},
      {"maximum", ops::maximum, fill_kind::normal},
      {"minimum", ops::minimum, fill_kind::normal},
      {"equal", ops::equal, fill_kind::indices},
      {"not_equal", ops::not_equal, fill_kind::indices},
      {"less", ops::less, fill_kind::normal},
      {"less_equal", ops::less_equal, fill_kind::indices},
      {"greater", ops::greater, fill_kind::normal},
      {"greater_equal", ops::greater_equal, fill_kind::indices},
  };
  for (const auto& [op, fn, fill] : binary) {
    for (dtype t : floats) {
      // Same shapes, then NumPy broadcasting ([4, 1, 7] with [3, 1]).
      add_case(op, op + " " + to_string(t), {{t, {6, 41}, fill, 3}, {t, {6, 41}, fill, 3}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0], in[1], {})};
               });
      add_case(op, op + " broadcast " + to_string(t),
               {{t, {4, 1, 7}, fill, 3}, {t, {3, 1}, fill, 3}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0], in[1], {})};
               });
    }
    if (op != "pow" && op != "div") {
      for (dtype t : {dtype::i32, dtype::i64}) {
        add_case(op, op + " " + to_string(t),
                 {{t, {5, 9}, fill_kind::indices, 7}, {t, {1, 9}, fill_kind::indices, 7}},
                 [fn = fn](graph_builder&, const std::vector<output>& in) {
                   return std::vector{fn(in[0], in[1], {})};
                 });
      }
    }
  }
  for (const auto& [op, fn] : std::vector<std::pair<std::string, binary_fn>>{
           {"logical_and", ops::logical_and}, {"logical_or", ops::logical_or}}) {
    add_case(op, op,
             {{dtype::boolean, {4, 9}, fill_kind::boolean},
              {dtype::boolean, {4, 9}, fill_kind::boolean}},
             [fn = fn](graph_builder&, const std::vector<output>& in) {
               return std::vector{fn(in[0], in[1], {})};
             });
  }
  add_case("logical_not", "logical_not", {{dtype::boolean, {4, 9}, fill_kind::boolean}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::logical_not(in[0], {})};
           });
  add_case(
      "where", "where f32",
      {{dtype::boolean, {4, 9}, fill_kind::boolean}, {dtype::f32, {4, 9}}, {dtype::f32, {1, 9}}},
      [](graph_builder&, const std::vector<output>& in) {
        return std::vector{ops::where(in[0], in[1], in[2], {})};
      });
  for (dtype from : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32}) {
    for (dtype to : {dtype::f32, dtype::f16, dtype::bf16, dtype::i64}) {
      add_case("cast", std::string("cast ") + to_string(from) + " to " + to_string(to),
               {{from, {7, 13}, fill_kind::indices, 50}},
               [to](graph_builder&, const std::vector<output>& in) {
                 return std::vector{ops::cast(in[0], to, {})};
               });
    }
  }
  // Generators: no inputs.
  add_case("fill", "fill", {}, [](graph_builder& b, const std::vector<output>&) {
    return std::vector{ops::fill(b, dtype::f32, {3, 5}, 2.5, {})};
  });
  add_case("zeros", "zeros", {}, [](graph_builder& b, const std::vector<output>&) {
    return std::vector{ops::zeros(b, dtype::f16, {3, 5}, {})};
  });
  add_case("ones", "ones", {}, [](graph_builder& b, const std::vector<output>&) {
    return std::vector{ops::ones(b, dtype::i32, {3, 5}, {})};
  });
  add_case("range", "range", {}, [](graph_builder& b, const std::vector<output>&) {
    return std::vector{ops::range(b, -2.0, 7.5, 0.75, dtype::f32, {})};
  });
  // Array ops.
  for (dtype t : {dtype::f32, dtype::f16, dtype::i64}) {
    const std::string ts = to_string(t);
    add_case("reshape", "reshape " + ts, {{t, {4, 6}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::reshape(in[0], {2, 3, 4}, {})};
             });
    add_case("transpose", "transpose " + ts, {{t, {3, 4, 5}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::transpose(in[0], {2, 0, 1}, {})};
             });
    add_case("concat", "concat " + ts, {{t, {2, 3}}, {t, {2, 5}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::concat({in[0], in[1]}, 1, {})};
             });
    add_case(
        "split", "split " + ts, {{t, {6, 4}}},
        [](graph_builder&, const std::vector<output>& in) { return ops::split(in[0], 3, 0, {}); });
    add_case("slice", "slice " + ts, {{t, {5, 7}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::slice(in[0], {1, 2}, {3, 4}, {})};
             });
    add_case("tile", "tile " + ts, {{t, {3, 1, 4}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::tile(in[0], {2, 5, 1}, {})};
             });
    add_case("flip", "flip " + ts, {{t, {3, 4, 5}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::flip(in[0], {0, -1}, {})};
             });
    add_case("strided_slice", "strided_slice " + ts, {{t, {7, 9}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::strided_slice(in[0], {-1, 1}, {0, 100}, {}, {-2, 3}, {})};
             });
    add_case("pad", "pad " + ts, {{t, {3, 4}}}, [](graph_builder&, const std::vector<output>& in) {
      return std::vector{ops::pad(in[0], {1, 0, 2, 3}, 1.5, {})};
    });
    add_case("broadcast_to", "broadcast_to " + ts, {{t, {3, 1}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::broadcast_to(in[0], {2, 3, 4}, {})};
             });
    add_case("expand_dims", "expand_dims " + ts, {{t, {3, 4}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::expand_dims(in[0], 1, {})};
             });
    add_case("squeeze", "squeeze " + ts, {{t, {3, 1, 4}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::squeeze(in[0], {1}, {})};
             });
    add_case("gather", "gather " + ts, {{t, {6, 5}}, {dtype::i64, {4}, fill_kind::indices, 6}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::gather(in[0], in[1], 0, {})};
             });
  }
  add_case(
      "gather", "gather wrap_negative", {{dtype::f32, {6, 5}}},
      [](graph_builder& b, const std::vector<output>& in) {
        const output idx = ops::constant(b, memory::host_tensor<std::int64_t>({3}, {-1, 0, -6}));
        return std::vector{ops::gather(in[0], idx, 0, true, {})};
      });
  add_case("gather_elements", "gather_elements",
           {{dtype::bf16, {5, 6}}, {dtype::i64, {5, 3}, fill_kind::indices, 6}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::gather_elements(in[0], in[1], 1, {})};
           });
  add_case("gather_nd", "gather_nd",
           {{dtype::f32, {4, 5, 3}}, {dtype::i32, {6, 2}, fill_kind::indices, 4}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::gather_nd(in[0], in[1], 0, {})};
           });
  add_case("gather_nd", "gather_nd batch_dims 1",
           {{dtype::i64, {4, 5, 3}}, {dtype::i64, {4, 2, 1}, fill_kind::indices, 4}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::gather_nd(in[0], in[1], 1, {})};
           });
  add_case("gather_grad", "gather_grad f32",
           {{dtype::f32, {7, 5}}, {dtype::i32, {7}, fill_kind::indices, 4}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::gather_grad(in[0], in[1], {4, 5}, 0, {})};
           });
  add_case("one_hot", "one_hot", {{dtype::i64, {9}, fill_kind::indices, 5}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::one_hot(in[0], 5, dtype::f32, 1.0, 0.0, -1, {})};
           });
  // Reductions, softmax, LayerNorm.
  using reduce_fn = output (*)(output, std::vector<std::int64_t>, bool, const node_options&);
  for (const auto& [op, fn] :
       std::vector<std::pair<std::string, reduce_fn>>{{"reduce_sum", ops::reduce_sum},
                                                      {"reduce_mean", ops::reduce_mean},
                                                      {"reduce_max", ops::reduce_max},
                                                      {"reduce_min", ops::reduce_min},
                                                      {"reduce_prod", ops::reduce_prod},
                                                      {"reduce_l1", ops::reduce_l1},
                                                      {"reduce_l2", ops::reduce_l2},
                                                      {"reduce_sum_square", ops::reduce_sum_square},
                                                      {"reduce_log_sum", ops::reduce_log_sum},
                                                      {"reduce_log_sum_exp",
                                                       ops::reduce_log_sum_exp}}) {
    for (dtype t : floats) {
      const fill_kind fill = op == "reduce_prod"      ? fill_kind::unit
                             : op == "reduce_log_sum" ? fill_kind::positive
                                                      : fill_kind::normal;
      add_case(op, op + " inner " + to_string(t), {{t, {9, 1023}, fill}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0], {-1}, false, {})};
               });
      add_case(op, op + " outer keepdims " + to_string(t), {{t, {33, 4, 7}, fill}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0], {0, 2}, true, {})};
               });
      add_case(op, op + " all " + to_string(t), {{t, {17, 29}, fill}},
               [fn = fn](graph_builder&, const std::vector<output>& in) {
                 return std::vector{fn(in[0], {}, false, {})};
               });
    }
  }
  for (const auto& [op, fn] : std::vector<std::pair<std::string, reduce_fn>>{
           {"reduce_any", ops::reduce_any}, {"reduce_all", ops::reduce_all}}) {
    add_case(op, op + " inner", {{dtype::boolean, {9, 1023}, fill_kind::boolean}},
             [fn = fn](graph_builder&, const std::vector<output>& in) {
               return std::vector{fn(in[0], {-1}, false, {})};
             });
    add_case(op, op + " outer keepdims", {{dtype::boolean, {33, 4, 7}, fill_kind::boolean}},
             [fn = fn](graph_builder&, const std::vector<output>& in) {
               return std::vector{fn(in[0], {0, 2}, true, {})};
             });
  }
  for (dtype t : floats) {
    add_case("batch_norm", std::string("batch_norm ") + to_string(t),
             {{t, {4, 5, 6, 7}}, {t, {5}}, {t, {5}}, {t, {5}}, {t, {5}, fill_kind::positive}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::batch_norm(in[0], in[1], in[2], in[3], in[4], 1e-5, {})};
             });
  }
  // Training batch norm: running statistics as variables of each device's own (made in
  // the build, so the GPU and the CPU update their own), both layouts; the gradient through
  // Σ y·w. sync_batch_norm and the gradient's pieces take one rank's packed statistics and
  // sums directly (no collective: the collectives have cases of their own).
  const auto running = [](graph_builder& b, std::int64_t c, dtype u) {
    std::vector<double> zeros(static_cast<std::size_t>(c), 0.0);
    std::vector<double> ones(static_cast<std::size_t>(c), 1.0);
    tensor m = memory::host_tensor(u, {c});
    tensor v = memory::host_tensor(u, {c});
    common::batch_norm_train::write_vector(m, zeros);
    common::batch_norm_train::write_vector(v, ones);
    return std::pair{ops::variable(b, b.g().unique_name("rm"), m),
                     ops::variable(b, b.g().unique_name("rv"), v)};
  };
  for (dtype t : floats) {
    for (const std::string format : {"NCHW", "NHWC"}) {
      const shape xs = format == "NCHW" ? shape{6, 5, 7, 9} : shape{6, 7, 9, 5};
      const std::string name = std::string(to_string(t)) + " " + format;
      add_case("batch_norm_train", "batch_norm_train " + name,
               {{t, xs}, {t, {5}, fill_kind::positive}, {t, {5}}},
               [running, t, format](graph_builder& b, const std::vector<output>& in) {
                 const auto [rm, rv] = running(b, 5, t);
                 const auto bn =
                     ops::batch_norm_train(in[0], in[1], in[2], rm, rv, {.data_format = format});
                 return std::vector{bn.y, bn.mean, bn.invstd};
               });
      add_case("batch_norm_train_grad", "batch_norm_train_grad " + name,
               {{t, xs}, {t, {5}, fill_kind::positive}, {t, {5}}, {t, xs}},
               [running, t, format](graph_builder& b, const std::vector<output>& in) {
                 const auto [rm, rv] = running(b, 5, t);
                 const auto bn =
                     ops::batch_norm_train(in[0], in[1], in[2], rm, rv, {.data_format = format});
                 const auto d = gradients(ops::reduce_sum(ops::mul(bn.y, in[3]), {}),
                                          {in[0], in[1], in[2]});
                 return std::vector{d[0], d[1], d[2]};
               });
      add_case("batch_norm_stats", "batch_norm_stats " + name, {{t, xs}},
               [format](graph_builder& b, const std::vector<output>& in) {
                 return std::vector{b.add1("batch_norm_stats", {in[0]}, {{"data_format", format}})};
               });
      add_case("sync_batch_norm", "sync_batch_norm one rank " + name,
               {{t, xs}, {t, {5}, fill_kind::positive}, {t, {5}}},
               [running, t, format](graph_builder& b, const std::vector<output>& in) {
                 const auto [rm, rv] = running(b, 5, t);
                 const output stats =
                     b.add1("batch_norm_stats", {in[0]}, {{"data_format", format}});
                 const auto outs = b.add("sync_batch_norm", {in[0], in[1], in[2], rm, rv, stats},
                                         {{"data_format", format}});
                 return std::vector{outs.at(0), outs.at(1), outs.at(2)};
               });
      for (const char* piece : {"batch_norm_grad_reduce", "batch_norm_grad_elemt"}) {
        add_case(piece, std::string(piece) + " " + name,
                 {{t, xs}, {t, {5}, fill_kind::positive}, {t, {5}}, {t, xs}},
                 [running, t, format](graph_builder& b, const std::vector<output>& in) {
                   const auto [rm, rv] = running(b, 5, t);
                   const auto bn =
                       ops::batch_norm_train(in[0], in[1], in[2], rm, rv, {.data_format = format});
                   const attr_map f{{"data_format", format}};
                   const auto red =
                       b.add("batch_norm_grad_reduce", {in[3], in[0], in[1], bn.mean, bn.invstd}, f);
                   const output dx = b.add1("batch_norm_grad_elemt",
                                            {in[3], in[0], in[1], bn.mean, bn.invstd, red.at(0)}, f);
                   return std::vector{red.at(0), red.at(1), red.at(2), dx};
                 });
      }
    }
  }
  add_case("argmax", "argmax", {{dtype::f32, {7, 300}}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::argmax(in[0], -1, dtype::i64, {})};
           });
  add_case("argmin", "argmin last index keepdims", {{dtype::f32, {7, 300}}},
           [](graph_builder&, const std::vector<output>& in) {
             return std::vector{ops::argmin(in[0], 0, dtype::i64, true, true, {})};
           });
  for (dtype t : floats) {
    const std::string ts = to_string(t);
    add_case("softmax", "softmax " + ts, {{t, {13, 1000}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::softmax(in[0], -1, {})};
             });
    add_case("log_softmax", "log_softmax " + ts, {{t, {13, 77}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::log_softmax(in[0], -1, {})};
             });
    add_case("layer_norm", "layer_norm " + ts, {{t, {37, 1024}}, {t, {1024}}, {t, {1024}}},
             [](graph_builder&, const std::vector<output>& in) {
               const auto ln = ops::layer_norm(in[0], in[1], in[2], -1, 1e-5, {});
               return std::vector{ln.y, ln.mean, ln.rstd};
             });
    add_case("layer_norm_grad", "layer_norm_grad " + ts,
             {{t, {37, 300}}, {t, {37, 300}}, {t, {300}}, {t, {300}}},
             [](graph_builder& b, const std::vector<output>& in) {
               const auto ln = ops::layer_norm(in[1], in[2], in[3], -1, 1e-5, {});
               return b.add("layer_norm_grad", {in[0], in[1], in[2], ln.mean, ln.rstd},
                            {{"axis", std::int64_t{1}}});
             });
    add_case("bias_add", "bias_add " + ts, {{t, {6, 50}}, {t, {50}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::bias_add(in[0], in[1], "NHWC", {})};
             });
    add_case("matmul", "matmul " + ts, {{t, {33, 65}}, {t, {65, 17}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::matmul(in[0], in[1], false, false, {})};
             });
    add_case("matmul", "matmul transposed batched " + ts, {{t, {3, 65, 33}}, {t, {3, 17, 65}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::matmul(in[0], in[1], true, true, {})};
             });
    add_case("fused_matmul", "fused_matmul bias relu " + ts,
             {{t, {31, 64}}, {t, {64, 24}}, {t, {24}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::fused_matmul(
                   in[0], in[1], {.bias = in[2], .activation = "relu"}, false, false, {})};
             });
    add_case("fused_matmul", "fused_matmul residual gelu " + ts,
             {{t, {31, 64}}, {t, {64, 24}}, {t, {31, 24}}},
             [](graph_builder&, const std::vector<output>& in) {
               return std::vector{ops::fused_matmul(
                   in[0], in[1], {.residual = in[2], .activation = "gelu"}, false, false, {})};
             });
  }
  add_case("softmax_cross_entropy", "softmax_cross_entropy",
           {{dtype::f32, {16, 10}}, {dtype::i64, {16}, fill_kind::indices, 10}},
           [](graph_builder&, const std::vector<output>& in) {
             const auto x = ops::softmax_cross_entropy(in[0], in[1], {});
             return std::vector{x.loss, x.backprop};
           });
  return out;
}

// Ops with CUDA kernels that a case here cannot express (state, transfers, optimizers that
// update variables, generated kernels): each is compared with the CPU by the test named.
const std::map<std::string, std::string> covered_elsewhere = {
    {"placeholder", "cuda_device_test (feeds)"},
    {"_arg", "cuda_device_test (feeds)"},
    {"const", "cuda_device_test"},
    {"variable", "cuda_device_test (VariablesLiveOnTheGpu...)"},
    {"assign", "cuda_device_test"},
    {"assign_add", "cuda_device_test"},
    {"assign_sub", "cuda_device_test"},
    {"identity", "cuda_device_test"},
    {"no_op", "cuda_device_test"},
    {"_send", "cuda_device_test (PrefersTheGpuAndFallsBack...)"},
    {"_recv", "cuda_device_test (PrefersTheGpuAndFallsBack...)"},
    {"apply_sgd", "optimizer_test"},
    {"apply_adam", "optimizer_test"},
    {"apply_adamw", "optimizer_test"},
    {"fused_sgd", "optimizer_test"},
    {"fused_adam", "optimizer_test"},
    {"fused_adamw", "optimizer_test"},
    {"fused_elementwise", "fused_elementwise_test (random fused graphs vs the CPU)"},
    {"relu_grad", "elementwise_test"},
    {"all_reduce", "nccl_test (a one-rank NCCL group and an MPI one, on the GPU)"},
    {"broadcast", "nccl_test"},
    {"all_gather", "nccl_test"},
    {"reduce_scatter", "nccl_test"},
};

TEST(CrossBackend, CoverageOfTheKernelTable) {
  std::set<std::string> with_case;
  for (const auto& c : cases()) with_case.insert(c.op);
  std::set<std::string> cuda_ops;
  for (const auto& op : op_registry::global().names()) {
    for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
      if (k->device == device_type::cuda) cuda_ops.insert(op);
    }
  }
  EXPECT_GT(cuda_ops.size(), 60u);
  for (const auto& op : cuda_ops) {
    EXPECT_TRUE(with_case.contains(op) || covered_elsewhere.contains(op))
        << "op '" << op << "' has a CUDA kernel but no cross-backend case";
  }
  // And every case is for an op that has a CUDA kernel (a stale case would skip silently).
  for (const auto& op : with_case)
    EXPECT_TRUE(cuda_ops.contains(op)) << op << " has a case but no CUDA kernel";
}

TEST(CrossBackend, EveryCudaKernelMatchesTheCpuKernel) {
  LOOM_REQUIRE_GPU();
  std::mt19937_64 rng(20261121);
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    graph g;
    graph_builder b(g);
    std::vector<output> in;
    std::vector<feed> feeds;
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      const std::string name = "in" + std::to_string(i);
      in.push_back(ops::placeholder(b, name, c.inputs[i].type, c.inputs[i].dims));
      feeds.emplace_back(name, random_tensor(c.inputs[i], rng));
    }
    std::vector<output> on_gpu;
    std::vector<output> on_cpu;
    {
      auto scope = b.with_device("cuda:0");
      on_gpu = c.build(b, in);
    }
    {
      auto scope = b.with_device("cpu:0");
      on_cpu = c.build(b, in);
    }
    std::vector<std::string> fetches;
    for (const auto& o : on_gpu) fetches.push_back(o.name());
    for (const auto& o : on_cpu) fetches.push_back(o.name());
    session s(std::move(g));
    const auto out = s.run(feeds, fetches);
    ASSERT_EQ(out.size(), 2 * on_gpu.size());
    for (std::size_t k = 0; k < on_gpu.size(); ++k) {
      const tensor& gpu = out[k];
      const tensor& cpu = out[on_gpu.size() + k];
      EXPECT_EQ(gpu.device().type, device_type::cuda)
          << "output " << k << " did not run on the GPU";
      ASSERT_EQ(gpu.shape(), cpu.shape());
      ASSERT_EQ(gpu.type(), cpu.type());
      auto& dev = dynamic_cast<cuda::cuda_device&>(s.find_device("cuda:0"));
      const auto got = as_doubles(dev.copy_to_host(gpu, memory::host_resource::instance()));
      const auto want = as_doubles(cpu);
      const double tol = tolerance(gpu.type());
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
          continue;
        }
        ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i])))
            << "output " << k << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom
