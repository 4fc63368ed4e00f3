// CUDA MoE combine: one block per token gathers its expert rows in slot order (f32 sums, no atomics), and the
// backward writes each row's gradient g dy and the gate gradient dy . row by a fixed-order block sum.
// Dtypes: yp, y, dy, dyp bf16|f16|f32 (one dtype); gates, dgates that dtype or f32 (the layer's f32 routing).
// Every row of yp must be named by one slot (the plan guarantees it): the backward writes only named rows.
#include "ops/cuda/moe/moe_common.cuh"
#include "ops/moe_unpermute.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

// y_i = sum_q g_iq yp[slot_row(i, q)]
template <int VEC, typename T, typename G>
__global__ void combine_kernel(const T* __restrict__ yp,
                               const int32_t* __restrict__ slot_row,
                               const G* __restrict__ gates,
                               T* __restrict__ y,
                               int k,
                               int64_t c) {
    const int64_t i = blockIdx.x;
    for (int64_t j = threadIdx.x * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
        float acc[VEC] = {};
        for (int q = 0; q < k; ++q) {
            const int32_t r = slot_row[i * k + q];
            if (r < 0) continue;
            const float g = to_f32(gates[i * k + q]);
            float v[VEC];
            load_vec<VEC>(yp + static_cast<int64_t>(r) * c + j, v);
#pragma unroll
            for (int u = 0; u < VEC; ++u) acc[u] += g * v[u];
        }
        store_vec<VEC>(y + i * c + j, acc);
    }
}

// dyp[slot_row(i, q)] = g_iq dy_i; dgates_iq = dy_i . yp[slot_row(i, q)] (0 when dropped)
template <int VEC, typename T, typename G>
__global__ void combine_bwd_kernel(const T* __restrict__ yp,
                                   const int32_t* __restrict__ slot_row,
                                   const G* __restrict__ gates,
                                   const T* __restrict__ dy,
                                   T* __restrict__ dyp,
                                   G* __restrict__ dgates,
                                   int k,
                                   int64_t c) {
    __shared__ float scratch[32];
    const int64_t i = blockIdx.x;
    for (int q = 0; q < k; ++q) {
        const int32_t r = slot_row[i * k + q];  // the same for every thread: the block branches together
        if (r < 0) {
            if (threadIdx.x == 0) dgates[i * k + q] = from_f32<G>(0.0f);
            continue;
        }
        const float g = to_f32(gates[i * k + q]);
        float dot = 0.0f;
        for (int64_t j = threadIdx.x * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
            float d[VEC], v[VEC], o[VEC];
            load_vec<VEC>(dy + i * c + j, d);
            load_vec<VEC>(yp + static_cast<int64_t>(r) * c + j, v);
#pragma unroll
            for (int u = 0; u < VEC; ++u) {
                dot += d[u] * v[u];
                o[u] = g * d[u];
            }
            store_vec<VEC>(dyp + static_cast<int64_t>(r) * c + j, o);
        }
        dot = block_sum(dot, scratch);
        if (threadIdx.x == 0) dgates[i * k + q] = from_f32<G>(dot);
    }
}

void check_gate_dtype(const Tensor& g, const Tensor& yp, std::string_view op, std::string_view arg) {
    MT_CHECK(g.dtype() == yp.dtype() || g.dtype() == DType::f32,
             "{}: {} has dtype {}, expected f32 or {} (the dtype of yp)",
             op,
             arg,
             core::dtype_name(g.dtype()),
             core::dtype_name(yp.dtype()));
}

}  // namespace

void moe_unpermute_fwd(const Tensor& yp, const Tensor& slot_row, const Tensor& gates, const Tensor& y) {
    constexpr std::string_view op = "moe_unpermute_fwd";
    check_cuda_float(yp, op, "yp");
    check_dtype_as(y, yp, op, "y", "yp");
    check_gate_dtype(gates, yp, op, "gates");
    const int64_t n = slot_row.size(0), k = slot_row.size(1), c = y.size(1);
    if (n == 0 || c == 0) return;
    core::NvtxRange range("moe_unpermute_fwd");
    const bool vec = vec_ok(c, {&yp, &y});
    const int threads = moe_row_threads(c, vec ? 8 : 1);
    MT_CUDA_DISPATCH(yp.dtype(), T, MT_MOE_F32_OR(gates.dtype(), T, G, {
                         const T* src = static_cast<const T*>(yp.raw());
                         const G* g = static_cast<const G*>(gates.raw());
                         T* dst = static_cast<T*>(y.raw());
                         if (vec)
                             combine_kernel<8, T, G><<<static_cast<unsigned>(n), threads, 0, core::exec_stream()>>>(
                                 src, slot_row.data<int32_t>(), g, dst, static_cast<int>(k), c);
                         else
                             combine_kernel<1, T, G><<<static_cast<unsigned>(n), threads, 0, core::exec_stream()>>>(
                                 src, slot_row.data<int32_t>(), g, dst, static_cast<int>(k), c);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_unpermute_fwd, cuda, moe_unpermute_fwd, ::mt::ops::half_and_float_dtypes);

void moe_unpermute_bwd(const Tensor& yp,
                       const Tensor& slot_row,
                       const Tensor& gates,
                       const Tensor& dy,
                       const Tensor& dyp,
                       const Tensor& dgates) {
    constexpr std::string_view op = "moe_unpermute_bwd";
    check_cuda_float(yp, op, "yp");
    check_dtype_as(dy, yp, op, "dy", "yp");
    check_dtype_as(dyp, yp, op, "dyp", "yp");
    check_gate_dtype(gates, yp, op, "gates");
    check_dtype_as(dgates, gates, op, "dgates", "gates");
    const int64_t n = slot_row.size(0), k = slot_row.size(1), c = dy.size(1);
    if (n == 0) return;
    core::NvtxRange range("moe_unpermute_bwd");
    const bool vec = vec_ok(c, {&yp, &dy, &dyp});
    const int threads = moe_row_threads(c, vec ? 8 : 1);
    MT_CUDA_DISPATCH(yp.dtype(), T, MT_MOE_F32_OR(gates.dtype(), T, G, {
                         const T* src = static_cast<const T*>(yp.raw());
                         const G* g = static_cast<const G*>(gates.raw());
                         const T* d = static_cast<const T*>(dy.raw());
                         T* drow = static_cast<T*>(dyp.raw());
                         G* dg = static_cast<G*>(dgates.raw());
                         if (vec)
                             combine_bwd_kernel<8, T, G><<<static_cast<unsigned>(n), threads, 0, core::exec_stream()>>>(
                                 src, slot_row.data<int32_t>(), g, d, drow, dg, static_cast<int>(k), c);
                         else
                             combine_bwd_kernel<1, T, G><<<static_cast<unsigned>(n), threads, 0, core::exec_stream()>>>(
                                 src, slot_row.data<int32_t>(), g, d, drow, dg, static_cast<int>(k), c);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_unpermute_bwd, cuda, moe_unpermute_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
