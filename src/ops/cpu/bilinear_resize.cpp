// CPU reference of the bilinear resize of the position table (ops/bilinear_resize.h): the forward reads each output
// row's (up to) 2 x 2 taps; the backward gathers, per table cell, the output rows that read it (no scatter, so the
// cells are independent and the threads never share a sum).
#include "ops/bilinear_resize.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

// One packed output row: its image's first row, and the row and column taps of its place (i, j) in the grid.
struct RowTaps {
    BilinearTap r, c;
};

std::vector<RowTaps> packed_taps(const Tensor& grids, int64_t hm, int64_t wm) {
    const int32_t* g = grids.data<int32_t>();
    std::vector<RowTaps> rows;
    for (int64_t k = 0; k < grids.size(0); ++k) {
        const std::vector<BilinearTap> rt = bilinear_taps(hm, g[2 * k]), ct = bilinear_taps(wm, g[2 * k + 1]);
        for (const BilinearTap& r : rt)
            for (const BilinearTap& c : ct) rows.push_back({r, c});
    }
    return rows;
}

// y[t, :] = sum over the row taps (a, la) and column taps (b, lb) of row t of la lb table[a, b, :], the zero-weight
// taps skipped (so a 1:1 axis copies exactly).
template <typename T>
void bilinear_resize_forward(const std::vector<RowTaps>& taps, const T* table, int64_t wm, int64_t c, T* y) {
    const auto p = static_cast<int64_t>(taps.size());
#pragma omp parallel for schedule(static) if (p * c >= kParallelMinWork)
    for (int64_t t = 0; t < p; ++t) {
        const RowTaps& tp = taps[t];
        const int32_t ra[2] = {tp.r.i0, tp.r.i1}, cb[2] = {tp.c.i0, tp.c.i1};
        const T rw[2] = {static_cast<T>(tp.r.l0), static_cast<T>(tp.r.l1)};
        const T cw[2] = {static_cast<T>(tp.c.l0), static_cast<T>(tp.c.l1)};
        T* out = y + t * c;  // [c]
        for (int64_t j = 0; j < c; ++j) out[j] = T(0);
        for (int u = 0; u < 2; ++u) {
            if (rw[u] == T(0)) continue;
            for (int v = 0; v < 2; ++v) {
                if (cw[v] == T(0)) continue;
                const T w = rw[u] * cw[v];
                const T* src = table + (ra[u] * wm + cb[v]) * c;  // [c]
                for (int64_t j = 0; j < c; ++j) out[j] += w * src[j];
            }
        }
    }
}

// One image's sources along both axes of the table, and its first packed row and grid width.
struct ImageSources {
    BilinearSources rows, cols;
    int64_t first = 0, w = 0;
};

// dtable[a, b, :] += sum over images, over the rows (i, wi) reading a, over the columns (j, wj) reading b, of
// wi wj dy[first + i w + j, :], summed in that order into a zeroed row first.
template <typename T>
void bilinear_resize_backward(
    const std::vector<ImageSources>& images, const T* dy, int64_t hm, int64_t wm, int64_t c, T* dtable) {
#pragma omp parallel if (hm * wm * c >= kParallelMinWork)
    {
        std::vector<T> acc(static_cast<size_t>(c));
#pragma omp for schedule(static)
        for (int64_t cell = 0; cell < hm * wm; ++cell) {
            const int64_t a = cell / wm, b = cell % wm;
            std::fill(acc.begin(), acc.end(), T(0));
            for (const ImageSources& im : images) {
                for (int32_t e = im.rows.first[a]; e < im.rows.first[a + 1]; ++e) {
                    const auto wi = static_cast<T>(im.rows.weight[e]);
                    for (int32_t f = im.cols.first[b]; f < im.cols.first[b + 1]; ++f) {
                        const T w = wi * static_cast<T>(im.cols.weight[f]);
                        const T* src = dy + (im.first + int64_t{im.rows.out[e]} * im.w + im.cols.out[f]) * c;  // [c]
                        for (int64_t j = 0; j < c; ++j) acc[j] += w * src[j];
                    }
                }
            }
            T* out = dtable + cell * c;  // [c]
            for (int64_t j = 0; j < c; ++j) out[j] += acc[j];
        }
    }
}

}  // namespace

// The CPU kernel of ops::bilinear_resize_fwd (registered in the op registry): the CPU dtypes, then the resize.
void bilinear_resize_fwd(const Tensor& table, const Tensor& grids, const Tensor& y) {
    constexpr std::string_view op = "bilinear_resize_fwd";
    check_float_arg(table, op, "table", 3);
    check_float_arg(y, op, "y", 2);
    check_dtype_as(y, table, op, "y", "table");
    const int64_t hm = table.size(0), wm = table.size(1), c = table.size(2);
    const std::vector<RowTaps> taps = packed_taps(grids, hm, wm);
    MT_DISPATCH_FLOAT(
        table.dtype(), op, bilinear_resize_forward(taps, table.data<scalar_t>(), wm, c, y.data<scalar_t>()));
}
MT_REGISTER_KERNEL(bilinear_resize_fwd, cpu, bilinear_resize_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::bilinear_resize_bwd (registered in the op registry): the CPU dtypes, then the gather.
void bilinear_resize_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dtable) {
    constexpr std::string_view op = "bilinear_resize_bwd";
    check_float_arg(dtable, op, "dtable", 3);
    check_float_arg(dy, op, "dy", 2);
    check_dtype_as(dy, dtable, op, "dy", "dtable");
    const int64_t hm = dtable.size(0), wm = dtable.size(1), c = dtable.size(2);
    const int32_t* g = grids.data<int32_t>();
    std::vector<ImageSources> images(static_cast<size_t>(grids.size(0)));
    int64_t first = 0;
    for (size_t k = 0; k < images.size(); ++k) {
        images[k] = {bilinear_sources(hm, g[2 * k]), bilinear_sources(wm, g[2 * k + 1]), first, g[2 * k + 1]};
        first += int64_t{g[2 * k]} * g[2 * k + 1];
    }
    MT_DISPATCH_FLOAT(
        dtable.dtype(), op, bilinear_resize_backward(images, dy.data<scalar_t>(), hm, wm, c, dtable.data<scalar_t>()));
}
MT_REGISTER_KERNEL(bilinear_resize_bwd, cpu, bilinear_resize_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
