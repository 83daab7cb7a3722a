// The loom command line: each subcommand adds itself to the app from one function, listed
// in main.cpp (no static registration).
#pragma once

#include <CLI/CLI.hpp>

namespace loom::tools {

/// `loom memreplay LOG [options]`: replays an allocation log against a configuration.
void add_memreplay_command(CLI::App& app);

/// `loom bench <suite>`: benchmarks against a peer measured in the same run.
void add_bench_command(CLI::App& app);

/// `loom devices`: the devices a session creates.
void add_devices_command(CLI::App& app);

/// `loom run GRAPH.json --feed name=FILE.npy --fetch name`: runs a serialized graph.
void add_run_command(CLI::App& app);

void add_train_command(CLI::App& app);

/// Set by a subcommand's callback: the process exit status.
int& exit_status();

}  // namespace loom::tools
