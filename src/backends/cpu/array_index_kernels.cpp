// The CPU's device work of the indexing array ops, gather (NumPy take) and one_hot, whose
// kernels every backend shares (src/kernel/common/array_kernels.hpp; shapes and checks are
// the op rules', loom/graph/ops/array_rules.hpp). Registered from register_array_kernels
// (array_kernels.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "array_index.hpp"
#include "cpu_kernels.hpp"
#include "elementwise_math.hpp"
#include "kernel/common/array_kernels.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::cpu {

void register_array_index_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;

// Calls f(T{}) with T an unsigned integer of `bytes` bytes: gather moves bits.
template <class F>
void visit_bits(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f(std::uint8_t{});
    case 2:
      return f(std::uint16_t{});
    case 4:
      return f(std::uint32_t{});
    default:
      return f(std::uint64_t{});
  }
}

// gather's CPU take (src/kernel/common/array_kernels.hpp): every index checked, then rows
// copied.
class gather_take {
 public:
  explicit gather_take(kernel_context& ctx) : ctx_(ctx) {}

  void operator()(const array_rules::gather_geometry& g, bool wrap_negative) const {
    kernel_context& ctx = ctx_;
    const tensor params = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    const std::size_t ax = g.axis;
    const std::int64_t n = g.n;
    tensor& out = ctx.allocate_output(0, g.out);
    visit_index(indices.type(), [&](auto itag) {
      using I = decltype(itag);
      const I* idx = indices.data<I>();
      const std::int64_t k = indices.num_elements();
      const std::int64_t lo = wrap_negative ? -n : 0;
      std::vector<I> wrapped;  // the indices with the negative ones wrapped, when any are
      for (std::int64_t i = 0; i < k; ++i) {
        if (idx[i] < lo || idx[i] >= n) {
          ctx.fail("indices{} = {} is out of range: params {} has {} entries along axis {}",
                   position(indices.shape(), i), static_cast<std::int64_t>(idx[i]),
                   params.describe(), n, ax);
        }
        if (idx[i] < 0 && wrapped.empty()) wrapped.assign(idx, idx + k);
        if (idx[i] < 0) wrapped[static_cast<std::size_t>(i)] = static_cast<I>(idx[i] + n);
      }
      if (!wrapped.empty()) idx = wrapped.data();
      if (out.num_elements() == 0) return;
      visit_bits(size_of(params.type()), [&](auto btag) {
        using T = decltype(btag);
        run<T, I>(ctx, static_cast<const T*>(params.raw_data()), idx,
                  static_cast<T*>(out.raw_data()), g.outer, n, g.inner, k);
      });
    });
  }

 private:
  // out[o, j, i] = params[o, idx[j], i]; indices already checked.
  template <class T, class I>
  static void run(const kernel_context& ctx, const T* params, const I* idx, T* out,
                  std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t k) {
    const double cost =
        static_cast<double>(inner * static_cast<std::int64_t>(sizeof(T))) * 0.15 + 2.0;
    ctx.parallel_for(outer * k, cost, [&](std::int64_t begin, std::int64_t end) {
      std::int64_t o = begin / k;
      std::int64_t j = begin % k;
      if (inner == 1) {
        for (std::int64_t u = begin; u < end; ++u) {
          out[u] = params[o * n + static_cast<std::int64_t>(idx[j])];
          if (++j == k) {
            j = 0;
            ++o;
          }
        }
        return;
      }
      const auto row = static_cast<std::size_t>(inner) * sizeof(T);
      for (std::int64_t u = begin; u < end; ++u) {
        std::memcpy(out + u * inner, params + (o * n + static_cast<std::int64_t>(idx[j])) * inner,
                    row);
        if (++j == k) {
          j = 0;
          ++o;
        }
      }
    });
  }

  kernel_context& ctx_;
};

// one_hot's CPU fill (src/kernel/common/array_kernels.hpp):
// out[p, d, s] = idx[p, s] == d ? on : off.
class one_hot_fill {
 public:
  explicit one_hot_fill(kernel_context& ctx) : ctx_(ctx) {}

  void operator()(const array_rules::one_hot_geometry& g, const common::one_hot_attrs& a) const {
    const tensor indices = ctx_.input_contiguous(0);
    tensor& out = ctx_.allocate_output(0, g.out);
    if (out.num_elements() == 0) return;
    visit_index(indices.type(), [&](auto itag) {
      using I = decltype(itag);
      visit_dtype(out.type(), [&](auto ttag) {
        using T = decltype(ttag);
        run<T, I>(indices.data<I>(), out.data<T>(), g.prefix, g.suffix, a);
      });
    });
  }

 private:
  template <class T, class I>
  void run(const I* idx, T* out, std::int64_t prefix, std::int64_t suffix,
           const common::one_hot_attrs& a) const {
    const T on = ew::wrap_from_double<T>(a.on);
    const T off = ew::wrap_from_double<T>(a.off);
    const std::int64_t depth = a.depth;
    const std::int64_t block = depth * suffix;
    const double cost = static_cast<double>(block * static_cast<std::int64_t>(sizeof(T))) * 0.1 +
                        static_cast<double>(suffix) + 2.0;
    ctx_.parallel_for(prefix, cost, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t p = begin; p < end; ++p) {
        T* o = out + p * block;
        std::fill_n(o, block, off);
        const I* row = idx + p * suffix;
        for (std::int64_t s = 0; s < suffix; ++s) {
          const auto v = static_cast<std::int64_t>(row[s]);
          if (v >= 0 && v < depth) o[v * suffix + s] = on;
        }
      }
    });
  }

  kernel_context& ctx_;
};

}  // namespace

void register_array_index_kernels(kernel_registry& r) {
  r.add(make_kernel_def<common::gather_kernel<gather_take>>(
      "gather", cpu, {{"T", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
  r.add(make_kernel_def<common::one_hot_kernel<one_hot_fill>>(
      "one_hot", cpu, {{"dtype", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
}

}  // namespace loom::cpu
