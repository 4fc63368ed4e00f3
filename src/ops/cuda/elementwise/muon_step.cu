// CUDA Muon step (ops/muon.h, muon.md §1) on a stack [E, A, B]: fused elementwise passes in f32 around the bf16
// Newton-Schulz of gemm/muon_newton_schulz.cu:
//   1. g = grad grad_scale; m = mu m + g (stored); n = g + mu m (Nesterov) or m; per-block f64 partials of n^2
//   2. inv[e] = 1 / (||n_e||_F + 1e-7), the partials of each matrix summed in a fixed order
//   3. X_0 = bf16(n inv[e]), n recomputed from grad and the stored m by the same f32 operations as in pass 1
//   4. the Newton-Schulz steps (three strided-batched cuBLASLt GEMMs per step over the E matrices)
//   5. param = (1 - lr wd) param - lr scale_factor sqrt(max(A, B)) O, with per-block f64 partials of the squared
//      change when update_sq is given, added to it in block order by one more block (no float atomics, no host sync),
//      or per matrix by one block each
// Dtypes: param, m f32 (master weights, optimizer state); grad f32|bf16|f16 (as adamw_step's CUDA path). The scalars
// are formed in f64 on the host, as on the CPU, and cast to f32 once.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/gemm/muon_newton_schulz.cuh"
#include "ops/muon.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

using muon::chunk_range;
using muon::ChunkRange;
using muon::kThreads;

struct MuonScalars {
    float mu, gs, decay, step;
    bool nesterov;
};

// The Nesterov (or plain) direction of one element from its scaled gradient and updated momentum: one definition for
// passes 1 and 3, so both see the same bits.
__device__ __forceinline__ float direction(float g, float m, const MuonScalars& s) {
    return s.nesterov ? __fadd_rn(g, __fmul_rn(s.mu, m)) : m;
}

// m = mu m + g for one element's scaled gradient g: one definition for passes 1 and muon_momentum, the same bits.
__device__ __forceinline__ float momentum_update(float g, float m, const MuonScalars& s) {
    return __fadd_rn(__fmul_rn(s.mu, m), g);
}

// Pass 1: the momentum update and the blocks' partial sums of the direction's square.
template <int VEC, typename TG>
__global__ void momentum_kernel(const TG* __restrict__ grad,
                                float* __restrict__ m,
                                int64_t n,
                                int64_t chunks,
                                MuonScalars s,
                                double* __restrict__ partial) {
    const ChunkRange r = chunk_range(n, chunks);
    double sq = 0.0;
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        const int64_t at = r.e * n + i;
        float g[VEC], mv[VEC];
        load_vec<VEC>(grad + at, g);
        load_vec<VEC>(m + at, mv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float gi = __fmul_rn(g[k], s.gs);
            mv[k] = momentum_update(gi, mv[k], s);
            const double d = direction(gi, mv[k], s);
            sq += d * d;
        }
        store_vec<VEC>(m + at, mv);
    }
    __shared__ double scratch[32];
    sq = block_sum(sq, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = sq;
}

// muon_momentum: pass 1's momentum update with the direction written out (f32) instead of summed.
template <int VEC, typename TG>
__global__ void direction_kernel(const TG* __restrict__ grad,
                                 float* __restrict__ m,
                                 float* __restrict__ out,
                                 int64_t n,
                                 int64_t chunks,
                                 MuonScalars s) {
    const ChunkRange r = chunk_range(n, chunks);
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        const int64_t at = r.e * n + i;
        float g[VEC], mv[VEC], d[VEC];
        load_vec<VEC>(grad + at, g);
        load_vec<VEC>(m + at, mv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float gi = __fmul_rn(g[k], s.gs);
            mv[k] = momentum_update(gi, mv[k], s);
            d[k] = direction(gi, mv[k], s);
        }
        store_vec<VEC>(m + at, mv);
        store_vec<VEC>(out + at, d);
    }
}

// Pass 3: X_0 (the padded bf16 layout of muon_newton_schulz.cuh) = the direction times its matrix's inverse norm.
template <int VEC, typename TG>
__global__ void normalise_kernel(const TG* __restrict__ grad,
                                 const float* __restrict__ m,
                                 int64_t n,
                                 int64_t chunks,
                                 int64_t stride,
                                 MuonScalars s,
                                 const float* __restrict__ inv,
                                 bf16* __restrict__ x0) {
    const ChunkRange r = chunk_range(n, chunks);
    const float scale = inv[r.e];
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        const int64_t at = r.e * n + i;
        float g[VEC], mv[VEC], x[VEC];
        load_vec<VEC>(grad + at, g);
        load_vec<VEC>(m + at, mv);
#pragma unroll
        for (int k = 0; k < VEC; ++k) x[k] = direction(__fmul_rn(g[k], s.gs), mv[k], s) * scale;
        store_vec<VEC>(x0 + r.e * stride + i, x);
    }
}

// Pass 5: decoupled weight decay and the scaled orthogonal update; with sq_partial (metrics steps, uniform over the
// grid) the blocks' partial sums of the squared change.
template <int VEC, typename TC, typename TO>
__global__ void update_kernel(float* __restrict__ param,
                              const TO* __restrict__ o,
                              int64_t n,
                              int64_t chunks,
                              int64_t stride,
                              MuonScalars s,
                              double* __restrict__ sq_partial,
                              TC* __restrict__ copy) {
    const ChunkRange r = chunk_range(n, chunks);
    double sq = 0.0;
    for (int64_t i = r.begin + static_cast<int64_t>(threadIdx.x) * VEC; i < r.end; i += blockDim.x * VEC) {
        const int64_t at = r.e * n + i;
        float w[VEC], u[VEC];
        load_vec<VEC>(param + at, w);
        load_vec<VEC>(o + r.e * stride + i, u);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float old = w[k];
            w[k] = __fsub_rn(__fmul_rn(s.decay, w[k]), __fmul_rn(s.step, u[k]));
            if (sq_partial != nullptr) {
                const double d = static_cast<double>(w[k]) - static_cast<double>(old);
                sq += d * d;
            }
        }
        store_vec<VEC>(param + at, w);
        if (copy != nullptr) store_vec<VEC>(copy + at, w);  // the forward's low-precision copy (mixed precision)
    }
    if (sq_partial != nullptr) {
        __shared__ double scratch[32];
        sq = block_sum(sq, scratch);
        if (threadIdx.x == 0) sq_partial[blockIdx.x] = sq;
    }
}

// ||N||_F of each matrix from the normalisation's reciprocal 1 / (||N|| + 1e-7) (metrics only).
__global__ void n_norm_kernel(const float* __restrict__ inv, int64_t e, double* __restrict__ out) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < e) out[i] = 1.0 / static_cast<double>(inv[i]) - 1e-7;
}

// The f32-only parameter (the primary tensor of the registration).
bool f32_param(core::DType dtype) {
    return dtype == core::DType::f32;
}

// Calls fn with the forward copy's pointer in its own dtype (a null float* without a copy): the update kernel's TC.
template <typename Fn>
void with_copy_pointer(const Tensor& param_copy, Fn&& fn) {
    if (!param_copy.defined())
        fn(static_cast<float*>(nullptr));
    else if (param_copy.dtype() == DType::bf16)
        fn(static_cast<bf16*>(param_copy.raw()));
    else if (param_copy.dtype() == DType::f16)
        fn(static_cast<f16*>(param_copy.raw()));
    else
        fn(param_copy.data<float>());
}

// update_sq += the update kernel's block partials: per matrix when it has E elements, else their total.
void add_update_sq(const muon::Layout& l, const double* partial, const Tensor& update_sq) {
    if (update_sq.numel() > 1)
        muon::launch_add_sums(l, partial, update_sq.data<double>());
    else
        muon::launch_add_sum(partial, l.blocks(), update_sq.data<double>());
}

template <int VEC, typename TG>
void run(const Tensor& param,
         const Tensor& grad,
         const Tensor& m,
         const MuonHyper& hyper,
         const MuonScalars& s,
         const Tensor& update_sq,
         const Tensor& param_copy,
         const Tensor& n_norm) {
    const muon::Layout l = muon::layout_of(param);
    const auto blocks = static_cast<unsigned>(l.blocks());
    const cudaStream_t stream = core::exec_stream();
    const Tensor partial = Tensor::scratch({l.blocks()}, DType::f64, core::Device::cuda);
    const Tensor inv = Tensor::scratch({l.e}, DType::f32, core::Device::cuda);
    const Tensor w0 = Tensor::scratch({l.e * l.x_stride}, DType::bf16, core::Device::cuda);
    const Tensor w1 = Tensor::scratch({l.e * l.x_stride}, DType::bf16, core::Device::cuda);
    auto* part = static_cast<double*>(partial.raw());
    auto* inv_p = static_cast<float*>(inv.raw());
    auto* x0 = static_cast<bf16*>(w0.raw());
    const TG* g = static_cast<const TG*>(grad.raw());
    float* mp = m.data<float>();
    momentum_kernel<VEC, TG><<<blocks, kThreads, 0, stream>>>(g, mp, l.n, l.chunks, s, part);
    MT_CUDA_CHECK(cudaGetLastError());
    muon::launch_inv_norm(l, part, inv_p);
    if (n_norm.defined()) {
        n_norm_kernel<<<static_cast<unsigned>((l.e + 255) / 256), 256, 0, stream>>>(inv_p, l.e, n_norm.data<double>());
        MT_CUDA_CHECK(cudaGetLastError());
    }
    normalise_kernel<VEC, TG><<<blocks, kThreads, 0, stream>>>(g, mp, l.n, l.chunks, l.x_stride, s, inv_p, x0);
    MT_CUDA_CHECK(cudaGetLastError());
    const bf16* o = muon::iterate(l, hyper, x0, static_cast<bf16*>(w1.raw()));
    // The norm's partials are consumed (stream order): the update's reuse the buffer.
    double* sq = update_sq.defined() ? part : nullptr;
    auto update = [&](auto* copy) {
        using TC = std::remove_pointer_t<decltype(copy)>;
        update_kernel<VEC, TC, bf16>
            <<<blocks, kThreads, 0, stream>>>(param.data<float>(), o, l.n, l.chunks, l.x_stride, s, sq, copy);
    };
    with_copy_pointer(param_copy, update);
    MT_CUDA_CHECK(cudaGetLastError());
    if (sq != nullptr) add_update_sq(l, sq, update_sq);
}

}  // namespace

// param, grad, m [E, A, B]; update_sq [1] or [E] f64, or undefined. Shapes are checked by the caller.
void muon_step(const Tensor& param,
               const Tensor& grad,
               const Tensor& m,
               const MuonHyper& hyper,
               double grad_scale,
               const Tensor& update_sq,
               const Tensor& param_copy,
               const Tensor& n_norm) {
    constexpr std::string_view op = "muon_step";
    check_f32(param, op, "param");
    check_cuda_float(grad, op, "grad");
    check_dtype_as(m, param, op, "m", "param");
    if (update_sq.defined()) check_dtype_in(update_sq, {DType::f64}, op, "update_sq");
    if (param.numel() == 0) return;
    core::NvtxRange range("muon_step");
    const double longer = static_cast<double>(std::max(param.size(1), param.size(2)));
    const MuonScalars s{static_cast<float>(hyper.momentum),
                        static_cast<float>(grad_scale),
                        static_cast<float>(1.0 - hyper.lr * hyper.weight_decay),
                        static_cast<float>(hyper.lr * hyper.scale_factor * std::sqrt(longer)),
                        hyper.nesterov};
    const bool vec = vec_ok(param.size(1) * param.size(2), {&param, &grad, &m}) &&
                     (!param_copy.defined() || vec_ok(param.size(1) * param.size(2), {&param_copy}));
    MT_CUDA_DISPATCH(grad.dtype(), TG, {
        if (vec)
            run<8, TG>(param, grad, m, hyper, s, update_sq, param_copy, n_norm);
        else
            run<1, TG>(param, grad, m, hyper, s, update_sq, param_copy, n_norm);
    });
}
MT_REGISTER_KERNEL(muon_step, cuda, muon_step, f32_param);

// grad f32|bf16|f16, m and n f32 [E, A, B].
void muon_momentum(const Tensor& grad, const Tensor& m, const Tensor& n, const MuonHyper& hyper, double grad_scale) {
    constexpr std::string_view op = "muon_momentum";
    check_f32(m, op, "m");
    check_f32(n, op, "n");
    check_cuda_float(grad, op, "grad");
    if (m.numel() == 0) return;
    const muon::Layout l = muon::layout_of(m);
    const MuonScalars s{static_cast<float>(hyper.momentum), static_cast<float>(grad_scale), 1.0f, 0.0f, hyper.nesterov};
    const bool vec = vec_ok(l.n, {&grad, &m, &n});
    MT_CUDA_DISPATCH(grad.dtype(), TG, {
        const auto* g = static_cast<const TG*>(grad.raw());
        if (vec)
            direction_kernel<8, TG><<<static_cast<unsigned>(l.blocks()), kThreads, 0, core::exec_stream()>>>(
                g, m.data<float>(), n.data<float>(), l.n, l.chunks, s);
        else
            direction_kernel<1, TG><<<static_cast<unsigned>(l.blocks()), kThreads, 0, core::exec_stream()>>>(
                g, m.data<float>(), n.data<float>(), l.n, l.chunks, s);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(muon_momentum, cuda, muon_momentum, f32_param);

// param f32, o f32|bf16 [E, A, B]; update_sq [1] or [E] f64; param_copy bf16|f16|f32.
void muon_apply(const Tensor& param,
                const Tensor& o,
                double decay,
                double step,
                const Tensor& update_sq,
                const Tensor& param_copy) {
    constexpr std::string_view op = "muon_apply";
    check_f32(param, op, "param");
    check_dtype_in(o, {DType::f32, DType::bf16}, op, "o");
    if (update_sq.defined()) check_dtype_in(update_sq, {DType::f64}, op, "update_sq");
    if (param.numel() == 0) return;
    const muon::Layout l = muon::layout_of(param);
    const MuonScalars s{0.0f, 1.0f, static_cast<float>(decay), static_cast<float>(step), false};
    const Tensor partial =
        update_sq.defined() ? Tensor::scratch({l.blocks()}, DType::f64, core::Device::cuda) : Tensor();
    double* sq = update_sq.defined() ? static_cast<double*>(partial.raw()) : nullptr;
    const bool vec = vec_ok(l.n, {&param, &o}) && (!param_copy.defined() || vec_ok(l.n, {&param_copy}));
    auto launch = [&](auto* copy, auto* ov) {
        using TC = std::remove_pointer_t<decltype(copy)>;
        using TO = std::remove_const_t<std::remove_pointer_t<decltype(ov)>>;
        const auto blocks = static_cast<unsigned>(l.blocks());
        if (vec)
            update_kernel<8, TC, TO><<<blocks, kThreads, 0, core::exec_stream()>>>(
                param.data<float>(), ov, l.n, l.chunks, l.n, s, sq, copy);
        else
            update_kernel<1, TC, TO><<<blocks, kThreads, 0, core::exec_stream()>>>(
                param.data<float>(), ov, l.n, l.chunks, l.n, s, sq, copy);
    };
    auto with_copy = [&](auto* ov) { with_copy_pointer(param_copy, [&](auto* copy) { launch(copy, ov); }); };
    if (o.dtype() == DType::bf16)
        with_copy(static_cast<const bf16*>(o.raw()));
    else
        with_copy(o.data<float>());
    MT_CUDA_CHECK(cudaGetLastError());
    if (sq != nullptr) add_update_sq(l, sq, update_sq);
}
MT_REGISTER_KERNEL(muon_apply, cuda, muon_apply, f32_param);

}  // namespace mt::ops::cuda
