// CUDA 2-D rotary position embedding (ops/rope2d.h), forward and inverse rotation.
// Dtypes: x and y (dy and dx) bf16|f16|f32, the same dtype; y may alias x (each thread reads its pairs before it
// writes them, and no other thread touches them). One thread per (token, angle): it computes its angle in f64, as the
// CPU does (a patch index times theta^(-2i/(D/2))), rounds cos and sin to f32, and rotates that pair in every head
// of the token in f32. Elementwise, so deterministic.
#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/rope2d.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Thread k: token t = k / (D/2), angle j = k % (D/2) of half part = j / (D/4) (0: rows, 1: cols) and pair
// i = j % (D/4): elements o + i and o + i + D/4 of every head, o = part D/2. sign -1 rotates back (the backward).
template <typename T>
__global__ void rope2d_rotate_kernel(const T* x,
                                     T* y,
                                     const int32_t* __restrict__ rows,
                                     const int32_t* __restrict__ cols,
                                     int64_t t,
                                     int64_t h,
                                     int64_t d,
                                     double theta,
                                     float sign) {
    const int64_t half = d / 2, quarter = d / 4, total = t * half;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t tt = k / half, j = k % half, part = j / quarter, i = j % quarter;
        const double p = static_cast<double>(part == 0 ? rows[tt] : cols[tt]);
        const double angle = p * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(half));
        double s, c;
        sincos(angle, &s, &c);
        const float cf = static_cast<float>(c), sf = static_cast<float>(s) * sign;
        const int64_t o = part * half + i;
        for (int64_t hh = 0; hh < h; ++hh) {
            const T* xr = x + (tt * h + hh) * d;  // [d]
            T* yr = y + (tt * h + hh) * d;        // [d]
            const float lo = to_f32(xr[o]), hi = to_f32(xr[o + quarter]);
            yr[o] = from_f32<T>(lo * cf - hi * sf);
            yr[o + quarter] = from_f32<T>(hi * cf + lo * sf);
        }
    }
}

void rope2d_run(const Tensor& in,
                const Tensor& rows,
                const Tensor& cols,
                const Tensor& out,
                double theta,
                bool inverse,
                std::string_view op,
                std::string_view in_arg,
                std::string_view out_arg) {
    check_cuda_float(in, op, in_arg);
    check_dtype_as(out, in, op, out_arg, in_arg);
    const int64_t t = in.size(0), h = in.size(1), d = in.size(2);
    if (in.numel() == 0) return;
    core::NvtxRange range(inverse ? "rope2d_bwd" : "rope2d_fwd");
    const float sign = inverse ? -1.0f : 1.0f;
    const int64_t work = t * (d / 2);
    MT_CUDA_DISPATCH(in.dtype(), T, {
        rope2d_rotate_kernel<T>
            <<<grid_for(work, kThreads), kThreads, 0, core::exec_stream()>>>(static_cast<const T*>(in.raw()),
                                                                             static_cast<T*>(out.raw()),
                                                                             rows.data<int32_t>(),
                                                                             cols.data<int32_t>(),
                                                                             t,
                                                                             h,
                                                                             d,
                                                                             theta,
                                                                             sign);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope2d_fwd(const Tensor& x, const Tensor& rows, const Tensor& cols, const Tensor& y, double theta) {
    rope2d_run(x, rows, cols, y, theta, false, "rope2d_fwd", "x", "y");
}
MT_REGISTER_KERNEL(rope2d_fwd, cuda, rope2d_fwd, ::mt::ops::half_and_float_dtypes);

void rope2d_bwd(const Tensor& dy, const Tensor& rows, const Tensor& cols, const Tensor& dx, double theta) {
    rope2d_run(dy, rows, cols, dx, theta, true, "rope2d_bwd", "dy", "dx");
}
MT_REGISTER_KERNEL(rope2d_bwd, cuda, rope2d_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
