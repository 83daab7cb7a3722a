// `loom devices`: the devices a session would create, with their memory and threads.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "loom/core/memory_stats.hpp"
#include "loom/cuda/info.hpp"
#include "loom/device/device_factory.hpp"

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
    if (*json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& d : devices) {
        const auto& a = d->attributes();
        out.push_back({{"name", a.name},
                       {"type", to_string(a.id.type)},
                       {"index", a.id.index},
                       {"memory_limit", a.memory_limit},
                       {"threads", a.threads},
                       {"description", a.description}});
      }
      fmt::print("{}\n", out.dump(2));
      return;
    }
    fmt::print("{:<18} {:<6} {:>8} {:>14}  {}\n", "device", "type", "threads", "memory limit",
               "description");
    for (const auto& d : devices) {
      const auto& a = d->attributes();
      fmt::print("{:<18} {:<6} {:>8} {:>14}  {}\n", a.name, to_string(a.id.type), a.threads,
                 a.memory_limit == 0 ? std::string("none") : format_bytes(a.memory_limit),
                 a.description);
    }
    fmt::print("CUDA: {}\n", cuda::describe());
  }));
}

}  // namespace loom::tools
