// `loom bench cuda`: GPU kernels and pools against direct CUDA calls. Compiled only in builds
// with the CUDA backend (tools/CMakeLists.txt), as the suites in bench/cuda are.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.hpp"
#include "cuda/kernel_bench.hpp"
#include "cuda/layer_norm_gpu_bench.hpp"
#include "cuda/pool_gpu_bench.hpp"

namespace loom::tools {

void add_bench_cuda_command(CLI::App& bench) {
  auto* gpu = bench.add_subcommand(
      "cuda",
      "GPU: pool allocate+free vs cudaMalloc+cudaFree; matmul vs direct cuBLASLt; FusedAdam vs "
      "a device-to-device copy; LayerNorm (python/bench/layer_norm_gpu_torch.py adds PyTorch)");
  struct cuda_flags {
    bench::gpu_bench_options options;
    bool json = false;
    std::string only;
  };
  auto cflags = std::make_shared<cuda_flags>();
  gpu->add_flag("--json", cflags->json, "Print the results as JSON");
  gpu->add_flag("--quick", cflags->options.quick, "Fewer repetitions, smaller problems");
  gpu->add_option("--repetitions", cflags->options.repetitions, "Timed repetitions per measurement")
      ->check(CLI::Range(1, 1000));
  gpu->add_option("--only", cflags->only, "Run one part")
      ->check(CLI::IsMember({"pool", "matmul", "fused_adam", "layer_norm"}));
  gpu->callback(guarded("bench cuda", [cflags] {
    const auto& o = cflags->options;
    auto wants = [&](const char* part) { return cflags->only.empty() || cflags->only == part; };
    nlohmann::json all = nlohmann::json::object();
    std::string text;
    bool failed = false;
    // Each part on its own: an error in one is reported in its place, the others still run.
    auto add = [&](const char* part, const auto& run) {
      if (!wants(part)) return;
      try {
        const auto r = run();
        all[part] = bench::to_json(r);
        text += fmt::format("== {} ==\n{}\n", part, bench::to_text(r));
      } catch (const std::exception& e) {
        failed = true;
        all[part] = {{"available", false}, {"reason", fmt::format("error: {}", e.what())}};
        text += fmt::format("== {} ==\n  error: {}\n\n", part, e.what());
      }
    };
    add("pool", [&] { return bench::run_pool_gpu_bench(o); });
    add("matmul", [&] { return bench::run_matmul_gpu_bench(o); });
    add("fused_adam", [&] { return bench::run_fused_adam_gpu_bench(o); });
    add("layer_norm", [&] { return bench::run_layer_norm_gpu_bench(o.repetitions); });
    fmt::print("{}", cflags->json ? all.dump(2) + "\n" : text);
    if (failed) exit_status() = 1;
  }));
}

}  // namespace loom::tools
