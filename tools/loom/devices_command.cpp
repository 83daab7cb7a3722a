// `loom devices`: the devices a session would create, with their memory and threads; under
// mpirun, those of every rank (task).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "loom/core/memory_stats.hpp"
#include "loom/cuda/info.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/distributed/communicator.hpp"

namespace loom::tools {

void add_devices_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the devices a session creates");
  auto options = std::make_shared<device_options>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--virtual-cpus", options->virtual_cpu_devices,
                  "Split the CPU into this many logical devices")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--threads", options->cpu_threads, "CPU threads in all (0: the machine's)")
      ->check(CLI::Range(0, 1024));
  cmd->add_option("--gpus", options->cuda_device_count, "GPUs to use (-1: every visible one)")
      ->check(CLI::Range(-1, 1024));
  cmd->add_flag("--json", *json, "Print JSON");
  cmd->callback(guarded("devices", [options, json] {
    const auto devices = device_factory_registry::global().create_devices(*options);
    // Under mpirun, every rank's devices (rank r is /job:worker/task:r), printed by rank 0.
    const bool job = distributed::launched_with_peers();
    const int task = job ? distributed::world()->rank() : 0;
    nlohmann::json mine = nlohmann::json::array();
    for (const auto& d : devices) {
      const auto& a = d->attributes();
      mine.push_back({{"name", job ? task_device_name(task, a.id) : a.name},
                      {"task", task},
                      {"type", to_string(a.id.type)},
                      {"index", a.id.index},
                      {"memory_limit", a.memory_limit},
                      {"threads", a.threads},
                      {"description", a.description}});
    }
    nlohmann::json all = nlohmann::json::array();
    std::vector<std::string> cuda_lines{cuda::describe()};
    if (job) {
      const auto world = distributed::world();
      cuda_lines = distributed::all_gather_strings(*world, cuda_lines[0]);
      for (const auto& text : distributed::all_gather_strings(*world, mine.dump())) {
        for (auto& d : nlohmann::json::parse(text)) all.push_back(std::move(d));
      }
      if (task != 0) return;
    } else {
      all = std::move(mine);
    }
    if (*json) {
      fmt::print("{}\n", all.dump(2));
      return;
    }
    const std::size_t width = job ? 34 : 18;
    fmt::print("{:<{}} {:<6} {:>8} {:>14}  {}\n", "device", width, "type", "threads",
               "memory limit", "description");
    for (const auto& d : all) {
      const auto limit = d["memory_limit"].get<std::size_t>();
      fmt::print("{:<{}} {:<6} {:>8} {:>14}  {}\n", d["name"].get<std::string>(), width,
                 d["type"].get<std::string>(), d["threads"].get<int>(),
                 limit == 0 ? std::string("none") : format_bytes(limit),
                 d["description"].get<std::string>());
    }
    for (std::size_t t = 0; t < cuda_lines.size(); ++t) {
      fmt::print("CUDA{}: {}\n", job ? fmt::format(" (task {})", t) : std::string(),
                 cuda_lines[t]);
    }
  }));
}

}  // namespace loom::tools
