// The loom command line: each subcommand adds itself to the app from one function, listed
// in main.cpp (no static registration).
//
// Note [exit statuses]
// Every command ends with one of these statuses (docs/cli.md), never with a signal of its
// own making (no std::terminate, no abort):
//   0   it did what was asked;
//   1   the work failed: a file operation, a node, out of memory, a non-finite loss, a
//       replay that does not fit, nothing to resume from with --resume=require, ...;
//   2   usage: the command line is wrong (an unknown option, a value out of range, a path
//       that cannot be used for what its option asks), or an input file does not parse
//       (graph JSON, .npy, CSV, checkpoint, allocation log);
//   70  an internal error: an exception loom does not expect (a defect; please report it).
// Each subcommand's callback runs through guarded(), which reports what it throws on
// stderr as "loom <command>: <message>"; CLI11's usage errors pass on to main(), which
// prints them with a pointer to --help.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <string_view>

namespace loom::tools {

inline constexpr int exit_failure = 1;
inline constexpr int exit_usage = 2;
inline constexpr int exit_internal = 70;  // sysexits.h's EX_SOFTWARE

/// `loom memreplay LOG [options]`: replays an allocation log against a configuration.
void add_memreplay_command(CLI::App& app);

/// `loom bench <suite>`: benchmarks against a peer measured in the same run.
void add_bench_command(CLI::App& app);

/// `loom bench cuda`: adds the GPU suite to `bench` in builds with the CUDA backend
/// (bench_cuda_command.cpp); adds nothing in builds without it (bench_cuda_none.cpp).
void add_bench_cuda_command(CLI::App& bench);
/// `loom bench distributed` (MPI builds; a no-op otherwise).
void add_bench_distributed_command(CLI::App& bench);

/// `loom devices`: the devices a session creates.
void add_devices_command(CLI::App& app);

/// `loom run GRAPH.json --feed name=FILE.npy --fetch name`: runs a serialized graph.
void add_run_command(CLI::App& app);

/// `loom train [options]`: trains a classifier and prints a summary.
void add_train_command(CLI::App& app);

/// Set by a subcommand's callback: the process exit status.
int& exit_status();

/// Reports the exception being handled on stderr ("<who>: <message>") and returns its exit
/// status (Note [exit statuses]). Call it only inside a catch block.
int report_current_exception(std::string_view who) noexcept;

/// A subcommand's callback: runs `work`, and reports anything it throws but CLI11's own
/// errors (report_current_exception, as "loom <command>"), setting exit_status().
[[nodiscard]] std::function<void()> guarded(std::string command, std::function<void()> work);

/// A CLI11 check that the option's value is a finite number > 0 (a learning rate).
[[nodiscard]] CLI::Validator finite_positive();

/// A CLI11 check that the option's value is an integer from 0 to 2^64 - 1 (a seed).
[[nodiscard]] CLI::Validator non_negative_integer();

/// The usage error for option `option` (exit status 2): throws CLI::ValidationError naming
/// the option, with `message`.
[[noreturn]] void usage_error(const std::string& option, const std::string& message);

}  // namespace loom::tools
