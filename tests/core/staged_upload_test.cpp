// StagedUpload (core/staged_upload.h): every byte arrives, across chunk boundaries (each staging buffer reused
// while the chunk before it moves), with sizes that are not multiples of the chunk or of the OpenMP threads'
// pieces, and copy after copy. On the CPU (the chunking itself) and on the GPU (label gpu: pinned buffers, DMA on
// the current lane).
#include "core/staged_upload.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

using namespace mt::core;

namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    uint32_t x = seed;
    for (auto& b : v) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<uint8_t>(x >> 24);
    }
    return v;
}

// Copies of several sizes into one device tensor, each at its own offset, then the whole read back.
void check_uploads(Device device, size_t chunk) {
    const std::vector<size_t> sizes = {0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 7, (size_t{3} << 20) + 5};
    size_t total = 0;
    for (size_t n : sizes) total += n;
    const Tensor dst = Tensor::zeros({static_cast<int64_t>(total)}, DType::u8, device);
    std::vector<uint8_t> want;
    {
        StagedUpload upload(device, chunk);
        size_t at = 0;
        for (size_t k = 0; k < sizes.size(); ++k) {
            const std::vector<uint8_t> src = pattern(sizes[k], static_cast<uint32_t>(k + 1));
            upload.copy(static_cast<uint8_t*>(dst.raw()) + at, src.data(), src.size());
            want.insert(want.end(), src.begin(), src.end());
            at += sizes[k];
        }
    }
    const Tensor back = dst.to_device(Device::cpu);
    const auto* got = static_cast<const uint8_t*>(back.raw());
    size_t wrong = 0;
    for (size_t i = 0; i < total; ++i) wrong += got[i] != want[i] ? 1 : 0;
    EXPECT_EQ(wrong, 0u) << "of " << total << " bytes, chunk " << chunk;
}

}  // namespace

TEST(StagedUpload, EveryByteArrivesAcrossChunks) {
    check_uploads(Device::cpu, 4096);
    check_uploads(Device::cpu, 1000);
    check_uploads(Device::cpu, (size_t{4} << 20) + 3);  // chunks of several OpenMP pieces, the last one short
}

TEST(GpuStagedUpload, EveryByteArrivesAcrossChunks) {
    if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device";
    check_uploads(Device::cuda, 4096);
    check_uploads(Device::cuda, 1000);
    check_uploads(Device::cuda, size_t{1} << 20);
    // The default chunk (16 MiB, 16 pieces), copies of tens of MiB: the DMA of one chunk is still running while the
    // threads fill the other buffer, so a missing wait for a buffer's last DMA would show here.
    check_uploads(Device::cuda, size_t{16} << 20);
}
