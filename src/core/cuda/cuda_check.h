// CUDA error checks and NVTX ranges for the CUDA half (include only from .cu files).
#pragma once

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "core/error.h"
#include "core/trace.h"

namespace mt::core {

[[noreturn]] void cuda_fail(cudaError_t err, const char* what, const char* file, int line);

// The stream every CUDA op and copy runs on (one per process for now; deterministic order).
cudaStream_t cuda_stream();

// An NVTX range for the lifetime of the object, named after the op (and a profile entry, core/trace.h).
class NvtxRange {
   public:
    explicit NvtxRange(const char* name) {
        nvtxRangePushA(name);
        profile_begin(name);
    }
    ~NvtxRange() {
        profile_end();
        nvtxRangePop();
    }
    NvtxRange(const NvtxRange&) = delete;
    NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace mt::core

// Every CUDA runtime call and every launch (MT_CUDA_CHECK(cudaGetLastError())) goes through this.
#define MT_CUDA_CHECK(expr)                                                                    \
    do {                                                                                       \
        const cudaError_t mt_err_ = (expr);                                                    \
        if (mt_err_ != cudaSuccess) ::mt::core::cuda_fail(mt_err_, #expr, __FILE__, __LINE__); \
    } while (0)
