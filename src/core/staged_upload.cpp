// Host-to-device copies through two pinned staging buffers: see staged_upload.h.
#include "core/staged_upload.h"

#include <algorithm>
#include <cstring>

#include "core/backend.h"
#include "core/exec.h"

namespace mt::core {

namespace {

// The OpenMP threads' share of a chunk.
constexpr size_t kPiece = size_t{1} << 20;

}  // namespace

StagedUpload::StagedUpload(Device device, size_t chunk_bytes)
    : device_(device), backend_(backend_get(device)), chunk_(std::max<size_t>(chunk_bytes, 1)) {
    for (uint8_t*& buffer : staging_) buffer = static_cast<uint8_t*>(backend_.alloc_pinned(chunk_));
}

StagedUpload::~StagedUpload() {
    for (int slot = 0; slot < 2; ++slot) {
        try {
            wait(slot);  // only after a copy that threw
        } catch (...) {  // a failed device: that copy's caller has its error
        }
        backend_.free_pinned(staging_[slot]);
    }
}

void StagedUpload::wait(int slot) {
    const uint64_t marker = in_flight_[slot];
    in_flight_[slot] = 0;  // waited for once, even if the wait throws
    if (marker != 0) backend_.marker_wait(marker);
}

void StagedUpload::copy(void* dst, const void* src, size_t bytes) {
    auto* out = static_cast<uint8_t*>(dst);
    const auto* in = static_cast<const uint8_t*>(src);
    for (size_t at = 0; at < bytes; at += chunk_) {
        const size_t n = std::min(chunk_, bytes - at);
        const int slot = next_;
        next_ ^= 1;
        wait(slot);  // the DMA two chunks back read this buffer
        uint8_t* stage = staging_[slot];
        const auto pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
        for (int64_t p = 0; p < pieces; ++p) {
            const size_t lo = static_cast<size_t>(p) * kPiece;
            std::memcpy(stage + lo, in + at + lo, std::min(kPiece, n - lo));
        }
        backend_.copy_async(out + at, device_, stage, Device::cpu, n);
        in_flight_[slot] = backend_.lane_marker(exec().lane);
    }
    wait(0);
    wait(1);
}

}  // namespace mt::core
