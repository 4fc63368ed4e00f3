// The short conv with a halo: the halo rows prepended, the conv over both, the halo's outputs dropped.
#include "nn/layers/conv_halo.h"

#include "nn/segments.h"
#include "ops/causal_conv1d.h"

namespace mt::nn {

namespace {

// [B, W - 1 + T, C]: the halo rows, then x's.
core::Tensor with_halo(const core::Tensor& halo, const core::Tensor& x) {
    const int64_t w1 = halo.size(1), t = x.size(1);
    const core::Tensor ext = core::Tensor::scratch({x.size(0), w1 + t, x.size(2)}, x.dtype(), x.device());
    copy_time_rows(ext, 0, halo, 0, w1);
    copy_time_rows(ext, w1, x, 0, t);
    return ext;
}

}  // namespace

void conv_halo_forward(const core::Tensor& halo,
                       const core::Tensor& x,
                       const core::Tensor& w,
                       const core::Tensor& y,
                       const core::Tensor& doc_start) {
    if (!halo.defined()) {
        ops::causal_conv1d_fwd(x, w, y, true, doc_start);
        return;
    }
    const core::Tensor ext = with_halo(halo, x);
    const core::Tensor y_ext = core::Tensor::scratch(ext.shape(), y.dtype(), y.device());
    ops::causal_conv1d_fwd(ext, w, y_ext, true, doc_start);
    copy_time_rows(y, 0, y_ext, halo.size(1), x.size(1));
}

core::Tensor conv_halo_backward(const core::Tensor& halo,
                                const core::Tensor& x,
                                const core::Tensor& w,
                                const core::Tensor& dy,
                                const core::Tensor& dx,
                                const core::Tensor& dw,
                                const core::Tensor& doc_start) {
    if (!halo.defined()) {
        ops::causal_conv1d_bwd(x, w, dy, dx, dw, true, doc_start);
        return {};
    }
    const core::Tensor ext = with_halo(halo, x);
    const int64_t w1 = halo.size(1), t = x.size(1);
    // The halo's outputs were dropped: no gradient flows into them.
    const core::Tensor dy_ext = core::Tensor::zeros(ext.shape(), dy.dtype(), dy.device());
    copy_time_rows(dy_ext, w1, dy, 0, t);
    const core::Tensor dx_ext = core::Tensor::scratch(ext.shape(), dx.dtype(), dx.device());
    ops::causal_conv1d_bwd(ext, w, dy_ext, dx_ext, dw, true, doc_start);
    copy_time_rows(dx, 0, dx_ext, w1, t);
    const core::Tensor dhalo = core::Tensor::scratch(halo.shape(), dx.dtype(), dx.device());
    copy_time_rows(dhalo, 0, dx_ext, 0, w1);
    return dhalo;
}

}  // namespace mt::nn
