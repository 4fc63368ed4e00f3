// CUDA Block AttnRes mix, backward (ops/attnres_mix.h; shared pieces and the layout in attnres_mix.cuh). One warp per
// chunk of kChunk consecutive tokens, one token at a time: a first pass over the row sums, per source, the squares,
// the query dots and the dh dots (3m values, butterflies to every lane), the lanes form the per-source coefficients
// in registers, and a second pass (backwards along the row, so the newest loads are re-read first, from L1) adds to
// every d_sources element, which has one owner (no atomics). The query and gain gradients share one per-column sum
// G[k] = sum over tokens and sources of ds_j / r_j v_j[k] (dquery = gain G, dgain = query G): the warp keeps G of its
// chunk in a row of a [chunks, C] buffer (each lane its own columns), and a second kernel sums the rows in chunk order
// into dquery and dkey_gain. A chunk is one warp's whole work, so the bits do not depend on the grid: deterministic.
#include "ops/attnres_mix.h"
#include "ops/cuda/attnres/attnres_mix.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

using namespace attnres;

constexpr int kChunk = 8;  // tokens per row of the G buffer
constexpr int kSumThreads = 256, kSumGroups = kSumThreads / 32;

struct Grads {
    void* dv[kMaxM];
};

// Per token (see the CPU reference, ops/cpu/attnres_mix.cpp), with u_j = v_j / r_j, w_j = blend / m + (1 - blend) a_j
// and ds_j = (1 - blend) a_j (da_j - sum_k a_k da_k):
//   dv_j += w_j dh + ds_j / r_j (q - u_j s_j / C),   G += ds_j / r_j v_j.
template <typename T, typename TD, int M, int VEC>
__global__ void __launch_bounds__(kThreads) mix_bwd_kernel(Sources src,
                                                           QueryGain qg,
                                                           float eps,
                                                           const float* alpha,
                                                           const T* dh,
                                                           Grads grads,
                                                           float* partial,
                                                           int m_run,
                                                           int64_t n,
                                                           int64_t c,
                                                           float blend) {
    constexpr int kM = M > 0 ? M : kMaxM, kUnroll = M > 0 ? M : 1;
    const int m = M > 0 ? M : m_run, lane = threadIdx.x % 32;
    const int64_t steps = lane_steps(c, lane, VEC), chunks = (n + kChunk - 1) / kChunk;
    for (int64_t chunk = grid_warp(); chunk < chunks; chunk += grid_warps()) {
        float* g_row = partial + chunk * c;  // [c]
        const int64_t first = chunk * kChunk, last = first + kChunk < n ? first + kChunk : n;
        for (int64_t row = first; row < last; ++row) {
            float ss[kM], qs[kM], da[kM];  // per source: sum of squares, q . v, dh . v
            row_sums<T, M, VEC, true>(src, qg, dh, m, row, c, steps, ss, qs, da);
            // The coefficients of dh (cd), q (cq, also G's weight) and v (cv: u s / C / r with u = v / r).
            const float* a = alpha + row * m;
            float mean_da = 0.0f, cd[kM], cq[kM], cv[kM];
#pragma unroll kUnroll
            for (int j = 0; j < m; ++j) {
                ss[j] = warp_sum(ss[j]);
                qs[j] = warp_sum(qs[j]);
                da[j] = warp_sum(da[j]);
                mean_da += a[j] * da[j];
            }
#pragma unroll kUnroll
            for (int j = 0; j < m; ++j) {
                const float r = sqrtf(ss[j] / static_cast<float>(c) + eps);
                const float ds = (1.0f - blend) * a[j] * (da[j] - mean_da);
                cd[j] = blend / static_cast<float>(m) + (1.0f - blend) * a[j];
                cq[j] = ds / r;
                cv[j] = ds / r * (qs[j] / r) / (static_cast<float>(c) * r);
            }
            for (int64_t i = steps - 1; i >= 0; --i) {
                const int64_t k = (lane + 32 * i) * VEC;
                float q[VEC], d[VEC], g[VEC] = {};
                load_q<VEC>(qg, k, q);
                load_vec<VEC>(dh + row * c + k, d);
                if (row != first) load_vec<VEC>(g_row + k, g);  // this chunk's G so far (the lane's own columns)
                auto update = [&](int j, const float(&x)[VEC], float(&dv)[VEC]) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        // The increment first, then one add: a small increment (a source the softmax all but
                        // ignores) added term by term to a large accumulated dv would be rounded three times.
                        dv[e] += cd[j] * d[e] + cq[j] * q[e] - cv[j] * x[e];
                        g[e] += cq[j] * x[e];
                    }
                    store_vec<VEC>(static_cast<TD*>(grads.dv[j]) + row * c + k, dv);
                };
                if constexpr (M > 0) {
                    // Every load before the first store: the compiler cannot move a load above a store to a pointer
                    // it may alias, and this way the 2M loads of a step are in flight together.
                    float x[kM][VEC], dv[kM][VEC];
#pragma unroll
                    for (int j = 0; j < M; ++j) {
                        load_vec<VEC>(static_cast<const T*>(src.v[j]) + row * c + k, x[j]);
                        load_vec<VEC>(static_cast<const TD*>(grads.dv[j]) + row * c + k, dv[j]);
                    }
#pragma unroll
                    for (int j = 0; j < M; ++j) update(j, x[j], dv[j]);
                } else {
                    for (int j = 0; j < m; ++j) {
                        float x[VEC], dv[VEC];
                        load_vec<VEC>(static_cast<const T*>(src.v[j]) + row * c + k, x);
                        load_vec<VEC>(static_cast<const TD*>(grads.dv[j]) + row * c + k, dv);
                        update(j, x, dv);
                    }
                }
                store_vec<VEC>(g_row + k, g);
            }
        }
    }
}

// dquery[k] += gain[k] G[k] and dgain[k] += query[k] G[k], G[k] the sum of partial[:, k] in a fixed order: a block
// takes 32 columns, warp w sums the rows w, w + kSumGroups, ... in order, then one warp adds the kSumGroups sums in
// warp order.
__global__ void __launch_bounds__(kSumThreads)
    partial_sum_kernel(const float* partial, int64_t chunks, int64_t c, QueryGain qg, float* dquery, float* dgain) {
    __shared__ float sums[kSumGroups][32];
    const int col = threadIdx.x % 32, group = threadIdx.x / 32;
    const int64_t k = static_cast<int64_t>(blockIdx.x) * 32 + col;
    float s = 0.0f;
    if (k < c) {
#pragma unroll 4
        for (int64_t b = group; b < chunks; b += kSumGroups) s += partial[b * c + k];
    }
    sums[group][col] = s;
    __syncthreads();
    if (group != 0 || k >= c) return;
    float total = 0.0f;
    for (int w = 0; w < kSumGroups; ++w) total += sums[w][col];
    float query[1], gain[1];
    load_any<1>(qg.query, qg.dtype, k, query);
    load_any<1>(qg.gain, qg.dtype, k, gain);
    dquery[k] += gain[0] * total;
    dgain[k] += query[0] * total;
}

}  // namespace

void attnres_mix_bwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& alpha,
                     const Tensor& dh,
                     const std::vector<Tensor>& d_sources,
                     const Tensor& dquery,
                     const Tensor& dkey_gain,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_bwd";
    check_common(sources, query, key_gain, alpha, op);
    check_dtype_as(dh, sources[0], op, "dh", "the sources");
    check_f32(dquery, op, "dquery");
    check_f32(dkey_gain, op, "dkey_gain");
    const DType dv_dtype = d_sources[0].dtype();
    MT_CHECK(dv_dtype == DType::f32 || dv_dtype == sources[0].dtype(),
             "{}: d_sources have dtype {}, expected f32 or {} (the sources' dtype)",
             op,
             core::dtype_name(dv_dtype),
             core::dtype_name(sources[0].dtype()));
    Grads g{};
    for (size_t j = 0; j < d_sources.size(); ++j) {
        check_dtype_as(d_sources[j], d_sources[0], op, "d_sources[j]", "d_sources[0]");
        g.dv[j] = d_sources[j].raw();  // disjoint: ops::attnres_mix_bwd checks it on every device
    }
    const int64_t n = sources[0].size(0), c = sources[0].size(1);
    const int m = static_cast<int>(sources.size());
    if (n == 0) return;
    core::NvtxRange range("attnres_mix_bwd");
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    const Tensor partial = Tensor::scratch({chunks, c}, DType::f32, core::Device::cuda);
    const bool vec = vec_path(c, sources, {&dh, &query, &key_gain, &partial}) && vec_path(c, d_sources, {});
    const unsigned grid = mix_grid(chunks, (m + 1) * c * static_cast<int64_t>(core::dtype_size(sources[0].dtype())));
    MT_CUDA_DISPATCH(sources[0].dtype(), T, with_mix_kernel(m, vec, [&](auto kM, auto kVecWidth) {
                         auto launch = [&](auto* dv_type) {
                             using TD = std::remove_pointer_t<decltype(dv_type)>;
                             mix_bwd_kernel<T, TD, decltype(kM)::value, decltype(kVecWidth)::value>
                                 <<<grid, kThreads, 0, core::exec_stream()>>>(sources_of(sources),
                                                                              query_gain_of(query, key_gain),
                                                                              static_cast<float>(eps),
                                                                              alpha.data<float>(),
                                                                              static_cast<const T*>(dh.raw()),
                                                                              g,
                                                                              partial.data<float>(),
                                                                              m,
                                                                              n,
                                                                              c,
                                                                              static_cast<float>(blend));
                         };
                         if (dv_dtype == DType::f32)
                             launch(static_cast<float*>(nullptr));
                         else
                             launch(static_cast<T*>(nullptr));
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
    partial_sum_kernel<<<static_cast<unsigned>((c + 31) / 32), kSumThreads, 0, core::exec_stream()>>>(
        partial.data<float>(),
        chunks,
        c,
        query_gain_of(query, key_gain),
        dquery.data<float>(),
        dkey_gain.data<float>());
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(attnres_mix_bwd, cuda, attnres_mix_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
