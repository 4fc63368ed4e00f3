// The process-wide distributed runtime: MPI is started only when a launcher (mpirun, srun, mpiexec) started this
// process, so a plain `moetrain train` runs as one process with the self backend and never touches MPI.
#pragma once

#include <functional>
#include <memory>

#include "parallel/comm.h"

namespace mt::parallel {

// True when the environment shows an MPI launcher: OMPI_COMM_WORLD_SIZE (Open MPI), PMIX_RANK (PMIx: Open MPI 5,
// srun --mpi=pmix) or PMI_RANK / PMI_SIZE (MPICH's Hydra, Slurm's PMI-2).
bool dist_launched_by_mpi();

// Starts MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI) when dist_launched_by_mpi(), else does nothing.
// Idempotent. The world communicator is MPI_COMM_WORLD's duplicate, or the self backend.
void dist_init(int* argc, char*** argv);
// Drops the world communicator and ends MPI if dist_init started it. Idempotent.
void dist_finalize();
// True between dist_init starting MPI and dist_finalize.
bool dist_mpi_active();

// How many processes of this job the launcher started on this machine: OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI),
// MPI_LOCALNRANKS (MPICH's Hydra) or LOCAL_WORLD_SIZE (torchrun-style launchers), the first one set; 1 otherwise.
int dist_local_size();

// Every process of the job (the self communicator when MPI is not running).
Comm& dist_world();

// Ends the whole job with this exit code: MPI_Abort when MPI runs with more than one process (so the other ranks
// do not wait forever in a collective), else std::exit.
[[noreturn]] void dist_abort(int code);

// main() of a tool that may run under mpirun (the benchmarks): dist_init, then body(argc, argv); an Error ends the
// whole job with "<program>: error: [rank R] ..." on stderr and its exit code (dist_abort); dist_finalize. Returns
// body's result.
int dist_run_main(int argc, char** argv, const char* program, const std::function<int(int, char**)>& body);

// Implemented in comm_mpi.cpp: a communicator over a duplicate of MPI_COMM_WORLD (MPI must be running).
std::unique_ptr<Comm> comm_make_mpi_world();

}  // namespace mt::parallel
