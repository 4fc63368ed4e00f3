// CUDA MoE router: one warp per token. Each lane holds the experts lane, lane + 32, ... (E <= 1024) in registers;
// the top K (+1 for QB's cutoff) come from K (+1) rounds of a warp argmax on (key desc, index asc), the CPU's tie
// rule, so the selection is the CPU's on equal keys. The gate sum runs in slot order, as on the CPU. The backward is
// one warp per token with the row's score gradient in shared memory; the gate terms are added by one lane in slot
// order. All math in f32; no atomics, deterministic.
// Dtypes: logits, dlogits bf16|f16|f32 (T); scores, gates, cutoff, dgates, dscores T or f32 (one dtype, S); bias T
// or f32. The MoE layer keeps S = f32 under mixed precision (spec: the router in fp32). With bias_rows (i32 [N],
// trusted to lie in [0, G): the MoE layer builds them) token i's bias is row bias_rows[i] of bias [G, E].
#include <cfloat>
#include <climits>

#include "ops/cuda/moe/moe_common.cuh"
#include "ops/moe_router.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kWarps = 4;  // tokens per block
constexpr float kGateEps = 1e-20f;

template <int EPL, typename T, typename B, typename S>
__global__ void router_fwd_kernel(const T* __restrict__ logits,
                                  const B* __restrict__ bias,
                                  const int32_t* __restrict__ bias_rows,
                                  S* __restrict__ scores,
                                  int32_t* __restrict__ indices,
                                  S* __restrict__ gates,
                                  S* __restrict__ cutoff,
                                  int64_t n,
                                  int e,
                                  int k,
                                  bool softmax,
                                  bool normalize,
                                  float rho) {
    extern __shared__ float selected[];  // [kWarps, K] the selected scores
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    if (i >= n) return;  // no block-wide synchronisation below
    float* sel = selected + warp * k;
    float s[EPL], key[EPL];
    uint32_t taken = 0;
    float zmax = -FLT_MAX;
#pragma unroll
    for (int t = 0; t < EPL; ++t) {
        const int j = lane + 32 * t;
        s[t] = j < e ? to_f32(logits[i * e + j]) : -FLT_MAX;
        if (j >= e) taken |= 1u << t;
        zmax = fmaxf(zmax, s[t]);
    }
    if (softmax) {
        zmax = warp_max(zmax);
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < EPL; ++t) {
            s[t] = (taken >> t & 1u) ? 0.0f : expf(s[t] - zmax);
            sum += s[t];
        }
        sum = warp_sum(sum);
#pragma unroll
        for (int t = 0; t < EPL; ++t) s[t] /= sum;
    } else {
#pragma unroll
        for (int t = 0; t < EPL; ++t) s[t] = 1.0f / (1.0f + expf(-s[t]));
    }
    const B* brow = bias && bias_rows ? bias + static_cast<int64_t>(bias_rows[i]) * e : bias;  // [E]
#pragma unroll
    for (int t = 0; t < EPL; ++t) {
        const int j = lane + 32 * t;
        const float v = s[t] + (brow && j < e ? to_f32(brow[j]) : 0.0f);
        key[t] = isnan(v) ? -INFINITY : v;  // a NaN key sorts last, as on the CPU
        if (j < e) scores[i * e + j] = from_f32<S>(s[t]);
    }
    const int rounds = cutoff ? k + 1 : k;
    float sum = 0.0f;
    for (int q = 0; q < rounds; ++q) {
        float bk = -INFINITY, bs = 0.0f;
        int bj = INT_MAX;
#pragma unroll
        for (int t = 0; t < EPL; ++t) {
            const int j = lane + 32 * t;
            if (!(taken >> t & 1u) && (key[t] > bk || (key[t] == bk && j < bj))) bk = key[t], bj = j, bs = s[t];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ok = __shfl_xor_sync(0xffffffffu, bk, o), os = __shfl_xor_sync(0xffffffffu, bs, o);
            const int oj = __shfl_xor_sync(0xffffffffu, bj, o);
            if (ok > bk || (ok == bk && oj < bj)) bk = ok, bj = oj, bs = os;
        }
        if (bj % 32 == lane) taken |= 1u << (bj / 32);
        if (q < k) {
            sum += bs;
            if (lane == 0) {
                sel[q] = bs;
                indices[i * k + q] = bj;
            }
        } else if (lane == 0) {
            cutoff[i] = from_f32<S>(bk);
        }
    }
    __syncwarp();
    const float denom = normalize ? sum + kGateEps : 1.0f;
    for (int q = lane; q < k; q += 32) gates[i * k + q] = from_f32<S>(rho * sel[q] / denom);
}

template <typename S, typename T>
__global__ void router_bwd_kernel(const S* __restrict__ scores,
                                  const int32_t* __restrict__ indices,
                                  const S* __restrict__ gates,
                                  const S* __restrict__ dgates,
                                  const S* __restrict__ dscores,
                                  T* __restrict__ dlogits,
                                  int64_t n,
                                  int e,
                                  int k,
                                  bool softmax,
                                  bool normalize,
                                  float rho) {
    extern __shared__ float dz_rows[];  // [kWarps, E] ds, then dz
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
    if (i >= n) return;
    float* dz = dz_rows + static_cast<int64_t>(warp) * e;
    for (int j = lane; j < e; j += 32) dz[j] = dscores ? to_f32(dscores[i * e + j]) : 0.0f;
    __syncwarp();
    if (lane == 0) {  // slot order, as the CPU reference
        const int32_t* idx = indices + i * k;
        if (normalize) {
            float sum = 0.0f, dot = 0.0f;
            for (int q = 0; q < k; ++q) {
                const int32_t j = idx[q];
                if (j >= 0 && j < e) sum += to_f32(scores[i * e + j]);
                dot += to_f32(dgates[i * k + q]) * to_f32(gates[i * k + q]);
            }
            const float denom = sum + kGateEps;
            for (int q = 0; q < k; ++q)
                if (idx[q] >= 0 && idx[q] < e) dz[idx[q]] += (rho * to_f32(dgates[i * k + q]) - dot) / denom;
        } else {
            for (int q = 0; q < k; ++q)
                if (idx[q] >= 0 && idx[q] < e) dz[idx[q]] += rho * to_f32(dgates[i * k + q]);
        }
    }
    __syncwarp();
    float dot = 0.0f;
    if (softmax) {
        for (int j = lane; j < e; j += 32) dot += dz[j] * to_f32(scores[i * e + j]);
        dot = warp_sum(dot);
    }
    for (int j = lane; j < e; j += 32) {
        const float sj = to_f32(scores[i * e + j]);
        dlogits[i * e + j] = from_f32<T>(softmax ? sj * (dz[j] - dot) : dz[j] * sj * (1.0f - sj));
    }
}

template <typename T, typename B, typename S>
void launch_fwd(const Tensor& logits,
                const Tensor& bias,
                const Tensor& scores,
                const Tensor& indices,
                const Tensor& gates,
                const Tensor& cutoff,
                const MoeRouterOptions& o,
                const Tensor& bias_rows) {
    const int64_t n = logits.size(0);
    const int e = static_cast<int>(logits.size(1)), k = static_cast<int>(o.top_k);
    const unsigned blocks = static_cast<unsigned>((n + kWarps - 1) / kWarps);
    const size_t shared = static_cast<size_t>(kWarps * k) * sizeof(float);
    const auto* z = static_cast<const T*>(logits.raw());
    const auto* b = bias.defined() ? static_cast<const B*>(bias.raw()) : nullptr;
    const int32_t* rows = bias_rows.defined() ? bias_rows.data<int32_t>() : nullptr;
    auto* s = static_cast<S*>(scores.raw());
    auto* g = static_cast<S*>(gates.raw());
    auto* c = cutoff.defined() ? static_cast<S*>(cutoff.raw()) : nullptr;
    int32_t* idx = indices.data<int32_t>();
    const bool softmax = o.score == MoeScore::softmax;
    const float rho = static_cast<float>(o.scale);
    auto run = [&](auto epl) {
        constexpr int EPL = decltype(epl)::value;
        router_fwd_kernel<EPL, T, B, S><<<blocks, kWarps * 32, shared, core::exec_stream()>>>(
            z, b, rows, s, idx, g, c, n, e, k, softmax, o.normalize, rho);
    };
    if (e <= 32)
        run(std::integral_constant<int, 1>{});
    else if (e <= 64)
        run(std::integral_constant<int, 2>{});
    else if (e <= 128)
        run(std::integral_constant<int, 4>{});
    else if (e <= 256)
        run(std::integral_constant<int, 8>{});
    else if (e <= 512)
        run(std::integral_constant<int, 16>{});
    else
        run(std::integral_constant<int, 32>{});
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void moe_router_fwd(const Tensor& logits,
                    const Tensor& bias,
                    const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& cutoff,
                    const MoeRouterOptions& options,
                    const Tensor& bias_rows) {
    constexpr std::string_view op = "moe_router_fwd";
    check_cuda_float(logits, op, "logits");
    MT_CHECK(scores.dtype() == logits.dtype() || scores.dtype() == DType::f32,
             "{}: scores has dtype {}, expected f32 or {} (the dtype of logits)",
             op,
             core::dtype_name(scores.dtype()),
             core::dtype_name(logits.dtype()));
    check_dtype_as(gates, scores, op, "gates", "scores");
    if (cutoff.defined()) check_dtype_as(cutoff, scores, op, "cutoff", "scores");
    if (bias.defined())
        MT_CHECK(bias.dtype() == logits.dtype() || bias.dtype() == DType::f32,
                 "{}: bias has dtype {}, expected f32 or {} (the dtype of logits)",
                 op,
                 core::dtype_name(bias.dtype()),
                 core::dtype_name(logits.dtype()));
    MT_CHECK(logits.size(1) <= 1024, "{}: the CUDA router takes at most 1024 experts (got {})", op, logits.size(1));
    if (logits.size(0) == 0) return;
    core::NvtxRange range("moe_router_fwd");
    const DType bias_dtype = bias.defined() ? bias.dtype() : DType::f32;
    MT_CUDA_DISPATCH(
        logits.dtype(), T, MT_MOE_F32_OR(bias_dtype, T, B, MT_MOE_F32_OR(scores.dtype(), T, S, {
                                             launch_fwd<T, B, S>(
                                                 logits, bias, scores, indices, gates, cutoff, options, bias_rows);
                                         })));
}
MT_REGISTER_KERNEL(moe_router_fwd, cuda, moe_router_fwd, ::mt::ops::half_and_float_dtypes);

void moe_router_bwd(const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& dgates,
                    const Tensor& dscores,
                    const Tensor& dlogits,
                    const MoeRouterOptions& options) {
    constexpr std::string_view op = "moe_router_bwd";
    check_cuda_float(dlogits, op, "dlogits");
    MT_CHECK(scores.dtype() == dlogits.dtype() || scores.dtype() == DType::f32,
             "{}: scores has dtype {}, expected f32 or {} (the dtype of dlogits)",
             op,
             core::dtype_name(scores.dtype()),
             core::dtype_name(dlogits.dtype()));
    check_dtype_as(gates, scores, op, "gates", "scores");
    check_dtype_as(dgates, scores, op, "dgates", "scores");
    if (dscores.defined()) check_dtype_as(dscores, scores, op, "dscores", "scores");
    const int64_t n = scores.size(0);
    const int e = static_cast<int>(scores.size(1)), k = static_cast<int>(options.top_k);
    if (n == 0) return;
    core::NvtxRange range("moe_router_bwd");
    const unsigned blocks = static_cast<unsigned>((n + kWarps - 1) / kWarps);
    const size_t shared = static_cast<size_t>(kWarps) * static_cast<size_t>(e) * sizeof(float);
    MT_CHECK(shared <= 48 * 1024, "{}: the CUDA router backward takes at most 3072 experts (got {})", op, e);
    const bool softmax = options.score == MoeScore::softmax;
    const float rho = static_cast<float>(options.scale);
    MT_CUDA_DISPATCH(dlogits.dtype(), T, MT_MOE_F32_OR(scores.dtype(), T, S, {
                         router_bwd_kernel<S, T><<<blocks, kWarps * 32, shared, core::exec_stream()>>>(
                             static_cast<const S*>(scores.raw()),
                             indices.data<int32_t>(),
                             static_cast<const S*>(gates.raw()),
                             static_cast<const S*>(dgates.raw()),
                             dscores.defined() ? static_cast<const S*>(dscores.raw()) : nullptr,
                             static_cast<T*>(dlogits.raw()),
                             n,
                             e,
                             k,
                             softmax,
                             options.normalize,
                             rho);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_router_bwd, cuda, moe_router_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
