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

// Note [optimizer vector access]: where every array of a launch has one storage type (the
// common case: float32 everywhere, or bfloat16/float16 parameters and gradients with float32
// moments), the update is compiled for those types and moves four elements per access: one
// 16-byte access for float32, one 8-byte access for 16-bit types. That needs each array's
// address and the chunk's start aligned to four elements; a chunk that is not falls back to
// one element per access, in the same kernel. The arithmetic is the same either way.
template <class T>
struct storage;
template <>
struct storage<float> {
  static constexpr optim_type type = optim_type::f32;
  using vec = float4;
  __device__ static void unpack(vec x, float out[4]) {
    out[0] = x.x;
    out[1] = x.y;
    out[2] = x.z;
    out[3] = x.w;
  }
  __device__ static vec pack(const float in[4]) { return make_float4(in[0], in[1], in[2], in[3]); }
};
// Four 16-bit values in one 8-byte access; S::widen and S::narrow convert one value.
template <class S>
struct storage16 {
  using vec = uint2;
  __device__ static void unpack(vec x, float out[4]) {
    out[0] = S::widen(x.x & 0xffffu);
    out[1] = S::widen(x.x >> 16);
    out[2] = S::widen(x.y & 0xffffu);
    out[3] = S::widen(x.y >> 16);
  }
  __device__ static vec pack(const float in[4]) {
    return make_uint2(S::narrow(in[0]) | (S::narrow(in[1]) << 16),
                      S::narrow(in[2]) | (S::narrow(in[3]) << 16));
  }
};
template <>
struct storage<__nv_bfloat16> : storage16<storage<__nv_bfloat16>> {
  static constexpr optim_type type = optim_type::bf16;
  __device__ static float widen(unsigned bits) { return __uint_as_float(bits << 16); }
  __device__ static unsigned narrow(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
template <>
struct storage<__half> : storage16<storage<__half>> {
  static constexpr optim_type type = optim_type::f16;
  __device__ static float widen(unsigned bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
  __device__ static unsigned narrow(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// Elements i .. i+3 (i a multiple of 4, the array aligned to four elements).
template <class T>
__device__ __forceinline__ void load4(const void* base, std::int64_t i, float out[4]) {
  using S = storage<T>;
  S::unpack(static_cast<const typename S::vec*>(base)[i / 4], out);
}
template <class T>
__device__ __forceinline__ void store4(void* base, std::int64_t i, const float in[4]) {
  using S = storage<T>;
  static_cast<typename S::vec*>(base)[i / 4] = S::pack(in);
}
template <class T>
__device__ __forceinline__ float load1(const void* base, std::int64_t i) {
  return load(base, storage<T>::type, i);
}
template <class T>
__device__ __forceinline__ void store1(void* base, std::int64_t i, float v) {
  store(base, storage<T>::type, i, v);
}

template <class T>
__device__ __forceinline__ bool aligned4(const void* p) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
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

// One element of an update: the gradient transform g = (g / scale) * clip, its square added
// to `acc` when `sum`, then the algorithm's step. Both update kernels call it.
template <optim_algorithm A>
__device__ __forceinline__ void update_element(float& w, float g, float& m, float& v, bool has_buf,
                                               bool first, bool sum, double& acc,
                                               const optim_step_state& c) {
  const float u = __fdiv_rn(g, c.scale);
  if (sum) acc += static_cast<double>(u) * static_cast<double>(u);
  const float gk = __fmul_rn(u, c.clip);
  if constexpr (A == optim_algorithm::sgd) {
    sgd_element(w, gk, m, has_buf, first, c);
  } else {
    adam_element(w, gk, m, v, c);
  }
}

// ---- reductions --------------------------------------------------------------------------

// The sum of `v` over the block, in thread 0 (a fixed tree: deterministic). Every thread of
// the block must call it.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[32];  // one per warp of a block of up to 1024 threads
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
        update_element<A>(w[k], g[k], m[k], v[k], has_buf, first, partial != nullptr, acc, c);
        if constexpr (A == optim_algorithm::sgd) {
          if (has_buf) store(s0, st, i, m[k]);
        } else {
          store(s0, st, i, m[k]);
          store(s1, st, i, v[k]);
        }
        if (master != nullptr) master[i] = w[k];
        store(param, pt, i, w[k]);
      }
    }
  }
  if (partial != nullptr) {
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[chunk_offset + blockIdx.x] = acc;
  }
}

// The update of a launch whose parameters and gradients all have storage type T and whose
// moments are float32 (Note [optimizer vector access]). The same arithmetic as update_kernel,
// element for element.
constexpr int typed_block_threads = 512;
constexpr int typed_vectors = 2;  // groups of four elements in flight per thread

template <optim_algorithm A, class T>
__global__ void __launch_bounds__(typed_block_threads)
    update_typed_kernel(const __grid_constant__ optim_tensor_list list,
                        const optim_step_state* state, double* partial,
                        std::int64_t chunk_offset) {
  if (state->skip != 0) return;
  const optim_step_state c = *state;
  const chunk_range r = chunk_of(list);
  void* const param = list.param[r.t];
  float* const master = list.master[r.t];
  const void* const grad = list.grad[r.t];
  float* const s0 = static_cast<float*>(list.state0[r.t]);
  float* const s1 = static_cast<float*>(list.state1[r.t]);
  const bool first = list.first[r.t] != 0;
  const bool has_buf = s0 != nullptr && c.momentum != 0.0f;  // as update_kernel
  const bool sum = partial != nullptr;
  double acc = 0.0;

  const bool vector = r.begin % 4 == 0 && aligned4<T>(param) && aligned4<T>(grad) &&
                      aligned4<float>(master) && aligned4<float>(s0) && aligned4<float>(s1);
  const std::int64_t vector_end = vector ? r.begin + (r.end - r.begin) / 4 * 4 : r.begin;
  const std::int64_t stride = 4 * static_cast<std::int64_t>(blockDim.x);
  for (std::int64_t base = r.begin + 4 * threadIdx.x; base < vector_end;
       base += typed_vectors * stride) {
    float w[typed_vectors][4], g[typed_vectors][4], m[typed_vectors][4], v[typed_vectors][4];
    // Loads first, for every group, so that their latencies overlap.
#pragma unroll
    for (int j = 0; j < typed_vectors; ++j) {
      const std::int64_t i = base + j * stride;
      if (i >= vector_end) break;
      if (master != nullptr) {
        load4<float>(master, i, w[j]);
      } else {
        load4<T>(param, i, w[j]);
      }
      load4<T>(grad, i, g[j]);
      if constexpr (A == optim_algorithm::sgd) {
        if (has_buf && !first) {
          load4<float>(s0, i, m[j]);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) m[j][k] = 0.0f;
        }
      } else {
        load4<float>(s0, i, m[j]);
        load4<float>(s1, i, v[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < typed_vectors; ++j) {
      const std::int64_t i = base + j * stride;
      if (i >= vector_end) break;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        update_element<A>(w[j][k], g[j][k], m[j][k], v[j][k], has_buf, first, sum, acc, c);
      }
      if constexpr (A == optim_algorithm::sgd) {
        if (has_buf) store4<float>(s0, i, m[j]);
      } else {
        store4<float>(s0, i, m[j]);
        store4<float>(s1, i, v[j]);
      }
      if (master != nullptr) store4<float>(master, i, w[j]);
      store4<T>(param, i, w[j]);
    }
  }
  // The rest of the chunk (all of it when it is not aligned), one element per access.
  for (std::int64_t i = vector_end + threadIdx.x; i < r.end; i += blockDim.x) {
    float w = master != nullptr ? master[i] : load1<T>(param, i);
    float m = 0.0f;
    float v = 0.0f;
    if constexpr (A == optim_algorithm::sgd) {
      if (has_buf && !first) m = s0[i];
    } else {
      m = s0[i];
      v = s1[i];
    }
    update_element<A>(w, load1<T>(grad, i), m, v, has_buf, first, sum, acc, c);
    if constexpr (A == optim_algorithm::sgd) {
      if (has_buf) s0[i] = m;
    } else {
      s0[i] = m;
      s1[i] = v;
    }
    if (master != nullptr) master[i] = w;
    store1<T>(param, i, w);
  }
  if (sum) {
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[chunk_offset + blockIdx.x] = acc;
  }
}

// sum_squares_kernel for a launch whose gradients all have storage type G.
template <class G>
__global__ void __launch_bounds__(typed_block_threads)
    sum_squares_typed_kernel(const __grid_constant__ optim_tensor_list list, double* partial,
                             std::int64_t chunk_offset, const optim_step_state* state) {
  const chunk_range r = chunk_of(list);
  const float scale = state->scale;
  const void* g = list.grad[r.t];
  double acc = 0.0;
  const std::int64_t vector_end =
      r.begin % 4 == 0 && aligned4<G>(g) ? r.begin + (r.end - r.begin) / 4 * 4 : r.begin;
  for (std::int64_t i = r.begin + 4 * threadIdx.x; i < vector_end; i += 4 * blockDim.x) {
    float x[4];
    load4<G>(g, i, x);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const double u = __fdiv_rn(x[k], scale);
      acc += u * u;
    }
  }
  for (std::int64_t i = vector_end + threadIdx.x; i < r.end; i += blockDim.x) {
    const double u = __fdiv_rn(load1<G>(g, i), scale);
    acc += u * u;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[chunk_offset + blockIdx.x] = acc;
}

__global__ void widen_kernel(const void* src, optim_type t, float* dst, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = load(src, t, i);
  }
}

// The storage types of a launch's tensors, when every tensor has the same ones.
struct launch_types {
  bool uniform = true;
  optim_type param = optim_type::f32;
  optim_type grad = optim_type::f32;
};

launch_types types_of(const optim_tensor_list& list) {
  launch_types t;
  const int tensors = list.chunk_tensor[list.chunks - 1] + 1;  // slots are used in order
  t.param = list.param_type[0];
  t.grad = list.grad_type[0];
  for (int k = 1; k < tensors; ++k) {
    t.uniform = t.uniform && list.param_type[k] == t.param && list.grad_type[k] == t.grad;
  }
  return t;
}

template <class T>
struct type_tag {
  using type = T;
};

// f(type_tag<T>{}) with T the CUDA type of `type`.
template <class F>
void with_storage(optim_type type, F&& f) {
  switch (type) {
    case optim_type::f16:
      f(type_tag<__half>{});
      return;
    case optim_type::bf16:
      f(type_tag<__nv_bfloat16>{});
      return;
    default:
      f(type_tag<float>{});
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
  const auto blocks = static_cast<unsigned>(list.chunks);
  const launch_types types = types_of(list);
  if (!types.uniform) {
    sum_squares_kernel<<<blocks, block_threads, 0, stream>>>(list, partial, chunk_offset, state);
  } else {
    with_storage(types.grad, [&](auto tag) {
      sum_squares_typed_kernel<typename decltype(tag)::type>
          <<<blocks, typed_block_threads, 0, stream>>>(list, partial, chunk_offset, state);
    });
  }
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
  const launch_types types = types_of(list);
  // adam and adamw differ only in their constants.
  const bool sgd = algo == optim_algorithm::sgd;
  if (!types.uniform || types.param != types.grad || list.state_type != optim_type::f32) {
    if (sgd) {
      update_kernel<optim_algorithm::sgd>
          <<<blocks, block_threads, 0, stream>>>(list, state, partial, chunk_offset);
    } else {
      update_kernel<optim_algorithm::adam>
          <<<blocks, block_threads, 0, stream>>>(list, state, partial, chunk_offset);
    }
  } else {
    with_storage(types.param, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (sgd) {
        update_typed_kernel<optim_algorithm::sgd, T>
            <<<blocks, typed_block_threads, 0, stream>>>(list, state, partial, chunk_offset);
      } else {
        update_typed_kernel<optim_algorithm::adam, T>
            <<<blocks, typed_block_threads, 0, stream>>>(list, state, partial, chunk_offset);
      }
    });
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
