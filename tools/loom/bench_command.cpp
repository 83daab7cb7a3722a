// `loom bench <suite>`: benchmarks that measure loom and its peer in the same run.
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "fusion/fusion_bench.hpp"
#include "interop/interop_bench.hpp"
#include "loom/core/input.hpp"
#include "memory/memory_bench.hpp"
#include "onnx/onnx_bench.hpp"
#include "runtime/runtime_bench.hpp"
#include "train/train_bench.hpp"

namespace loom::tools {

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks against a peer measured in the same run");
  bench->require_subcommand(1);

  auto* memory = bench->add_subcommand(
      "memory", "Pools against glibc malloc/free: mixed sizes, large tensors, adaptors, replay");
  struct memory_flags {
    bench::memory_bench_options options;
    bool json = false;
    bool quick = false;
  };
  auto flags = std::make_shared<memory_flags>();
  memory->add_flag("--json", flags->json, "Print the results as JSON");
  memory->add_flag("--quick", flags->quick, "Fewer repetitions and steps (a smoke run)");
  memory->add_option("--repetitions", flags->options.repetitions, "Timed repetitions per workload")
      ->check(CLI::Range(1, 1000));
  memory->add_option("--seed", flags->options.seed, "Seed of the workloads")
      ->check(non_negative_integer());
  memory->callback(guarded("bench memory", [flags] {
    bench::memory_bench_options o = flags->options;
    if (flags->quick) {
      o.repetitions = 3;
      o.mixed_steps /= 10;
      o.large_steps /= 4;
      o.replay_events /= 10;
    }
    const bench::memory_bench_result r = bench::run_memory_bench(o);
    if (flags->json) {
      fmt::print("{}\n", bench::to_json(r).dump(2));
    } else {
      fmt::print("{}", bench::to_text(r));
    }
  }));

  auto* runtime = bench->add_subcommand(
      "runtime",
      "Executor overhead on a 10,000-node chain; matmul and conv2d against direct oneDNN calls");
  struct runtime_flags {
    bench::runtime_bench_options options;
    bool json = false;
    bool quick = false;
    std::string only;
  };
  auto rflags = std::make_shared<runtime_flags>();
  runtime->add_flag("--json", rflags->json, "Print the results as JSON");
  runtime->add_flag("--quick", rflags->quick,
                    "Fewer repetitions and smaller problems (a smoke run)");
  runtime
      ->add_option("--repetitions", rflags->options.repetitions,
                   "Timed repetitions per measurement")
      ->check(CLI::Range(1, 1000));
  runtime->add_option("--threads", rflags->options.threads, "Threads for matmul and conv2d")
      ->check(CLI::Range(1, 1024));
  runtime->add_option("--only", rflags->only, "Run one part: the executor chain or the kernels")
      ->check(CLI::IsMember({"executor", "kernels"}));
  runtime->callback(guarded("bench runtime", [rflags] {
    bench::runtime_bench_options o = rflags->options;
    o.quick = rflags->quick;
    o.run_executor = rflags->only.empty() || rflags->only == "executor";
    o.run_kernels = rflags->only.empty() || rflags->only == "kernels";
    if (o.quick) o.repetitions = std::min(o.repetitions, 3);
    const auto r = bench::run_runtime_bench(o);
    fmt::print("{}", rflags->json ? bench::to_json(r).dump(2) + "\n" : bench::to_text(r));
  }));

  auto* train = bench->add_subcommand(
      "train", "Training-step parts: Adam fused vs per-tensor, against the STREAM-triad floor");
  struct train_flags {
    bench::train_bench_options options;
    bool json = false;
  };
  auto tflags = std::make_shared<train_flags>();
  train->add_flag("--json", tflags->json, "Print the results as JSON");
  train->add_flag("--quick", tflags->options.quick, "Fewer repetitions (a smoke run)");
  train
      ->add_option("--repetitions", tflags->options.repetitions,
                   "Timed repetitions per measurement")
      ->check(CLI::Range(1, 1000));
  train->add_option("--threads", tflags->options.threads, "Threads of the CPU device")
      ->check(CLI::Range(1, 1024));
  train->add_option("--only", tflags->options.only, "Run one part")
      ->check(CLI::IsMember(bench::train_bench_parts()));
  train->callback(guarded("bench train", [tflags] {
    const auto r = bench::run_train_bench(tflags->options);
    fmt::print("{}", tflags->json ? bench::to_json(r).dump(2) + "\n" : bench::to_text(r));
  }));

  auto* interop = bench->add_subcommand(
      "interop", "Zero-copy interop: DLPack round trips in C++, AoS <-> SoA against the floor");
  struct interop_flags {
    bench::interop_bench_options options;
    bool json = false;
  };
  auto iflags = std::make_shared<interop_flags>();
  interop->add_flag("--json", iflags->json, "Print the results as JSON");
  interop->add_flag("--quick", iflags->options.quick,
                    "Fewer repetitions, no 1 GB tensor (a smoke run)");
  interop
      ->add_option("--repetitions", iflags->options.repetitions,
                   "Timed repetitions per measurement")
      ->check(CLI::Range(1, 1000));
  interop->add_option("--threads", iflags->options.threads, "Threads for the layout conversions")
      ->check(CLI::Range(1, 1024));
  interop->add_option("--only", iflags->options.only, "Run one part")
      ->check(CLI::IsMember(bench::interop_bench_parts()));
  interop->callback(guarded("bench interop", [iflags] {
    const auto r = bench::run_interop_bench(iflags->options);
    fmt::print("{}", iflags->json ? bench::to_json(r).dump(2) + "\n" : bench::to_text(r));
  }));

  auto* fusion = bench->add_subcommand(
      "fusion",
      "Graph passes: an 8-op chain fused vs unfused vs the triad; the MLP step with passes on "
      "and off; LayerNorm vs PyTorch");
  struct fusion_flags {
    bench::fusion_bench_options options;
    bool json = false;
    std::string only;
  };
  auto fflags = std::make_shared<fusion_flags>();
  fusion->add_flag("--json", fflags->json, "Print the results as JSON");
  fusion->add_flag("--quick", fflags->options.quick,
                   "Fewer repetitions, 4M elements (a smoke run)");
  fusion
      ->add_option("--repetitions", fflags->options.repetitions,
                   "Timed repetitions per measurement")
      ->check(CLI::Range(1, 1000));
  fusion->add_option("--threads", fflags->options.threads, "Threads of the CPU device")
      ->check(CLI::Range(1, 1024));
  fusion->add_option("--only", fflags->only, "Run one part")
      ->check(CLI::IsMember({"chain", "mlp", "layer_norm", "batch_norm"}));
  fusion->callback(guarded("bench fusion", [fflags] {
    bench::fusion_bench_options o = fflags->options;
    if (!fflags->only.empty()) {
      o.run_chain = fflags->only == "chain";
      o.run_mlp = fflags->only == "mlp";
      o.run_layer_norm = fflags->only == "layer_norm";
      o.run_batch_norm = fflags->only == "batch_norm";
    }
    const auto r = bench::run_fusion_bench(o);
    fmt::print("{}", fflags->json ? bench::to_json(r).dump(2) + "\n" : bench::to_text(r));
  }));

  auto* onnx = bench->add_subcommand(
      "onnx",
      "An ONNX model's latency (batch 1) and throughput (batch 32), loom against ONNX Runtime "
      "on the same file and threads");
  struct onnx_flags {
    bench::onnx_bench_options options;
    bool json = false;
    std::vector<std::string> dims;
  };
  auto oflags = std::make_shared<onnx_flags>();
  onnx->add_option("model", oflags->options.model, "The .onnx file")->required()->check(CLI::ExistingFile);
  onnx->add_flag("--json", oflags->json, "Print the results as JSON");
  onnx->add_flag("--profile", oflags->options.profile, "Also print loom's time per op (from traced runs)");
  onnx->add_option("--batch", oflags->options.batches, "Batch sizes (repeatable; default 1 and 32)")
      ->check(CLI::Range(1, 1 << 20));
  onnx->add_option("--threads", oflags->options.threads, "Thread counts (repeatable; default 1 and 2)")
      ->check(CLI::Range(1, 1024));
  onnx->add_option("--iterations", oflags->options.iterations, "Timed runs at batch 1")
      ->check(CLI::Range(1, 100000));
  onnx->add_option("--warmup", oflags->options.warmup, "Untimed runs first")->check(CLI::Range(0, 1000));
  onnx->add_option("--dim", oflags->dims, "NAME=N: a symbolic dimension's value (repeatable)");
  onnx->add_option("--ort-script", oflags->options.ort_script,
                   "ONNX Runtime's timing script (default $LOOM_ORT_BENCH or "
                   "bench/onnx/ort_bench.js); 'none' skips ONNX Runtime");
  onnx->callback(guarded("bench onnx", [oflags] {
    bench::onnx_bench_options o = oflags->options;
    for (const auto& d : oflags->dims) {
      const auto eq = d.find('=');
      if (eq == std::string::npos || eq == 0) usage_error("--dim", fmt::format("'{}' is not NAME=N", d));
      o.dims[d.substr(0, eq)] = parse_number<std::int64_t>(std::string_view(d).substr(eq + 1), "--dim " + d);
    }
    const auto r = bench::run_onnx_bench(o);
    fmt::print("{}", oflags->json ? bench::to_json(r).dump(2) + "\n" : bench::to_text(r));
  }));

  add_bench_cuda_command(*bench);
  add_bench_distributed_command(*bench);
}

}  // namespace loom::tools
