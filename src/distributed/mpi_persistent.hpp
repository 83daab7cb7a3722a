// A persistent all-gather (made once, started with MPI_Start each time): MPI 4's, or the same
// call in Open MPI 4's pcollreq extension. Used by the MPI communicator's agreement exchange
// (Note [agreeing ranks] in mpi_communicator.cpp) and by `loom bench distributed`, which makes
// the same exchange directly as the floor of a checked collective.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#if MPI_VERSION < 4
#include <mpi-ext.h>
#endif

namespace loom::distributed {

inline int allgather_init(const void* send, int send_count, MPI_Datatype send_type, void* recv, int recv_count,
                          MPI_Datatype recv_type, MPI_Comm comm, MPI_Info info, MPI_Request* request) {
#if MPI_VERSION >= 4
  return MPI_Allgather_init(send, send_count, send_type, recv, recv_count, recv_type, comm, info, request);
#elif defined(OMPI_HAVE_MPI_EXT_PCOLLREQ)
  return MPIX_Allgather_init(send, send_count, send_type, recv, recv_count, recv_type, comm, info, request);
#else
#error "loom's MPI communicator needs persistent collectives: MPI 4, or Open MPI 4's pcollreq extension"
#endif
}

}  // namespace loom::distributed
