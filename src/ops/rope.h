// Rotary position embedding, "rotate half" layout (as Llama / Hugging Face): for i < D/2,
//   angle = (pos_offset + p) * theta^(-2i/D), p = positions[b, t] when given, else t
//   y[i]       = x[i] cos(angle) - x[i + D/2] sin(angle)
//   y[i + D/2] = x[i + D/2] cos(angle) + x[i] sin(angle)
//   x, y: [B, T, H, D] f32|f64, D even; y may alias x.
//   positions: optional [B, T] i32 on the device of x, each in [0, max(T, position_limit)): the token's position in
//   its own document (t - doc_start[b, t] of a packed batch, long_context.md §2), so that positions restart at every
//   document. A sequence segment (long_context.md §4) passes the end of its positions in the whole sequence as the
//   limit: a document that began in an earlier segment continues its count.
// _bwd applies the inverse rotation: dx written (=), may alias dy. Saves nothing.
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

void rope_fwd(const Tensor& x,
              double theta,
              int64_t pos_offset,
              const Tensor& y,
              const Tensor& positions = Tensor(),
              int64_t position_limit = 0);
void rope_bwd(const Tensor& dy,
              double theta,
              int64_t pos_offset,
              const Tensor& dx,
              const Tensor& positions = Tensor(),
              int64_t position_limit = 0);

}  // namespace mt::ops
