// 2-D rotary position embedding of the ViT's patches (multimodal.md §1, vision.pos = "rope2d"). Each head of dim D
// (D divisible by 4) is two halves of D/2: the first, [0, D/2), rotates by the patch's row index r = rows[t], the
// second, [D/2, D), by its column index c = cols[t]. Within each half (offset o = 0 with index p = r, o = D/2 with
// p = c) the "rotate half" pairing of ops/rope.h applies to a head of dim D/2: for i < D/4,
//   angle = p * theta^(-2i/(D/2)) = p * theta^(-4i/D)
//   y[o + i]       = x[o + i] cos(angle) - x[o + i + D/4] sin(angle)
//   y[o + i + D/4] = x[o + i + D/4] cos(angle) + x[o + i] sin(angle)
// so half h of rope2d equals rope_fwd on that half alone (head dim D/2) at positions rows (h = 0) or cols (h = 1).
//   x, y: [T, H, D] f32|f64 (CUDA: bf16|f16|f32, y the dtype of x), T = the packed patches of every image
//   rows, cols: [T] i32 on the device of x, each >= 0: the patch's row and column in its image's grid (checked on the
//   CPU; a device tensor is not read back)
//   theta: the base, > 0 (10000 by default, as the spec's theta_i)
// The angles are computed in f64 and cos, sin rounded to the math dtype (f32 on CUDA). y may alias x.
// _bwd applies the inverse rotation (sin -> -sin): dx written (=), may alias dy. Saves nothing.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

inline constexpr double kRope2dTheta = 10000.0;

void rope2d_fwd(const Tensor& x, const Tensor& rows, const Tensor& cols, const Tensor& y, double theta = kRope2dTheta);
void rope2d_bwd(
    const Tensor& dy, const Tensor& rows, const Tensor& cols, const Tensor& dx, double theta = kRope2dTheta);

}  // namespace mt::ops
