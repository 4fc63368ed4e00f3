// Entry points of the causal depthwise conv: argument checks, then the CPU reference or the CUDA kernels.
#include "ops/causal_conv1d.h"

#include <string_view>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/documents.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// Ranks, contiguity and shapes on any device: x [B, T, C], w [C, W], like_x as x.
void check_conv_shapes(const Tensor& x, const Tensor& w, std::initializer_list<NamedArg> like_x, std::string_view op) {
    check_arg(x, op, "x", 3);
    check_arg(w, op, "w", 2);
    MT_CHECK(w.size(0) == x.size(2),
             "{}: w has shape {} but x has {} channels; w must be [C, W]",
             op,
             core::shape_str(w.shape()),
             x.size(2));
    MT_CHECK(w.size(1) > 0, "{}: w has shape {}; the width W must be > 0", op, core::shape_str(w.shape()));
    for (const NamedArg& a : like_x) {
        check_arg(a.tensor, op, a.name, 3);
        check_shape(a.tensor, x.shape(), op, a.name);
    }
}

}  // namespace

void causal_conv1d_fwd(const Tensor& x, const Tensor& w, const Tensor& y, bool silu, const Tensor& doc_start) {
    constexpr std::string_view op = "causal_conv1d_fwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"w", w}, {"y", y}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_conv_shapes(x, w, {{"y", y}}, op);
    if (doc_start.defined()) cpu::check_doc_start_map(doc_start, x, op, "doc_start");
    // The CUDA kernels take the map themselves; the CPU convolves each document as its own sequence (its leading
    // positions read zero) on a copy of its rows (ops/cpu/documents.h).
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(causal_conv1d_fwd, core::Device::cuda, x, w, y, silu, doc_start);
    }
    if (doc_start.defined()) {
        for (const cpu::DocSpan& s : cpu::doc_spans(doc_start)) {
            const Tensor ys = cpu::doc_rows(y, s);
            MT_CALL_KERNEL(causal_conv1d_fwd, core::Device::cpu, cpu::doc_rows(x, s), w, ys, silu, Tensor());
            cpu::doc_view(y, s).copy_from(ys.select(0, 0));
        }
        return;
    }
    MT_CALL_KERNEL(causal_conv1d_fwd, core::Device::cpu, x, w, y, silu, Tensor());
}

void causal_conv1d_bwd(const Tensor& x,
                       const Tensor& w,
                       const Tensor& dy,
                       const Tensor& dx,
                       const Tensor& dw,
                       bool silu,
                       const Tensor& doc_start) {
    constexpr std::string_view op = "causal_conv1d_bwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}, {"dw", dw}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_conv_shapes(x, w, {{"dy", dy}, {"dx", dx}}, op);
    check_arg(dw, op, "dw", 2);
    check_shape(dw, w.shape(), op, "dw");
    if (doc_start.defined()) cpu::check_doc_start_map(doc_start, x, op, "doc_start");
    // As the forward: the CUDA kernels take the map; the CPU runs each document alone, dw accumulating over them.
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(causal_conv1d_bwd, core::Device::cuda, x, w, dy, dx, dw, silu, doc_start);
    }
    if (doc_start.defined()) {
        for (const cpu::DocSpan& s : cpu::doc_spans(doc_start)) {
            const Tensor dxs = cpu::doc_rows(dx, s);
            MT_CALL_KERNEL(causal_conv1d_bwd,
                           core::Device::cpu,
                           cpu::doc_rows(x, s),
                           w,
                           cpu::doc_rows(dy, s),
                           dxs,
                           dw,
                           silu,
                           Tensor());
            cpu::doc_view(dx, s).copy_from(dxs.select(0, 0));
        }
        return;
    }
    MT_CALL_KERNEL(causal_conv1d_bwd, core::Device::cpu, x, w, dy, dx, dw, silu, Tensor());
}

}  // namespace mt::ops
