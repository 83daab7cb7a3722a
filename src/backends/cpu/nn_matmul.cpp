// matmul on CPU: oneDNN for float32 and bfloat16 (and float16 where the machine's oneDNN
// has it), a blocked reference loop for float64 and whatever oneDNN cannot do.
//
// Inputs reach oneDNN without a copy whenever their last two dimensions have a unit stride
// on one side (row-major, or column-major as a transposed or `non_contiguous` view is):
// the memory descriptors carry the tensors' own strides, transpose_a/transpose_b become
// swapped strides, and a batch dimension broadcast through a zero stride becomes a
// dimension of 1 that oneDNN broadcasts itself. Anything else is made dense first. A B
// without a batch of its own makes one 2-D product of A's batches (Note [folded batch]),
// and a B from a `const` node is kept in oneDNN's layout (Note [constant weights]).
//
// Note [constant weights]
// An imported model's weights are `const` nodes: the same buffer, holding the same values,
// on every run. When B comes straight from one, the primitive is made with
// format_tag::any weights (oneDNN picks a blocked layout, BA16a64b for float32 on AVX-512)
// and B is reordered into it once per kernel and buffer (onednn::constant_reorders, Note
// [constant reorders]); every other B (placeholders, variables, activations) is taken in
// its own layout on every run, as before. Measured with the transformer of docs/onnx.md
// (one thread, AVX-512), the [128, 256] x [256, 1024] product went from 0.75 to 0.64 ms.
// Both layouts run the same implementation (brg:avx512_core), and a constant B gives the
// same bits as the same B fed at run time (tested, float32 and bfloat16); the fused
// matmul calls this kernel too, so it always matches the unfused graph.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernel/common/apply_rule.hpp"
#include "loom/core/half.hpp"
#include "loom/device/thread_pool.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// An input seen as [batch..., rows, cols] with the output's rank: transposes applied,
// missing leading dimensions added as 1.
struct operand {
  shape dims;
  shape strides;
  const void* data = nullptr;
};

// The view of `x` for the reference loop: broadcast dimensions (size 1 or stride 0 in the
// batch) get stride 0 and keep the output's size implicitly.
operand view_of(const tensor& x, bool transposed, std::size_t rank) {
  operand v;
  v.dims = shape::filled(rank, 1);
  v.strides = shape::filled(rank, 0);
  v.data = x.raw_data();
  const std::size_t lead = rank - x.rank();
  for (std::size_t i = 0; i < x.rank(); ++i) {
    v.dims[lead + i] = x.dim(i);
    v.strides[lead + i] = x.dim(i) == 1 ? 0 : x.strides()[i];
  }
  if (transposed) {
    std::swap(v.dims[rank - 1], v.dims[rank - 2]);
    std::swap(v.strides[rank - 1], v.strides[rank - 2]);
  }
  for (std::size_t i = 0; i + 2 < rank; ++i) {
    if (v.strides[i] == 0) v.dims[i] = 1;  // broadcast in the batch: oneDNN broadcasts it
  }
  return v;
}

// Makes `v` a view oneDNN takes (true), or says it cannot (false): strides of size-1
// dimensions become the dense ones, the last two dimensions need a unit stride on one side
// and a leading dimension that covers the other, and batch strides must be positive.
bool to_onednn_layout(operand& v) {
  const std::size_t r = v.dims.rank();
  std::int64_t dense = 1;
  for (std::size_t i = r; i-- > 0;) {
    if (v.dims[i] == 1) v.strides[i] = dense;
    dense *= v.dims[i];
  }
  const std::int64_t rows = v.dims[r - 2];
  const std::int64_t cols = v.dims[r - 1];
  const std::int64_t sr = v.strides[r - 2];
  const std::int64_t sc = v.strides[r - 1];
  const bool row_major = sc == 1 && sr >= cols;
  const bool col_major = sr == 1 && sc >= rows;
  if (!row_major && !col_major) return false;
  for (std::size_t i = 0; i + 2 < r; ++i) {
    if (v.strides[i] <= 0) return false;
  }
  return true;
}

// Note [folded batch]
// A product whose B has no batch of its own (B is 2-D, or every batch dimension of B is 1 or
// broadcast) multiplies every batch of A by the same matrix: when A's rows lie evenly
// spaced across its batches (a dense A, or any view whose batch strides continue its row
// stride), [batch..., M, K] x [K, N] is one [batch * M, K] x [K, N] product, and so is the
// dense output. oneDNN gets that 2-D product: a transformer's [seq, 1, d] x [d, 3d]
// projection (the sequence-first layout, M = 1) would otherwise be `seq` matrix-vector
// products. Each output element is still one dot product of a row of A and a column of B,
// which oneDNN sums along K as it does for any 2-D product.

// Makes a, b and `out_dims` the 2-D product of Note [folded batch] (true), or leaves them
// (false). a and b are oneDNN views (to_onednn_layout).
bool fold_batch(operand& a, operand& b, shape& out_dims) {
  const std::size_t r = a.dims.rank();
  if (r <= 2) return false;
  const std::int64_t m = a.dims[r - 2];
  const std::int64_t k = a.dims[r - 1];
  if (a.strides[r - 1] != 1 && k != 1) return false;  // column-major rows do not stack
  std::int64_t rows = m;
  // The row stride: M's own, or when M is 1, that of the innermost batch of more than one.
  std::int64_t row_stride = m == 1 ? 0 : a.strides[r - 2];
  for (std::size_t i = r - 2; i-- > 0;) {
    // B's own batch, or A broadcast over the batch.
    if (b.dims[i] != 1 || a.dims[i] != out_dims[i]) return false;
    if (a.dims[i] == 1) continue;
    if (row_stride == 0) row_stride = a.strides[i];
    if (a.strides[i] != row_stride * rows) return false;  // rows not evenly spaced
    rows *= a.dims[i];
  }
  if (row_stride == 0) row_stride = k;  // a single row
  if (row_stride < k) return false;
  a.dims = shape{rows, k};
  a.strides = shape{row_stride, 1};
  b.dims = shape{b.dims[r - 2], b.dims[r - 1]};
  b.strides = shape{b.strides[r - 2], b.strides[r - 1]};
  out_dims = shape{rows, out_dims[r - 1]};
  return true;
}

dnnl::memory::desc md_of(const operand& v, dnnl::memory::data_type t) {
  return {onednn::dims_of(v.dims.dims()), t, onednn::dims_of(v.strides.dims())};
}

// out[b] = a[b] @ b[b] in Acc: b is packed to dense Acc rows once per batch of b, then
// blocks of 4 rows of a sweep over column tiles of the packed b, so that the inner loop is
// a contiguous axpy the compiler vectorises.
template <class T>
void reference_matmul(kernel_context& ctx, const operand& a, const operand& b, tensor& out) {
  using Acc = acc_t<T>;
  const std::size_t r = a.dims.rank();
  const std::size_t nb = r - 2;
  const std::int64_t m = a.dims[r - 2];
  const std::int64_t k = a.dims[r - 1];
  const std::int64_t n = b.dims[r - 1];
  const shape& os = out.shape();

  // Batch offsets of a (elements) and of packed b (rows of k*n) for each output batch.
  std::int64_t batches = 1;
  for (std::size_t i = 0; i < nb; ++i) batches *= os[i];
  std::int64_t b_batches = 1;
  std::vector<std::int64_t> b_packed_stride(nb, 0);
  for (std::size_t i = nb; i-- > 0;) {
    b_packed_stride[i] = b.dims[i] == 1 ? 0 : b_batches;
    b_batches *= b.dims[i];
  }
  std::vector<std::int64_t> a_off(static_cast<std::size_t>(batches));
  std::vector<std::int64_t> b_off(static_cast<std::size_t>(batches));
  std::vector<std::int64_t> b_src_off(static_cast<std::size_t>(b_batches));
  for (std::int64_t bo = 0; bo < batches; ++bo) {
    std::int64_t rem = bo;
    std::int64_t ao = 0;
    std::int64_t po = 0;
    for (std::size_t i = nb; i-- > 0;) {
      const std::int64_t idx = rem % os[i];
      rem /= os[i];
      ao += idx * a.strides[i];
      po += idx * b_packed_stride[i];
    }
    a_off[static_cast<std::size_t>(bo)] = ao;
    b_off[static_cast<std::size_t>(bo)] = po;
  }
  for (std::int64_t bb = 0; bb < b_batches; ++bb) {
    std::int64_t rem = bb;
    std::int64_t so = 0;
    for (std::size_t i = nb; i-- > 0;) {
      const std::int64_t idx = rem % b.dims[i];
      rem /= b.dims[i];
      so += idx * b.strides[i];
    }
    b_src_off[static_cast<std::size_t>(bb)] = so;
  }

  tensor packed = ctx.allocate_temp(dtype_v<Acc>, shape{b_batches * k, n});
  Acc* pb = packed.data<Acc>();
  const T* bsrc = static_cast<const T*>(b.data);
  const std::int64_t bsr = b.strides[r - 2];
  const std::int64_t bsc = b.strides[r - 1];
  ctx.parallel_for(b_batches * k, static_cast<double>(n), [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t row = lo; row < hi; ++row) {
      const T* src = bsrc + b_src_off[static_cast<std::size_t>(row / k)] + (row % k) * bsr;
      Acc* dst = pb + row * n;
      for (std::int64_t j = 0; j < n; ++j) dst[j] = widen<T>(src[j * bsc]);
    }
  });

  constexpr std::int64_t rows_per_block = 4;
  constexpr std::int64_t tile = 256;
  const std::int64_t blocks = (m + rows_per_block - 1) / rows_per_block;
  const T* asrc = static_cast<const T*>(a.data);
  const std::int64_t asr = a.strides[r - 2];
  const std::int64_t asc = a.strides[r - 1];
  T* dst = out.data<T>();
  const double cost = static_cast<double>(rows_per_block * k * n) * 0.25;
  ctx.parallel_for(batches * blocks, cost, [&](std::int64_t lo, std::int64_t hi) {
    Acc acc[rows_per_block][tile];
    for (std::int64_t item = lo; item < hi; ++item) {
      const std::int64_t bo = item / blocks;
      const std::int64_t m0 = (item % blocks) * rows_per_block;
      const std::int64_t rows = std::min(rows_per_block, m - m0);
      const T* arow = asrc + a_off[static_cast<std::size_t>(bo)] + m0 * asr;
      const Acc* bmat = pb + b_off[static_cast<std::size_t>(bo)] * k * n;
      T* orow = dst + (bo * m + m0) * n;
      for (std::int64_t n0 = 0; n0 < n; n0 += tile) {
        const std::int64_t nt = std::min(tile, n - n0);
        for (std::int64_t i = 0; i < rows; ++i) std::fill_n(acc[i], nt, Acc{0});
        for (std::int64_t kk = 0; kk < k; ++kk) {
          const Acc* brow = bmat + kk * n + n0;
          for (std::int64_t i = 0; i < rows; ++i) {
            const Acc av = widen<T>(arow[i * asr + kk * asc]);
            Acc* ai = acc[i];
            for (std::int64_t j = 0; j < nt; ++j) ai[j] += av * brow[j];
          }
        }
        for (std::int64_t i = 0; i < rows; ++i) {
          for (std::int64_t j = 0; j < nt; ++j) orow[i * n + n0 + j] = narrow<T>(acc[i][j]);
        }
      }
    }
  });
}

class matmul_kernel final : public op_kernel {
 public:
  // oneDNN runs on its own (OpenMP) threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }
  explicit matmul_kernel(const kernel_construction& c)
      : op_kernel(c),
        transpose_a_(c.attr<bool>("transpose_a")),
        transpose_b_(c.attr<bool>("transpose_b")),
        type_(c.attr<dtype>("T")),
        constant_b_(onednn::input_is_constant(c, 1)) {}

  void compute(kernel_context& ctx) override {
    const tensor& a = ctx.input(0);
    const tensor& b = ctx.input(1);
    const auto [out_shape, ka] =
        common::apply_rule(ctx, [&] { return nn_rules::matmul_dims_of(a, b, transpose_a_, transpose_b_); });
    tensor& out = ctx.allocate_output(0, out_shape);
    if (out.num_elements() == 0) return;
    if (ka == 0) {
      std::memset(out.raw_data(), 0, out.nbytes());  // all-zero bits are +0 in every float type
      return;
    }
    const std::size_t rank = out_shape.rank();
    const auto dt = onednn::data_type_of(type_);
    if (dt && !onednn_lacks_type_.load(std::memory_order_relaxed)) {
      if (run_onednn(ctx, view_of(a, transpose_a_, rank), view_of(b, transpose_b_, rank), out,
                     *dt)) {
        return;
      }
      // Strides oneDNN does not take: once more with dense copies.
      if (!a.is_contiguous() || !b.is_contiguous()) {
        const tensor ac = ctx.input_contiguous(0);
        const tensor bc = ctx.input_contiguous(1);
        if (run_onednn(ctx, view_of(ac, transpose_a_, rank), view_of(bc, transpose_b_, rank), out,
                       *dt)) {
          return;
        }
      }
      // Dense inputs and still no primitive: oneDNN lacks the dtype on this machine (float16
      // in oneDNN 2.6, bfloat16 before AVX-512); later calls go straight to the reference
      // loop. float32 it always has, whatever the shapes.
      if (type_ != dtype::f32) onednn_lacks_type_.store(true, std::memory_order_relaxed);
    }
    const operand va = view_of(a, transpose_a_, rank);
    const operand vb = view_of(b, transpose_b_, rank);
    visit_float(ctx, va, vb, out);
  }

 private:
  // True when oneDNN ran the product; false when it cannot take these views or dtype.
  bool run_onednn(kernel_context& ctx, operand va, operand vb, tensor& out,
                  dnnl::memory::data_type dt) {
    if (!to_onednn_layout(va) || !to_onednn_layout(vb)) return false;
    const int threads = ctx.num_threads();
    shape out_dims = out.shape();
    fold_batch(va, vb, out_dims);
    const std::size_t rank = out_dims.rank();
    onednn::primitive_cache::key key;
    key.reserve(3 + 5 * rank);
    key.push_back(static_cast<std::int64_t>(type_));
    key.push_back(threads);
    key.push_back(static_cast<std::int64_t>(rank));
    for (const shape* v : std::initializer_list<const shape*>{&va.dims, &va.strides, &vb.dims,
                                                              &vb.strides, &out_dims}) {
      key.insert(key.end(), v->begin(), v->end());
    }
    const auto plan = cache_.get(key, [&] {
      onednn::use_threads(threads);
      const dnnl::memory::desc src_md = md_of(va, dt);
      const dnnl::memory::desc wei_md = md_of(vb, dt);
      const dnnl::memory::desc dst_md(onednn::dims_of(out_dims.dims()), dt,
                                      onednn::dims_of(contiguous_strides(out_dims).dims()));
      // A constant B is taken in the layout oneDNN picks (Note [constant weights]).
      const dnnl::memory::desc wei_inner =
          constant_b_ ? dnnl::memory::desc(wei_md.dims(), dt, dnnl::memory::format_tag::any)
                      : wei_md;
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_inner, dst_md),
                                            onednn::user_scratchpad_attr(), onednn::engine());
      return onednn::make_plan<dnnl::matmul>(pd, {{DNNL_ARG_SRC, src_md},
                                                  {DNNL_ARG_WEIGHTS, wei_md, pd.weights_desc()},
                                                  {DNNL_ARG_DST, dst_md}});
    });
    if (!plan->primitive) return false;  // no implementation, or strides oneDNN rejects
    // B is argument 1 (Note [constant reorders]).
    onednn::execute(ctx, *plan, {va.data, vb.data, out.raw_data()}, constants_,
                    constant_b_ ? 0b010U : 0U);
    return true;
  }

  void visit_float(kernel_context& ctx, const operand& a, const operand& b, tensor& out) const {
    visit_float_type(ctx, type_, "matmul",
                     [&](auto tag) { reference_matmul<decltype(tag)>(ctx, a, b, out); });
  }

  bool transpose_a_;
  bool transpose_b_;
  dtype type_;
  bool constant_b_;
  onednn::primitive_cache cache_;
  onednn::constant_reorders constants_;
  std::atomic<bool> onednn_lacks_type_{false};
};

}  // namespace

void register_nn_matmul_kernels(kernel_registry& r) {
  r.add(onednn::with_emulated_reason(make_kernel_def<matmul_kernel>(
      "matmul", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn")));
}

}  // namespace loom::cpu
