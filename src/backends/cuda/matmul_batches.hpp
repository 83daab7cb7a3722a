// How the CUDA matmul kernels cut a batched product into cublasLtMatmul calls (Note [cuda
// matmul layout] in nn_matmul.cpp). Host-only, so tests check it without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/shape.hpp"

namespace loom::cuda {

/// One cublasLtMatmul call of a batched product: element offsets of its first matrices in
/// the dense operands a and b and in the output, its matrix count, and the element strides
/// between a's and b's matrices (0: broadcast). The output's stride is always M x N.
struct gemm_call {
  std::int64_t a_offset = 0, b_offset = 0, c_offset = 0;
  std::int64_t count = 1;
  std::int64_t a_stride = 0, b_stride = 0;

  friend bool operator==(const gemm_call&, const gemm_call&) = default;
};

/// The calls for dense operands of shapes `a` and `b` (rank >= 2, batch dimensions
/// broadcast NumPy-style, right-aligned) and output shape `out`; `mn` = M x N. One call when
/// every operand's matrices sit at (batch index) x (one stride); else one call per run of
/// the output's last batch dimension. Calls hold at most INT32_MAX matrices.
std::vector<gemm_call> plan_gemm_calls(const shape& a, const shape& b, const shape& out,
                                       std::int64_t mn);

}  // namespace loom::cuda
