// `loom bench cuda --only pool`: allocate+free through loom's GPU pool against
// cudaMalloc+cudaFree and cudaMallocAsync+cudaFreeAsync (the driver's own pool), measured in
// the same run on the same GPU. Target: the pool >= 1000x faster than cudaMalloc+cudaFree.
#pragma once

#include "cuda/kernel_bench.hpp"

namespace loom::bench {

/// Rows per size (256 B, 1 MiB, 64 MiB, and a mixed sequence): loom's time per
/// allocate+free pair beside the peer's, ratio = peer time / loom time. Without a GPU:
/// available = false and the reason.
gpu_bench_result run_pool_gpu_bench(const gpu_bench_options& options = {});

}  // namespace loom::bench
