// loom: the command-line tool.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "commands.hpp"
#include "loom/core/error.hpp"
#include "loom/core/input.hpp"

namespace loom::tools {

int& exit_status() {
  static int status = 0;
  return status;
}

namespace {

// One line on stderr; printing must not throw out of an error report.
void say(std::string_view who, std::string_view message) noexcept {
  try {
    fmt::print(stderr, "{}: {}\n", who, message);
  } catch (...) {
    std::fputs("loom: an error occurred, and printing its message failed\n", stderr);
  }
}

}  // namespace

int report_current_exception(std::string_view who) noexcept {
  try {
    throw;
  } catch (const parse_error& e) {
    say(who, e.what());
    return exit_usage;
  } catch (const error& e) {
    say(who, e.what());
    return exit_failure;
  } catch (const std::bad_alloc& e) {  // loom::out_of_memory too
    try {
      say(who, fmt::format("out of memory: {}", e.what()));
    } catch (...) {
      say(who, "out of memory");
    }
    return exit_failure;
  } catch (const std::filesystem::filesystem_error& e) {
    say(who, e.what());  // names the path(s) and the system's reason
    return exit_failure;
  } catch (const nlohmann::json::parse_error& e) {
    try {
      say(who, fmt::format("malformed JSON: {}", e.what()));
    } catch (...) {
      say(who, "malformed JSON");
    }
    return exit_usage;
  } catch (const nlohmann::json::exception& e) {
    try {
      say(who, fmt::format("JSON: {}", e.what()));
    } catch (...) {
      say(who, "JSON error");
    }
    return exit_failure;
  } catch (const std::system_error& e) {
    say(who, e.what());
    return exit_failure;
  } catch (const std::exception& e) {
    try {
      say(who, fmt::format("internal error: {}", e.what()));
    } catch (...) {
      say(who, "internal error");
    }
    return exit_internal;
  } catch (...) {
    say(who, "internal error: an exception that is not a std::exception");
    return exit_internal;
  }
}

std::function<void()> guarded(std::string command, std::function<void()> work) {
  return [who = "loom " + std::move(command), work = std::move(work)] {
    try {
      work();
    } catch (const CLI::Error&) {
      throw;  // usage: main() prints it with the pointer to --help
    } catch (...) {
      exit_status() = report_current_exception(who);
    }
  };
}

CLI::Validator finite_positive() {
  return {[](std::string& text) -> std::string {
            double v = 0;
            try {
              v = parse_number<double>(text, "the value");
            } catch (const parse_error&) {
              return fmt::format("'{}' is not a number", text);
            }
            if (!std::isfinite(v) || v <= 0) {
              return fmt::format("{} is not a finite number > 0", text);
            }
            return {};
          },
          "FINITE > 0", "finite positive number"};
}

CLI::Validator non_negative_integer() {
  return {[](std::string& text) -> std::string {
            try {
              (void)parse_number<std::uint64_t>(text, "the value");
            } catch (const parse_error&) {
              return fmt::format("'{}' is not an integer from 0 to 2^64 - 1", text);
            }
            return {};
          },
          "UINT64", "non-negative integer"};
}

void usage_error(const std::string& option, const std::string& message) {
  throw CLI::ValidationError(option, message);
}

}  // namespace loom::tools

int main(int argc, char** argv) {
  using namespace loom::tools;
  int status = 0;
  try {
    CLI::App app{
        "loom: a device-aware tensor runtime. Exit status: 0 done, 1 the work failed, "
        "2 bad usage or input that does not parse, 70 internal error (docs/cli.md)"};
    app.require_subcommand(1);
    add_memreplay_command(app);
    add_bench_command(app);
    add_devices_command(app);
    add_run_command(app);
    add_train_command(app);
    try {
      app.parse(argc, argv);
      status = exit_status();
    } catch (const CLI::Error& e) {
      // A first word that names no subcommand: say so, with the ones there are (CLI11 says
      // only that a subcommand is required).
      std::vector<std::string> names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
        names.push_back(sub->get_name());
      }
      if (argc > 1 && argv[1][0] != '-' &&
          std::find(names.begin(), names.end(), argv[1]) == names.end()) {
        std::fprintf(stderr, "loom: unknown subcommand '%s' (loom has: %s; loom --help says more)\n",
                     argv[1], fmt::format("{}", fmt::join(names, ", ")).c_str());
        return exit_usage;
      }
      // Help (--help) is a CLI::Success: status 0; every other CLI11 error is usage.
      status = app.exit(e) == 0 ? 0 : exit_usage;
    }
  } catch (...) {
    status = report_current_exception("loom");
  }
  // Output that could not be written (a full disk, a closed pipe) is a failure too.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int err = errno;
    std::fprintf(stderr, "loom: writing the standard output failed: %s\n",
                 err != 0 ? std::strerror(err) : "unknown reason");
    if (status == 0) status = exit_failure;
  }
  return status;
}
