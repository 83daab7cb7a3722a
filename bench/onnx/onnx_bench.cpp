// `loom bench onnx`: loom and ONNX Runtime on the same .onnx file, same inputs' shapes,
// same thread count, in one run.
#include "onnx/onnx_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "bench_stats.hpp"
#include "loom/core/error.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/onnx/import.hpp"
#include "loom/runtime/session.hpp"

namespace loom::bench {
namespace {

// Each graph input's shape for batch `batch`: a symbolic dimension 0 is the batch, the
// others come from options.dims by name.
std::map<std::string, shape> shapes_for(const onnx::imported_model& m, int batch,
                                        const onnx_bench_options& o) {
  std::map<std::string, shape> out;
  for (const auto& in : m.inputs) {
    shape s = in.dims;
    for (std::size_t i = 0; i < s.rank(); ++i) {
      if (s[i] >= 0) continue;
      const std::string& name = i < in.dim_names.size() ? in.dim_names[i] : std::string();
      auto it = name.empty() ? o.dims.end() : o.dims.find(name);
      if (it != o.dims.end()) {
        s[i] = it->second;
      } else if (i == 0) {
        s[i] = batch;
      } else {
        throw invalid_argument(fmt::format(
            "input '{}' has symbolic dimension {} ('{}'): give its value with --dim {}=N",
            in.onnx_name, i, name, name.empty() ? "NAME" : name));
      }
    }
    out[in.onnx_name] = s;
  }
  return out;
}

tensor random_input(dtype t, const shape& s, std::mt19937& rng) {
  tensor x = memory::host_tensor(t, s);
  std::normal_distribution<float> d;
  if (t == dtype::f32) {
    for (auto& v : x.span<float>()) v = d(rng);
  } else if (x.nbytes() > 0) {
    std::memset(x.raw_data(), 0, x.nbytes());  // integer inputs (indices): zeros
  }
  return x;
}

latency stats_of(std::vector<double> seconds, int batch) {
  std::sort(seconds.begin(), seconds.end());
  auto pct = [&](double p) {
    const auto k = static_cast<std::size_t>(std::min<double>(
        static_cast<double>(seconds.size()) - 1, std::ceil(p * static_cast<double>(seconds.size())) - 1));
    return 1e3 * seconds[k];
  };
  latency l;
  l.p50_ms = 1e3 * median(seconds);
  l.p90_ms = pct(0.9);
  l.p99_ms = pct(0.99);
  double sum = 0;
  for (double s : seconds) sum += s;
  l.mean_ms = 1e3 * sum / static_cast<double>(seconds.size());
  l.samples_per_s = batch / (l.p50_ms / 1e3);
  return l;
}

int iterations_for(const onnx_bench_options& o, int batch) {
  return batch <= 1 ? o.iterations : std::max(3, o.iterations * 4 / batch);
}

// Time per op over traced runs (each op's median over the runs), most first.
std::vector<op_time> profile_of(session& s, const std::vector<feed>& feeds, const std::vector<std::string>& fetches) {
  std::map<std::string, std::vector<double>> per_run;
  std::map<std::string, int> nodes;
  run_options ro;
  ro.trace = true;
  constexpr int runs = 5;
  for (int i = 0; i < runs; ++i) {
    run_metadata md;
    (void)s.run(feeds, fetches, {}, &md, ro);
    std::map<std::string, double> ms;
    std::map<std::string, int> count;
    for (const auto& n : md.nodes) {
      ms[n.op] += static_cast<double>(n.duration_ns) / 1e6;
      ++count[n.op];
    }
    for (const auto& [op, t] : ms) per_run[op].push_back(t);
    nodes = count;
  }
  std::vector<op_time> out;
  for (auto& [op, t] : per_run) out.push_back({op, nodes[op], median(t)});
  std::sort(out.begin(), out.end(), [](const op_time& a, const op_time& b) { return a.ms > b.ms; });
  return out;
}

latency run_loom(const onnx_bench_options& o, const std::map<std::string, shape>& shapes,
                 int batch, int threads, std::vector<op_time>* profile) {
  onnx::import_options io;
  io.input_shapes = shapes;
  auto m = onnx::import_file(o.model, io);
  session_options so;
  so.devices.cpu_threads = threads;
  so.devices.cuda_device_count = 0;
  session s(std::move(m.graph), so);
  std::mt19937 rng(0);
  std::vector<feed> feeds;
  for (const auto& in : m.inputs) feeds.emplace_back(in.tensor, random_input(in.type, shapes.at(in.onnx_name), rng));
  std::vector<std::string> fetches;
  for (const auto& out : m.outputs) fetches.push_back(out.tensor);
  for (int i = 0; i < o.warmup; ++i) (void)s.run(feeds, fetches);
  std::vector<double> t;
  const int n = iterations_for(o, batch);
  for (int i = 0; i < n; ++i) t.push_back(seconds_of([&] { (void)s.run(feeds, fetches); }));
  if (profile != nullptr) *profile = profile_of(s, feeds, fetches);
  return stats_of(t, batch);
}

std::string ort_script(const onnx_bench_options& o) {
  if (!o.ort_script.empty()) return o.ort_script;
  if (const char* env = std::getenv("LOOM_ORT_BENCH"); env != nullptr && *env != '\0') return env;
  return "bench/onnx/ort_bench.js";
}

// ONNX Runtime through the Node.js script: its JSON line, or why it did not run.
std::optional<nlohmann::json> run_ort(const onnx_bench_options& o, const std::map<std::string, shape>& shapes,
                                      int batch, int threads, std::string& why) {
  const std::string script = ort_script(o);
  if (script == "none") {
    why = "not asked for";
    return std::nullopt;
  }
  if (!std::filesystem::exists(script)) {
    why = fmt::format("{} not found (set LOOM_ORT_BENCH or --ort-script)", script);
    return std::nullopt;
  }
  std::string cmd = fmt::format("node '{}' '{}' --batch {} --threads {} --warmup {} --iters {}", script,
                                o.model, batch, threads, o.warmup, iterations_for(o, batch));
  for (const auto& [name, s] : shapes) {
    std::vector<std::string> d;
    for (auto v : s) d.push_back(std::to_string(v));
    cmd += fmt::format(" --shape '{}={}'", name, fmt::join(d, ","));
  }
  cmd += " 2>&1";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::array<char, 4096> buf{};
    while (std::fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) text += buf.data();
    const int status = pclose(p);
    if (status != 0) {
      why = fmt::format("ONNX Runtime failed (status {}): {}", status, text.substr(0, 400));
      return std::nullopt;
    }
  } else {
    why = "cannot start node";
    return std::nullopt;
  }
  const auto brace = text.rfind("\n{");
  const std::string line = text.substr(brace == std::string::npos ? 0 : brace + 1);
  try {
    return nlohmann::json::parse(line);
  } catch (const std::exception&) {
    why = fmt::format("ONNX Runtime printed no JSON: {}", text.substr(0, 400));
    return std::nullopt;
  }
}

}  // namespace

onnx_bench_result run_onnx_bench(const onnx_bench_options& o) {
  onnx_bench_result r;
  r.model = o.model;
  const auto probe = onnx::import_file(o.model);
  for (int threads : o.threads) {
    for (int batch : o.batches) {
      const auto shapes = shapes_for(probe, batch, o);
      onnx_bench_row row;
      row.batch = batch;
      row.threads = threads;
      // Interleaved: ONNX Runtime first, then loom, each warmed up on its own.
      if (auto j = run_ort(o, shapes, batch, threads, row.ort_missing)) {
        latency l;
        const auto& lat = (*j)["latency_ms"];
        l.p50_ms = lat.value("p50", 0.0);
        l.p90_ms = lat.value("p90", 0.0);
        l.p99_ms = lat.value("p99", 0.0);
        l.mean_ms = lat.value("mean", 0.0);
        l.samples_per_s = batch / (l.p50_ms / 1e3);
        row.ort = l;
        r.ort_version = j->value("ort_version", "");
      }
      row.loom = run_loom(o, shapes, batch, threads, o.profile ? &row.profile : nullptr);
      r.rows.push_back(row);
    }
  }
  return r;
}

std::string to_text(const onnx_bench_result& r) {
  std::string out = fmt::format("ONNX model {} (ONNX Runtime {})\n", r.model,
                                r.ort_version.empty() ? "not run" : r.ort_version);
  out += fmt::format("{:>6} {:>8} | {:>10} {:>10} {:>10} {:>10} | {:>10} {:>10} | {:>9}\n", "batch",
                     "threads", "loom p50", "p90", "p99", "samples/s", "ORT p50", "samples/s",
                     "loom/ORT");
  for (const auto& row : r.rows) {
    out += fmt::format("{:>6} {:>8} | {:>8.2f}ms {:>8.2f}ms {:>8.2f}ms {:>10.1f} | ", row.batch, row.threads,
                       row.loom.p50_ms, row.loom.p90_ms, row.loom.p99_ms, row.loom.samples_per_s);
    if (row.ort) {
      out += fmt::format("{:>8.2f}ms {:>10.1f} | {:>8.2f}x\n", row.ort->p50_ms, row.ort->samples_per_s,
                         row.ort->p50_ms / row.loom.p50_ms);
    } else {
      out += fmt::format("{:>10} {:>10} | {:>9}\n", "-", "-", "-");
    }
  }
  for (const auto& row : r.rows) {
    if (!row.ort && !row.ort_missing.empty()) {
      out += fmt::format("ONNX Runtime: {}\n", row.ort_missing);
      break;
    }
  }
  out += "loom/ORT: ONNX Runtime's median latency over loom's (above 1: loom is faster)\n";
  for (const auto& row : r.rows) {
    if (row.profile.empty()) continue;
    double total = 0;
    for (const auto& p : row.profile) total += p.ms;
    out += fmt::format("loom's time per op, batch {}, {} thread{} (traced; {:.2f} ms in nodes):\n", row.batch,
                       row.threads, row.threads == 1 ? "" : "s", total);
    for (const auto& p : row.profile) {
      if (p.ms < 0.005 * total) continue;
      out += fmt::format("  {:<22} {:>4} nodes {:>9.2f} ms {:>5.1f}%\n", p.op, p.nodes, p.ms, 100 * p.ms / total);
    }
  }
  return out;
}

nlohmann::json to_json(const onnx_bench_result& r) {
  auto lat = [](const latency& l) {
    return nlohmann::json{{"p50_ms", l.p50_ms}, {"p90_ms", l.p90_ms}, {"p99_ms", l.p99_ms},
                          {"mean_ms", l.mean_ms}, {"samples_per_s", l.samples_per_s}};
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json j{{"batch", row.batch}, {"threads", row.threads}, {"loom", lat(row.loom)}};
    if (!row.profile.empty()) {
      nlohmann::json p = nlohmann::json::array();
      for (const auto& t : row.profile) p.push_back({{"op", t.op}, {"nodes", t.nodes}, {"ms", t.ms}});
      j["profile"] = p;
    }
    if (row.ort) {
      j["ort"] = lat(*row.ort);
      j["loom_over_ort"] = row.ort->p50_ms / row.loom.p50_ms;
    } else {
      j["ort_missing"] = row.ort_missing;
    }
    rows.push_back(j);
  }
  return {{"model", r.model}, {"ort_version", r.ort_version}, {"rows", rows}};
}

}  // namespace loom::bench
