// Fill with counter-based normal draws (Philox4x32-10, core/philox.h): element i of out gets
// mean + std * N(seed, stream, offset + i), the draw of core::rng_normal, so a tensor initialised on the GPU holds the
// numbers the CPU would draw (the parameter init of nn::ParamTable, performance issue item 6: billions of draws
// on the host took tens of seconds). offset lets a shard draw its slice of a larger tensor's stream.
//   out: any shape, contiguous; CPU f32|f64|bf16|f16, CUDA f32|bf16|f16; written (=)
// The value is computed in double and rounded once to out's dtype on both devices. The CPU's and the GPU's double
// log and cos may differ in the last bit, which the rounding to f32 hides except about once in 2^28 draws (then
// by one f32 ulp): the parity check counts them.
// No backward (a constant of the model's seed).
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

void rng_fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std);

}  // namespace mt::ops
