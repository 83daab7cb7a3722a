// The CPU's device work of the array ops that gradients build on, pad (the gradient of
// slice) and gather_grad (of gather), whose kernels every backend shares
// (src/kernel/common/array_kernels.hpp; shapes and checks are the op rules',
// loom/graph/ops/array_rules.hpp). broadcast_to, a stride-0 view (Note [array views] in
// src/kernel/common/array_views.hpp), is one of the kernels every device shares
// (src/kernel/common/neutral_kernels.cpp). Registered from register_array_kernels
// (array_kernels.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "array_copy.hpp"
#include "array_index.hpp"
#include "cpu_kernels.hpp"
#include "elementwise_math.hpp"
#include "kernel/common/array_kernels.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::cpu {

void register_array_grad_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;
using ints = std::vector<std::int64_t>;

// The unsigned integer of T's size: pad moves bits, so one instantiation per size serves
// every dtype.
template <class T>
using bits_t = std::conditional_t<
    sizeof(T) == 1, std::uint8_t,
    std::conditional_t<sizeof(T) == 2, std::uint16_t,
                       std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;

// ---- pad --------------------------------------------------------------------------------

// pad's CPU fill (src/kernel/common/array_kernels.hpp). One task per output row (the last
// dimension): rows outside the input are the constant; the others are the constant, the
// input's row, the constant. Every element is written once.
class pad_fill {
 public:
  explicit pad_fill(kernel_context& ctx) : ctx_(ctx) {}

  void operator()(const tensor& in, const shape& s, const common::pad_attrs& a) const {
    tensor& out = ctx_.allocate_output(0, s);
    if (out.num_elements() == 0) return;
    visit_dtype(in.type(), [&](auto ttag) {
      using T = decltype(ttag);
      using B = bits_t<T>;
      static_assert(sizeof(B) == sizeof(T));
      const T value = ew::wrap_from_double<T>(a.constant);
      B bits;
      std::memcpy(&bits, &value, sizeof(B));
      run<B>(in, out, bits, a.paddings);
    });
  }

 private:
  template <class B>
  void run(const tensor& in, tensor& out, B value, const ints& paddings) const {
    const std::size_t rank = out.rank();
    const std::int64_t len = out.dim(rank - 1);
    const std::int64_t in_len = in.dim(rank - 1);
    const std::int64_t before = paddings[2 * (rank - 1)];
    const std::int64_t last_stride = in.strides()[rank - 1];
    const std::int64_t rows = out.num_elements() / len;
    const auto* src = in.num_elements() > 0 ? static_cast<const B*>(in.raw_data()) : nullptr;
    auto* dst = static_cast<B*>(out.raw_data());
    const double cost = static_cast<double>(len * static_cast<std::int64_t>(sizeof(B))) * 0.1 +
                        5.0 * static_cast<double>(rank);
    ctx_.parallel_for(rows, cost, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t r = lo; r < hi; ++r) {
        B* row = dst + r * len;
        // The input row this output row holds, if any.
        std::int64_t rest = r;
        std::int64_t at = 0;
        bool inside = in_len > 0;
        for (std::size_t d = rank - 1; d-- > 0;) {
          const std::int64_t k = rest % out.dim(d) - paddings[2 * d];
          rest /= out.dim(d);
          if (k < 0 || k >= in.dim(d)) inside = false;
          at += k * in.strides()[d];
        }
        if (!inside) {
          std::fill_n(row, len, value);
          continue;
        }
        std::fill_n(row, before, value);
        const B* from = src + at;
        if (last_stride == 1) {
          std::memcpy(row + before, from, static_cast<std::size_t>(in_len) * sizeof(B));
        } else {
          for (std::int64_t i = 0; i < in_len; ++i) row[before + i] = from[i * last_stride];
        }
        std::fill(row + before + in_len, row + len, value);
      }
    });
  }

  kernel_context& ctx_;
};

// ---- gather_grad ------------------------------------------------------------------------

// The sum type of gather_grad: float for float32 and the 16-bit floats, double for float64,
// uint64 for integers (wrapping, as the integer's own addition would, without UB).
template <class T>
using sum_t = std::conditional_t<std::is_integral_v<T>, std::uint64_t,
                                 std::conditional_t<std::is_same_v<T, double>, double, float>>;

template <class T>
sum_t<T> to_sum(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<sum_t<T>>(v);
  }
}

template <class T>
T from_sum(sum_t<T> v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(v);
  } else {
    return static_cast<T>(v);  // integers: modulo 2^bits (C++20)
  }
}

// gather_grad's CPU sum (src/kernel/common/array_kernels.hpp): every index checked, then
// the rows summed in a fixed order.
class gather_grad_sum {
 public:
  explicit gather_grad_sum(kernel_context& ctx) : ctx_(ctx) {}

  void operator()(const array_rules::gather_geometry& g) const {
    kernel_context& ctx = ctx_;
    const tensor dy = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    const shape& ps = g.out;
    const std::size_t ax = g.axis;
    const std::int64_t n = g.n;
    tensor& out = ctx.allocate_output(0, ps);
    visit_index(indices.type(), [&](auto itag) {
      using I = decltype(itag);
      const I* idx = indices.data<I>();
      const std::int64_t count = indices.num_elements();
      for (std::int64_t i = 0; i < count; ++i) {
        if (idx[i] < 0 || idx[i] >= n) {
          ctx.fail("indices{} = {} is out of range: params_shape {} has {} entries along axis {}",
                   position(indices.shape(), i), static_cast<std::int64_t>(idx[i]), to_string(ps),
                   n, ax);
        }
      }
      if (out.num_elements() == 0) return;
      if (count == 0) {  // nothing was gathered: zeros
        std::memset(out.raw_data(), 0, out.nbytes());
        return;
      }
      visit_dtype(out.type(), [&](auto ttag) {
        using T = decltype(ttag);
        if constexpr (std::is_same_v<T, bool>) {
          ctx.fail("gather_grad has no kernel for bool");
        } else {
          run<T, I>(ctx, dy.data<T>(), idx, out.data<T>(), g.outer, n, g.inner, count);
        }
      });
    });
  }

 private:
  // out[o, r, :] = sum over the positions j with idx[j] == r, in increasing j, of
  // dy[o, j, :]. The positions are bucketed by destination first (a stable counting
  // sort), so each task owns whole output rows (or a block of columns of one): no two
  // tasks write one element, and each element's sum has a fixed order.
  template <class T, class I>
  static void run(const kernel_context& ctx, const T* dy, const I* idx, T* out, std::int64_t outer,
                  std::int64_t n, std::int64_t inner, std::int64_t count) {
    std::vector<std::int64_t> start(static_cast<std::size_t>(n + 1), 0);
    for (std::int64_t j = 0; j < count; ++j) ++start[static_cast<std::size_t>(idx[j]) + 1];
    for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) start[r + 1] += start[r];
    std::vector<std::int64_t> order(static_cast<std::size_t>(count));
    {
      std::vector<std::int64_t> next(start.begin(), start.end() - 1);
      for (std::int64_t j = 0; j < count; ++j) {
        order[static_cast<std::size_t>(next[static_cast<std::size_t>(idx[j])]++)] = j;
      }
    }
    // Wide rows are cut into blocks of columns, so one index picked many times still
    // spreads over the threads.
    constexpr std::int64_t block = 1024;
    const std::int64_t blocks = (inner + block - 1) / block;
    const std::int64_t width = std::min(inner, block);
    const double cost =
        (static_cast<double>(count) / static_cast<double>(n) + 1.0) * static_cast<double>(width);
    ctx.parallel_for(outer * n * blocks, cost, [&](std::int64_t lo, std::int64_t hi) {
      std::vector<sum_t<T>> acc(static_cast<std::size_t>(width));
      for (std::int64_t item = lo; item < hi; ++item) {
        const std::int64_t row = item / blocks;  // o * n + r
        const std::int64_t c0 = (item % blocks) * block;
        const std::int64_t c1 = std::min(inner, c0 + block);
        const std::int64_t o = row / n;
        const auto r = static_cast<std::size_t>(row % n);
        std::fill(acc.begin(), acc.end(), sum_t<T>{0});
        for (std::int64_t q = start[r]; q < start[r + 1]; ++q) {
          const T* src = dy + (o * count + order[static_cast<std::size_t>(q)]) * inner;
          for (std::int64_t c = c0; c < c1; ++c) {
            acc[static_cast<std::size_t>(c - c0)] += to_sum<T>(src[c]);
          }
        }
        T* dst = out + row * inner;
        for (std::int64_t c = c0; c < c1; ++c) {
          dst[c] = from_sum<T>(acc[static_cast<std::size_t>(c - c0)]);
        }
      }
    });
  }

  kernel_context& ctx_;
};

}  // namespace

void register_array_grad_kernels(kernel_registry& r) {
  r.add(make_kernel_def<common::pad_kernel<dense_copy, pad_fill>>("pad", cpu,
                                                                  type_constraint(all_types())));
  // The op's dtypes: T numeric (no bool), Tindices int32 or int64.
  r.add(make_kernel_def<common::gather_grad_kernel<gather_grad_sum>>("gather_grad", cpu));
}

}  // namespace loom::cpu
