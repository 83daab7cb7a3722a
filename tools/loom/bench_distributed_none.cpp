// `loom bench distributed` in builds without MPI: there is no such suite (bench/distributed
// is compiled only with MPI; tools/CMakeLists.txt picks this file or
// bench_distributed_command.cpp).
#include "commands.hpp"

namespace loom::tools {

void add_bench_distributed_command(CLI::App& /*bench*/) {}

}  // namespace loom::tools
