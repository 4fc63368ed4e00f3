// CPU reference of the 2x2 pixel shuffle (ops/pixel_shuffle.h): the source patch of every (output cell, quarter)
// from the grids, then row copies in either direction.
#include "ops/pixel_shuffle.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

// source[4 o + q] = the patch row of x that lands in quarter q of output row o: image k's cell (r, c) is output row
// o_k + r (w/2) + c, and quarter q is its patch (2r + q/2, 2c + q%2), row 4 o_k + (2r + q/2) w + 2c + q%2 of x.
std::vector<int64_t> pixel_shuffle_sources(const Tensor& grids) {
    const int32_t* g = grids.data<int32_t>();
    std::vector<int64_t> source;
    int64_t first = 0;  // 4 o_k: the image's first patch row
    for (int64_t k = 0; k < grids.size(0); ++k) {
        const int64_t h = g[2 * k], w = g[2 * k + 1];
        for (int64_t r = 0; r < h / 2; ++r)
            for (int64_t c = 0; c < w / 2; ++c)
                for (int64_t q = 0; q < 4; ++q) source.push_back(first + (2 * r + q / 2) * w + 2 * c + q % 2);
        first += h * w;
    }
    return source;
}

// forward: cells[o, q C : (q + 1) C] = patches[source[4 o + q], :]; inverse: the other way round.
template <typename T>
void pixel_shuffle_copy(const std::vector<int64_t>& source, T* patches, T* cells, int64_t c, bool inverse) {
    const int64_t slots = static_cast<int64_t>(source.size());  // P: output rows times 4
    const size_t bytes = static_cast<size_t>(c) * sizeof(T);
#pragma omp parallel for schedule(static) if (slots * c >= kParallelMinWork)
    for (int64_t s = 0; s < slots; ++s) {
        T* patch = patches + source[s] * c;  // [c]
        T* cell = cells + s * c;             // [c]: quarter s % 4 of output row s / 4
        if (inverse)
            std::memcpy(patch, cell, bytes);
        else
            std::memcpy(cell, patch, bytes);
    }
}

void pixel_shuffle_run(const Tensor& patches,
                       std::string_view patches_arg,
                       const Tensor& grids,
                       const Tensor& cells,
                       std::string_view cells_arg,
                       bool inverse,
                       std::string_view op) {
    check_float_arg(patches, op, patches_arg, 2);
    check_float_arg(cells, op, cells_arg, 2);
    check_dtype_as(cells, patches, op, cells_arg, patches_arg);
    const std::vector<int64_t> source = pixel_shuffle_sources(grids);
    MT_DISPATCH_FLOAT(
        patches.dtype(),
        op,
        pixel_shuffle_copy(source, patches.data<scalar_t>(), cells.data<scalar_t>(), patches.size(1), inverse));
}

}  // namespace

// The CPU kernel of ops::pixel_shuffle_fwd (registered in the op registry): the CPU dtypes, then the copy.
void pixel_shuffle_fwd(const Tensor& x, const Tensor& grids, const Tensor& y) {
    pixel_shuffle_run(x, "x", grids, y, "y", false, "pixel_shuffle_fwd");
}
MT_REGISTER_KERNEL(pixel_shuffle_fwd, cpu, pixel_shuffle_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::pixel_shuffle_bwd (registered in the op registry): the CPU dtypes, then the inverse copy.
void pixel_shuffle_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dx) {
    pixel_shuffle_run(dx, "dx", grids, dy, "dy", true, "pixel_shuffle_bwd");
}
MT_REGISTER_KERNEL(pixel_shuffle_bwd, cpu, pixel_shuffle_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
