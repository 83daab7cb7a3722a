#include "cuda/kernel_bench.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_stats.hpp"
#include "loom/cuda/info.hpp"

// The measurements need the CUDA headers and the backend's private device header; a build
// without them reports the benchmarks as unavailable.
#if __has_include(<cublasLt.h>) && __has_include("backends/cuda/cuda_device.hpp")
#define LOOM_GPU_BENCH 1
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>

#include "backends/cuda/cuda_check.hpp"
#include "backends/cuda/cuda_device.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#endif

namespace loom::bench {
namespace {

#ifdef LOOM_GPU_BENCH

// Values in [-1, 1) from an LCG: cheap for hundreds of millions of elements.
tensor random_host(dtype t, const shape& s, std::uint32_t seed) {
  tensor out = memory::host_tensor(t, s);
  std::uint32_t x = seed * 2654435761u + 1u;
  const std::int64_t n = out.num_elements();
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if (t == dtype::bf16) {
      out.data<bfloat16>()[i] = bfloat16(v);
    } else {
      out.data<float>()[i] = v;
    }
  }
  return out;
}

// Times `batch` calls of f() on `stream` with CUDA events, `reps` times (after one warm-up
// batch); returns the median milliseconds of one call.
template <class F>
double time_ms(cudaStream_t stream, int batch, int reps, F&& f) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreate(&start));
  LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < batch; ++i) f();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    LOOM_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < batch; ++i) f();
    LOOM_CUDA_CHECK(cudaEventRecord(stop, stream));
    LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(static_cast<double>(ms) / batch);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return median(times);
}

// ---- the cuBLASLt peer --------------------------------------------------------------------

// C[m, n] = A[m, k] B[k, n] (row-major, as loom's kernel computes it: column-major C^T =
// B^T A^T) with an optional RELU_BIAS epilogue, planned once with the heuristic.
class lt_peer {
 public:
  lt_peer(cuda::cuda_device& dev, dtype t, std::int64_t m, std::int64_t n, std::int64_t k,
          bool bias_relu)
      : dev_(dev) {
    const cudaDataType_t dt = t == dtype::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (bias_relu) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
      LOOM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, dt, static_cast<std::uint64_t>(n),
                                                 static_cast<std::uint64_t>(k), n));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, dt, static_cast<std::uint64_t>(k),
                                                 static_cast<std::uint64_t>(m), k));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, dt, static_cast<std::uint64_t>(n),
                                                 static_cast<std::uint64_t>(m), n));
    cublasLtMatmulPreference_t pref = nullptr;
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = dev.lt_workspace_bytes();
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // The bias pointer is not needed to choose; set it before each call.
    LOOM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(dev.cublas_lt(), desc_, a_, b_, c_, c_, pref,
                                                     1, &result, &found));
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw error("cuBLASLt found no algorithm for the peer's matmul");
    algo_ = result.algo;
  }
  ~lt_peer() {
    (void)cublasLtMatrixLayoutDestroy(a_);
    (void)cublasLtMatrixLayoutDestroy(b_);
    (void)cublasLtMatrixLayoutDestroy(c_);
    (void)cublasLtMatmulDescDestroy(desc_);
  }
  lt_peer(const lt_peer&) = delete;
  lt_peer& operator=(const lt_peer&) = delete;

  void run(const void* a, const void* b, const void* bias, void* c, cudaStream_t stream) {
    if (bias != nullptr) {
      LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof(bias)));
    }
    const float alpha = 1.0f;
    const float beta = 0.0f;
    LOOM_CUBLAS_CHECK(cublasLtMatmul(dev_.cublas_lt(), desc_, &alpha, b, a_, a, b_, &beta, c, c_, c,
                                     c_, &algo_, dev_.lt_workspace(), dev_.lt_workspace_bytes(),
                                     stream));
  }

 private:
  cuda::cuda_device& dev_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

struct matmul_case {
  std::string name;
  dtype type;
  std::int64_t m, n, k;
  bool bias_relu;
};

gpu_bench_row run_matmul_case(const matmul_case& c, const gpu_bench_options& o) {
  graph g;
  graph_builder b(g);
  auto a = ops::variable(b, "a", random_host(c.type, {c.m, c.k}, 1));
  auto w = ops::variable(b, "w", random_host(c.type, {c.k, c.n}, 2));
  if (c.bias_relu) {
    ops::epilogue e;
    e.bias = ops::variable(b, "bias", random_host(c.type, {c.n}, 3));
    e.activation = "relu";
    (void)ops::fused_matmul(a, w, e, false, false, {.name = "y", .device = "cuda:0"});
  } else {
    (void)ops::matmul(a, w, false, false, {.name = "y", .device = "cuda:0"});
  }
  session s(std::move(g));
  auto& dev = dynamic_cast<cuda::cuda_device&>(s.find_device("cuda:0"));
  const cudaStream_t stream = dev.compute_stream();
  s.run({}, {}, {"y"});  // places the variables on the GPU
  const int batch = o.quick ? 3 : 20;
  gpu_bench_row row;
  row.name = c.name;
  row.peer = "cublasLtMatmul";
  row.loom_ms = time_ms(stream, batch, o.repetitions, [&] { s.run({}, {}, {"y"}); });

  const tensor& av = s.variables().find("a")->value;
  const tensor& wv = s.variables().find("w")->value;
  const void* bias = c.bias_relu ? s.variables().find("bias")->value.raw_data() : nullptr;
  const tensor out = memory::allocate_tensor(dev.allocator(), dev.id(), c.type, {c.m, c.n});
  lt_peer peer(dev, c.type, c.m, c.n, c.k, c.bias_relu);
  row.peer_ms = time_ms(stream, batch, o.repetitions, [&] {
    peer.run(av.raw_data(), wv.raw_data(), bias, out.raw_data(), stream);
  });
  const double flops =
      2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  row.rate_unit = "TFLOP/s";
  row.loom_rate = flops / (row.loom_ms * 1e-3) / 1e12;
  row.peer_rate = flops / (row.peer_ms * 1e-3) / 1e12;
  row.ratio = row.loom_rate / row.peer_rate;
  row.target = 0.95;
  dev.sync();
  return row;
}

struct fused_adam_case {
  int tensors;
  std::int64_t per;  // elements per tensor
  dtype param_type;  // f32, or bf16 with f32 moments (no master copy, as torch keeps none)
  bool check_finite;
};

gpu_bench_row run_fused_adam_case(const fused_adam_case& c, const gpu_bench_options& o) {
  graph g;
  graph_builder b(g);
  std::vector<output> params, grads;
  for (int k = 0; k < c.tensors; ++k) {
    const auto seed = static_cast<std::uint32_t>(k);
    params.push_back(
        ops::variable(b, fmt::format("p{}", k), random_host(c.param_type, {c.per}, seed)));
    // Gradients as variables: on the GPU once, read in place every step.
    grads.push_back(
        ops::variable(b, fmt::format("g{}", k), random_host(c.param_type, {c.per}, 1000u + seed)));
  }
  auto lr = ops::scalar(b, 1e-4);
  auto step = ops::scalar(b, 1.0, dtype::i64);
  auto scale = ops::scalar(b, 1.0);
  ops::adam_options adam;
  adam.master_weights = false;
  ops::fused_options fused;
  fused.check_finite = c.check_finite;
  (void)ops::fused_adam(params, grads, lr, step, scale, adam, fused,
                        {.name = "update", .device = "cuda:0"});
  session s(std::move(g));
  auto& dev = dynamic_cast<cuda::cuda_device&>(s.find_device("cuda:0"));
  const cudaStream_t stream = dev.compute_stream();
  s.run({}, {}, {"update"});  // creates the moments
  const int batch = o.quick ? 3 : 10;
  gpu_bench_row row;
  row.name = fmt::format("fused_adam {} x {} {}{}", c.tensors, c.per, to_string(c.param_type),
                         c.check_finite ? " +finite check" : "");
  row.peer = "cudaMemcpyAsync D2D";
  row.params = {{"tensors", c.tensors},
                {"elements", c.per},
                {"param_dtype", to_string(c.param_type)},
                {"check_finite", c.check_finite}};
  row.loom_ms = time_ms(stream, batch, o.repetitions, [&] { s.run({}, {}, {"update"}); });
  // The bytes the step must move: read p, g, m, v and write p, m, v (f32 moments); with the
  // inf/NaN check, the gradients once more before anything is written (a step that finds
  // one must change nothing). The peer copies half as many bytes: a copy reads and writes
  // each.
  const double param_bytes = static_cast<double>(size_of(c.param_type));
  const double element_bytes = 3.0 * param_bytes + 16.0 + (c.check_finite ? param_bytes : 0.0);
  const double bytes = element_bytes * static_cast<double>(c.per) * c.tensors;
  const auto copy_bytes = static_cast<std::int64_t>(bytes / 2);
  const tensor from = memory::allocate_tensor(dev.allocator(), dev.id(), dtype::u8, {copy_bytes});
  const tensor to = memory::allocate_tensor(dev.allocator(), dev.id(), dtype::u8, {copy_bytes});
  row.peer_ms = time_ms(stream, batch, o.repetitions, [&] {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(to.raw_data(), from.raw_data(),
                                    static_cast<std::size_t>(copy_bytes), cudaMemcpyDeviceToDevice,
                                    stream));
  });
  row.rate_unit = "GB/s";
  row.loom_rate = bytes / (row.loom_ms * 1e-3) / 1e9;
  row.peer_rate = bytes / (row.peer_ms * 1e-3) / 1e9;
  row.ratio = row.loom_rate / row.peer_rate;
  // Bandwidth is the target where there are bytes enough to fill the GPU; small cases are
  // launch-bound and compared with PyTorch instead (python/bench/cuda_vs_torch.py).
  row.target = static_cast<double>(c.per) * c.tensors >= (1 << 24) ? 0.80 : 0.0;
  dev.sync();
  return row;
}

#endif  // LOOM_GPU_BENCH

// Whether the benchmarks can run here; fills `r` with the reason when not.
bool prepare(gpu_bench_result& r, const gpu_bench_options& o) {
  r.repetitions = o.repetitions;
#ifndef LOOM_GPU_BENCH
  r.available = false;
  r.reason = cuda::is_built() ? "loom_bench was built without the CUDA headers"
                              : "loom was built without CUDA";
  return false;
#else
  if (cuda::device_count() == 0) {
    r.available = false;
    r.reason = cuda::availability();
    return false;
  }
  r.available = true;
  r.device = cuda::describe();
  return true;
#endif
}

}  // namespace

gpu_bench_result run_matmul_gpu_bench(const gpu_bench_options& options) {
  gpu_bench_result r;
  if (!prepare(r, options)) return r;
#ifdef LOOM_GPU_BENCH
  const std::int64_t big = options.quick ? 1024 : 4096;
  const std::int64_t rows = options.quick ? 256 : 1024;
  const std::vector<matmul_case> cases = {
      {fmt::format("matmul {0}x{0}x{0} f32", big), dtype::f32, big, big, big, false},
      {fmt::format("matmul {0}x{0}x{0} bf16", big), dtype::bf16, big, big, big, false},
      {fmt::format("fused_matmul {}x{}x{} f32 bias+relu", rows, big, big), dtype::f32, rows, big,
       big, true},
      {fmt::format("fused_matmul {}x{}x{} bf16 bias+relu", rows, big, big), dtype::bf16, rows, big,
       big, true},
  };
  for (const auto& c : cases) r.rows.push_back(run_matmul_case(c, options));
#endif
  return r;
}

gpu_bench_result run_fused_adam_gpu_bench(const gpu_bench_options& options) {
  gpu_bench_result r;
  if (!prepare(r, options)) return r;
#ifdef LOOM_GPU_BENCH
  const std::int64_t big =
      options.quick ? (std::int64_t{32} << 20) / 200 : (std::int64_t{256} << 20) / 200;
  const std::vector<fused_adam_case> cases = {
      {200, 4096, dtype::f32, false},  {200, 4096, dtype::bf16, false},
      {8, 1 << 20, dtype::f32, false}, {8, 1 << 20, dtype::bf16, false},
      {200, big, dtype::f32, false},   {200, big, dtype::f32, true},
  };
  for (const auto& c : cases) r.rows.push_back(run_fused_adam_case(c, options));
#endif
  return r;
}

nlohmann::json to_json(const gpu_bench_result& r) {
  nlohmann::json j;
  j["available"] = r.available;
  if (!r.available) j["reason"] = r.reason;
  j["device"] = r.device;
  j["repetitions"] = r.repetitions;
  j["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows) {
    j["rows"].push_back({{"name", row.name},
                         {"peer", row.peer},
                         {"loom_ms", row.loom_ms},
                         {"peer_ms", row.peer_ms},
                         {"loom_rate", row.loom_rate},
                         {"peer_rate", row.peer_rate},
                         {"rate_unit", row.rate_unit},
                         {"ratio", row.ratio},
                         {"target", row.target},
                         {"met", row.ratio >= row.target},
                         {"params", row.params}});
  }
  return j;
}

std::string to_text(const gpu_bench_result& r) {
  if (!r.available) return fmt::format("  (not run: {})\n", r.reason);
  std::string out =
      fmt::format("  {} (medians of {} batches, CUDA events)\n", r.device, r.repetitions);
  out += fmt::format("  {:<44} {:>10} {:>10} {:>12} {:>12} {:>7} {:>7}\n", "case", "loom ms",
                     "peer ms", "loom", "peer", "ratio", "target");
  for (const auto& row : r.rows) {
    out += fmt::format("  {:<44} {:>10.3f} {:>10.3f} {:>12} {:>12} {:>7.3f} {:>7.2f}{}\n", row.name,
                       row.loom_ms, row.peer_ms,
                       fmt::format("{:.1f} {}", row.loom_rate, row.rate_unit),
                       fmt::format("{:.1f} {}", row.peer_rate, row.rate_unit), row.ratio,
                       row.target, row.ratio >= row.target ? "" : "  (below target)");
    out += fmt::format("  {:<44} peer: {}\n", "", row.peer);
  }
  return out;
}

}  // namespace loom::bench
