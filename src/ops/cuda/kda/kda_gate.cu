// CUDA KDA gate (ops/kda_gate.h): u, g, dg, du bf16|f16|f32 (one dtype); a_log and bias bf16|f16|f32 (one dtype);
// da_log and dbias bf16|f16|f32 each (f32 when the model keeps parameter grads in f32); f32 math. Forward and du: one
// thread per element. Parameter grads: block (column tile, token block) sums dg dz and dg dlog_a over its kTokens
// tokens per (head, key) column in token order into f32 partials; a second pass adds the partials in block order
// (dA_log also over the key channels, in order). No atomics.
#include "ops/cuda/common.cuh"
#include "ops/kda_gate.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kTokens = 128;  // tokens per parameter-grad partial
constexpr int kThreads = 128;

struct GateDims {
    int64_t n, hv, k;
    bool lower_bound;
    float l;
};

__device__ __forceinline__ float softplus_f32(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

template <typename TP>
__device__ __forceinline__ float a_of(const TP* a_log, int64_t h) {
    return a_log != nullptr ? expf(to_f32(a_log[h])) : 1.0f;
}

template <typename T, typename TP>
__global__ void gate_fwd_kernel(
    const T* __restrict__ u, const TP* __restrict__ a_log, const TP* __restrict__ bias, T* __restrict__ g, GateDims d) {
    const int64_t total = d.n * d.hv * d.k;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t hk = i % (d.hv * d.k), h = hk / d.k;
        const float a = a_of(a_log, h), z = to_f32(u[i]) + to_f32(bias[hk]);
        g[i] = from_f32<T>(d.lower_bound ? d.l * sigmoid_f32(a * z) : -a * softplus_f32(z));
    }
}

// du = dg dz; pdb[blk, hk] = sum dg dz, pda[blk, hk] = sum dg dlog_a over the block's tokens.
template <typename T, typename TP>
__global__ void gate_bwd_kernel(const T* __restrict__ u,
                                const TP* __restrict__ a_log,
                                const TP* __restrict__ bias,
                                const T* __restrict__ dg,
                                T* __restrict__ du,
                                float* __restrict__ pdb,
                                float* __restrict__ pda,
                                GateDims d) {
    const int64_t hkn = d.hv * d.k, hk = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (hk >= hkn) return;
    const int64_t h = hk / d.k, r0 = static_cast<int64_t>(blockIdx.y) * kTokens;
    const int64_t r1 = r0 + kTokens < d.n ? r0 + kTokens : d.n;
    const float a = a_of(a_log, h), b = to_f32(bias[hk]);
    float sdb = 0.0f, sda = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t i = r * hkn + hk;
        const float z = to_f32(u[i]) + b, gv = to_f32(dg[i]);
        float dz, dlog_a;
        if (d.lower_bound) {
            const float s = sigmoid_f32(a * z), ds = d.l * s * (1.0f - s);
            dz = ds * a;
            dlog_a = ds * a * z;
        } else {
            dz = -a * sigmoid_f32(z);
            dlog_a = -a * softplus_f32(z);
        }
        du[i] = from_f32<T>(gv * dz);
        sdb += gv * dz;
        sda += gv * dlog_a;
    }
    pdb[blockIdx.y * hkn + hk] = sdb;
    pda[blockIdx.y * hkn + hk] = sda;
}

template <typename TG>
__global__ void gate_dbias_kernel(const float* __restrict__ pdb, TG* __restrict__ dbias, int64_t blocks, int64_t hkn) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < hkn;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
        for (int64_t blk = 0; blk < blocks; ++blk) acc += pdb[blk * hkn + j];
        dbias[j] = from_f32<TG>(to_f32(dbias[j]) + acc);
    }
}

template <typename TG>
__global__ void gate_dalog_kernel(const float* __restrict__ pda, TG* __restrict__ da_log, int64_t blocks, GateDims d) {
    const int64_t hkn = d.hv * d.k;
    for (int64_t h = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; h < d.hv;
         h += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
        for (int64_t x = 0; x < d.k; ++x)
            for (int64_t blk = 0; blk < blocks; ++blk) acc += pda[blk * hkn + h * d.k + x];
        da_log[h] = from_f32<TG>(to_f32(da_log[h]) + acc);
    }
}

template <typename TP>
const TP* ptr_or_null(const Tensor& t) {
    return t.defined() ? static_cast<const TP*>(t.raw()) : nullptr;
}

}  // namespace

void kda_gate_fwd(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const Tensor& g, const KdaGateOptions& options) {
    constexpr std::string_view op = "kda_gate_fwd";
    const bool lower_bound = options.kind == KdaGateKind::lower_bound;
    const double l = options.lower_bound;
    check_cuda_float(u, op, "u");
    check_cuda_float(bias, op, "bias");
    if (a_log.defined()) check_dtype_as(a_log, bias, op, "a_log", "bias");
    check_dtype_as(g, u, op, "g", "u");
    const GateDims d{u.size(0), u.size(1), u.size(2), lower_bound, static_cast<float>(l)};
    const int64_t total = d.n * d.hv * d.k;
    if (total == 0) return;
    core::NvtxRange range("kda_gate_fwd");
    MT_CUDA_DISPATCH(u.dtype(), T, MT_CUDA_DISPATCH(bias.dtype(), TP, {
                         gate_fwd_kernel<T, TP>
                             <<<grid_for(total, 256), 256, 0, core::exec_stream()>>>(static_cast<const T*>(u.raw()),
                                                                                     ptr_or_null<TP>(a_log),
                                                                                     static_cast<const TP*>(bias.raw()),
                                                                                     static_cast<T*>(g.raw()),
                                                                                     d);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(kda_gate_fwd, cuda, kda_gate_fwd, ::mt::ops::half_and_float_dtypes);

void kda_gate_bwd(const Tensor& u,
                  const Tensor& a_log,
                  const Tensor& bias,
                  const Tensor& dg,
                  const Tensor& du,
                  const Tensor& da_log,
                  const Tensor& dbias,
                  const KdaGateOptions& options) {
    constexpr std::string_view op = "kda_gate_bwd";
    const bool lower_bound = options.kind == KdaGateKind::lower_bound;
    const double l = options.lower_bound;
    check_cuda_float(u, op, "u");
    check_cuda_float(bias, op, "bias");
    if (a_log.defined()) check_dtype_as(a_log, bias, op, "a_log", "bias");
    check_dtype_as(dg, u, op, "dg", "u");
    check_dtype_as(du, u, op, "du", "u");
    check_cuda_float(dbias, op, "dbias");
    if (da_log.defined()) check_cuda_float(da_log, op, "da_log");
    const GateDims d{u.size(0), u.size(1), u.size(2), lower_bound, static_cast<float>(l)};
    const int64_t hkn = d.hv * d.k;
    if (d.n * hkn == 0) return;
    core::NvtxRange range("kda_gate_bwd");
    const int64_t blocks = (d.n + kTokens - 1) / kTokens;
    MT_CHECK(blocks < 65536, "{}: N = {} tokens is too large for the parameter-grad partial grid", op, d.n);
    const Tensor pdb = Tensor::scratch({blocks * hkn}, DType::f32, core::Device::cuda);
    const Tensor pda = Tensor::scratch({blocks * hkn}, DType::f32, core::Device::cuda);
    const dim3 grid(static_cast<unsigned>((hkn + kThreads - 1) / kThreads), static_cast<unsigned>(blocks));
    MT_CUDA_DISPATCH(u.dtype(), T, MT_CUDA_DISPATCH(bias.dtype(), TP, {
                         gate_bwd_kernel<T, TP>
                             <<<grid, kThreads, 0, core::exec_stream()>>>(static_cast<const T*>(u.raw()),
                                                                          ptr_or_null<TP>(a_log),
                                                                          static_cast<const TP*>(bias.raw()),
                                                                          static_cast<const T*>(dg.raw()),
                                                                          static_cast<T*>(du.raw()),
                                                                          pdb.data<float>(),
                                                                          pda.data<float>(),
                                                                          d);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
    MT_CUDA_DISPATCH(dbias.dtype(), TG, {
        gate_dbias_kernel<TG><<<grid_for(hkn, 256), 256, 0, core::exec_stream()>>>(
            pdb.data<float>(), static_cast<TG*>(dbias.raw()), blocks, hkn);
    });
    MT_CUDA_CHECK(cudaGetLastError());
    if (da_log.defined()) {
        MT_CUDA_DISPATCH(da_log.dtype(), TG, {
            gate_dalog_kernel<TG><<<grid_for(d.hv, 64), 64, 0, core::exec_stream()>>>(
                pda.data<float>(), static_cast<TG*>(da_log.raw()), blocks, d);
        });
        MT_CUDA_CHECK(cudaGetLastError());
    }
}
MT_REGISTER_KERNEL(kda_gate_bwd, cuda, kda_gate_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
