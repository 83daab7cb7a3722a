#include "interop/dlpack_bench.hpp"

#include <fmt/format.h>

#include "bench_stats.hpp"
#include "loom/interop/dlpack.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::bench {
namespace {

// Where the round trips' results go, so the compiler cannot drop them.
volatile std::int64_t sink = 0;

template <bool Versioned>
double ns_per_round_trip(const tensor& t, int round_trips, int repetitions) {
  std::vector<double> ns;
  for (int r = 0; r < repetitions; ++r) {
    const double s = seconds_of([&] {
      for (int i = 0; i < round_trips; ++i) {
        const tensor back = Versioned ? interop::from_dlpack(interop::to_dlpack_versioned(t))
                                      : interop::from_dlpack(interop::to_dlpack(t));
        sink = sink + back.num_elements();
      }
    });
    ns.push_back(s * 1e9 / round_trips);
  }
  return median(std::move(ns));
}

}  // namespace

dlpack_bench_result run_dlpack_bench(int repetitions, bool quick) {
  dlpack_bench_result r;
  r.repetitions = repetitions;
  r.round_trips_per_repetition = quick ? 2000 : 20000;
  struct input {
    std::string name;
    tensor t;
  };
  std::vector<input> inputs{{"0-d f32", memory::host_tensor(dtype::f32, {})},
                            {"1 KB", memory::host_tensor(dtype::f32, {256})}};
  if (!quick) inputs.push_back({"1 GB", memory::host_tensor(dtype::f32, {std::int64_t{1} << 28})});
  for (const input& in : inputs) {
    for (const bool versioned : {false, true}) {
      dlpack_bench_row row;
      row.tensor = in.name;
      row.abi = versioned ? "dltensor_versioned" : "dltensor";
      row.bytes = static_cast<std::int64_t>(in.t.nbytes());
      (void)(versioned ? ns_per_round_trip<true>(in.t, 100, 1)
                       : ns_per_round_trip<false>(in.t, 100, 1));
      row.ns_per_round_trip =
          versioned ? ns_per_round_trip<true>(in.t, r.round_trips_per_repetition, repetitions)
                    : ns_per_round_trip<false>(in.t, r.round_trips_per_repetition, repetitions);
      r.rows.push_back(row);
    }
  }
  return r;
}

nlohmann::json to_json(const dlpack_bench_result& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    rows.push_back({{"tensor", row.tensor},
                    {"abi", row.abi},
                    {"bytes", row.bytes},
                    {"ns_per_round_trip", row.ns_per_round_trip},
                    {"target_met", row.ns_per_round_trip < r.target_ns}});
  }
  return {{"repetitions", r.repetitions},
          {"round_trips_per_repetition", r.round_trips_per_repetition},
          {"target_ns", r.target_ns},
          {"rows", rows}};
}

std::string to_text(const dlpack_bench_result& r) {
  std::string out = fmt::format(
      "dlpack: export + import round trip in C++ (to_dlpack, from_dlpack, drop), median of {} x "
      "{} round trips\n",
      r.repetitions, r.round_trips_per_repetition);
  for (const auto& row : r.rows) {
    out += fmt::format("  {:<8} {:<20} {:>8.1f} ns   target < {:.0f} ns: {}\n", row.tensor, row.abi,
                       row.ns_per_round_trip, r.target_ns,
                       row.ns_per_round_trip < r.target_ns ? "met" : "NOT met");
  }
  return out;
}

}  // namespace loom::bench
