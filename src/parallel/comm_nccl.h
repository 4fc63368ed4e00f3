// The NCCL backend of Comm: the same operations over GPU buffers, for the GPU half of every parallel layout. An
// NCCL communicator is bootstrapped over an existing (MPI) Comm of the same ranks, which carries NCCL's unique id.
// Builds without NCCL (no CUDA, or no nccl.h / libnccl) compile comm_nccl_stub.cpp instead.
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace mt::parallel {

// True when this build contains the NCCL backend (MT_HAVE_NCCL).
bool comm_nccl_compiled();

// The GPU this process drives: its rank on the node (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID or
// LOCAL_RANK, the first one set), else the world rank, modulo the visible devices. -1 without a GPU or NCCL.
int comm_nccl_local_device();

// A communicator over the ranks of `bootstrap` (same ranks, same order) that moves GPU buffers with NCCL. Collective
// over `bootstrap`: rank 0 makes NCCL's unique id and broadcasts it, every rank makes comm_nccl_local_device() the
// current CUDA device and joins (ncclCommInitRank). Call it before other CUDA work of the process, so the ops'
// stream and allocations live on the same device. In a build without NCCL it fails with exit 2.
//
// Semantics beyond comm.h:
// * Every buffer is device memory of the current device. Each operation first waits (on the GPU) for the work
//   already queued on the ops' stream (core::exec_stream()), then runs on the communicator's own stream;
//   CommWork::wait() blocks the host until it has completed, and reports NCCL's asynchronous errors (exit 6)
//   instead of hanging; CommWork::wait_on_device() makes the ops' stream wait for it instead. A watchdog thread
//   polls every live communicator for asynchronous errors and ends the process with exit 6 on one, so a rank whose
//   GPU work waits on a failed collective does not block forever.
// * send and recv are not issued at once: consecutive ones are batched and issued as one NCCL group at the next
//   operation of this communicator, or when one of their handles is waited for or polled. So the MPI idiom "post
//   the receive, post the send, wait" works (NCCL runs point-to-point operations only in stream order, and a
//   lone receive posted before the matching send would deadlock). Tags are not matched: messages between two
//   ranks arrive in the order they were sent.
// * split() needs color >= 0 on every rank (NCCL has no "not in any group" here, unlike MPI_UNDEFINED).
std::unique_ptr<Comm> comm_make_nccl(Comm& bootstrap);

}  // namespace mt::parallel
