// CUDA rotary position embedding ("rotate half"), forward and inverse rotation.
// Dtypes: x and y (dy and dx) bf16|f16|f32, the same dtype; y may alias x. The angles are computed in f64, as on the
// CPU, into a [T, D/2] table of f32 (cos, sin) pairs (an f32 angle would be off by ~1e-4 rad at position 4096), and
// the rotation runs in f32. Tables are kept per (T, D, theta, position offset): a training step asks for the same one
// four times per layer (q and k, forward and backward), and building it each time cost a table kernel and an
// allocation per call. With per-token positions (document masking restarts them at every document) a row reads the
// table at its position instead of its t: every position is below max(T, position_limit), the table's rows.
// Elementwise, so deterministic.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/rope.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// table[p, i] = (cos, sin) of (pos_offset + p) theta^(-2i/d)
__global__ void rope_table_kernel(
    float2* __restrict__ table, int64_t t, int64_t half, int64_t d, double theta, int64_t pos_offset) {
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < t * half;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t p = k / half, i = k % half;
        const double freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double angle = static_cast<double>(pos_offset + p) * freq;
        double s, c;
        sincos(angle, &s, &c);
        table[k] = make_float2(static_cast<float>(c), static_cast<float>(s));
    }
}

// One thread per VEC consecutive pairs (i, i + D/2) of one (b, t, h) row; sign -1 rotates back (the backward).
// positions: [B, T] or null (the position of token (b, t) is t).
template <int VEC, typename T>
__global__ void rope_rotate_kernel(const T* x,
                                   T* y,
                                   const float2* __restrict__ table,
                                   const int32_t* __restrict__ positions,
                                   int64_t rows,
                                   int64_t t,
                                   int64_t h,
                                   int64_t half,
                                   float sign) {
    const int64_t groups = half / VEC, total = rows * groups;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = k / groups, i0 = (k % groups) * VEC;
        const int64_t p = positions ? positions[row / h] : (row / h) % t;
        const T* xr = x + row * 2 * half;
        T* yr = y + row * 2 * half;
        float lo[VEC], hi[VEC], out_lo[VEC], out_hi[VEC];
        load_vec<VEC>(xr + i0, lo);
        load_vec<VEC>(xr + half + i0, hi);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const float2 cs = table[p * half + i0 + v];
            const float sn = cs.y * sign;
            out_lo[v] = lo[v] * cs.x - hi[v] * sn;
            out_hi[v] = hi[v] * cs.x + lo[v] * sn;
        }
        store_vec<VEC>(yr + i0, out_lo);
        store_vec<VEC>(yr + half + i0, out_hi);
    }
}

// The cached table for these sizes, built on first use; the caller's copy keeps it alive even if another thread
// clears the cache meanwhile. The map is never destroyed, so that no tensor outlives the CUDA runtime at exit.
Tensor rope_table(int64_t t, int64_t d, double theta, int64_t pos_offset) {
    using Key = std::tuple<int64_t, int64_t, double, int64_t>;
    static std::mutex mutex;
    static auto* tables = new std::map<Key, Tensor>();
    constexpr size_t kMaxTables = 16;  // a context-length curriculum asks for a few sizes; clear past this
    std::lock_guard<std::mutex> lock(mutex);
    const Key key{t, d, theta, pos_offset};
    auto it = tables->find(key);
    if (it == tables->end()) {
        if (tables->size() >= kMaxTables) tables->clear();  // stream order keeps queued users of the old ones safe
        const int64_t half = d / 2;
        Tensor table = Tensor::scratch({t, half, 2}, DType::f32, core::Device::cuda);  // [t, half] (cos, sin)
        rope_table_kernel<<<grid_for(t * half, kThreads), kThreads, 0, core::exec_stream()>>>(
            reinterpret_cast<float2*>(table.data<float>()), t, half, d, theta, pos_offset);
        MT_CUDA_CHECK(cudaGetLastError());
        it = tables->emplace(key, std::move(table)).first;
    }
    return it->second;
}

void rope_run(const Tensor& in,
              double theta,
              int64_t pos_offset,
              const Tensor& out,
              const Tensor& positions,
              int64_t position_limit,
              bool inverse,
              std::string_view op,
              std::string_view in_arg,
              std::string_view out_arg) {
    check_cuda_float(in, op, in_arg);
    check_dtype_as(out, in, op, out_arg, in_arg);
    const int64_t b = in.size(0), t = in.size(1), h = in.size(2), d = in.size(3), half = d / 2;
    if (in.numel() == 0) return;
    core::NvtxRange range(inverse ? "rope_bwd" : "rope_fwd");
    const Tensor table = rope_table(std::max(t, position_limit), d, theta, pos_offset);
    const float2* tp = reinterpret_cast<const float2*>(table.data<float>());
    const float sign = inverse ? -1.0f : 1.0f;
    const bool vec = vec_ok(half, {&in, &out});
    const int32_t* pp = positions.defined() ? positions.data<int32_t>() : nullptr;
    const int64_t rows = b * t * h;
    MT_CUDA_DISPATCH(in.dtype(), T, {
        const T* xp = static_cast<const T*>(in.raw());
        T* yp = static_cast<T*>(out.raw());
        if (vec)
            rope_rotate_kernel<8, T><<<grid_for(rows * half / 8, kThreads), kThreads, 0, core::exec_stream()>>>(
                xp, yp, tp, pp, rows, t, h, half, sign);
        else
            rope_rotate_kernel<1, T><<<grid_for(rows * half, kThreads), kThreads, 0, core::exec_stream()>>>(
                xp, yp, tp, pp, rows, t, h, half, sign);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_fwd(const Tensor& x,
              double theta,
              int64_t pos_offset,
              const Tensor& y,
              const Tensor& positions,
              int64_t position_limit) {
    rope_run(x, theta, pos_offset, y, positions, position_limit, false, "rope_fwd", "x", "y");
}
MT_REGISTER_KERNEL(rope_fwd, cuda, rope_fwd, ::mt::ops::half_and_float_dtypes);

void rope_bwd(const Tensor& dy,
              double theta,
              int64_t pos_offset,
              const Tensor& dx,
              const Tensor& positions,
              int64_t position_limit) {
    rope_run(dy, theta, pos_offset, dx, positions, position_limit, true, "rope_bwd", "dy", "dx");
}
MT_REGISTER_KERNEL(rope_bwd, cuda, rope_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
