// How the CUDA optimizer kernels cut a multi-tensor chunk table into launches (Note [cuda
// optimizer steps] in optimizer_kernels.cpp). Host-only, so tests check it without a GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "loom/kernel/multi_tensor_apply.hpp"

namespace loom::cuda {

/// One launch: chunks [chunk_begin, chunk_end) of the table.
struct launch_group {
  std::size_t chunk_begin = 0;
  std::size_t chunk_end = 0;

  friend bool operator==(const launch_group&, const launch_group&) = default;
};

/// Consecutive runs of the table, each of at most `max_chunks` chunks of at most
/// `max_tensors` distinct tensors (kernels::optim_list_chunks and optim_list_tensors in
/// the kernels), covering the table in order. Throws loom::invalid_argument for limits < 1.
std::vector<launch_group> group_chunks(const std::vector<tensor_chunk>& table, int max_tensors,
                                       std::size_t max_chunks);

}  // namespace loom::cuda
