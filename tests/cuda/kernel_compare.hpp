// Header-only support for the CUDA element-wise and array kernel tests (elementwise_test.cpp,
// array_test.cpp): one op node run by hand with the kernel the registry gives a device, on
// the GPU and on a CPU device, inputs placed on the GPU with the exact strides and offset of
// a host view, and comparisons of the two results.
//
// The CPU kernels are the reference (they are tested against float64 references in
// tests/kernels); the CUDA kernels must agree with them within a per-dtype tolerance. Running
// a CUDA kernel on the CPU device is also useful without a GPU: every CUDA kernel makes its
// argument checks before its first CUDA call, so a bad node fails there with the CPU kernel's
// message, and the pure view kernels (squeeze, expand_dims, ...) run to the end.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_device.hpp"
#include "cuda/cuda_test_support.hpp"
#include "loom/core/tensor.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/host_resource.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::testing::cuda_compare {

using ints = std::vector<std::int64_t>;

/// A CPU device for the reference runs (2 threads, as the kernel tests use).
inline cpu_device& reference_cpu() {
  static cpu_device d(0, 2, 0, "cuda comparison cpu");
  return d;
}

/// GPU 0, made on first use (tests call LOOM_REQUIRE_GPU() first).
inline cuda::cuda_device& test_gpu() {
  static cuda::cuda_device d(0, cuda_options{});
  return d;
}

// ---- host tensors ----------------------------------------------------------------------------

inline void store_double(dtype t, void* base, std::int64_t i, double v) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(base) + i;
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      *p = T(static_cast<float>(v));
    } else if constexpr (std::is_same_v<T, bool>) {
      *p = v != 0.0;
    } else if constexpr (std::is_integral_v<T>) {
      // Through int64, wrapping (a direct conversion out of T's range is undefined).
      const double c = std::isnan(v) ? 0.0 : std::clamp(v, -9.2e18, 9.2e18);
      *p = static_cast<T>(static_cast<std::int64_t>(c));
    } else {
      *p = static_cast<T>(v);
    }
  });
}

inline double load_double(dtype t, const void* base, std::int64_t i) {
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

/// A dense host tensor holding `v` (row-major, converted from double).
inline tensor make(dtype t, const shape& s, const std::vector<double>& v) {
  tensor out = memory::host_tensor(t, s);
  EXPECT_EQ(static_cast<std::int64_t>(v.size()), out.num_elements());
  for (std::size_t i = 0; i < v.size(); ++i) {
    store_double(t, out.raw_data(), static_cast<std::int64_t>(i), v[i]);
  }
  return out;
}

/// A dense host tensor of values drawn uniformly from [lo, hi) (whole numbers for integer
/// types, non-negative for uint8, a coin for bool), reproducibly from `seed`.
inline tensor random(dtype t, const shape& s, std::uint64_t seed, double lo = -2.0,
                     double hi = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(s.num_elements()));
  for (auto& x : v) {
    x = dist(rng);
    if (is_integer(t)) x = std::floor(x);
    if (t == dtype::u8 && x < 0) x = -x;
    if (t == dtype::boolean) x = x > (lo + hi) / 2 ? 1.0 : 0.0;
  }
  return make(t, s, v);
}

/// The elements of a host tensor (any strides) in row-major order, as doubles.
inline std::vector<double> values(const tensor& x) {
  std::vector<std::byte> dense(x.nbytes());
  if (!dense.empty()) copy_to_dense(x, dense.data());
  std::vector<double> out(static_cast<std::size_t>(x.num_elements()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = load_double(x.type(), dense.data(), static_cast<std::int64_t>(i));
  }
  return out;
}

/// A view of x (rank >= 2) whose storage holds the last two dimensions swapped: the same
/// elements, not contiguous.
inline tensor transposed_storage(const tensor& x) {
  const std::size_t r = x.rank();
  shape stored = x.shape();
  std::swap(stored[r - 1], stored[r - 2]);
  tensor storage = memory::host_tensor(x.type(), stored);
  const auto v = values(x);
  const shape src = contiguous_strides(x.shape());
  shape view = contiguous_strides(stored);
  std::swap(view[r - 1], view[r - 2]);
  for (std::int64_t i = 0; i < x.num_elements(); ++i) {
    std::int64_t rem = i;
    std::int64_t off = 0;
    for (std::size_t k = 0; k < r; ++k) {
      off += rem / src[k] * view[k];
      rem %= src[k];
    }
    store_double(x.type(), storage.raw_data(), off, v[static_cast<std::size_t>(i)]);
  }
  return tensor::strided(storage.buf(), x.type(), x.shape(), view, 0);
}

/// A view of x (any rank) through every `step`-th element of a bigger buffer, starting at
/// element `offset`: strided along every dimension, with an offset.
inline tensor spread(const tensor& x, std::int64_t step = 2, std::int64_t offset = 3) {
  const auto v = values(x);
  const std::int64_t n = x.num_elements();
  tensor storage = memory::host_tensor(x.type(), {offset + std::max<std::int64_t>(n, 1) * step});
  for (std::int64_t i = 0; i < n; ++i) {
    store_double(x.type(), storage.raw_data(), offset + i * step, v[static_cast<std::size_t>(i)]);
  }
  shape strides = contiguous_strides(x.shape());
  for (std::size_t d = 0; d < strides.rank(); ++d) strides[d] *= step;
  return tensor::strided(storage.buf(), x.type(), x.shape(), strides, offset);
}

/// x broadcast to `to` by stride 0 (a view).
inline tensor broadcast_view(const tensor& x, const shape& to) {
  shape strides = shape::filled(to.rank(), 0);
  const std::size_t lead = to.rank() - x.rank();
  for (std::size_t d = 0; d < x.rank(); ++d) {
    strides[lead + d] = x.dim(d) == 1 && to[lead + d] != 1 ? 0 : x.strides()[d];
  }
  return tensor::strided(x.buf(), x.type(), to, strides, x.offset());
}

// ---- moving between host and GPU -------------------------------------------------------------

/// The same view on the GPU. A dense tensor from its buffer's start is copied as it is (a
/// buffer of exactly its bytes); for other views x's whole buffer is copied and the view keeps
/// x's shape, strides and offset, so non-contiguous and broadcast inputs reach the kernel as
/// they are.
inline tensor to_gpu(const tensor& x) {
  if (x.is_contiguous() && x.offset() == 0) return test_gpu().copy_from_host(x);
  const auto bytes = static_cast<std::int64_t>(x.buf()->bytes());
  const tensor raw = tensor::strided(x.buf(), dtype::u8, {bytes}, {1}, 0);
  const tensor on_gpu = test_gpu().copy_from_host(raw);
  return tensor::strided(on_gpu.buf(), x.type(), x.shape(), x.strides(), x.offset());
}

/// A dense host copy of a GPU tensor (waits for the GPU).
inline tensor to_host(const tensor& x) {
  return test_gpu().copy_to_host(x, memory::host_resource::instance());
}

// ---- running one node ------------------------------------------------------------------------

/// One `op` node ("under_test") fed by placeholders declared with the given dtypes and shapes
/// (dimensions may be -1), with `attrs`.
class op_node {
 public:
  op_node(const std::string& op, const std::vector<std::pair<dtype, shape>>& inputs,
          attr_map attrs = {}) {
    node_spec spec;
    spec.name = "under_test";
    spec.op = op;
    spec.attrs = std::move(attrs);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      node_spec p;
      p.name = "input_" + std::to_string(i);
      p.op = "placeholder";
      p.attrs = {{"dtype", inputs[i].first}, {"shape", inputs[i].second}};
      spec.inputs.push_back({g_.add_node(std::move(p)).id, 0});
    }
    node_ = &g_.add_node(std::move(spec));
  }
  // The node points into the graph: neither is copied or moved.
  op_node(const op_node&) = delete;
  op_node& operator=(const op_node&) = delete;

  /// Declared with the inputs' own dtypes and shapes.
  static op_node of(const std::string& op, const std::vector<tensor>& inputs, attr_map attrs = {}) {
    std::vector<std::pair<dtype, shape>> decl;
    for (const auto& t : inputs) decl.emplace_back(t.type(), t.shape());
    return op_node(op, decl, std::move(attrs));
  }

  [[nodiscard]] const node& get() const { return *node_; }

  /// Runs the kernel the registry has for `d`'s type on `d` once. The inputs are moved into
  /// the context, so a tensor the caller does not keep is held by the node alone.
  std::vector<tensor> run(device& d, std::vector<tensor> inputs) const {
    const kernel_def& def = kernel_registry::global().get(*node_, d.type());
    auto kernel = def.create(kernel_construction(*node_, d, &g_));
    std::vector<tensor> outputs(node_->outputs.size());
    variable_store variables;
    kernel_context ctx(*node_, d, inputs, outputs, &variables, nullptr);
    kernel->compute(ctx);
    return outputs;
  }

  /// Runs the CUDA kernel for this node on the CPU device: for argument checks made before
  /// any CUDA call, and for the view kernels, which make none.
  std::vector<tensor> run_cuda_kernel_on_cpu(std::vector<tensor> inputs) const {
    const kernel_def& def = kernel_registry::global().get(*node_, device_type::cuda);
    auto kernel = def.create(kernel_construction(*node_, reference_cpu(), &g_));
    std::vector<tensor> outputs(node_->outputs.size());
    variable_store variables;
    kernel_context ctx(*node_, reference_cpu(), inputs, outputs, &variables, nullptr);
    kernel->compute(ctx);
    return outputs;
  }

 private:
  graph g_;
  const node* node_ = nullptr;
};

// ---- comparing -------------------------------------------------------------------------------

/// Tolerances of a CUDA result against the CPU's for a dtype: both compute in float (or
/// double), so floats differ by a few ulp of the math library; a 16-bit result may then round
/// to the neighbouring value. Integers and bool must be equal.
struct tolerance {
  double rtol = 0;
  double atol = 0;
};
inline tolerance tolerance_for(dtype t) {
  switch (t) {
    case dtype::f64:
      return {1e-12, 1e-14};
    case dtype::f32:
      return {2e-6, 1e-7};
    case dtype::f16:
      return {2e-3, 1e-4};
    case dtype::bf16:
      return {1.6e-2, 1e-3};
    default:
      return {0, 0};
  }
}

/// Expects two host tensors to hold the same elements: same dtype and shape, values within
/// `tol` (NaN matches NaN; infinities must be equal).
inline void expect_same(const tensor& got, const tensor& want, tolerance tol,
                        const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  ASSERT_EQ(got.type(), want.type()) << what;
  ASSERT_EQ(to_string(got.shape()), to_string(want.shape())) << what;
  const auto a = values(got);
  const auto e = values(want);
  int reported = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(e[i])) {
      ok = std::isnan(a[i]);
    } else if (std::isinf(e[i])) {
      ok = a[i] == e[i];
    } else {
      ok = std::fabs(a[i] - e[i]) <= tol.atol + tol.rtol * std::fabs(e[i]);
    }
    if (!ok && reported++ < 8) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << " on the GPU, " << e[i]
                    << " on the CPU";
    }
  }
}

/// Runs `n` on the CPU with `inputs` (host views) and on the GPU with the same views placed
/// there, and expects the outputs to agree (tolerance_for each output's dtype, scaled by
/// `slack`). Returns the GPU's outputs, copied to the host.
inline std::vector<tensor> expect_gpu_matches_cpu(const op_node& n,
                                                  const std::vector<tensor>& inputs,
                                                  const std::string& what, double slack = 1.0) {
  const auto want = n.run(reference_cpu(), inputs);
  std::vector<tensor> on_gpu;
  for (const auto& x : inputs) on_gpu.push_back(to_gpu(x));
  const auto got_gpu = n.run(test_gpu(), on_gpu);
  std::vector<tensor> got;
  for (std::size_t i = 0; i < got_gpu.size(); ++i) {
    EXPECT_EQ(got_gpu[i].device().type, device_type::cuda) << what << ": output " << i;
    got.push_back(to_host(got_gpu[i]));
    tolerance tol = tolerance_for(want[i].type());
    tol.rtol *= slack;
    tol.atol *= slack;
    expect_same(got.back(), want[i], tol, what + ", output " + std::to_string(i));
  }
  return got;
}

/// The message of the loom::node_error f throws ("" and a failure when it throws none).
template <class F>
std::string node_error_of(F&& f) {
  try {
    f();
  } catch (const node_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected loom::node_error, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected loom::node_error";
  return "";
}

/// Expects the CUDA kernel of `n`, run on the CPU device, to fail exactly as the CPU kernel
/// does (the same node_error message, which names the node, op and device), with a message
/// containing `part`.
inline void expect_same_failure(const op_node& n, const std::vector<tensor>& inputs,
                                const std::string& part) {
  const std::string want = node_error_of([&] { n.run(reference_cpu(), inputs); });
  const std::string got = node_error_of([&] { n.run_cuda_kernel_on_cpu(inputs); });
  EXPECT_EQ(got, want);
  EXPECT_NE(want.find(part), std::string::npos) << "'" << part << "' not in: " << want;
  EXPECT_NE(want.find("under_test"), std::string::npos) << want;
}

}  // namespace loom::testing::cuda_compare
