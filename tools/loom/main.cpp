// loom: the command-line tool.
#include <fmt/format.h>

#include <exception>
#include <new>

#include "commands.hpp"
#include "loom/core/error.hpp"

namespace loom::tools {
int& exit_status() {
  static int status = 0;
  return status;
}
}  // namespace loom::tools

int main(int argc, char** argv) {
  CLI::App app{"loom: a device-aware tensor runtime"};
  app.require_subcommand(1);
  loom::tools::add_memreplay_command(app);
  loom::tools::add_bench_command(app);
  loom::tools::add_devices_command(app);
  loom::tools::add_run_command(app);
  loom::tools::add_train_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const loom::parse_error& e) {
    fmt::print(stderr, "loom: {}\n", e.what());
    return 2;
  } catch (const loom::error& e) {
    fmt::print(stderr, "loom: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc& e) {
    fmt::print(stderr, "loom: out of memory: {}\n", e.what());
    return 1;
  }
  return loom::tools::exit_status();
}
