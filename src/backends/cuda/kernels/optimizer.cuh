// The optimizers on the GPU (apply_* and fused_* of optimizer_kernels.cpp): the step's
// constants computed on the device from the lr/step/grad_scale tensors, the multi-tensor
// sum of squares with its reduction (grad_norm, found_inf, the clipping coefficient, the
// decision to skip), and the update. Everything is queued on one stream; nothing here waits
// for the device (Note [cuda optimizer steps] in optimizer_kernels.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda::kernels {

/// Storage types of parameters, gradients and moments (loom's f16/bf16 are bit-compatible
/// with __half and __nv_bfloat16), numbered as loom::dtype numbers them.
enum class optim_type : std::uint8_t { f32 = 0, f16 = 2, bf16 = 3 };

enum class optim_algorithm : int { sgd, adam, adamw };

/// The hyperparameters of a node (its attributes), as doubles; the per-step constants are
/// derived from them on the device exactly as make_adam_constants / make_sgd_constants do
/// on the CPU (in double, rounded to float once).
struct optim_hyper {
  optim_algorithm algo = optim_algorithm::adam;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0, dampening = 0.0;
  int nesterov = 0;
  double max_grad_norm = 0.0;  // 0: no clipping
  int check_finite = 0;        // skip the step when a gradient is inf or NaN
};

/// What the prologue and the reduction leave in device memory for the update kernels.
struct optim_step_state {
  // The constants (float, as optimizer_math.hpp rounds them).
  float l2, decay, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps, step_size;
  int lerp_small;
  float lr, weight_decay, momentum, one_minus_dampening;
  int nesterov;
  // The gradient transform g = (g / scale) * clip.
  float scale, clip;
  // 1 when lr, step or grad_scale was invalid (the step does nothing).
  int bad_input;
  // 1 when the update must not run (bad input, or found_inf with check_finite).
  int skip;
};

/// The scalar inputs: each read from device memory when its pointer is set, else the value.
struct optim_scalars {
  const float* lr = nullptr;
  float lr_value = 0.0f;
  const std::int64_t* step = nullptr;  // Adam only
  std::int64_t step_value = 1;
  const float* grad_scale = nullptr;  // fused only
  float grad_scale_value = 1.0f;
};

/// Tensors and chunks of one launch, passed by value as the kernel's argument (CUDA 12.1+
/// takes up to 32,764 bytes of arguments; this is about 16 KiB).
inline constexpr int optim_list_tensors = 64;
inline constexpr int optim_list_chunks = 1024;
/// Elements per chunk: loom's multi_tensor_chunk_elements, one chunk per block.
inline constexpr std::int64_t optim_chunk_elements = std::int64_t{1} << 16;

struct optim_tensor_list {
  void* param[optim_list_tensors];
  float* master[optim_list_tensors];  // nullptr: none
  const void* grad[optim_list_tensors];
  void* state0[optim_list_tensors];  // adam: m; sgd: momentum (or nullptr)
  void* state1[optim_list_tensors];  // adam: v
  std::int64_t size[optim_list_tensors];
  optim_type param_type[optim_list_tensors];
  optim_type grad_type[optim_list_tensors];
  std::uint8_t first[optim_list_tensors];        // SGD: the momentum buffer is new this step
  std::int32_t chunk_tensor[optim_list_chunks];  // index into the arrays above
  std::int64_t chunk_begin[optim_list_chunks];
  std::int32_t chunks = 0;
  optim_type state_type = optim_type::f32;
};

/// One thread computes the step's constants into `state` (validating the scalars: lr finite
/// and >= 0, step >= 1, grad_scale finite and > 0; otherwise bad_input and skip are set).
cudaError_t optim_prologue(const optim_hyper& hyper, const optim_scalars& scalars,
                           optim_step_state* state, cudaStream_t stream);

/// partial[chunk_offset + c] = Σ (g / state->scale)² over chunk c of `list`, in double.
cudaError_t optim_sum_squares(const optim_tensor_list& list, double* partial,
                              std::int64_t chunk_offset, const optim_step_state* state,
                              cudaStream_t stream);

/// Adds partial[0 .. chunks) in a fixed order: grad_norm = sqrt(total) as float, found_inf =
/// total not finite (or bad input); sets state->clip (max_grad_norm > 0) and state->skip
/// (bad input, or found_inf with check_finite). `norm` and `found_inf` may be null.
cudaError_t optim_finalize(const double* partial, std::int64_t chunks, const optim_hyper& hyper,
                           optim_step_state* state, float* norm, bool* found_inf,
                           cudaStream_t stream);

/// The update of every chunk of `list` (nothing when state->skip). With `partial` set, each
/// chunk's sum of squares is also written to partial[chunk_offset + c] (the one-pass mode).
cudaError_t optim_update(optim_algorithm algo, const optim_tensor_list& list,
                         const optim_step_state* state, double* partial, std::int64_t chunk_offset,
                         cudaStream_t stream);

/// dst[i] = float(src[i]) for a parameter's first master copy.
cudaError_t optim_widen(const void* src, optim_type type, float* dst, std::int64_t n,
                        cudaStream_t stream);

}  // namespace loom::cuda::kernels
