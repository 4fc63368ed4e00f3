// Entry points of the bilinear resize of the position table: argument checks (including the host grid values),
// dispatch by device, and the per-axis taps both devices share.
#include "ops/bilinear_resize.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/image_grids.h"
#include "ops/registry.h"

namespace mt::ops {

std::vector<BilinearTap> bilinear_taps(int64_t in, int64_t out) {
    MT_CHECK(in > 0 && out > 0, "bilinear_taps: sizes {} -> {} must be > 0", in, out);
    std::vector<BilinearTap> taps(static_cast<size_t>(out));
    if (in == out) {  // PyTorch's scale-1 case: a copy (its formula would give the same taps)
        for (int64_t i = 0; i < out; ++i) taps[i] = {static_cast<int32_t>(i), static_cast<int32_t>(i), 1.0, 0.0};
        return taps;
    }
    const double scale = static_cast<double>(in) / static_cast<double>(out);
    for (int64_t i = 0; i < out; ++i) {
        const double src = std::max(0.0, scale * (static_cast<double>(i) + 0.5) - 0.5);
        const auto i0 = static_cast<int64_t>(src);  // floor: src >= 0
        const int64_t i1 = i0 < in - 1 ? i0 + 1 : i0;
        const double l1 = std::clamp(src - static_cast<double>(i0), 0.0, 1.0);
        BilinearTap& t = taps[i];
        t.i0 = static_cast<int32_t>(i0);
        t.i1 = static_cast<int32_t>(i1);
        if (i1 == i0 || l1 == 0.0) {  // one input: weight 1 exactly (l0 + l1 would round)
            t.i1 = t.i0;
            t.l0 = 1.0;
            t.l1 = 0.0;
        } else {
            t.l0 = 1.0 - l1;
            t.l1 = l1;
        }
    }
    return taps;
}

BilinearSources bilinear_sources(int64_t in, int64_t out) {
    const std::vector<BilinearTap> taps = bilinear_taps(in, out);
    std::vector<std::vector<std::pair<int32_t, double>>> by_input(static_cast<size_t>(in));
    for (int64_t i = 0; i < out; ++i) {
        const BilinearTap& t = taps[i];
        by_input[t.i0].emplace_back(static_cast<int32_t>(i), t.l0);
        if (t.l1 != 0.0) by_input[t.i1].emplace_back(static_cast<int32_t>(i), t.l1);
    }
    BilinearSources s;
    s.first.push_back(0);
    for (const auto& list : by_input) {
        for (const auto& [i, w] : list) {
            s.out.push_back(i);
            s.weight.push_back(w);
        }
        s.first.push_back(static_cast<int32_t>(s.out.size()));
    }
    return s;
}

namespace {

// table: [Hm, Wm, C], rows: [P, C] on one device, one dtype family checked by the kernels; grids a host i32 [n, 2] of
// positive (h, w) whose sum of h w is P. Returns the device.
core::Device check_bilinear_resize_args(const Tensor& table,
                                        std::string_view table_arg,
                                        const Tensor& grids,
                                        const Tensor& rows,
                                        std::string_view rows_arg,
                                        std::string_view op) {
    check_arg(table, op, table_arg, 3);
    check_arg(rows, op, rows_arg, 2);
    MT_CHECK(table.size(0) > 0 && table.size(1) > 0,
             "{}: {} has shape {}; the table needs at least one row and one column",
             op,
             table_arg,
             core::shape_str(table.shape()));
    const int64_t total = cpu::check_image_grids(grids, op, /*even=*/false);
    MT_CHECK(total == rows.size(0),
             "{}: the grids hold {} patches but {} has {} rows ({})",
             op,
             total,
             rows_arg,
             rows.size(0),
             core::shape_str(rows.shape()));
    check_shape(rows, {total, table.size(2)}, op, rows_arg);
    return check_same_device(op, {{table_arg, table}, {rows_arg, rows}});
}

}  // namespace

void bilinear_resize_fwd(const Tensor& table, const Tensor& grids, const Tensor& y) {
    constexpr std::string_view op = "bilinear_resize_fwd";
    MT_CALL_KERNEL(bilinear_resize_fwd, check_bilinear_resize_args(table, "table", grids, y, "y", op), table, grids, y);
}

void bilinear_resize_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dtable) {
    constexpr std::string_view op = "bilinear_resize_bwd";
    MT_CALL_KERNEL(
        bilinear_resize_bwd, check_bilinear_resize_args(dtable, "dtable", grids, dy, "dy", op), grids, dy, dtable);
}

}  // namespace mt::ops
