// `loom bench distributed` (bench/distributed): all_reduce through loom against direct MPI.
// Builds with MPI only (tools/CMakeLists.txt picks this file or bench_distributed_none.cpp).
#include <fmt/format.h>

#include <memory>

#include "commands.hpp"
#include "distributed/distributed_bench.hpp"
#include "loom/distributed/communicator.hpp"

namespace loom::tools {

void add_bench_distributed_command(CLI::App& bench) {
  auto* d = bench.add_subcommand(
      "distributed",
      "all_reduce through loom's communicator vs the same MPI_Allreduce called directly, "
      "4 KB to 256 MB, and data-parallel training with and without overlap and against one "
      "rank alone (run under mpirun -np N; rank 0 prints)");
  struct flags {
    bench::distributed_bench_options options;
    bool json = false;
  };
  auto f = std::make_shared<flags>();
  d->add_flag("--json", f->json, "Print the results as JSON");
  d->add_option("--size", f->options.sizes, "Message sizes in bytes (repeatable)")
      ->check(CLI::Range(std::int64_t{4}, std::int64_t{1} << 31));
  d->add_option("--rounds", f->options.rounds, "Timed rounds per size and peer (the median counts)")
      ->check(CLI::Range(1, 1000));
  d->add_option("--train-steps", f->options.train_steps,
                "Steps of the data-parallel training figures (0: none)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{100000}));
  d->add_option("--batch-norm-steps", f->options.batch_norm_steps,
                "Steps of the CNN with plain and with synchronized batch norms (0: none)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{100000}));
  d->add_option("--train-rounds", f->options.train_rounds,
                "Rounds of each training configuration (the median counts)")
      ->check(CLI::Range(1, 100));
  d->callback(guarded("bench distributed", [f] {
    const auto r = bench::run_distributed_bench(f->options);
    if (distributed::world()->rank() == 0) {
      fmt::print("{}", f->json ? bench::to_json(r).dump(2) + "\n" : bench::to_text(r));
    }
  }));
}

}  // namespace loom::tools
