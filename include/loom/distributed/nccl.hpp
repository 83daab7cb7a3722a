/// Communicators of GPUs on NCCL (docs/distributed.md, "NCCL").
///
/// An NCCL communicator is a loom::distributed::communicator whose tensors live on one GPU
/// per rank: all_reduce, broadcast, all_gather, reduce_scatter, barrier and send / recv are
/// NCCL's, queued on a stream of the communicator's own. The stream handshake: each
/// operation first waits (an event, no host wait) for the work queued so far on the stream
/// its tensors are ordered on (the GPU's compute stream, for tensors of loom's pools), and
/// that stream then waits for the operation, so kernels queued after it read its results and
/// memory freed after it is not reused before it is done. wait() blocks the host until the
/// operation is complete, or until the communicator's timeout, when it aborts the NCCL
/// communicator and throws a loom::distributed_error. A work handle dropped before
/// completion does not wait: the tensors' stream does.
///
/// The graph ops of loom/graph/ops/collective.hpp run on a GPU through a group registered
/// with an NCCL communicator (distributed::register_group). NCCL is loaded when the first
/// communicator is made (libnccl.so.2), never by a process that does not make one.
#pragma once

#include <memory>
#include <string>

#include "loom/distributed/communicator.hpp"

namespace loom::distributed {

/// An NCCL communicator of the ranks of `bootstrap`, this rank on GPU `cuda_ordinal`.
/// Collective over `bootstrap` (every rank calls it; rank 0's NCCL id travels over it).
/// Throws loom::distributed_error naming the rank when the build has no CUDA backend, NCCL
/// cannot be loaded, the GPU is not there, or NCCL refuses.
[[nodiscard]] std::shared_ptr<communicator> make_nccl_communicator(
    const std::shared_ptr<communicator>& bootstrap, int cuda_ordinal);

/// "" when this process can make NCCL communicators (a CUDA build, a GPU, NCCL loadable),
/// else why not.
[[nodiscard]] std::string nccl_availability();

}  // namespace loom::distributed
