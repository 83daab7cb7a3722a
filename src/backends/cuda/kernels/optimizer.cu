// The optimizers' device code (optimizer.cuh).
//
// The element math is optimizer_math.hpp's (Note [optimizer element math]), operation for
// operation, written with the explicitly rounded intrinsics (__fadd_rn, __fmul_rn, ...)
// because nvcc would otherwise contract a*b + c into one FMA and round once instead of
// twice: with them every step rounds as the CPU's does, so for the same constants and
// gradient transform a GPU step gives the CPU's bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "optimizer.cuh"

namespace loom::cuda::kernels {
namespace {

constexpr int block_threads = 256;
constexpr int ilp = 4;  // elements in flight per thread

// ---- loads and stores ------------------------------------------------------------------

__device__ __forceinline__ float load(const void* base, optim_type t, std::int64_t i) {
  switch (t) {
    case optim_type::f16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case optim_type::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store(void* base, optim_type t, std::int64_t i, float v) {
  switch (t) {
    case optim_type::f16:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      return;
    case optim_type::bf16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      return;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

// ---- the element math (optimizer_math.hpp) -----------------------------------------------

__device__ __forceinline__ void adam_element(float& p, float g, float& m, float& v,
                                             const optim_step_state& c) {
  p = __fmul_rn(p, c.decay);
  if (c.l2 != 0.0f) g = __fadd_rn(g, __fmul_rn(c.l2, p));
  if (c.lerp_small) {
    m = __fadd_rn(m, __fmul_rn(c.lerp_weight, __fsub_rn(g, m)));
  } else {
    m = __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), __fsub_rn(1.0f, c.lerp_weight)));
  }
  v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  p = __fsub_rn(p, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

__device__ __forceinline__ void sgd_element(float& p, float g, float& buf, bool has_buf, bool first,
                                            const optim_step_state& c) {
  if (c.weight_decay != 0.0f) g = __fadd_rn(g, __fmul_rn(c.weight_decay, p));
  if (has_buf) {
    if (first) {
      buf = g;
    } else {
      buf = __fadd_rn(__fmul_rn(buf, c.momentum), __fmul_rn(c.one_minus_dampening, g));
    }
    g = c.nesterov ? __fadd_rn(g, __fmul_rn(c.momentum, buf)) : buf;
  }
  p = __fsub_rn(p, __fmul_rn(c.lr, g));
}

// ---- reductions --------------------------------------------------------------------------

// The sum of `v` over the block, in thread 0 (a fixed tree: deterministic). Every thread of
// the block must call it.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[block_threads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x + 31) / 32;
    v = lane < warps ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// ---- kernels -----------------------------------------------------------------------------

__global__ void prologue_kernel(const optim_hyper h, const optim_scalars s, optim_step_state* out) {
  optim_step_state c{};
  const float lr_f = s.lr != nullptr ? *s.lr : s.lr_value;
  const float scale = s.grad_scale != nullptr ? *s.grad_scale : s.grad_scale_value;
  const std::int64_t step = s.step != nullptr ? *s.step : s.step_value;
  const double lr = lr_f;
  bool bad = !(lr >= 0.0) || !isfinite(lr);
  bad = bad || !(scale > 0.0f) || !isfinite(scale);
  if (h.algo != optim_algorithm::sgd) bad = bad || step < 1;
  c.scale = scale;
  c.clip = 1.0f;
  // make_adam_constants and make_sgd_constants (optimizer_math.hpp), in the same order.
  if (h.algo == optim_algorithm::sgd) {
    c.lr = static_cast<float>(lr);
    c.weight_decay = static_cast<float>(h.weight_decay);
    c.momentum = static_cast<float>(h.momentum);
    c.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
    c.nesterov = h.nesterov;
  } else {
    const bool decoupled = h.algo == optim_algorithm::adamw;
    const double t = static_cast<double>(step < 1 ? 1 : step);
    const double bc1 = 1.0 - pow(h.beta1, t);
    const double bc2 = 1.0 - pow(h.beta2, t);
    c.l2 = decoupled ? 0.0f : static_cast<float>(h.weight_decay);
    c.decay = decoupled ? static_cast<float>(1.0 - lr * h.weight_decay) : 1.0f;
    c.lerp_weight = static_cast<float>(1.0 - h.beta1);
    c.lerp_small = fabsf(c.lerp_weight) < 0.5f;
    c.beta2 = static_cast<float>(h.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    c.bc2_sqrt = static_cast<float>(sqrt(bc2));
    c.eps = static_cast<float>(h.eps);
    c.step_size = static_cast<float>(lr / bc1);
  }
  c.bad_input = bad ? 1 : 0;
  c.skip = c.bad_input;
  *out = c;
}

// The chunk of this block: [begin, end) of tensor t.
struct chunk_range {
  int t;
  std::int64_t begin, end;
};

__device__ __forceinline__ chunk_range chunk_of(const optim_tensor_list& list) {
  const int c = static_cast<int>(blockIdx.x);
  chunk_range r;
  r.t = list.chunk_tensor[c];
  r.begin = list.chunk_begin[c];
  r.end = min(r.begin + optim_chunk_elements, list.size[r.t]);
  return r;
}

__global__ void __launch_bounds__(block_threads)
    sum_squares_kernel(const __grid_constant__ optim_tensor_list list, double* partial,
                       std::int64_t chunk_offset, const optim_step_state* state) {
  const chunk_range r = chunk_of(list);
  const float scale = state->scale;
  const void* g = list.grad[r.t];
  const optim_type gt = list.grad_type[r.t];
  double acc = 0.0;
  for (std::int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) {
    const double u = __fdiv_rn(load(g, gt, i), scale);
    acc += u * u;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[chunk_offset + blockIdx.x] = acc;
}

__global__ void __launch_bounds__(block_threads)
    finalize_kernel(const double* partial, std::int64_t chunks, const optim_hyper h,
                    optim_step_state* state, float* norm_out, bool* found_out) {
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < chunks; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x != 0) return;
  const bool bad = state->bad_input != 0;
  const float norm = bad ? __int_as_float(0x7fc00000) : static_cast<float>(sqrt(acc));
  const bool found = bad || !isfinite(acc);
  if (h.max_grad_norm > 0.0) {
    // clip_grad_norm_'s coefficient, as the CPU kernel computes it (std::min keeps a NaN).
    const float a = __fdiv_rn(static_cast<float>(h.max_grad_norm), __fadd_rn(norm, 1e-6f));
    state->clip = 1.0f < a ? 1.0f : a;
  }
  state->skip = (bad || (found && h.check_finite != 0)) ? 1 : 0;
  if (norm_out != nullptr) *norm_out = norm;
  if (found_out != nullptr) *found_out = found;
}

template <optim_algorithm A>
__global__ void __launch_bounds__(block_threads)
    update_kernel(const __grid_constant__ optim_tensor_list list, const optim_step_state* state,
                  double* partial, std::int64_t chunk_offset) {
  if (state->skip != 0) return;  // the same for every thread of the grid
  const optim_step_state c = *state;
  const chunk_range r = chunk_of(list);
  void* const param = list.param[r.t];
  float* const master = list.master[r.t];
  const void* const grad = list.grad[r.t];
  void* const s0 = list.state0[r.t];
  void* const s1 = list.state1[r.t];
  const optim_type pt = list.param_type[r.t];
  const optim_type gt = list.grad_type[r.t];
  const optim_type st = list.state_type;
  const bool first = list.first[r.t] != 0;
  // As sgd_update: the buffer takes part only for a momentum that is nonzero in float.
  const bool has_buf = s0 != nullptr && c.momentum != 0.0f;
  const std::int64_t stride = blockDim.x;
  double acc = 0.0;
  for (std::int64_t base = r.begin + threadIdx.x; base < r.end; base += ilp * stride) {
    float w[ilp], g[ilp], m[ilp], v[ilp];
    // Loads first, for all ilp elements, so that their latencies overlap.
#pragma unroll
    for (int k = 0; k < ilp; ++k) {
      const std::int64_t i = base + k * stride;
      if (i < r.end) {
        w[k] = master != nullptr ? master[i] : load(param, pt, i);
        g[k] = load(grad, gt, i);
        if constexpr (A == optim_algorithm::sgd) {
          m[k] = has_buf && !first ? load(s0, st, i) : 0.0f;
        } else {
          m[k] = load(s0, st, i);
          v[k] = load(s1, st, i);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < ilp; ++k) {
      const std::int64_t i = base + k * stride;
      if (i < r.end) {
        const float u = __fdiv_rn(g[k], c.scale);
        if (partial != nullptr) acc += static_cast<double>(u) * static_cast<double>(u);
        const float gk = __fmul_rn(u, c.clip);
        if constexpr (A == optim_algorithm::sgd) {
          sgd_element(w[k], gk, m[k], has_buf, first, c);
          if (has_buf) store(s0, st, i, m[k]);
        } else {
          adam_element(w[k], gk, m[k], v[k], c);
          store(s0, st, i, m[k]);
          store(s1, st, i, v[k]);
        }
        if (master != nullptr) {
          master[i] = w[k];
          store(param, pt, i, w[k]);
        } else {
          store(param, pt, i, w[k]);
        }
      }
    }
  }
  if (partial != nullptr) {
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[chunk_offset + blockIdx.x] = acc;
  }
}

__global__ void widen_kernel(const void* src, optim_type t, float* dst, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = load(src, t, i);
  }
}

}  // namespace

cudaError_t optim_prologue(const optim_hyper& hyper, const optim_scalars& scalars,
                           optim_step_state* state, cudaStream_t stream) {
  prologue_kernel<<<1, 1, 0, stream>>>(hyper, scalars, state);
  return cudaGetLastError();
}

cudaError_t optim_sum_squares(const optim_tensor_list& list, double* partial,
                              std::int64_t chunk_offset, const optim_step_state* state,
                              cudaStream_t stream) {
  if (list.chunks <= 0) return cudaSuccess;
  sum_squares_kernel<<<static_cast<unsigned>(list.chunks), block_threads, 0, stream>>>(
      list, partial, chunk_offset, state);
  return cudaGetLastError();
}

cudaError_t optim_finalize(const double* partial, std::int64_t chunks, const optim_hyper& hyper,
                           optim_step_state* state, float* norm, bool* found_inf,
                           cudaStream_t stream) {
  finalize_kernel<<<1, block_threads, 0, stream>>>(partial, chunks, hyper, state, norm, found_inf);
  return cudaGetLastError();
}

cudaError_t optim_update(optim_algorithm algo, const optim_tensor_list& list,
                         const optim_step_state* state, double* partial, std::int64_t chunk_offset,
                         cudaStream_t stream) {
  if (list.chunks <= 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(list.chunks);
  switch (algo) {
    case optim_algorithm::sgd:
      update_kernel<optim_algorithm::sgd>
          <<<blocks, block_threads, 0, stream>>>(list, state, partial, chunk_offset);
      break;
    default:  // adam and adamw differ only in their constants
      update_kernel<optim_algorithm::adam>
          <<<blocks, block_threads, 0, stream>>>(list, state, partial, chunk_offset);
      break;
  }
  return cudaGetLastError();
}

cudaError_t optim_widen(const void* src, optim_type type, float* dst, std::int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const std::int64_t blocks =
      std::min<std::int64_t>((n + block_threads - 1) / block_threads, 65536);
  widen_kernel<<<static_cast<unsigned>(blocks), block_threads, 0, stream>>>(src, type, dst, n);
  return cudaGetLastError();
}

}  // namespace loom::cuda::kernels
