// `loom bench cuda` in builds without the CUDA backend: there is no such suite (bench/cuda is
// compiled only with the backend; tools/CMakeLists.txt picks this file or
// bench_cuda_command.cpp).
#include "commands.hpp"

namespace loom::tools {

void add_bench_cuda_command(CLI::App& /*bench*/) {}

}  // namespace loom::tools
