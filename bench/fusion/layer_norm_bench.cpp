#include "fusion/layer_norm_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_stats.hpp"
#include "fusion/python_peer.hpp"
#include "fusion/random_input.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::bench {
namespace {

struct timings {
  double run_ms = 0;     // median wall time of session.run
  double kernel_ms = 0;  // median time inside the kernels named below (traced runs)
  double kernel2_ms = 0;
};

// Runs `fetches` of `g` fed `feeds`: warm-up runs, then `repetitions` timed runs and as many
// traced ones for the kernels' own times.
timings measure(graph g, const std::vector<feed>& feeds, const std::vector<std::string>& fetches,
                int threads, int repetitions) {
  session_options o;
  o.devices.cpu_threads = threads;
  session s(std::move(g), o);
  for (int w = 0; w < 5; ++w) (void)s.run(feeds, fetches);
  std::vector<double> t, k1, k2;
  for (int r = 0; r < repetitions; ++r) {
    t.push_back(seconds_of([&] { (void)s.run(feeds, fetches); }));
  }
  for (int r = 0; r < repetitions; ++r) {
    run_metadata m;
    (void)s.run(feeds, fetches, {}, &m, {.trace = true});
    double a = 0;
    double b = 0;
    for (const auto& e : m.nodes) {
      if (e.op == "layer_norm") a += static_cast<double>(e.duration_ns);
      if (e.op == "layer_norm_grad") b += static_cast<double>(e.duration_ns);
    }
    k1.push_back(a * 1e-6);
    k2.push_back(b * 1e-6);
  }
  return {median(std::move(t)) * 1e3, median(std::move(k1)), median(std::move(k2))};
}

// Runs the PyTorch peer and fills the torch_* fields of r, or says why it could not.
void measure_peer(layer_norm_bench_result& r) {
  const peer_answer a = run_python_peer(
      "layer_norm_torch.py",
      {"--threads", std::to_string(r.threads), "--repetitions", std::to_string(r.repetitions),
       "--rows", std::to_string(r.rows), "--cols", std::to_string(r.cols)},
      {"forward_ms", "forward_backward_ms"});
  if (!a.available()) {
    r.peer_unavailable_reason = a.unavailable_reason;
    return;
  }
  r.peer_available = true;
  r.torch_version = a.json.value("torch_version", std::string("?"));
  r.torch_forward_ms = a.json["forward_ms"].get<double>();
  r.torch_forward_backward_ms = a.json["forward_backward_ms"].get<double>();
}

}  // namespace

layer_norm_bench_result run_layer_norm_bench(int threads, int repetitions, bool quick) {
  layer_norm_bench_result r;
  r.threads = threads;
  r.repetitions = quick ? std::min(repetitions, 5) : repetitions;
  const shape xs{r.rows, r.cols};
  const shape ps{r.cols};
  const std::vector<feed> feeds{{"x", random_f32(xs, 1, -2.0f, 2.0f)},
                                {"gamma", random_f32(ps, 2, 0.5f, 1.5f)},
                                {"beta", random_f32(ps, 3, -1.0f, 1.0f)},
                                {"dy", random_f32(xs, 4, -1.0f, 1.0f)}};
  {
    graph g;
    graph_builder b(g);
    const auto x = ops::placeholder(b, "x", dtype::f32, xs);
    const auto gamma = ops::placeholder(b, "gamma", dtype::f32, ps);
    const auto beta = ops::placeholder(b, "beta", dtype::f32, ps);
    const auto y = ops::layer_norm(x, gamma, beta).y;
    const std::vector<feed> fwd_feeds(feeds.begin(), feeds.begin() + 3);
    const auto t = measure(std::move(g), fwd_feeds, {y.name()}, threads, r.repetitions);
    r.forward_ms = t.run_ms;
    r.forward_kernel_ms = t.kernel_ms;
  }
  {
    graph g;
    graph_builder b(g);
    const auto x = ops::placeholder(b, "x", dtype::f32, xs);
    const auto gamma = ops::placeholder(b, "gamma", dtype::f32, ps);
    const auto beta = ops::placeholder(b, "beta", dtype::f32, ps);
    const auto dy = ops::placeholder(b, "dy", dtype::f32, xs);
    const auto y = ops::layer_norm(x, gamma, beta).y;
    const auto grads = gradients(y, {x, gamma, beta}, dy);
    const auto t =
        measure(std::move(g), feeds, {y.name(), grads[0].name(), grads[1].name(), grads[2].name()},
                threads, r.repetitions);
    r.forward_backward_ms = t.run_ms;
    r.backward_kernel_ms = t.kernel2_ms;
  }
  measure_peer(r);
  if (r.peer_available) {
    r.forward_speedup = r.torch_forward_ms / r.forward_ms;
    r.forward_backward_speedup = r.torch_forward_backward_ms / r.forward_backward_ms;
  }
  return r;
}

nlohmann::json to_json(const layer_norm_bench_result& r) {
  nlohmann::json peer;
  if (r.peer_available) {
    peer = {{"available", true},
            {"name", "PyTorch F.layer_norm"},
            {"torch_version", r.torch_version},
            {"forward_ms", r.torch_forward_ms},
            {"forward_backward_ms", r.torch_forward_backward_ms}};
  } else {
    peer = {{"available", false}, {"reason", r.peer_unavailable_reason}};
  }
  return {{"shape", {r.rows, r.cols}},
          {"dtype", "float32"},
          {"threads", r.threads},
          {"repetitions", r.repetitions},
          {"forward_ms", r.forward_ms},
          {"forward_backward_ms", r.forward_backward_ms},
          {"forward_kernel_ms", r.forward_kernel_ms},
          {"backward_kernel_ms", r.backward_kernel_ms},
          {"peer", peer},
          {"forward_speedup", r.forward_speedup},
          {"forward_backward_speedup", r.forward_backward_speedup},
          {"target_speedup", r.target_speedup}};
}

std::string to_text(const layer_norm_bench_result& r) {
  std::string out = fmt::format(
      "layer_norm: [{}, {}] f32 through a session, {} threads, median of {}\n"
      "  loom     forward {:8.3f} ms   forward+backward {:8.3f} ms   (in kernels: layer_norm "
      "{:.3f} ms, layer_norm_grad {:.3f} ms)\n",
      r.rows, r.cols, r.threads, r.repetitions, r.forward_ms, r.forward_backward_ms,
      r.forward_kernel_ms, r.backward_kernel_ms);
  if (!r.peer_available) {
    out += fmt::format("  PyTorch  peer unavailable: {}\n", r.peer_unavailable_reason);
    return out;
  }
  const auto verdict = [&](double s) { return s >= r.target_speedup ? "met" : "NOT met"; };
  out += fmt::format(
      "  PyTorch  forward {:8.3f} ms   forward+backward {:8.3f} ms   (torch {}, F.layer_norm, "
      "same run)\n"
      "  speedup  forward {:6.2f}x       forward+backward {:6.2f}x\n"
      "  target: loom >= {:.1f}x faster: forward {}, forward+backward {}\n",
      r.torch_forward_ms, r.torch_forward_backward_ms, r.torch_version, r.forward_speedup,
      r.forward_backward_speedup, r.target_speedup, verdict(r.forward_speedup),
      verdict(r.forward_backward_speedup));
  return out;
}

}  // namespace loom::bench
