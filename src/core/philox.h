// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the normal draw built on
// it, as inline functions that nvcc compiles for the host and the device alike: core/rng.cpp draws on the CPU, the
// rng_fill op (ops/rng_fill.h) on the GPU, from this one definition. A draw is addressed by (seed, stream, counter).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace mt::core {

struct Philox4 {
    uint32_t v[4];
};

// One Philox4x32-10 block: key = seed, counter = (counter, stream) as four 32-bit words.
MT_HOST_DEVICE inline Philox4 philox4x32_block(uint64_t seed, uint64_t stream, uint64_t counter) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
    uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c0, p1 = static_cast<uint64_t>(kM1) * c2;
        const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += kW0;
        k1 += kW1;
    }
    return {{c0, c1, c2, c3}};
}

// Standard normal by Box-Muller on one Philox block (53-bit uniforms, u1 in (0, 1], u2 in [0, 1)), in double: the
// CPU's and the GPU's log and cos may differ in the last bit of the double, which rounding to f32 hides all but
// about once in 2^28 draws (then by one f32 ulp).
MT_HOST_DEVICE inline double philox_normal(uint64_t seed, uint64_t stream, uint64_t offset) {
    const Philox4 b = philox4x32_block(seed, stream, offset);
    const uint64_t a = (static_cast<uint64_t>(b.v[0]) << 32 | b.v[1]) >> 11;
    const uint64_t c = (static_cast<uint64_t>(b.v[2]) << 32 | b.v[3]) >> 11;
    const double u1 = (static_cast<double>(a) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(c) * 0x1.0p-53;
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    return sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2);
}

}  // namespace mt::core
