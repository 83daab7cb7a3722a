// Host launchers of the CUDA layer_norm and layer_norm_grad kernels (layer_norm.cu), over raw
// device pointers; normalization_kernels.cpp maps tensors onto them.
//
// Note [cuda layer_norm]
// Both view x as [rows, n] and give each row a team (a warp for rows of up to 256 elements,
// eight rows per block; else a block of up to 1024 threads with the row cached in shared
// memory when it fits). The numerics are the CPU kernel's (Note [layer_norm row kernels] in
// src/backends/cpu/normalization_kernels.cpp), in float for f32/f16/bf16 and double for f64:
//  - forward: Σx gives a centre c (the mean rounded to the compute type), a second pass the
//    centred sums Σd and Σd² with d = x - c, and var = (Σd² - (Σd)²/n) / n (clamped at 0),
//    rstd = 1 / sqrt(var + eps) in double; y = ((x - c) r - delta r) g + b with
//    delta = Σd / n, and mean = c + delta;
//  - backward, dx: one pass gives Σ dy·g and Σ dy·g·xhat, a second writes
//    dx = dy·g·r - (x - mean)·k3 - k1 with k1 = r·mean(dy·g), k3 = r²·mean(dy·g·xhat);
//  - backward, dgamma = Σ_rows dy·xhat and dbeta = Σ_rows dy: a first kernel gives each
//    chunk of rows its partial sums (blocks of 32 columns x 8 thread rows, coalesced along
//    the columns), a second adds the chunks' partials in order, in double (Note [cuda
//    deterministic reductions]). The chunking depends on (rows, n) only.
// y may be x's buffer and dx dy's: each element is read before it is written, and the
// dgamma/dbeta partials (which read dy) are computed before dx is written.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "elementwise.cuh"  // elem_type

namespace loom::cuda::kernels {

/// Whether layer_norm and layer_norm_grad take t (f32, f64, f16, bf16).
bool layer_norm_supports(elem_type t);

/// y, mean[rows], rstd[rows] of x [rows, n] (rows > 0, n > 0) with gamma, beta [n], all of
/// type t and dense; y may be x. Queued on `stream`.
void launch_layer_norm(elem_type t, const void* x, const void* gamma, const void* beta, void* y,
                       void* mean, void* rstd, std::int64_t rows, std::int64_t n, double epsilon,
                       cudaStream_t stream);

/// Device bytes launch_layer_norm_grad needs as a temporary for [rows, n] of type t.
std::size_t layer_norm_grad_temp_bytes(elem_type t, std::int64_t rows, std::int64_t n);

/// dx [rows, n], dgamma [n], dbeta [n] from dy, x [rows, n], gamma [n], mean, rstd [rows]
/// (rows > 0, n > 0), all of type t and dense; dx may be dy. `temp` holds
/// layer_norm_grad_temp_bytes(t, rows, n) bytes. Queued on `stream`.
void launch_layer_norm_grad(elem_type t, const void* dy, const void* x, const void* gamma,
                            const void* mean, const void* rstd, void* dx, void* dgamma, void* dbeta,
                            void* temp, std::int64_t rows, std::int64_t n, cudaStream_t stream);

}  // namespace loom::cuda::kernels
