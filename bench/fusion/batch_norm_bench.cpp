#include "fusion/batch_norm_bench.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "bench_stats.hpp"
#include "fusion/python_peer.hpp"
#include "fusion/random_input.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"
#include "stream_triad.hpp"

namespace loom::bench {
namespace {

// Median ms of session.run over `repetitions` after warm-up runs.
double median_run_ms(graph g, const std::vector<feed>& feeds,
                     const std::vector<std::string>& fetches, int threads, int repetitions) {
  session_options o;
  o.devices.cpu_threads = threads;
  session s(std::move(g), o);
  for (int w = 0; w < 3; ++w) (void)s.run(feeds, fetches);
  std::vector<double> t;
  for (int r = 0; r < repetitions; ++r) {
    t.push_back(seconds_of([&] { (void)s.run(feeds, fetches); }));
  }
  return median(std::move(t)) * 1e3;
}

void measure(batch_norm_case& c, int threads, int repetitions) {
  const bool nhwc = c.data_format == "NHWC";
  const std::int64_t ch = c.shape[1];
  const shape xs = nhwc ? shape{c.shape[0], c.shape[2], c.shape[3], ch}
                        : shape{c.shape[0], ch, c.shape[2], c.shape[3]};
  const tensor x = random_f32(xs, 1, -1.0f, 3.0f);
  const tensor dy = random_f32(xs, 2, -1.0f, 1.0f);
  for (const bool backward : {false, true}) {
    graph g;
    graph_builder b(g);
    const output xin = ops::placeholder(b, "x", dtype::f32, xs);
    const output dyin = ops::placeholder(b, "dy", dtype::f32, xs);
    const auto var = [&](const char* name, float v) {
      return ops::variable(b, name, random_f32({ch}, 3, v, v));
    };
    const output scale = var("scale", 1.0f);
    const output bias = var("bias", 0.0f);
    const auto y = ops::batch_norm_train(xin, scale, bias, var("running_mean", 0.0f),
                                         var("running_var", 1.0f), {.data_format = c.data_format})
                       .y;
    std::vector<std::string> fetches{y.name()};
    std::vector<feed> feeds{{"x", x}};
    if (backward) {
      for (const output& d : gradients(y, {xin, scale, bias}, dyin)) fetches.push_back(d.name());
      feeds.push_back({"dy", dy});
    }
    const double ms = median_run_ms(std::move(g), feeds, fetches, threads, repetitions);
    (backward ? c.forward_backward_ms : c.forward_ms) = ms;
  }
  const std::string dims = fmt::format("{}", fmt::join(c.shape, ","));
  std::vector<std::string> args{"--threads", std::to_string(threads), "--repetitions",
                                std::to_string(repetitions), "--shape", dims};
  if (nhwc) args.emplace_back("--channels-last");
  const peer_answer a = run_python_peer("batch_norm_torch.py", args,
                                        {"forward_ms", "forward_backward_ms"});
  if (!a.available()) {
    c.peer_unavailable_reason = a.unavailable_reason;
    return;
  }
  c.peer_available = true;
  c.torch_forward_ms = a.json["forward_ms"].get<double>();
  c.torch_forward_backward_ms = a.json["forward_backward_ms"].get<double>();
}

std::string torch_version() {
  const peer_answer a = run_python_peer("batch_norm_torch.py",
                                        {"--repetitions", "1", "--warmup", "0", "--shape",
                                         "2,2,2,2"},
                                        {"torch_version"});
  return a.available() ? a.json["torch_version"].get<std::string>() : std::string("?");
}

}  // namespace

batch_norm_bench_result run_batch_norm_bench(int threads, int repetitions, bool quick) {
  batch_norm_bench_result r;
  r.threads = threads;
  r.repetitions = quick ? std::min(repetitions, 5) : repetitions;
  for (const auto& [dims, format] :
       std::vector<std::pair<std::vector<std::int64_t>, std::string>>{
           {{32, 64, 56, 56}, "NCHW"}, {{64, 256, 14, 14}, "NCHW"}, {{32, 64, 56, 56}, "NHWC"}}) {
    batch_norm_case c;
    c.shape = dims;
    c.data_format = format;
    const std::int64_t elements = dims[0] * dims[1] * dims[2] * dims[3];
    const double bytes = 4.0 * static_cast<double>(elements);
    // The triad over arrays of the batch's size: the bandwidth of the memory level the
    // batch lives in (the caches hold a 25 MB batch on some machines).
    c.triad_gb_per_s = triad_gb_per_s(threads, elements, 5);
    c.forward_floor_ms = 2 * bytes / (c.triad_gb_per_s * 1e6);
    c.forward_backward_floor_ms = 5 * bytes / (c.triad_gb_per_s * 1e6);
    measure(c, threads, r.repetitions);
    r.cases.push_back(c);
  }
  r.torch_version = torch_version();
  return r;
}

nlohmann::json to_json(const batch_norm_bench_result& r) {
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : r.cases) {
    nlohmann::json j{{"shape", c.shape},
                     {"data_format", c.data_format},
                     {"forward_ms", c.forward_ms},
                     {"forward_backward_ms", c.forward_backward_ms},
                     {"triad_gb_per_s", c.triad_gb_per_s},
                     {"forward_floor_ms", c.forward_floor_ms},
                     {"forward_backward_floor_ms", c.forward_backward_floor_ms},
                     {"forward_fraction_of_floor", c.forward_floor_ms / c.forward_ms},
                     {"forward_backward_fraction_of_floor",
                      c.forward_backward_floor_ms / c.forward_backward_ms}};
    if (c.peer_available) {
      j["peer"] = {{"available", true},
                   {"name", "PyTorch torch.nn.BatchNorm2d, train()"},
                   {"forward_ms", c.torch_forward_ms},
                   {"forward_backward_ms", c.torch_forward_backward_ms}};
      j["forward_speedup"] = c.torch_forward_ms / c.forward_ms;
      j["forward_backward_speedup"] = c.torch_forward_backward_ms / c.forward_backward_ms;
    } else {
      j["peer"] = {{"available", false}, {"reason", c.peer_unavailable_reason}};
    }
    cases.push_back(j);
  }
  return {{"threads", r.threads},
          {"repetitions", r.repetitions},
          {"dtype", "float32"},
          {"torch_version", r.torch_version},
          {"target_speedup", r.target_speedup},
          {"cases", cases}};
}

std::string to_text(const batch_norm_bench_result& r) {
  std::string out = fmt::format(
      "batch_norm_train: float32 through a session, {} threads, median of {}; PyTorch {} "
      "BatchNorm2d train() in the same run; floor: the bytes that must move (forward 2x, "
      "forward+backward 5x the batch) at the STREAM triad's bandwidth over arrays of the "
      "batch's size (GB/s column), as a fraction of loom's time\n"
      "  {:<16} {:>5} {:>6} | {:>8} {:>8} {:>7} {:>5} | {:>8} {:>8} {:>7} {:>5}\n",
      r.threads, r.repetitions, r.torch_version, "shape", "", "GB/s", "fwd ms", "torch ms",
      "speedup", "floor", "f+b ms", "torch ms", "speedup", "floor");
  bool met = true;
  for (const auto& c : r.cases) {
    const std::string dims = fmt::format("{}", fmt::join(c.shape, "x"));
    const double sf = c.peer_available ? c.torch_forward_ms / c.forward_ms : 0;
    const double sb = c.peer_available ? c.torch_forward_backward_ms / c.forward_backward_ms : 0;
    met = met && sf >= r.target_speedup && sb >= r.target_speedup;
    out += fmt::format(
        "  {:<16} {:>5} {:>6.1f} | {:>8.3f} {:>8.3f} {:>6.2f}x {:>4.0f}% | {:>8.3f} {:>8.3f} "
        "{:>6.2f}x {:>4.0f}%\n",
        dims, c.data_format, c.triad_gb_per_s, c.forward_ms, c.torch_forward_ms, sf,
        100 * c.forward_floor_ms / c.forward_ms, c.forward_backward_ms,
        c.torch_forward_backward_ms, sb, 100 * c.forward_backward_floor_ms / c.forward_backward_ms);
    if (!c.peer_available) out += fmt::format("    PyTorch unavailable: {}\n", c.peer_unavailable_reason);
  }
  out += fmt::format("  target: loom >= {:.1f}x PyTorch, forward and forward+backward: {}\n",
                     r.target_speedup, met ? "met" : "NOT met");
  return out;
}

}  // namespace loom::bench
