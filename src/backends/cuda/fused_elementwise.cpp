// CUDA kernel of fused_elementwise (Note [fused element-wise semantics] in
// src/graph/ops/fused_ops.cpp): the expression printed as CUDA C++ (fused_codegen.hpp,
// Note [fused cuda kernel]), compiled by NVRTC (nvrtc_compiler.hpp, Note [nvrtc cache])
// once per (input layout, device architecture), and launched on the compute stream.
//
// The source depends on the expression, the element type, each input's kind (dense,
// scalar, strided, unused) and the collapsed rank of the strided index; sizes and strides
// are launch parameters. So a node compiles one kernel per layout its inputs ever take --
// usually one -- and nodes with the same expression share it through the process cache.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "fused_codegen.hpp"
#include "kernel/common/elementwise_checks.hpp"
#include "loom/graph/fused_expr.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "nvrtc_compiler.hpp"

namespace loom::cuda {
namespace {

constexpr const char* kernel_name = "loom_fused_elementwise";
constexpr unsigned threads_per_block = 256;
// Kernel parameters stay within the 4 KiB every device takes; a launch that would need
// more (dozens of strided inputs of high rank) reads dense copies of them instead.
constexpr std::size_t max_param_bytes = 4096;

// `x` viewed with shape `s` (which it broadcasts to): stride 0 along broadcast dims.
tensor broadcast_view(const tensor& x, const shape& s) {
  std::vector<std::int64_t> st(s.rank(), 0);
  const shape& xs = x.shape();
  for (std::size_t d = 0; d < xs.rank(); ++d) {
    if (xs[d] != 1) st[s.rank() - xs.rank() + d] = x.strides()[d];
  }
  return tensor::strided(x.buf(), x.type(), s, shape(st), x.offset());
}

class fused_elementwise_kernel final : public op_kernel {
 public:
  explicit fused_elementwise_kernel(const kernel_construction& c)
      : op_kernel(c), type_(c.attr<dtype>("T")), expr_(ew::fused_expr_of(c)) {}

  void compute(kernel_context& ctx) override;

 private:
  // The loaded kernel for `layout` on a device of compute capability `cc`, compiled on
  // first use (Note [nvrtc cache]).
  cudaKernel_t kernel_for(kernel_context& ctx, const cudaDeviceProp& p,
                          const fused_layout& layout) const;

  dtype type_;
  fused_expr expr_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, cudaKernel_t> kernels_;  // by "<cc>/<layout key>"
};

cudaKernel_t fused_elementwise_kernel::kernel_for(kernel_context& ctx, const cudaDeviceProp& p,
                                                  const fused_layout& layout) const {
  const std::string key = fmt::format("{}{}/{}", p.major, p.minor, layout_key(layout));
  const std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
  cudaKernel_t k = nullptr;
  try {
    const std::string arch = nvrtc_arch(p.major, p.minor);
    k = nvrtc_kernel(generate_cuda_source(expr_, layout, kernel_name), arch, kernel_name);
  } catch (const cuda_error& e) {
    ctx.fail("could not build the CUDA kernel of {}: {}", expr_.to_string(), e.what());
  }
  kernels_.emplace(key, k);
  return k;
}

void fused_elementwise_kernel::compute(kernel_context& ctx) {
  if (type_ != dtype::f32 && type_ != dtype::f64 && type_ != dtype::f16 && type_ != dtype::bf16) {
    ctx.fail("fused_elementwise does not take {}", to_string(type_));
  }
  const auto n_in = static_cast<std::size_t>(expr_.num_inputs);
  const std::size_t n_out = expr_.results.size();
  // The output shape: all the inputs broadcast.
  const shape s = ew::fused_shape_of(ctx, expr_);
  const std::int64_t count = s.num_elements();
  if (count == 0) {
    for (std::size_t j = 0; j < n_out; ++j) (void)ctx.allocate_output(j, s);
    return;
  }

  launch_scope scope(ctx);
  std::vector<const tensor*> ins(n_in);
  for (std::size_t i = 0; i < n_in; ++i) ins[i] = &ctx.input(i);
  fused_index ix = plan_fused_index(expr_, type_, ins, s);
  std::vector<tensor> copies;  // dense copies of strided inputs, when parameters overflow
  if (kernel_param_bytes(ix.layout, n_out) > max_param_bytes) {
    copies.reserve(n_in);
    for (std::size_t i = 0; i < n_in; ++i) {
      if (ix.layout.inputs[i] != fused_input_kind::strided) continue;
      copies.push_back(scope.dev.contiguous_copy(broadcast_view(*ins[i], s)));
      ins[i] = &copies.back();
    }
    ix = plan_fused_index(expr_, type_, ins, s);
  }

  // Outputs: in an input's buffer when the node alone holds it and it has the output's
  // shape (each thread reads element i of every input before it writes element i of any
  // output: Note [fused cuda kernel]); never in an input that is itself a result.
  std::vector<bool> input_taken(n_in, false);
  for (std::int32_t r : expr_.results) {
    if (static_cast<std::size_t>(r) < n_in) input_taken[static_cast<std::size_t>(r)] = true;
  }
  std::vector<void*> pointers;
  pointers.reserve(n_in + n_out);
  for (std::size_t i = 0; i < n_in; ++i) {
    if (ix.layout.inputs[i] != fused_input_kind::unused) pointers.push_back(ins[i]->raw_data());
  }
  for (std::size_t j = 0; j < n_out; ++j) {
    tensor* out = nullptr;
    for (std::size_t i = 0; i < n_in && out == nullptr; ++i) {
      if (input_taken[i] || ins[i] != &ctx.input(i) || ctx.input(i).shape() != s) continue;
      out = ctx.forward_input(i, j, s);
      if (out != nullptr) input_taken[i] = true;
    }
    if (out == nullptr) out = &ctx.allocate_output(j, s);
    pointers.push_back(out->raw_data());
  }

  // The index parameter: sizes, then each strided input's strides (int64, row-major).
  std::vector<std::int64_t> index(ix.sizes);
  for (const auto& st : ix.strides) index.insert(index.end(), st.begin(), st.end());

  std::vector<void*> args;
  args.reserve(pointers.size() + 2);
  long long n = count;
  args.push_back(&n);
  for (void*& p : pointers) args.push_back(&p);
  if (ix.layout.rank > 0) args.push_back(index.data());

  const cudaDeviceProp& props = scope.dev.properties();
  const cudaKernel_t kernel = kernel_for(ctx, props, ix.layout);
  const std::int64_t blocks_needed = (count + threads_per_block - 1) / threads_per_block;
  const std::int64_t max_blocks =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(props.multiProcessorCount) * 8);
  const dim3 grid(static_cast<unsigned>(std::min(blocks_needed, max_blocks)));
  const dim3 block(threads_per_block);
  const cudaError_t status = cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block,
                                              args.data(), 0, scope.stream);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the next launch
    ctx.fail("launching the fused kernel failed: {}", describe(status));
  }
  check_launch(ctx, "fused_elementwise");
}

}  // namespace

void register_fused_kernels(kernel_registry& r) {
  r.add(make_kernel_def<fused_elementwise_kernel>(
      "fused_elementwise", device_type::cuda,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "cuda"));
}

}  // namespace loom::cuda
