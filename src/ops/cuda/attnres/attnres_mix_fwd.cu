// CUDA Block AttnRes mix, forward (ops/attnres_mix.h; shared pieces and the layout in attnres_mix.cuh). One warp per
// token: a first pass sums every source's squares and query dots over the row, the butterflies give all lanes the
// totals, every lane computes the softmax of the m logits in registers, and a second pass writes h = sum_j w_j v_j.
// The second pass walks the row backwards so that it re-reads the most recently loaded columns first, while they
// are still in L1.
#include "ops/attnres_mix.h"
#include "ops/cuda/attnres/attnres_mix.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

using namespace attnres;

template <typename T, int M, int VEC>
__global__ void __launch_bounds__(kThreads) mix_fwd_kernel(
    Sources src, QueryGain qg, float eps, T* h, float* alpha, int m_run, int64_t n, int64_t c, float blend) {
    constexpr int kM = M > 0 ? M : kMaxM, kUnroll = M > 0 ? M : 1;
    const int m = M > 0 ? M : m_run, lane = threadIdx.x % 32;
    const int64_t steps = lane_steps(c, lane, VEC);
    for (int64_t row = grid_warp(); row < n; row += grid_warps()) {
        float ss[kM], qs[kM], unused[kM];  // per source: sum of squares, q . v
        row_sums<T, M, VEC, false>(src, qg, static_cast<const T*>(nullptr), m, row, c, steps, ss, qs, unused);
        float w[kM], smax = -INFINITY, total = 0.0f;  // the logits, then the value weights
#pragma unroll kUnroll
        for (int j = 0; j < m; ++j) {
            w[j] = warp_sum(qs[j]) / sqrtf(warp_sum(ss[j]) / static_cast<float>(c) + eps);
            smax = fmaxf(smax, w[j]);
        }
#pragma unroll kUnroll
        for (int j = 0; j < m; ++j) total += (w[j] = expf(w[j] - smax));
#pragma unroll kUnroll
        for (int j = 0; j < m; ++j) {
            const float a = w[j] / total;
            if (lane == j) alpha[row * m + j] = a;
            w[j] = blend / static_cast<float>(m) + (1.0f - blend) * a;
        }
        for (int64_t i = steps - 1; i >= 0; --i) {
            const int64_t k = (lane + 32 * i) * VEC;
            float acc[VEC] = {};
#pragma unroll kUnroll
            for (int j = 0; j < m; ++j) {
                float x[VEC];
                load_vec<VEC>(static_cast<const T*>(src.v[j]) + row * c + k, x);
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc[e] += w[j] * x[e];
            }
            store_vec<VEC>(h + row * c + k, acc);
        }
    }
}

}  // namespace

void attnres_mix_fwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& h,
                     const Tensor& alpha,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_fwd";
    check_common(sources, query, key_gain, alpha, op);
    check_dtype_as(h, sources[0], op, "h", "the sources");
    const int64_t n = sources[0].size(0), c = sources[0].size(1);
    const int m = static_cast<int>(sources.size());
    if (n == 0) return;
    core::NvtxRange range("attnres_mix_fwd");
    const bool vec = vec_path(c, sources, {&h, &query, &key_gain});
    const unsigned grid = mix_grid(n, m * c * static_cast<int64_t>(core::dtype_size(sources[0].dtype())));
    MT_CUDA_DISPATCH(sources[0].dtype(), T, with_mix_kernel(m, vec, [&](auto kM, auto kVecWidth) {
                         mix_fwd_kernel<T, decltype(kM)::value, decltype(kVecWidth)::value>
                             <<<grid, kThreads, 0, core::exec_stream()>>>(sources_of(sources),
                                                                          query_gain_of(query, key_gain),
                                                                          static_cast<float>(eps),
                                                                          static_cast<T*>(h.raw()),
                                                                          alpha.data<float>(),
                                                                          m,
                                                                          n,
                                                                          c,
                                                                          static_cast<float>(blend));
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(attnres_mix_fwd, cuda, attnres_mix_fwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
