#include "cuda/pool_gpu_bench.hpp"

#include <fmt/format.h>

#include <chrono>
#include <vector>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cuda_device.hpp"
#include "bench_stats.hpp"
#include "loom/cuda/info.hpp"

namespace loom::bench {
namespace {

using clock_type = std::chrono::steady_clock;

// Nanoseconds per allocate+free pair of `sizes` (cycled) through alloc/free, `pairs` pairs
// per repetition, median over repetitions.
template <class Alloc, class Free>
double ns_per_pair(const std::vector<std::size_t>& sizes, int pairs, int reps, Alloc&& alloc,
                   Free&& free_fn) {
  std::vector<double> samples;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    const auto start = clock_type::now();
    for (int i = 0; i < pairs; ++i) {
      const std::size_t n = sizes[static_cast<std::size_t>(i) % sizes.size()];
      void* p = alloc(n);
      free_fn(p, n);
    }
    const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - start).count();
    if (r > 0) samples.push_back(ns / pairs);
  }
  return median(samples);
}

}  // namespace

gpu_bench_result run_pool_gpu_bench(const gpu_bench_options& options) {
  gpu_bench_result out;
  out.repetitions = options.repetitions;
  if (cuda::device_count() == 0) {
    out.reason = cuda::availability();
    return out;
  }
  out.available = true;
  out.device = cuda::describe();
  cuda::cuda_device dev(0, cuda_options{});
  memory::memory_resource& pool = dev.allocator();
  const cudaStream_t s = dev.compute_stream();
  const cuda::device_guard guard(0);

  struct workload {
    std::string name;
    std::vector<std::size_t> sizes;
  };
  std::vector<workload> workloads = {
      {"256 B", {256}},
      {"1 MiB", {std::size_t{1} << 20}},
      {"64 MiB", {std::size_t{64} << 20}},
      {"mixed 256 B..16 MiB", {256, 4096, 65536, 1 << 20, 3 << 20, 16 << 20, 1024, 8 << 20}},
  };
  const int pairs_loom = options.quick ? 2000 : 20000;
  const int pairs_peer = options.quick ? 50 : 300;  // cudaMalloc+cudaFree: tens of us each
  for (const auto& w : workloads) {
    const double loom_ns = ns_per_pair(
        w.sizes, pairs_loom, options.repetitions,
        [&](std::size_t n) { return pool.allocate(n, 256, stream(s)); },
        [&](void* p, std::size_t n) { pool.deallocate(p, n, 256, stream(s)); });
    const double malloc_ns = ns_per_pair(
        w.sizes, pairs_peer, options.repetitions,
        [](std::size_t n) {
          void* p = nullptr;
          LOOM_CUDA_CHECK(cudaMalloc(&p, n));
          return p;
        },
        [](void* p, std::size_t) { LOOM_CUDA_CHECK(cudaFree(p)); });
    const double async_ns = ns_per_pair(
        w.sizes, pairs_loom, options.repetitions,
        [&](std::size_t n) {
          void* p = nullptr;
          LOOM_CUDA_CHECK(cudaMallocAsync(&p, n, s));
          return p;
        },
        [&](void* p, std::size_t) { LOOM_CUDA_CHECK(cudaFreeAsync(p, s)); });
    for (const auto& [peer, peer_ns, target] :
         {std::tuple{std::string("cudaMalloc+cudaFree"), malloc_ns, 1000.0},
          std::tuple{std::string("cudaMallocAsync+cudaFreeAsync"), async_ns, 0.0}}) {
      gpu_bench_row row;
      row.name = "pool allocate+free, " + w.name;
      row.peer = peer;
      row.loom_ms = loom_ns / 1e6;
      row.peer_ms = peer_ns / 1e6;
      row.loom_rate = 1e9 / loom_ns;  // pairs per second
      row.peer_rate = 1e9 / peer_ns;
      row.rate_unit = "pairs/s";
      row.ratio = peer_ns / loom_ns;
      row.target = target;
      out.rows.push_back(row);
    }
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(s));
  return out;
}

}  // namespace loom::bench
