// Builds without NCCL (no CUDA toolkit, or no nccl.h / libnccl): the NCCL communicator is absent, and asking for it
// ends with exit 2 and a message that says how to get it.
#ifndef MT_HAVE_NCCL
#include "parallel/comm_nccl.h"

namespace mt::parallel {

bool comm_nccl_compiled() {
    return false;
}

int comm_nccl_local_device() {
    return -1;
}

std::unique_ptr<Comm> comm_make_nccl(Comm& bootstrap) {
    core::fail_hint(core::ExitCode::usage,
                    "rebuild with the CUDA toolkit and NCCL where CMake finds them (nccl.h and libnccl beside the "
                    "toolkit, or under NCCL_HOME); the configure step prints \"moetrain: NCCL found\"",
                    "this moetrain was built without NCCL, so rank {} cannot communicate GPU buffers",
                    bootstrap.rank());
}

}  // namespace mt::parallel
#endif
