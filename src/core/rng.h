// Counter-based random numbers (Philox4x32-10). A draw is addressed by (seed, stream, offset), so the value of
// element i never depends on the number of threads or ranks that compute it, and the same numbers can be
// produced on a GPU later. Streams separate independent uses (one per parameter tensor, one per data epoch).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace mt::core {

// One Philox4x32-10 block: key = seed, counter = (stream, counter).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

// Uniform in [0, 1) with 24 random bits; element `offset` of the stream.
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t offset);
// Uniform 64-bit integer; element `offset` of the stream.
uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t offset);
// Standard normal (Box-Muller on one Philox block); element `offset` of the stream.
double rng_normal(uint64_t seed, uint64_t stream, uint64_t offset);

// Fills a contiguous float tensor: element i gets mean + std * rng_normal(seed, stream, offset + i).
void rng_fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, double mean, double std, uint64_t offset = 0);
// Fills a contiguous float tensor with lo + (hi - lo) * rng_uniform(seed, stream, i).
void rng_fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, double lo, double hi);

// Stable 64-bit hash of a string (FNV-1a), used to derive a stream id from a tensor name.
uint64_t hash_name(const char* name);

}  // namespace mt::core
