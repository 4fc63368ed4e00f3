// KDA's short conv over rows that continue earlier ones (long_context.md §4 and §7): a sequence segment, or a
// context-parallel span, whose first rows read the W - 1 projection rows before them (the halo) from the segment or
// span that holds those. The halo's rows go first into the causal conv and their outputs are dropped; in the
// backward the halo rows' input gradient is what their owner adds to its own.
#pragma once

#include "core/tensor.h"

namespace mt::nn {

// x [B, T, C] the rows, halo [B, W - 1, C] the rows before them or undefined (the rows start the sequence; positions
// before them read zero), w [C, W]; y [B, T, C] = SiLU(conv) written. doc_start: the document map of the rows read,
// [B, W - 1 + T] with a halo and [B, T] without (nn/segments.h doc_map_from), or undefined.
void conv_halo_forward(const core::Tensor& halo,
                       const core::Tensor& x,
                       const core::Tensor& w,
                       const core::Tensor& y,
                       const core::Tensor& doc_start);
// dx [B, T, C] written (=), dw accumulated (+=); with a halo, its rows' gradient returned ([B, W - 1, C]), else an
// undefined tensor.
core::Tensor conv_halo_backward(const core::Tensor& halo,
                                const core::Tensor& x,
                                const core::Tensor& w,
                                const core::Tensor& dy,
                                const core::Tensor& dx,
                                const core::Tensor& dw,
                                const core::Tensor& doc_start);

}  // namespace mt::nn
