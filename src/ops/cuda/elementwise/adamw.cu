// CUDA AdamW step, elementwise over flat buffers, with an optional low-precision model copy written by the same
// kernel (one read of grad, m, v, param and one write of m, v, param and the copy per element).
// Dtypes: param f32 (master weights); m, v f32|bf16 (optimizer state; bf16 stored with stochastic rounding, the
// bits from core/stochastic_round.h as on the CPU); grad f32|bf16|f16; param_copy bf16|f16|f32 or undefined. The
// scalars are formed in f64 on the host and the elementwise math runs in f32 in the CPU reference's order.
// With update_sq or param_sq (metrics steps) each block also sums the squared change and the squared new value of its
// elements in f64 into partials of a scratch buffer, and one more block adds the partials in block order to
// *update_sq and *param_sq: deterministic, no float atomics, no host sync. The flag is uniform over the grid, so the
// branch costs nothing on the other steps.

#include "ops/adamw.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/elementwise/adamw_update.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <int VEC, typename TG, typename TS, typename TC, bool kCopy>
__global__ void adamw_kernel(float* __restrict__ param,
                             const TG* __restrict__ grad,
                             TS* __restrict__ m,
                             TS* __restrict__ v,
                             TC* __restrict__ copy,
                             int64_t n,
                             AdamWScalars s,
                             double* __restrict__ sq_partial) {
    double sq = 0.0, psq = 0.0;  // the squared change and the squared new value
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC)
        adamw_update<VEC>(param, grad, m, v, kCopy ? copy : nullptr, k, s, sq_partial != nullptr, sq, psq);
    if (sq_partial != nullptr) {
        __shared__ double scratch[32];
        sq = block_sum(sq, scratch);
        psq = block_sum(psq, scratch);
        if (threadIdx.x == 0) sq_partial[2 * blockIdx.x] = sq, sq_partial[2 * blockIdx.x + 1] = psq;
    }
}

// One block: *update_sq and *param_sq (each may be null) += their partials (interleaved) in block order.
__global__ void square_sums_kernel(const double* __restrict__ partial,
                                   int64_t blocks,
                                   double* __restrict__ update_sq,
                                   double* __restrict__ param_sq) {
    __shared__ double scratch[32];
    double change = 0.0, value = 0.0;
    for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) change += partial[2 * b], value += partial[2 * b + 1];
    change = block_sum(change, scratch);
    value = block_sum(value, scratch);
    if (threadIdx.x == 0 && update_sq != nullptr) *update_sq += change;
    if (threadIdx.x == 0 && param_sq != nullptr) *param_sq += value;
}

template <int VEC, typename TG, typename TS>
void launch(const Tensor& param,
            const Tensor& grad,
            const Tensor& m,
            const Tensor& v,
            const Tensor& copy,
            const AdamWScalars& s,
            const Tensor& update_sq,
            const Tensor& param_sq) {
    const int64_t n = param.numel();
    const unsigned blocks = grid_for((n + VEC - 1) / VEC, kThreads);
    // Every block writes its two partials before the sum reads them.
    const bool sums = update_sq.defined() || param_sq.defined();
    const Tensor partial = sums ? Tensor::scratch({2 * int64_t{blocks}}, DType::f64, core::Device::cuda) : Tensor();
    double* sq = sums ? static_cast<double*>(partial.raw()) : nullptr;
    const TG* g = static_cast<const TG*>(grad.raw());
    float* p = param.data<float>();
    auto *mp = static_cast<TS*>(m.raw()), *vp = static_cast<TS*>(v.raw());
    if (!copy.defined())
        adamw_kernel<VEC, TG, TS, float, false>
            <<<blocks, kThreads, 0, core::exec_stream()>>>(p, g, mp, vp, nullptr, n, s, sq);
    else
        MT_CUDA_DISPATCH(copy.dtype(), TC, {
            adamw_kernel<VEC, TG, TS, TC, true>
                <<<blocks, kThreads, 0, core::exec_stream()>>>(p, g, mp, vp, static_cast<TC*>(copy.raw()), n, s, sq);
        });
    if (sq == nullptr) return;
    MT_CUDA_CHECK(cudaGetLastError());
    square_sums_kernel<<<1, kThreads, 0, core::exec_stream()>>>(
        sq,
        blocks,
        update_sq.defined() ? update_sq.data<double>() : nullptr,
        param_sq.defined() ? param_sq.data<double>() : nullptr);
}

template <int VEC, typename TG>
void launch_state(const Tensor& param,
                  const Tensor& grad,
                  const Tensor& m,
                  const Tensor& v,
                  const Tensor& copy,
                  const AdamWScalars& s,
                  const Tensor& update_sq,
                  const Tensor& param_sq) {
    if (m.dtype() == DType::bf16)
        launch<VEC, TG, bf16>(param, grad, m, v, copy, s, update_sq, param_sq);
    else
        launch<VEC, TG, float>(param, grad, m, v, copy, s, update_sq, param_sq);
}

}  // namespace

void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale,
                const Tensor& param_copy,
                const AdamWRounding& rounding,
                const Tensor& update_sq,
                const Tensor& param_sq) {
    constexpr std::string_view op = "adamw_step";
    check_f32(param, op, "param");
    check_cuda_float(grad, op, "grad");
    if (m.dtype() != DType::bf16) {
        check_f32(m, op, "m");
        check_f32(v, op, "v");
    } else {
        check_dtype_as(v, m, op, "v", "m");
    }
    if (param_copy.defined()) check_cuda_float(param_copy, op, "param_copy");
    if (update_sq.defined()) check_dtype_in(update_sq, {DType::f64}, op, "update_sq");
    if (param_sq.defined()) check_dtype_in(param_sq, {DType::f64}, op, "param_sq");
    if (param.numel() == 0) return;
    core::NvtxRange range("adamw_step");
    const AdamWStepScalars h = adamw_step_scalars(hyper, step, grad_scale);
    const AdamWScalars s = device_scalars(
        h, core::sr_stream(rounding.seed, step, 0), core::sr_stream(rounding.seed, step, 1), rounding.first);
    const bool vec = vec_ok(param.numel(), {&param, &grad, &m, &v, &param_copy});
    MT_CUDA_DISPATCH(grad.dtype(), TG, {
        if (vec)
            launch_state<8, TG>(param, grad, m, v, param_copy, s, update_sq, param_sq);
        else
            launch_state<1, TG>(param, grad, m, v, param_copy, s, update_sq, param_sq);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(adamw_step, cuda, adamw_step, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
