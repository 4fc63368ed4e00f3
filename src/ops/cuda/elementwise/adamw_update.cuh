// The AdamW element update shared by the per-tensor kernel (adamw.cu) and the list kernel (adamw_list.cu): VEC
// consecutive elements loaded, updated in the CPU reference's order (ops/cpu/adamw.cpp) and stored, the moments as
// f32 or as bf16 with stochastic rounding (core/stochastic_round.h), the optional model copy in its dtype.
#pragma once

#include "core/stochastic_round.h"
#include "ops/adamw.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

// The step's scalars in f32 (formed in f64 on the host by adamw_step_scalars) and a piece's rounding streams.
struct AdamWScalars {
    float b1, b2, gs, decay, step_size, bc2_sqrt, eps;
    uint64_t stream_m, stream_v;  // stochastic rounding of bf16 moments
    int64_t first;                // the rounding index of the piece's element 0
};

// The host's f64 scalars in f32, with a piece's rounding streams and first index.
inline AdamWScalars device_scalars(const AdamWStepScalars& h, uint64_t stream_m, uint64_t stream_v, int64_t first) {
    return {static_cast<float>(h.beta1),
            static_cast<float>(h.beta2),
            static_cast<float>(h.grad_scale),
            static_cast<float>(h.decay),
            static_cast<float>(h.step_size),
            static_cast<float>(h.bc2_sqrt),
            static_cast<float>(h.eps),
            stream_m,
            stream_v,
            first};
}

// A moment's store: f32 as is, bf16 with stochastic rounding of element `at`.
template <int VEC, typename TS>
__device__ __forceinline__ void store_moment(TS* p, const float (&in)[VEC], uint64_t stream, int64_t at) {
    if constexpr (sizeof(TS) == 4) {
        store_vec<VEC>(p, in);
    } else {
        alignas(16) uint16_t bits[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            bits[e] = core::f32_to_bf16_stochastic(in[e], core::sr_random_bits(stream, static_cast<uint64_t>(at + e)));
        if constexpr (VEC == 8) {
            *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(bits);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) reinterpret_cast<uint16_t*>(p)[e] = bits[e];
        }
    }
}

// Elements [k, k + VEC) of one piece; with `sums`, adds the squared change and the squared new value to sq and psq
// (f64). copy may be null (no model copy).
template <int VEC, typename TG, typename TS, typename TC>
__device__ __forceinline__ void adamw_update(float* __restrict__ param,
                                             const TG* __restrict__ grad,
                                             TS* __restrict__ m,
                                             TS* __restrict__ v,
                                             TC* __restrict__ copy,
                                             int64_t k,
                                             const AdamWScalars& s,
                                             bool sums,
                                             double& sq,
                                             double& psq) {
    float p[VEC], g[VEC], mv[VEC], vv[VEC];
    load_vec<VEC>(param + k, p);
    load_vec<VEC>(grad + k, g);
    load_vec<VEC>(m + k, mv);
    load_vec<VEC>(v + k, vv);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const float gi = g[e] * s.gs;
        mv[e] = s.b1 * mv[e] + (1.0f - s.b1) * gi;
        vv[e] = s.b2 * vv[e] + (1.0f - s.b2) * gi * gi;
        const float old = p[e];
        p[e] = p[e] * s.decay - s.step_size * mv[e] / (sqrtf(vv[e]) / s.bc2_sqrt + s.eps);
        if (sums) {  // metrics steps only (uniform over the grid)
            const double change = static_cast<double>(p[e]) - static_cast<double>(old);
            sq += change * change;
            psq += static_cast<double>(p[e]) * static_cast<double>(p[e]);
        }
    }
    store_vec<VEC>(param + k, p);
    store_moment<VEC>(m + k, mv, s.stream_m, s.first + k);
    store_moment<VEC>(v + k, vv, s.stream_v, s.first + k);
    if (copy != nullptr) store_vec<VEC>(copy + k, p);
}

}  // namespace mt::ops::cuda
