// CUDA bilinear resize of the position table (ops/bilinear_resize.h), forward and the gathering backward.
// Dtypes: table and y bf16|f16|f32, one dtype; dy bf16|f16|f32 and dtable bf16|f16|f32 (f32 under a bf16 forward: the
// parameter gradient). The host builds the per-axis taps and their transposes (ops::bilinear_taps, bilinear_sources,
// the CPU reference's own), rounds the weights to f32 and copies the small tables to the device on the op's stream.
// Forward: one thread per (output row, channel), its image found by binary search over the images' first rows, its
// (up to) 2 x 2 taps summed in f32 in the CPU's order. Backward: one thread per (table cell, channel) sums, image by
// image, the output rows that read the cell, in the CPU's order, and adds the sum to dtable once. Every element is
// written by one thread in a fixed order, with no atomics, so both directions are deterministic.
#include <vector>

#include "ops/bilinear_resize.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

struct DevTap {  // a BilinearTap with f32 weights
    int32_t i0, i1;
    float l0, l1;
};
struct DevSource {  // one (output coordinate, weight) entry of a BilinearSources
    int32_t out;
    float weight;
};

// A host vector copied to a new device buffer on the op's stream (a pageable source is staged before the call
// returns, and the stream-ordered allocator keeps the buffer until the kernels queued after the copy have run).
template <typename V>
Tensor upload(const std::vector<V>& v) {
    static_assert(sizeof(V) % sizeof(int32_t) == 0);
    const auto words = static_cast<int64_t>(v.size() * sizeof(V) / sizeof(int32_t));
    const Tensor t = Tensor::scratch({words > 0 ? words : 1}, DType::i32, core::Device::cuda);
    if (!v.empty())
        MT_CUDA_CHECK(
            cudaMemcpyAsync(t.raw(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice, core::exec_stream()));
    return t;
}

// image: [4n + 1] int64: first[0..n] (each image's first output row, then P), width[n], row_tap[n], col_tap[n] (where
// the image's row taps and column taps start in taps). Thread k: output row t = k / c, channel j = k % c.
template <typename T>
__global__ void bilinear_resize_fwd_kernel(const T* __restrict__ table,
                                           T* __restrict__ y,
                                           const int64_t* __restrict__ image,
                                           const DevTap* __restrict__ taps,
                                           int64_t n,
                                           int64_t wm,
                                           int64_t c) {
    const int64_t* first = image;
    const int64_t* width = image + n + 1;
    const int64_t* row_tap = width + n;
    const int64_t* col_tap = row_tap + n;
    const int64_t total = first[n] * c;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = k / c, j = k % c;
        int64_t lo = 0, hi = n - 1;  // the last image whose first row is <= t
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (first[mid] <= t)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int64_t l = t - first[lo], w = width[lo];
        const DevTap r = taps[row_tap[lo] + l / w], q = taps[col_tap[lo] + l % w];
        const int32_t ra[2] = {r.i0, r.i1}, cb[2] = {q.i0, q.i1};
        const float rw[2] = {r.l0, r.l1}, cw[2] = {q.l0, q.l1};
        float acc = 0.0f;
        for (int u = 0; u < 2; ++u) {
            if (rw[u] == 0.0f) continue;
            for (int v = 0; v < 2; ++v) {
                if (cw[v] == 0.0f) continue;
                acc += (rw[u] * cw[v]) * to_f32(table[(ra[u] * wm + cb[v]) * c + j]);
            }
        }
        y[k] = from_f32<T>(acc);
    }
}

// image: [2n] int64: first[n] (each image's first row of dy), width[n]. first_of: [n (hm + 1) + n (wm + 1)] int32:
// image k's row sources start at row_first[k (hm + 1)] (indices into sources), then the column sources' column_first.
// Thread k: table cell (a, b) = k / c, channel j = k % c.
template <typename T, typename TG>
__global__ void bilinear_resize_bwd_kernel(const T* __restrict__ dy,
                                           TG* __restrict__ dtable,
                                           const int64_t* __restrict__ image,
                                           const int32_t* __restrict__ first_of,
                                           const DevSource* __restrict__ sources,
                                           int64_t n,
                                           int64_t hm,
                                           int64_t wm,
                                           int64_t c) {
    const int64_t* first = image;
    const int64_t* width = image + n;
    const int32_t* row_first = first_of;
    const int32_t* col_first = first_of + n * (hm + 1);
    const int64_t total = hm * wm * c;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t cell = k / c, j = k % c, a = cell / wm, b = cell % wm;
        float acc = 0.0f;
        for (int64_t im = 0; im < n; ++im) {
            const int32_t* rf = row_first + im * (hm + 1);
            const int32_t* cf = col_first + im * (wm + 1);
            for (int32_t e = rf[a]; e < rf[a + 1]; ++e) {
                const DevSource rs = sources[e];
                for (int32_t f = cf[b]; f < cf[b + 1]; ++f) {
                    const DevSource cs = sources[f];
                    const float w = rs.weight * cs.weight;
                    acc += w * to_f32(dy[(first[im] + int64_t{rs.out} * width[im] + cs.out) * c + j]);
                }
            }
        }
        dtable[k] = from_f32<TG>(to_f32(dtable[k]) + acc);
    }
}

}  // namespace

void bilinear_resize_fwd(const Tensor& table, const Tensor& grids, const Tensor& y) {
    constexpr std::string_view op = "bilinear_resize_fwd";
    check_cuda_float(table, op, "table");
    check_dtype_as(y, table, op, "y", "table");
    const int64_t n = grids.size(0), hm = table.size(0), wm = table.size(1), c = table.size(2);
    if (y.numel() == 0) return;
    core::NvtxRange range("bilinear_resize_fwd");
    const int32_t* g = grids.data<int32_t>();
    std::vector<int64_t> image(static_cast<size_t>(4 * n + 1));  // first[0..n], width, row_tap, col_tap
    std::vector<DevTap> taps;
    for (int64_t k = 0; k < n; ++k) {
        image[k + 1] = image[k] + int64_t{g[2 * k]} * g[2 * k + 1];
        image[n + 1 + k] = g[2 * k + 1];
        for (int axis = 0; axis < 2; ++axis) {
            image[(axis == 0 ? 2 * n + 1 : 3 * n + 1) + k] = static_cast<int64_t>(taps.size());
            for (const BilinearTap& t : bilinear_taps(axis == 0 ? hm : wm, g[2 * k + axis]))
                taps.push_back({t.i0, t.i1, static_cast<float>(t.l0), static_cast<float>(t.l1)});
        }
    }
    const Tensor image_dev = upload(image), taps_dev = upload(taps);
    const int64_t work = y.numel();
    MT_CUDA_DISPATCH(table.dtype(), T, {
        bilinear_resize_fwd_kernel<T><<<grid_for(work, kThreads), kThreads, 0, core::exec_stream()>>>(
            static_cast<const T*>(table.raw()),
            static_cast<T*>(y.raw()),
            static_cast<const int64_t*>(image_dev.raw()),
            static_cast<const DevTap*>(taps_dev.raw()),
            n,
            wm,
            c);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(bilinear_resize_fwd, cuda, bilinear_resize_fwd, ::mt::ops::half_and_float_dtypes);

void bilinear_resize_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dtable) {
    constexpr std::string_view op = "bilinear_resize_bwd";
    check_cuda_float(dy, op, "dy");
    check_cuda_float(dtable, op, "dtable");
    const int64_t n = grids.size(0), hm = dtable.size(0), wm = dtable.size(1), c = dtable.size(2);
    if (dtable.numel() == 0 || n == 0) return;
    core::NvtxRange range("bilinear_resize_bwd");
    const int32_t* g = grids.data<int32_t>();
    std::vector<int64_t> image(static_cast<size_t>(2 * n));  // first[n], width[n]
    std::vector<int32_t> row_first, col_first;
    std::vector<DevSource> sources;
    for (int64_t k = 0; k < n; ++k) {
        image[n + k] = g[2 * k + 1];
        if (k + 1 < n) image[k + 1] = image[k] + int64_t{g[2 * k]} * g[2 * k + 1];
        for (int axis = 0; axis < 2; ++axis) {
            const BilinearSources s = bilinear_sources(axis == 0 ? hm : wm, g[2 * k + axis]);
            const auto base = static_cast<int32_t>(sources.size());
            for (const int32_t f : s.first) (axis == 0 ? row_first : col_first).push_back(base + f);
            for (size_t e = 0; e < s.out.size(); ++e) sources.push_back({s.out[e], static_cast<float>(s.weight[e])});
        }
    }
    std::vector<int32_t> first_of = row_first;
    first_of.insert(first_of.end(), col_first.begin(), col_first.end());
    const Tensor image_dev = upload(image), first_dev = upload(first_of), sources_dev = upload(sources);
    const int64_t work = dtable.numel();
    MT_CUDA_DISPATCH(dy.dtype(), T, {
        MT_CUDA_DISPATCH(dtable.dtype(), TG, {
            bilinear_resize_bwd_kernel<T, TG><<<grid_for(work, kThreads), kThreads, 0, core::exec_stream()>>>(
                static_cast<const T*>(dy.raw()),
                static_cast<TG*>(dtable.raw()),
                static_cast<const int64_t*>(image_dev.raw()),
                static_cast<const int32_t*>(first_dev.raw()),
                static_cast<const DevSource*>(sources_dev.raw()),
                n,
                hm,
                wm,
                c);
        });
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(bilinear_resize_bwd, cuda, bilinear_resize_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
