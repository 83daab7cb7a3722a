#include "kernels/kernel_test_support.hpp"

#include <cmath>
#include <cstring>

#include "loom/graph/graph.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::testing {

cpu_device& test_device() {
  static cpu_device device(0, 2, 0, "test device");
  return device;
}

namespace {
// Runs one node; `output_types` (when given) receives the types inference declared.
std::vector<tensor> run_node(std::string_view op, std::vector<tensor> inputs,
                             const std::vector<shape>& declared, attr_map attrs,
                             std::vector<dtype>* output_types) {
  graph g;
  node_spec spec;
  spec.name = "under_test";
  spec.op = std::string(op);
  spec.attrs = std::move(attrs);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    node_spec p;
    p.name = "input_" + std::to_string(i);
    p.op = "placeholder";
    p.attrs = {{"dtype", inputs[i].type()}, {"shape", declared.at(i)}};
    spec.inputs.push_back({g.add_node(std::move(p)).id, 0});
  }
  const node& n = g.add_node(std::move(spec));
  const kernel_def& def = kernel_registry::global().get(n, device_type::cpu);
  auto kernel = def.create(kernel_construction(n, test_device(), &g));
  std::vector<tensor> outputs(n.outputs.size());
  variable_store variables;
  kernel_context ctx(n, test_device(), inputs, outputs, &variables, nullptr);
  if (output_types != nullptr) {
    for (const auto& t : n.outputs) output_types->push_back(t.type);
  }
  kernel->compute(ctx);
  return outputs;
}
}  // namespace

std::vector<tensor> run_op_declared(std::string_view op, std::vector<tensor> inputs,
                                    const std::vector<shape>& declared, attr_map attrs) {
  return run_node(op, std::move(inputs), declared, std::move(attrs), nullptr);
}

std::vector<tensor> run_op(std::string_view op, std::vector<tensor> inputs, attr_map attrs) {
  std::vector<shape> declared;
  for (const auto& in : inputs) declared.push_back(in.shape());
  std::vector<dtype> types;
  auto outputs = run_node(op, std::move(inputs), declared, std::move(attrs), &types);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_TRUE(outputs[i].defined()) << "output " << i << " of " << op << " was not set";
    if (outputs[i].defined()) {
      EXPECT_EQ(outputs[i].type(), types[i]) << "output " << i << " of " << op;
    }
  }
  return outputs;
}

void expect_invalid_argument(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected loom::invalid_argument";
  } catch (const invalid_argument& e) {
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
    }
  }
}

tensor run_op1(std::string_view op, std::vector<tensor> inputs, attr_map attrs) {
  auto outs = run_op(op, std::move(inputs), std::move(attrs));
  EXPECT_EQ(outs.size(), 1u);
  return outs.at(0);
}

namespace {
void store(dtype t, void* base, std::int64_t i, double v) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(base) + i;
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      *p = T(static_cast<float>(v));
    } else if constexpr (std::is_same_v<T, bool>) {
      *p = v != 0.0;
    } else {
      *p = static_cast<T>(v);
    }
  });
}

double load(dtype t, const void* base, std::int64_t i) {
  return visit_dtype(t, [&](auto tag) -> double {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(base) + i;
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      return static_cast<double>(static_cast<float>(*p));
    } else {
      return static_cast<double>(*p);
    }
  });
}
}  // namespace

tensor make(dtype t, const shape& s, const std::vector<double>& vals) {
  tensor out = memory::host_tensor(t, s);
  EXPECT_EQ(static_cast<std::int64_t>(vals.size()), out.num_elements()) << "make: value count";
  for (std::size_t i = 0; i < vals.size() && static_cast<std::int64_t>(i) < out.num_elements(); ++i) {
    store(t, out.raw_data(), static_cast<std::int64_t>(i), vals[i]);
  }
  return out;
}

tensor random(dtype t, const shape& s, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> vals(static_cast<std::size_t>(s.num_elements()));
  for (auto& v : vals) {
    v = dist(rng);
    if (is_integer(t)) v = std::floor(v);
    if (t == dtype::boolean) v = v > (lo + hi) / 2 ? 1.0 : 0.0;
    if (t == dtype::u8 && v < 0) v = -v;
  }
  return make(t, s, vals);
}

std::vector<double> values(const tensor& x) {
  std::vector<std::byte> dense(x.nbytes());
  copy_to_dense(x, dense.data());
  std::vector<double> out(static_cast<std::size_t>(x.num_elements()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = load(x.type(), dense.data(), static_cast<std::int64_t>(i));
  }
  return out;
}

conv2d_reference conv2d_float64(const tensor& x, const tensor& w, const std::vector<std::int64_t>& strides,
                                const std::vector<std::int64_t>& padding,
                                const std::vector<std::int64_t>& dilations, std::int64_t groups) {
  const auto xv = values(x);
  const auto wv = values(w);
  std::vector<std::int64_t> p = padding;
  if (p.size() == 2) p = {p[0], p[0], p[1], p[1]};
  const std::int64_t n = x.dim(0), ch = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const std::int64_t o = w.dim(0), cg = w.dim(1), kh = w.dim(2), kw = w.dim(3);
  const std::int64_t oh = (h + p[0] + p[1] - dilations[0] * (kh - 1) - 1) / strides[0] + 1;
  const std::int64_t ow = (wd + p[2] + p[3] - dilations[1] * (kw - 1) - 1) / strides[1] + 1;
  conv2d_reference r;
  r.s = {n, o, oh, ow};
  r.value.assign(static_cast<std::size_t>(n * o * oh * ow), 0.0);
  r.magnitude.assign(r.value.size(), 0.0);
  const std::int64_t per_group = o / groups;
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t f = 0; f < o; ++f) {
      const std::int64_t g = f / per_group;
      for (std::int64_t y = 0; y < oh; ++y) {
        for (std::int64_t xx = 0; xx < ow; ++xx) {
          double sum = 0;
          double mag = 0;
          for (std::int64_t ci = 0; ci < cg; ++ci) {
            for (std::int64_t i = 0; i < kh; ++i) {
              for (std::int64_t j = 0; j < kw; ++j) {
                const std::int64_t iy = y * strides[0] - p[0] + i * dilations[0];
                const std::int64_t ix = xx * strides[1] - p[2] + j * dilations[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                const double a = xv[static_cast<std::size_t>(((b * ch + g * cg + ci) * h + iy) * wd + ix)];
                const double bw = wv[static_cast<std::size_t>(((f * cg + ci) * kh + i) * kw + j)];
                sum += a * bw;
                mag += std::fabs(a * bw);
              }
            }
          }
          const auto k = static_cast<std::size_t>(((b * o + f) * oh + y) * ow + xx);
          r.value[k] = sum;
          r.magnitude[k] = mag;
        }
      }
    }
  }
  return r;
}

tensor non_contiguous(const tensor& x) {
  const std::size_t r = x.rank();
  EXPECT_GE(r, 2u);
  // Storage order: dims with the last two swapped.
  shape stored = x.shape();
  std::swap(stored[r - 1], stored[r - 2]);
  tensor storage = memory::host_tensor(x.type(), stored);
  const auto v = values(x);
  const shape src_strides = contiguous_strides(x.shape());
  const shape dst_strides = contiguous_strides(stored);
  shape view_strides = dst_strides;
  std::swap(view_strides[r - 1], view_strides[r - 2]);
  for (std::int64_t i = 0; i < x.num_elements(); ++i) {
    std::int64_t rem = i;
    std::int64_t off = 0;
    for (std::size_t k = 0; k < r; ++k) {
      const std::int64_t idx = rem / src_strides[k];
      rem %= src_strides[k];
      off += idx * view_strides[k];
    }
    store(x.type(), storage.raw_data(), off, v[static_cast<std::size_t>(i)]);
  }
  return tensor::strided(storage.buf(), x.type(), x.shape(), view_strides, 0);
}

tensor broadcast_view(const tensor& x, const shape& to) {
  const shape from = x.shape();
  EXPECT_LE(from.rank(), to.rank());
  shape strides = shape::filled(to.rank(), 0);
  const std::size_t lead = to.rank() - from.rank();
  for (std::size_t i = 0; i < from.rank(); ++i) {
    strides[lead + i] = from[i] == 1 && to[lead + i] != 1 ? 0 : x.strides()[i];
  }
  return tensor::strided(x.buf(), x.type(), to, strides, x.offset());
}

void expect_close(const tensor& actual, const shape& expected_shape,
                  const std::vector<double>& expected, double rtol, double atol) {
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(to_string(actual.shape()), to_string(expected_shape));
  const auto got = values(actual);
  ASSERT_EQ(got.size(), expected.size());
  std::size_t reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i];
    const double e = expected[i];
    bool ok;
    if (std::isnan(e)) ok = std::isnan(a);
    else if (std::isinf(e)) ok = a == e;
    else ok = std::fabs(a - e) <= atol + rtol * std::fabs(e);
    if (!ok && reported++ < 8) {
      ADD_FAILURE() << "element " << i << ": got " << a << ", expected " << e << " ("
                    << actual.describe() << ")";
    }
  }
}

double rtol_for(dtype t) {
  switch (t) {
    case dtype::f64: return 1e-12;
    case dtype::f32: return 1e-5;
    case dtype::f16: return 2e-3;
    case dtype::bf16: return 1.6e-2;
    default: return 0.0;
  }
}

double atol_for(dtype t) {
  switch (t) {
    case dtype::f64: return 1e-12;
    case dtype::f32: return 1e-6;
    case dtype::f16: return 1e-3;
    case dtype::bf16: return 1e-2;
    default: return 0.0;
  }
}

}  // namespace loom::testing
