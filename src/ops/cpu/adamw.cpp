// CPU reference of the AdamW step, elementwise over flat buffers (as PyTorch's single-tensor AdamW).
#include "ops/adamw.h"

#include <cmath>
#include <vector>

#include "core/stochastic_round.h"
#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 16384;  // elements per parallel task

// The squared change and the squared new value of the blocks (f64 partials per block, written by the block's task),
// summed in block order into *update_sq and *param_sq (either may be null): the same result for any thread count.
struct SquareSums {
    SquareSums(double* update_sq, double* param_sq, int64_t blocks)
        : update_sq(update_sq),
          param_sq(param_sq),
          change(update_sq != nullptr ? static_cast<size_t>(blocks) : 0, 0.0),
          value(param_sq != nullptr ? static_cast<size_t>(blocks) : 0, 0.0) {}
    void add(int64_t blk, double old_value, double new_value) {
        if (update_sq != nullptr) change[static_cast<size_t>(blk)] += (new_value - old_value) * (new_value - old_value);
        if (param_sq != nullptr) value[static_cast<size_t>(blk)] += new_value * new_value;
    }
    void finish() const {
        for (double p : change) *update_sq += p;
        for (double p : value) *param_sq += p;
    }
    double *update_sq, *param_sq;
    std::vector<double> change, value;
};
}  // namespace

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// param *= 1 - lr * wd;  param -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bci = 1 - bi^step.
// The scalars come in f64 (adamw_step_scalars) and the elementwise math runs in T (as PyTorch does for f32
// parameters). update_sq, param_sq (or null): += the sums of the squared changes and squared new values, in f64.
template <typename T>
void adamw_step(
    T* param, const T* grad, T* m, T* v, int64_t n, const AdamWStepScalars& s, double* update_sq, double* param_sq) {
    const T b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2), gs = static_cast<T>(s.grad_scale);
    const T decay = static_cast<T>(s.decay), step_size = static_cast<T>(s.step_size);
    const T bc2_sqrt = static_cast<T>(s.bc2_sqrt), eps_t = static_cast<T>(s.eps);
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    SquareSums sq(update_sq, param_sq, blocks);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            const T g = grad[i] * gs;
            m[i] = b1 * m[i] + (T(1) - b1) * g;
            v[i] = b2 * v[i] + (T(1) - b2) * g * g;
            const T old = param[i];
            param[i] = param[i] * decay - step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps_t);
            sq.add(blk, static_cast<double>(old), static_cast<double>(param[i]));
        }
    }
    sq.finish();
}

template void adamw_step<float>(
    float*, const float*, float*, float*, int64_t, const AdamWStepScalars&, double*, double*);
template void adamw_step<double>(
    double*, const double*, double*, double*, int64_t, const AdamWStepScalars&, double*, double*);

// The same step with bf16 moments (param and grad f32): each moment widened to f32, updated in the order above, and
// stored with stochastic rounding; the parameter update reads the f32 values before rounding, as the CUDA kernel.
void adamw_step_bf16_state(float* param,
                           const float* grad,
                           uint16_t* m,
                           uint16_t* v,
                           int64_t n,
                           const AdamWStepScalars& s,
                           int64_t step,
                           const AdamWRounding& rounding,
                           double* update_sq,
                           double* param_sq) {
    const float b1 = static_cast<float>(s.beta1), b2 = static_cast<float>(s.beta2);
    const float gs = static_cast<float>(s.grad_scale), decay = static_cast<float>(s.decay);
    const float step_size = static_cast<float>(s.step_size), bc2_sqrt = static_cast<float>(s.bc2_sqrt);
    const float eps = static_cast<float>(s.eps);
    const uint64_t stream_m = core::sr_stream(rounding.seed, step, 0),
                   stream_v = core::sr_stream(rounding.seed, step, 1);
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    SquareSums sq(update_sq, param_sq, blocks);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            const float g = grad[i] * gs;
            const float mi = b1 * core::bf16_to_f32(m[i]) + (1.0f - b1) * g;
            const float vi = b2 * core::bf16_to_f32(v[i]) + (1.0f - b2) * g * g;
            const float old = param[i];
            param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
            sq.add(blk, static_cast<double>(old), static_cast<double>(param[i]));
            const auto at = static_cast<uint64_t>(rounding.first + i);
            m[i] = core::f32_to_bf16_stochastic(mi, core::sr_random_bits(stream_m, at));
            v[i] = core::f32_to_bf16_stochastic(vi, core::sr_random_bits(stream_v, at));
        }
    }
    sq.finish();
}

// The CPU kernel of ops::adamw_step (registered in the op registry): the CPU dtypes, then the float dispatch.
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
    check_float_arg(param, op, "param", 1);
    check_float_arg(grad, op, "grad", 1);
    check_dtype_as(grad, param, op, "grad", "param");
    if (param_copy.defined()) check_dtype_in(param_copy, {DType::bf16, DType::f32}, op, "param_copy");
    const AdamWStepScalars scalars = adamw_step_scalars(hyper, step, grad_scale);
    double* sq = update_sq.defined() ? update_sq.data<double>() : nullptr;
    double* psq = param_sq.defined() ? param_sq.data<double>() : nullptr;
    if (m.dtype() == DType::bf16) {
        check_dtype_as(v, m, op, "v", "m");
        MT_CHECK(param.dtype() == DType::f32,
                 "{}: bf16 moments need f32 param, got {}",
                 op,
                 core::dtype_name(param.dtype()));
        adamw_step_bf16_state(param.data<float>(),
                              grad.data<float>(),
                              static_cast<uint16_t*>(m.raw()),
                              static_cast<uint16_t*>(v.raw()),
                              param.numel(),
                              scalars,
                              step,
                              rounding,
                              sq,
                              psq);
    } else {
        check_float_arg(m, op, "m", 1);
        check_float_arg(v, op, "v", 1);
        check_dtype_as(m, param, op, "m", "param");
        check_dtype_as(v, param, op, "v", "param");
        MT_DISPATCH_FLOAT(param.dtype(),
                          op,
                          cpu::adamw_step(param.data<scalar_t>(),
                                          grad.data<scalar_t>(),
                                          m.data<scalar_t>(),
                                          v.data<scalar_t>(),
                                          param.numel(),
                                          scalars,
                                          sq,
                                          psq));
    }
    if (param_copy.defined()) param_copy.copy_from(param);  // converts (round to nearest even for bf16)
}
MT_REGISTER_KERNEL(adamw_step, cpu, adamw_step, ::mt::ops::float_dtypes);

// The list form on the CPU: each piece by the kernel above (its blocks are already parallel).
void adamw_step_list(const std::vector<AdamWPiece>& pieces, const AdamWHyper& hyper, int64_t step, double grad_scale) {
    AdamWHyper no_decay = hyper;
    no_decay.weight_decay = 0.0;
    for (const AdamWPiece& p : pieces)
        cpu::adamw_step(p.param,
                        p.grad,
                        p.m,
                        p.v,
                        p.decay ? hyper : no_decay,
                        step,
                        grad_scale,
                        p.param_copy,
                        p.rounding,
                        p.update_sq,
                        p.param_sq);
}
MT_REGISTER_KERNEL(adamw_step_list, cpu, adamw_step_list, ::mt::ops::any_dtype);

}  // namespace mt::ops::cpu
