// Copies of ordinary (pageable) host memory into device memory at the host's memory speed: a checkpoint's tensors,
// read out of the file's mapping, on resume.
//
// A plain copy from pageable memory goes through the driver's own small staging buffer on one thread, and the page
// faults of a freshly mapped file come on top: kimi_linear_mini's 31 GB state loaded at 0.5 GB/s (61 s) through such
// copies and a copy back for the finiteness check (docs/PERFORMANCE.md, the restart downtime). StagedUpload keeps
// two pinned buffers of `chunk_bytes`; each chunk is copied into one of them by the OpenMP threads (faults and all,
// in parallel) while the DMA of the chunk before it, from the other buffer, runs on the current lane.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace mt::core {

class Backend;

class StagedUpload {
   public:
    // For copies into `device`'s memory (Device::cpu works too, as plain copies: the tests drive the chunking on it).
    explicit StagedUpload(Device device, size_t chunk_bytes = size_t{16} << 20);
    ~StagedUpload();
    StagedUpload(const StagedUpload&) = delete;
    StagedUpload& operator=(const StagedUpload&) = delete;

    // dst[0, bytes) = src[0, bytes): dst in the device's memory, src any host memory. Queued on the current lane
    // (core::exec()); returns when the bytes have arrived, as Backend::copy does, so that work on any stream (a
    // collective's) may read them next. The overlap is within one copy: chunk k + 1 is staged while chunk k moves.
    void copy(void* dst, const void* src, size_t bytes);
    Device device() const {
        return device_;
    }

   private:
    void wait(int slot);

    Device device_;
    Backend& backend_;
    size_t chunk_;
    uint8_t* staging_[2] = {nullptr, nullptr};
    uint64_t in_flight_[2] = {0, 0};  // the marker after the last DMA that reads each staging buffer (0: none)
    int next_ = 0;
};

}  // namespace mt::core
