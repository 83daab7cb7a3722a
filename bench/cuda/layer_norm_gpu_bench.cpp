#include "cuda/layer_norm_gpu_bench.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_stats.hpp"
#include "loom/core/error.hpp"
#include "loom/cuda/info.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

#include <cuda_runtime.h>

// The launchers are plain C++ over device pointers (no loom headers behind them).
#include "../../src/backends/cuda/kernels/layer_norm.cuh"

namespace loom::bench {
namespace {

constexpr int warmup = 10;

std::vector<float> random_values(std::int64_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

tensor host_f32(const shape& s, const std::vector<float>& v) {
  tensor t = memory::host_tensor(dtype::f32, s);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw error(fmt::format("layer_norm GPU bench: {} failed: {}: {}", what, cudaGetErrorName(e),
                            cudaGetErrorString(e)));
  }
}

// Device memory and the stream and events of one measurement, released on every path.
struct gpu_state {
  std::vector<void*> blocks;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;

  gpu_state() = default;
  gpu_state(const gpu_state&) = delete;
  gpu_state& operator=(const gpu_state&) = delete;
  ~gpu_state() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    for (void* p : blocks) cudaFree(p);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  void* alloc(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    blocks.push_back(p);
    return p;
  }
  void* upload(const std::vector<float>& v) {
    void* p = alloc(v.size() * sizeof(float));
    check(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    return p;
  }
};

// Median milliseconds of `launch` on the state's stream, by CUDA events.
template <class F>
double time_events(gpu_state& g, int repetitions, F&& launch) {
  for (int i = 0; i < warmup; ++i) launch();
  check(cudaStreamSynchronize(g.stream), "warm-up");
  std::vector<double> ms;
  for (int i = 0; i < repetitions; ++i) {
    check(cudaEventRecord(g.start, g.stream), "cudaEventRecord");
    launch();
    check(cudaEventRecord(g.stop, g.stream), "cudaEventRecord");
    check(cudaEventSynchronize(g.stop), "cudaEventSynchronize");
    check(cudaGetLastError(), "a layer_norm kernel launch");
    float t = 0;
    check(cudaEventElapsedTime(&t, g.start, g.stop), "cudaEventElapsedTime");
    ms.push_back(static_cast<double>(t));
  }
  return median(std::move(ms));
}

void measure_kernels(layer_norm_gpu_result& r, const std::vector<float>& x,
                     const std::vector<float>& gamma, const std::vector<float>& beta,
                     const std::vector<float>& dy) {
  using cuda::kernels::elem_type;
  const std::int64_t rows = r.rows;
  const std::int64_t n = r.cols;
  const auto bytes = static_cast<std::size_t>(rows * n) * sizeof(float);
  gpu_state g;
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaEventCreate(&g.start), "cudaEventCreate");
  check(cudaEventCreate(&g.stop), "cudaEventCreate");
  void* dx_in = g.upload(x);
  void* dgam = g.upload(gamma);
  void* dbet = g.upload(beta);
  void* ddy = g.upload(dy);
  void* y = g.alloc(bytes);
  void* mean = g.alloc(static_cast<std::size_t>(rows) * sizeof(float));
  void* rstd = g.alloc(static_cast<std::size_t>(rows) * sizeof(float));
  void* dx = g.alloc(bytes);
  void* dgamma = g.alloc(static_cast<std::size_t>(n) * sizeof(float));
  void* dbeta = g.alloc(static_cast<std::size_t>(n) * sizeof(float));
  void* temp = g.alloc(cuda::kernels::layer_norm_grad_temp_bytes(elem_type::f32, rows, n));
  auto forward = [&] {
    cuda::kernels::launch_layer_norm(elem_type::f32, dx_in, dgam, dbet, y, mean, rstd, rows, n,
                                     1e-5, g.stream);
  };
  auto backward = [&] {
    cuda::kernels::launch_layer_norm_grad(elem_type::f32, ddy, dx_in, dgam, mean, rstd, dx, dgamma,
                                          dbeta, temp, rows, n, g.stream);
  };
  r.forward_ms = time_events(g, r.repetitions, forward);
  r.forward_backward_ms = time_events(g, r.repetitions, [&] {
    forward();
    backward();
  });
}

// Wall-clock median of `run` followed by cudaDeviceSynchronize.
template <class F>
double time_synced(int repetitions, F&& run) {
  for (int i = 0; i < warmup; ++i) run();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<double> ms;
  for (int i = 0; i < repetitions; ++i) {
    ms.push_back(1e3 * seconds_of([&] {
                   run();
                   check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
                 }));
  }
  return median(std::move(ms));
}

void measure_session(layer_norm_gpu_result& r, const std::vector<float>& x,
                     const std::vector<float>& gamma, const std::vector<float>& beta,
                     const std::vector<float>& dy) {
  const shape s{r.rows, r.cols};
  graph gr;
  graph_builder b(gr);
  {
    const auto guard = b.with_device("cuda:0");
    auto vx = ops::variable(b, "x", host_f32(s, x));
    auto vg = ops::variable(b, "gamma", host_f32({r.cols}, gamma));
    auto vb = ops::variable(b, "beta", host_f32({r.cols}, beta));
    auto vdy = ops::variable(b, "dy", host_f32(s, dy));
    auto ln = ops::layer_norm(vx, vg, vb, -1, 1e-5, {.name = "ln"});
    auto grads = gradients(ln.y, {vx, vg, vb}, vdy);
    ops::identity(grads[0], {.name = "dx"});
    ops::identity(grads[1], {.name = "dgamma"});
    ops::identity(grads[2], {.name = "dbeta"});
  }
  session sess(std::move(gr));
  const std::vector<std::string> fwd{"ln:0"};
  const std::vector<std::string> both{"ln:0", "dx", "dgamma", "dbeta"};
  r.session_forward_ms = time_synced(r.repetitions, [&] { (void)sess.run({}, fwd); });
  r.session_forward_backward_ms = time_synced(r.repetitions, [&] { (void)sess.run({}, both); });
}

}  // namespace

layer_norm_gpu_result run_layer_norm_gpu_bench(int repetitions) {
  layer_norm_gpu_result r;
  r.repetitions = repetitions < 1 ? 1 : repetitions;
  if (cuda::device_count() == 0) {
    r.reason = cuda::availability();
    return r;
  }
  r.available = true;
  r.device = cuda::describe();
  const auto x = random_values(r.rows * r.cols, 1, -2.0f, 3.0f);
  const auto gamma = random_values(r.cols, 2, 0.5f, 1.5f);
  const auto beta = random_values(r.cols, 3, -0.5f, 0.5f);
  const auto dy = random_values(r.rows * r.cols, 4, -1.0f, 1.0f);
  measure_kernels(r, x, gamma, beta, dy);
  try {
    measure_session(r, x, gamma, beta, dy);
  } catch (const std::exception& e) {
    r.session_forward_ms = 0;
    r.session_forward_backward_ms = 0;
    r.session_error = e.what();
  }
  return r;
}

nlohmann::json to_json(const layer_norm_gpu_result& r) {
  nlohmann::json j;
  j["available"] = r.available;
  if (!r.available) j["reason"] = r.reason;
  j["device"] = r.device;
  j["repetitions"] = r.repetitions;
  j["shape"] = {r.rows, r.cols};
  j["dtype"] = "float32";
  j["forward_ms"] = r.forward_ms;
  j["forward_backward_ms"] = r.forward_backward_ms;
  j["session_forward_ms"] = r.session_forward_ms;
  j["session_forward_backward_ms"] = r.session_forward_backward_ms;
  if (!r.session_error.empty()) j["session_error"] = r.session_error;
  return j;
}

std::string to_text(const layer_norm_gpu_result& r) {
  if (!r.available) return fmt::format("layer_norm on GPU: not measured ({})\n", r.reason);
  std::string s = fmt::format("layer_norm on {} [{}, {}] f32, median of {}\n", r.device, r.rows,
                              r.cols, r.repetitions);
  s += fmt::format("  kernels (CUDA events):  forward {:.4f} ms   forward+backward {:.4f} ms\n",
                   r.forward_ms, r.forward_backward_ms);
  if (r.session_error.empty()) {
    s += fmt::format("  session.run (synced):   forward {:.4f} ms   forward+backward {:.4f} ms\n",
                     r.session_forward_ms, r.session_forward_backward_ms);
  } else {
    s += fmt::format("  session.run: failed: {}\n", r.session_error);
  }
  return s;
}

}  // namespace loom::bench
