// AdamW step (Loshchilov & Hutter, decoupled weight decay), elementwise over flat buffers, as PyTorch's AdamW:
//   g = grad * grad_scale                     (grad_scale carries global-norm clipping)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   param -= lr * weight_decay * param
//   param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
//   param, grad, m, v: [n] f32|f64, all the same dtype; step >= 1. param, m, v are updated in place.
//   m, v may instead be bf16 with param and grad f32 (optim.state_dtype = "bf16"): the math runs in f32 on the
//   widened moments and each is stored back with stochastic rounding (core/stochastic_round.h), its random bits
//   drawn from `rounding`: stream sr_stream(seed, step, moment), element i at index rounding.first + i.
//   On CUDA: param f32 (master weights), m, v f32|bf16 (optimizer state); grad f32|bf16.
//   param_copy (optional, undefined = none): [n] bf16|f32, written (=) with the updated param converted
//   to its dtype: the low-precision model copy the forward reads, written by the same kernel on CUDA.
//   update_sq (optional, undefined = none): [1] f64 on param's device, += sum_i (param_new[i] - param_old[i])^2, the
//   squared L2 norm of the change the step applied (metrics.layer_stats: layer/<l>/update_norm), summed in f64 in a
//   fixed order; on CUDA by the same kernel (block partials, then one fixed-order sum), without a host sync.
//   param_sq (optional, undefined = none): [1] f64 like update_sq, += sum_i param_new[i]^2, the squared norm of the
//   updated parameter (layer/<l>/param_norm), summed beside update_sq by the same pass: no second read of the weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/op_common.h"

namespace mt::ops {

struct AdamWHyper {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.0;
};

// The step's scalars, formed in f64 once for every backend (each kernel casts them to its math type and runs the
// elementwise update in the order above): decay = 1 - lr wd, step_size = lr / (1 - beta1^step),
// bc2_sqrt = sqrt(1 - beta2^step).
struct AdamWStepScalars {
    double beta1, beta2, grad_scale, decay, step_size, bc2_sqrt, eps;
};
inline AdamWStepScalars adamw_step_scalars(const AdamWHyper& h, int64_t step, double grad_scale) {
    const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
    return {h.beta1, h.beta2, grad_scale, 1.0 - h.lr * h.weight_decay, h.lr / bc1, std::sqrt(bc2), h.eps};
}

// Where the stochastic rounding of bf16 moments draws its bits (unused for f32 moments): the run's seed and the
// index of the buffer's first element in a numbering that does not depend on how the buffer was cut (the
// optimizer uses the parameter's name hash and its element offset in the global tensor).
struct AdamWRounding {
    uint64_t seed = 0;
    int64_t first = 0;
};
void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale,
                const Tensor& param_copy = {},
                const AdamWRounding& rounding = {},
                const Tensor& update_sq = {},
                const Tensor& param_sq = {});

// The same step over a list of parameter pieces, each as adamw_step's arguments with its own weight decay (on or
// off) and rounding stream: the optimizer's whole update in one call. On CUDA a launch covers up to 32 pieces
// (kernel parameter space), a block one chunk of one piece, instead of a launch per piece (hundreds a step, most of
// them too small to fill the GPU); the elementwise math is adamw_step's, the squared sums are summed per piece in
// chunk order (deterministic; a different order than adamw_step's, so they can differ from it in the last bits).
// Every piece of a list has the same dtypes (param f32 on CUDA, grad, moments, copy or none of them), one device.
struct AdamWPiece {
    Tensor param, grad, m, v;
    Tensor param_copy;  // optional, as adamw_step's
    bool decay = true;  // hyper.weight_decay applies (false: 0, as for gains and biases)
    AdamWRounding rounding;
    Tensor update_sq, param_sq;  // optional [1] f64 each, as adamw_step's
};
void adamw_step_list(const std::vector<AdamWPiece>& pieces, const AdamWHyper& hyper, int64_t step, double grad_scale);

}  // namespace mt::ops
