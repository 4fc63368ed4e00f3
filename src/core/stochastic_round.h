// Stochastic rounding of f32 to bf16 (the AdamW moments under optim.state_dtype = "bf16"): x rounds up with
// probability equal to its distance from the lower bf16 neighbour over the gap, so the stored value is unbiased
// (E[stored] = x) and small updates to a large moment are not lost on average as they are under round-to-nearest.
// The random bits come from a counter-based hash of (stream, element index), the same on the CPU and the GPU and
// independent of threads, chunking and the mesh, so a run and its resume store the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace mt::core {

// The splitmix64 finalizer of stream + index * golden ratio: 32 well-mixed bits per (stream, index).
MT_HOST_DEVICE inline uint32_t sr_random_bits(uint64_t stream, uint64_t index) {
    uint64_t z = stream + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

// The stream of one moment at one optimizer step: the run's seed, the step and which moment (0: m, 1: v).
MT_HOST_DEVICE inline uint64_t sr_stream(uint64_t seed, int64_t step, int moment) {
    return sr_random_bits(seed ^ 0xA5A5A5A5A5A5A5A5ull, static_cast<uint64_t>(step) * 2 + moment) |
           (static_cast<uint64_t>(sr_random_bits(seed, static_cast<uint64_t>(step) * 2 + moment)) << 32);
}

// x's bf16 bits, rounded up or down by the low 16 of `bits`: adding them to the 16 bits that truncation drops
// carries into the kept half with the right probability. NaN stays a quiet NaN; infinities stay infinite.
MT_HOST_DEVICE inline uint16_t f32_to_bf16_stochastic(float x, uint32_t bits) {
    uint32_t u = 0;
#if defined(__CUDA_ARCH__)
    u = __float_as_uint(x);
#else
    std::memcpy(&u, &x, sizeof(u));
#endif
    if ((u & 0x7F800000u) == 0x7F800000u) return static_cast<uint16_t>((u >> 16) | ((u & 0x007FFFFFu) ? 0x40u : 0u));
    return static_cast<uint16_t>((u + (bits & 0xFFFFu)) >> 16);
}

}  // namespace mt::core
