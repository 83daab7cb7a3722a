// matmul and fused_matmul on CUDA: one cublasLtMatmul per product (or per group of batches),
// and for fused_matmul an element-wise epilogue kernel after it.
//
// Note [cuda matmul layout]
// loom's tensors are row-major and cuBLASLt's matrices column-major. A row-major [m, n]
// matrix is the column-major [n, m] matrix of its transpose, so C = op(A) op(B) is computed
// as C^T = op(B)^T op(A)^T: cuBLASLt's "A" is loom's b (its stored layout, transposed when
// transpose_b), its "B" is loom's a, and D is [n, m] column-major with leading dimension n,
// which is exactly the row-major [m, n] output. Inputs are made dense first
// (ctx.input_contiguous). Batches go through strided batch layouts: when every operand's
// offset is (batch index) x (one stride) over the output's batches, one call does them all
// (a broadcast operand has stride 0); otherwise (broadcasts in the middle of several batch
// dimensions) one call per run of the last batch dimension, over which offsets always are.
// float32 computes in float32 (CUBLAS_COMPUTE_32F: no TF32), float64 in float64, float16
// and bfloat16 in float32 with results rounded once.
//
// Note [cuda matmul epilogues]
// fused_matmul's y = act(a @ b + bias + residual) gives bit for bit what the unfused graph
// gives on the GPU, NaN, infinities and signed zeros included (docs/passes.md, "Passes never
// change an answer"): the product is the very cublasLtMatmul the plain matmul runs (the same
// configuration, so the same algorithm from the heuristic, summing in the same order), and
// one element-wise kernel after it (kernels/epilogue.cu) adds the bias, adds the residual
// and applies the activation, each step as the unfused bias_add, add and activation kernels
// compute and round it. cuBLASLt's own epilogues would save that kernel's pass but change
// answers: its RELU is a max(x, 0) that may give 0 for NaN and +0 for -0 (relu keeps both,
// Note [NaN rules]), its GELU is less exact than loom's (6e-5 relative in float32 on an
// H200), its BIAS and the residual as C (beta = 1) add in another order and round float16
// and bfloat16 once where the unfused ops round after each add. K = 0 is zeros plus the
// epilogue, as on CPU.
//
// Plans (matmul descriptor settings, layouts and the heuristic's algorithm) are cached per
// shape, batching, dtype and pointer alignment in the kernel, under a mutex; the matmul
// descriptor itself is made per call (it is cheap, and concurrent runs share nothing).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/apply_rule.hpp"
#include "kernels/epilogue.cuh"
#include "loom/graph/ops/nn_rules.hpp"
#include "matmul_batches.hpp"

namespace loom::cuda {
namespace {

using kernels::epilogue_activation;
using kernels::epilogue_type;

// ---- cuBLASLt objects ------------------------------------------------------------------

struct layout_deleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const noexcept {
    (void)cublasLtMatrixLayoutDestroy(l);
  }
};
using layout_ptr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, layout_deleter>;

struct desc_deleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const noexcept {
    (void)cublasLtMatmulDescDestroy(d);
  }
};
using desc_ptr = std::unique_ptr<cublasLtMatmulDescOpaque_t, desc_deleter>;

struct pref_deleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const noexcept {
    (void)cublasLtMatmulPreferenceDestroy(p);
  }
};
using pref_ptr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, pref_deleter>;

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)));
}

template <class V>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const V& v) {
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, a, &v, sizeof(v)));
}

cudaDataType_t data_type_of(dtype t) {
  switch (t) {
    case dtype::f64:
      return CUDA_R_64F;
    case dtype::f16:
      return CUDA_R_16F;
    case dtype::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

epilogue_type epilogue_type_of(dtype t) {
  static_assert(static_cast<int>(epilogue_type::f64) == static_cast<int>(dtype::f64) &&
                static_cast<int>(epilogue_type::bf16) == static_cast<int>(dtype::bf16));
  return static_cast<epilogue_type>(static_cast<int>(t));  // the float types: T's constraint
}

// The largest power of two <= 256 dividing the address and, for batched operands, the batch
// stride in bytes: what the heuristic may assume about every matrix of the operand.
std::int64_t alignment_of(const void* p, std::int64_t stride_bytes) {
  auto v = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  if (stride_bytes != 0) v |= static_cast<std::uint64_t>(stride_bytes);
  std::int64_t a = 1;
  while (a < 256 && (v & static_cast<std::uint64_t>(a)) == 0) a *= 2;
  return a;
}

// ---- one product ------------------------------------------------------------------------

// What a plan depends on (the cache key, as a vector of integers).
struct gemm_config {
  dtype type = dtype::f32;
  bool transpose_a = false;  // loom's flags (Note [cuda matmul layout])
  bool transpose_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;                                 // matrices per call
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between matrices
  std::int64_t align_a = 256, align_b = 256, align_c = 256, align_d = 256;

  [[nodiscard]] std::vector<std::int64_t> key() const {
    return {static_cast<std::int64_t>(type),
            transpose_a,
            transpose_b,
            m,
            n,
            k,
            batch,
            stride_a,
            stride_b,
            stride_c,
            align_a,
            align_b,
            align_c,
            align_d};
  }
};

bool is_double(dtype t) {
  return t == dtype::f64;
}

// The matmul descriptor of `c` (cuBLASLt's default epilogue: Note [cuda matmul epilogues]).
desc_ptr make_desc(const gemm_config& c) {
  cublasLtMatmulDesc_t d = nullptr;
  const cublasComputeType_t compute = is_double(c.type) ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale = is_double(c.type) ? CUDA_R_64F : CUDA_R_32F;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, compute, scale));
  desc_ptr owned(d);
  // cuBLASLt's A is loom's b, its B loom's a.
  const cublasOperation_t op_a = c.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = c.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(d, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(d, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  return owned;
}

layout_ptr make_layout(dtype t, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                       std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &l, data_type_of(t), static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld));
  layout_ptr owned(l);
  if (batch > 1) {
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<std::int32_t>(batch));
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return owned;
}

// A cached plan: the layouts and the algorithm for one gemm_config.
struct gemm_plan {
  layout_ptr a, b, cd;
  cublasLtMatmulAlgo_t algo{};
};

std::shared_ptr<const gemm_plan> make_plan(const gemm_config& c, cuda_device& dev) {
  auto p = std::make_shared<gemm_plan>();
  // cuBLASLt's A: loom's b, stored [k, n] (or [n, k] when transposed) row-major, i.e.
  // column-major n x k (k x n) with leading dimension n (k).
  p->a = c.transpose_b ? make_layout(c.type, c.k, c.n, c.k, c.batch, c.stride_b)
                       : make_layout(c.type, c.n, c.k, c.n, c.batch, c.stride_b);
  p->b = c.transpose_a ? make_layout(c.type, c.m, c.k, c.m, c.batch, c.stride_a)
                       : make_layout(c.type, c.k, c.m, c.k, c.batch, c.stride_a);
  p->cd = make_layout(c.type, c.n, c.m, c.n, c.batch, c.stride_c);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  pref_ptr pref(pref_raw);
  const std::uint64_t workspace = dev.lt_workspace_bytes();
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  const auto set_align = [&](cublasLtMatmulPreferenceAttributes_t attr, std::int64_t a) {
    const auto v = static_cast<std::uint32_t>(a);
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_raw, attr, &v, sizeof(v)));
  };
  // cuBLASLt's A and B are loom's b and a.
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, c.align_b);
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, c.align_a);
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c.align_c);
  set_align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c.align_d);

  const desc_ptr desc = make_desc(c);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(dev.cublas_lt(), desc.get(), p->a.get(), p->b.get(),
                                     p->cd.get(), p->cd.get(), pref.get(), 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return nullptr;
  p->algo = result.algo;
  return p;
}

// Runs one cublasLtMatmul of `c` under `plan`: D = A B (beta 0, C is D).
void run_plan(kernel_context& ctx, cuda_device& dev, cudaStream_t stream, const gemm_config& c,
              const gemm_plan& plan, const void* a, const void* b, void* d) {
  const desc_ptr desc = make_desc(c);
  const float alpha_f = 1.0f;
  const float beta_f = 0.0f;
  const double alpha_d = 1.0;
  const double beta_d = 0.0;
  const void* alpha = is_double(c.type) ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = is_double(c.type) ? static_cast<const void*>(&beta_d) : &beta_f;
  const cublasStatus_t st =
      cublasLtMatmul(dev.cublas_lt(), desc.get(), alpha, b, plan.a.get(), a, plan.b.get(), beta,
                     d, plan.cd.get(), d, plan.cd.get(), &plan.algo, dev.lt_workspace(),
                     dev.lt_workspace_bytes(), stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    ctx.fail("cublasLtMatmul failed: {} ({})", cublasGetStatusName(st), cublasGetStatusString(st));
  }
}

// The element offset of operand `x` (dense, of rank >= 2) for each of the output's batches
// (`batch_dims`, row-major): its batch dimensions are right-aligned to the output's, and
// broadcast ones (size 1 or missing) contribute nothing.
std::vector<std::int64_t> batch_offsets(const shape& x, const shape& batch_dims) {
  const std::size_t nb = batch_dims.rank();
  const std::size_t xb = x.rank() - 2;
  std::vector<std::int64_t> stride(nb, 0);
  std::int64_t s = x[x.rank() - 1] * x[x.rank() - 2];
  for (std::size_t i = xb; i-- > 0;) {
    const std::size_t o = nb - xb + i;
    stride[o] = x[i] == 1 ? 0 : s;
    s *= x[i];
  }
  const std::int64_t total = batch_dims.num_elements();
  std::vector<std::int64_t> off(static_cast<std::size_t>(total), 0);
  for (std::int64_t bo = 0; bo < total; ++bo) {
    std::int64_t rem = bo;
    std::int64_t o = 0;
    for (std::size_t i = nb; i-- > 0;) {
      o += (rem % batch_dims[i]) * stride[i];
      rem /= batch_dims[i];
    }
    off[static_cast<std::size_t>(bo)] = o;
  }
  return off;
}

// True when off[i] == off[lo] + (i - lo) * step over [lo, hi).
bool is_progression(const std::vector<std::int64_t>& off, std::size_t lo, std::size_t hi,
                    std::int64_t& step) {
  step = hi - lo > 1 ? off[lo + 1] - off[lo] : 0;
  for (std::size_t i = lo + 1; i < hi; ++i) {
    if (off[i] - off[i - 1] != step) return false;
  }
  return true;
}

}  // namespace

std::vector<gemm_call> plan_gemm_calls(const shape& a, const shape& b, const shape& out,
                                       std::int64_t mn) {
  const shape batch_dims(out.dims().first(out.rank() - 2));
  const std::int64_t total = batch_dims.num_elements();
  const auto oa = batch_offsets(a, batch_dims);
  const auto ob = batch_offsets(b, batch_dims);
  // cuBLASLt counts a batch in an int32.
  constexpr std::int64_t max_count = std::numeric_limits<std::int32_t>::max();
  std::int64_t run = total;
  std::int64_t sa = 0;
  std::int64_t sb = 0;
  const auto n = static_cast<std::size_t>(total);
  if (!is_progression(oa, 0, n, sa) || !is_progression(ob, 0, n, sb)) {
    run = batch_dims[batch_dims.rank() - 1];  // a run of the last batch dimension always is
  }
  run = std::max<std::int64_t>(1, std::min(run, max_count));
  std::vector<gemm_call> calls;
  for (std::int64_t lo = 0; lo < total; lo += run) {
    gemm_call c;
    c.count = std::min(run, total - lo);
    const auto l = static_cast<std::size_t>(lo);
    c.a_offset = oa[l];
    c.b_offset = ob[l];
    c.c_offset = lo * mn;
    c.a_stride = c.count > 1 ? oa[l + 1] - oa[l] : 0;
    c.b_stride = c.count > 1 ? ob[l + 1] - ob[l] : 0;
    calls.push_back(c);
  }
  return calls;
}

namespace {

// ---- the kernels ------------------------------------------------------------------------

epilogue_activation activation_of(const kernel_construction& c) {
  static_assert(static_cast<int>(epilogue_activation::sigmoid) ==
                    static_cast<int>(nn_rules::activation::sigmoid) &&
                static_cast<int>(epilogue_activation::clip) ==
                    static_cast<int>(nn_rules::activation::clip));
  const nn_rules::activation a =
      common::apply_rule(c, [&] { return nn_rules::activation_of(c.attr<std::string>("activation")); });
  return static_cast<epilogue_activation>(static_cast<int>(a));
}

// matmul and fused_matmul: the product, with the epilogue of a fused node.
class lt_matmul_kernel : public op_kernel {
 public:
  lt_matmul_kernel(const kernel_construction& c, bool fused)
      : op_kernel(c),
        transpose_a_(c.attr<bool>("transpose_a")),
        transpose_b_(c.attr<bool>("transpose_b")),
        type_(c.attr<dtype>("T")) {
    if (fused) {
      has_bias_ = c.attr<bool>("has_bias");
      has_residual_ = c.attr<bool>("has_residual");
      act_ = activation_of(c);
      clip_min_ = c.attr<double>("clip_min");
      clip_max_ = c.attr<double>("clip_max");
      common::apply_rule(c, [&] {
        nn_rules::check_epilogue_inputs(c.node().inputs.size(), has_bias_, has_residual_);
        nn_rules::check_clip_bounds(static_cast<nn_rules::activation>(act_), clip_min_, clip_max_);
      });
    }
  }

  void compute(kernel_context& ctx) override {
    const nn_rules::matmul_dims dims = common::apply_rule(ctx, [&] {
      return nn_rules::matmul_dims_of(ctx.input(0), ctx.input(1), transpose_a_, transpose_b_);
    });
    const shape& out_shape = dims.out;
    const std::int64_t k = dims.k;
    common::apply_rule(ctx, [&] {
      nn_rules::check_epilogue_args(out_shape, out_shape.rank() - 1,
                                    has_bias_ ? &ctx.input(2) : nullptr,
                                    has_residual_ ? &ctx.input(has_bias_ ? 3 : 2) : nullptr);
    });
    launch_scope s(ctx);
    // A new buffer: the product is the plain matmul's, the residual is read after it
    // (Note [cuda matmul epilogues]).
    tensor& out = ctx.allocate_output(0, out_shape);
    if (out.num_elements() == 0) return;
    const std::int64_t n = out_shape[out_shape.rank() - 1];
    const std::int64_t rows = out.num_elements() / n;
    const tensor bias = has_bias_ ? ctx.input_contiguous(2) : tensor();
    const tensor residual = has_residual_ ? ctx.input_contiguous(has_bias_ ? 3 : 2) : tensor();
    if (k == 0) {
      // The product is zeros (all-zero bits are +0 in every float type).
      LOOM_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), s.stream));
    } else {
      const tensor a = ctx.input_contiguous(0);
      const tensor b = ctx.input_contiguous(1);
      const std::int64_t m = out_shape[out_shape.rank() - 2];
      const auto calls = plan_gemm_calls(a.shape(), b.shape(), out_shape, m * n);
      const auto elem = static_cast<std::int64_t>(size_of(type_));
      const auto* a0 = static_cast<const std::byte*>(a.raw_data());
      const auto* b0 = static_cast<const std::byte*>(b.raw_data());
      auto* d0 = static_cast<std::byte*>(out.raw_data());
      for (const gemm_call& call : calls) {
        gemm_config c;
        c.type = type_;
        c.transpose_a = transpose_a_;
        c.transpose_b = transpose_b_;
        c.m = m;
        c.n = n;
        c.k = k;
        c.batch = call.count;
        c.stride_a = call.a_stride;
        c.stride_b = call.b_stride;
        c.stride_c = m * n;
        const void* pa = a0 + call.a_offset * elem;
        const void* pb = b0 + call.b_offset * elem;
        void* pd = d0 + call.c_offset * elem;
        c.align_a = alignment_of(pa, c.batch > 1 ? c.stride_a * elem : 0);
        c.align_b = alignment_of(pb, c.batch > 1 ? c.stride_b * elem : 0);
        c.align_d = alignment_of(pd, c.batch > 1 ? c.stride_c * elem : 0);
        c.align_c = c.align_d;  // C is D
        const auto plan = plan_for(c, s.dev);
        if (plan == nullptr) {
          ctx.fail("cuBLASLt has no algorithm for {} [{}, {}] x [{}, {}] ({} matrices){}",
                   to_string(type_), m, k, k, n, c.batch,
                   transpose_a_ || transpose_b_ ? " with transposes" : "");
        }
        run_plan(ctx, s.dev, s.stream, c, *plan, pa, pb, pd);
      }
    }
    launch_epilogue(ctx, s.stream, out, bias, residual.defined() ? residual.raw_data() : nullptr,
                    rows, n, act_);
  }

 private:
  void launch_epilogue(kernel_context& ctx, cudaStream_t stream, tensor& out, const tensor& bias,
                       const void* residual, std::int64_t rows, std::int64_t n,
                       epilogue_activation act) const {
    if (!bias.defined() && residual == nullptr && act == epilogue_activation::none) return;
    const cudaError_t e = kernels::matmul_epilogue(
        out.raw_data(), bias.defined() ? bias.raw_data() : nullptr, residual, rows, n,
        epilogue_type_of(type_), act, clip_min_, clip_max_, stream);
    if (e != cudaSuccess) ctx.fail("matmul epilogue kernel failed to launch: {}", describe(e));
    check_launch(ctx, "matmul_epilogue");
  }

  std::shared_ptr<const gemm_plan> plan_for(const gemm_config& c, cuda_device& dev) {
    const auto key = c.key();
    {
      const std::lock_guard lock(mutex_);
      if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    auto plan = make_plan(c, dev);  // outside the lock: the heuristic takes a while
    const std::lock_guard lock(mutex_);
    return plans_.emplace(key, std::move(plan)).first->second;
  }

  bool transpose_a_;
  bool transpose_b_;
  dtype type_;
  bool has_bias_ = false;
  bool has_residual_ = false;
  epilogue_activation act_ = epilogue_activation::none;
  double clip_min_ = 0;  // activation clip's bounds
  double clip_max_ = 0;
  std::mutex mutex_;
  std::map<std::vector<std::int64_t>, std::shared_ptr<const gemm_plan>> plans_;  // null: none
};

class matmul_kernel final : public lt_matmul_kernel {
 public:
  explicit matmul_kernel(const kernel_construction& c) : lt_matmul_kernel(c, false) {}
};

class fused_matmul_kernel final : public lt_matmul_kernel {
 public:
  explicit fused_matmul_kernel(const kernel_construction& c) : lt_matmul_kernel(c, true) {}
};

}  // namespace

void register_nn_matmul_kernels(kernel_registry& registry) {
  const auto floats = [] {
    return type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16});
  };
  registry.add(make_kernel_def<matmul_kernel>("matmul", device_type::cuda, floats(), "cublaslt"));
  registry.add(make_kernel_def<fused_matmul_kernel>("fused_matmul", device_type::cuda, floats(),
                                                    "cublaslt"));
}

}  // namespace loom::cuda
