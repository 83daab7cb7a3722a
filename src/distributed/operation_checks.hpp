// What every communicator checks before it starts an operation, whatever engine moves the
// bytes (MPI's in mpi_communicator.cpp, NCCL's in src/backends/cuda/nccl_communicator.cpp):
// each returns "" when the call is fine, else what is wrong, for the communicator to raise
// as its distributed_error naming the rank.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "loom/core/tensor.hpp"

namespace loom::distributed::checks {

inline std::string not_dense(const tensor& t, std::string_view role) {
  return t.is_contiguous() ? std::string() : fmt::format("the {} {} is not dense", role, t.describe());
}

inline std::string not_same_layout(const tensor& in, const tensor& out) {
  if (in.type() == out.type() && in.shape() == out.shape()) return {};
  return fmt::format("the output {} is not of the input's dtype and shape {}", out.describe(),
                     in.describe());
}

// whole = `size` blocks of `part` along dimension 0, of its dtype.
inline std::string not_blocks(const tensor& whole, const tensor& part, int size,
                              std::string_view whole_role, std::string_view part_role) {
  bool ok = whole.type() == part.type() && whole.rank() == part.rank() && part.rank() >= 1 &&
            whole.shape()[0] == part.shape()[0] * size;
  for (std::size_t d = 1; ok && d < part.rank(); ++d) ok = whole.shape()[d] == part.shape()[d];
  if (ok) return {};
  return fmt::format("the {} must be {} blocks of the {} along dimension 0, of its dtype (rank "
                     "1 or more)",
                     whole_role, size, part_role);
}

inline std::string not_peer(int r, int size, std::string_view role) {
  return r >= 0 && r < size ? std::string() : fmt::format("{} {} is not a rank of {}", role, r, size);
}

}  // namespace loom::distributed::checks
