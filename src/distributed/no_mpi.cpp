// world() in a build without MPI: loom::distributed needs Open MPI (libopenmpi-dev), which
// scripts/install-deps.sh installs; CMake builds mpi_communicator.cpp in place of this file
// when it finds MPI.
#include "loom/distributed/communicator.hpp"

namespace loom::distributed {

std::shared_ptr<communicator> world() {
  throw unsupported_error(
      "this loom was built without MPI: install Open MPI's libopenmpi-dev "
      "(scripts/install-deps.sh) and rebuild for loom::distributed");
}

}  // namespace loom::distributed
