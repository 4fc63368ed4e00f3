// Rotary position embedding, "rotate half" layout (as Llama / Hugging Face): for i < D/2,
//   angle = (pos_offset + t) * theta^(-2i/D)
//   y[i]       = x[i] cos(angle) - x[i + D/2] sin(angle)
//   y[i + D/2] = x[i + D/2] cos(angle) + x[i] sin(angle)
//   x, y: [B, T, H, D] f32|f64, D even; y may alias x.
// _bwd applies the inverse rotation: dx written (=), may alias dy. Saves nothing.
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

void rope_fwd(const Tensor& x, double theta, int64_t pos_offset, const Tensor& y);
void rope_bwd(const Tensor& dy, double theta, int64_t pos_offset, const Tensor& dx);

}  // namespace mt::ops
