#include "interop/layout_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "bench_stats.hpp"
#include "loom/device/thread_pool.hpp"
#include "loom/interop/layout.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "stream_triad.hpp"

namespace loom::bench {
namespace {

void fill_pattern(void* p, std::size_t bytes, std::uint32_t seed) {
  auto* b = static_cast<std::uint8_t*>(p);
  std::uint32_t x = seed * 2654435761u + 1u;
  for (std::size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    b[i] = static_cast<std::uint8_t>(x >> 24);
  }
}

// "4M", "256K": a row count in binary units.
std::string rows_text(std::int64_t n) {
  if (n % (std::int64_t{1} << 20) == 0) return fmt::format("{}M", n >> 20);
  if (n % (std::int64_t{1} << 10) == 0) return fmt::format("{}K", n >> 10);
  return fmt::format("{}", n);
}

template <class F>
double median_ms(int repetitions, F&& f) {
  f();  // warm: pool blocks, page faults, caches
  std::vector<double> t;
  for (int r = 0; r < repetitions; ++r) t.push_back(seconds_of(f));
  return median(std::move(t)) * 1e3;
}

// memcpy of `bytes`, split over the pool as the layout copies are.
double memcpy_ms(thread_pool& pool, std::size_t bytes, int repetitions) {
  std::vector<std::uint8_t> src(bytes), dst(bytes);
  fill_pattern(src.data(), bytes, 3);
  const auto chunks = static_cast<std::int64_t>(bytes / 4096);
  return median_ms(repetitions, [&] {
    pool.parallel_for(chunks, 400.0, [&](std::int64_t begin, std::int64_t end) {
      const auto b = static_cast<std::size_t>(begin) * 4096;
      const auto e = end == chunks ? bytes : static_cast<std::size_t>(end) * 4096;
      std::memcpy(dst.data() + b, src.data() + b, e - b);
    });
  });
}

layout_case_result finish(layout_case_result c, double triad_gb_per_s, double memcpy) {
  c.gb_per_s = c.bytes / (c.ms * 1e-3) / 1e9;
  c.floor_ms = c.bytes / (triad_gb_per_s * 1e9) * 1e3;
  c.over_floor = c.ms / c.floor_ms;
  c.memcpy_ms = memcpy;
  c.over_memcpy = c.ms / memcpy;
  return c;
}

}  // namespace

layout_bench_result run_layout_bench(const layout_bench_options& options) {
  layout_bench_result r;
  r.repetitions = options.quick ? std::min(options.repetitions, 3) : options.repetitions;
  r.threads = options.threads;
  r.quick = options.quick;
  const int reps = std::max(r.repetitions, 1);
  const std::int64_t scale = options.quick ? 8 : 1;
  r.triad_mib_per_array = 64.0 / static_cast<double>(scale);
  r.triad_gb_per_s =
      triad_gb_per_s(options.threads, (std::int64_t{16} << 20) / scale, std::max(reps, 5));
  thread_pool pool(options.threads, "layout-bench");

  // [N, k] f32, N * k = 16M.
  const std::int64_t elements = (std::int64_t{16} << 20) / scale;
  const auto bytes = static_cast<std::size_t>(elements) * 4;
  const double copy_ms = memcpy_ms(pool, bytes, reps);
  for (std::int64_t k : {2, 4, 8}) {
    const std::int64_t n = elements / k;
    tensor aos = memory::host_tensor(dtype::f32, shape{n, k});
    fill_pattern(aos.raw_data(), aos.nbytes(), static_cast<std::uint32_t>(k));
    const std::string label = fmt::format("f32 [{}, {}]", rows_text(n), k);
    layout_case_result d;
    d.op = "deinterleave";
    d.label = label;
    d.rows = n;
    d.columns = k;
    d.bytes = 2.0 * static_cast<double>(bytes);
    d.ms = median_ms(reps, [&] { (void)interop::deinterleave(aos, &pool); });
    r.cases.push_back(finish(d, r.triad_gb_per_s, copy_ms));

    const std::vector<tensor> cols = interop::deinterleave(aos, &pool);
    layout_case_result i = d;
    i.op = "interleave";
    i.ms = median_ms(reps, [&] { (void)interop::interleave(cols, &pool); });
    r.cases.push_back(finish(i, r.triad_gb_per_s, copy_ms));
  }

  // Packed records (f64, f32, i32): 16 bytes read and 16 written per record.
  {
    const std::int64_t n = (std::int64_t{4} << 20) / scale;
    const std::size_t record_size = 16;
    std::vector<std::uint8_t> records(static_cast<std::size_t>(n) * record_size);
    fill_pattern(records.data(), records.size(), 9);
    const std::vector<interop::field> fields = {
        {"t", dtype::f64, 0}, {"x", dtype::f32, 8}, {"id", dtype::i32, 12}};
    layout_case_result c;
    c.op = "records_to_columns";
    c.label = fmt::format("{} x 16 B (f64, f32, i32)", rows_text(n));
    c.rows = n;
    c.columns = 3;
    c.bytes = 2.0 * static_cast<double>(records.size());
    c.ms = median_ms(reps, [&] {
      (void)interop::records_to_columns(records.data(), n, record_size, fields, &pool);
    });
    const double records_copy_ms = memcpy_ms(pool, records.size(), reps);
    r.cases.push_back(finish(c, r.triad_gb_per_s, records_copy_ms));

    const interop::table tab =
        interop::records_to_columns(records.data(), n, record_size, fields, &pool);
    layout_case_result back = c;
    back.op = "columns_to_records";
    back.ms = median_ms(reps, [&] {
      interop::columns_to_records(tab, records.data(), record_size, fields, &pool);
    });
    r.cases.push_back(finish(back, r.triad_gb_per_s, records_copy_ms));
  }
  return r;
}

nlohmann::json to_json(const layout_bench_result& r) {
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : r.cases) {
    cases.push_back({{"op", c.op},
                     {"label", c.label},
                     {"rows", c.rows},
                     {"columns", c.columns},
                     {"bytes", c.bytes},
                     {"ms", c.ms},
                     {"gb_per_s", c.gb_per_s},
                     {"floor_ms", c.floor_ms},
                     {"over_floor", c.over_floor},
                     {"memcpy_ms", c.memcpy_ms},
                     {"over_memcpy", c.over_memcpy}});
  }
  return {{"repetitions", r.repetitions},
          {"threads", r.threads},
          {"quick", r.quick},
          {"triad_gb_per_s", r.triad_gb_per_s},
          {"triad_mib_per_array", r.triad_mib_per_array},
          {"layout", cases}};
}

std::string to_text(const layout_bench_result& r) {
  std::string out = fmt::format(
      "layout: AoS <-> SoA copies, {} threads, median of {}{}\n"
      "  STREAM triad bandwidth  {:6.1f} GB/s   (3 x {:.0f} MiB arrays; the floor is bytes / "
      "this)\n"
      "  {:<19} {:<26} {:>9} {:>8} {:>9} {:>7} {:>9} {:>8}\n",
      r.threads, r.repetitions, r.quick ? " (quick: 1/8 sizes)" : "", r.triad_gb_per_s,
      r.triad_mib_per_array, "op", "case", "ms", "GB/s", "floor ms", "/floor", "memcpy ms",
      "/memcpy");
  for (const auto& c : r.cases) {
    out += fmt::format("  {:<19} {:<26} {:9.3f} {:8.2f} {:9.3f} {:7.2f} {:9.3f} {:8.2f}\n", c.op,
                       c.label, c.ms, c.gb_per_s, c.floor_ms, c.over_floor, c.memcpy_ms,
                       c.over_memcpy);
  }
  out +=
      "  (bytes = read + written; memcpy copies the input's bytes on the same threads, the "
      "best a copy can do)\n";
  return out;
}

}  // namespace loom::bench
