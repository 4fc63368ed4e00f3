// Muon's step on a stack of whole matrices (muon.md §1), elementwise around a Newton-Schulz orthogonalisation:
//   g = grad * grad_scale
//   m = mu m + g;  n = g + mu m (nesterov) or m
//   X_0 = n / (||n||_F + 1e-7), transposed when A > B (so X is p x q, p = min(A, B), q = max(A, B))
//   X_{k+1} = a X_k + (b X_k X_k^T + c (X_k X_k^T)^2) X_k, (a, b, c) per MuonHyper::coeffs(k)
//   O = X_K transposed back;  param -= lr wd param;  param -= lr scale_factor sqrt(max(A, B)) O
//   param, grad, m: [E, A, B] (E matrices of A x B: the stacked experts; E = 1 for one weight) f32|f64, one dtype,
//   updated in place; each of the E matrices is orthogonalised on its own.
//   update_sq (optional): [1] f64 += the squared L2 norm of the change (metrics.layer_stats), as adamw_step's; or
//   [E] f64, each += its own matrix's (optim::Muon batches several parameters' matrices into one call).
//   param_copy (optional): [E, A, B] bf16|f16|f32, written (=) with the updated param in its dtype: the forward's
//   low-precision copy under mixed precision (on CUDA by the update kernel itself).
//   n_norm (optional): [E] f64 on param's device, written (=) with ||N||_F of each matrix, Newton-Schulz's input before
//   the normalisation (the metrics of muon.md §8; on CUDA from the normalisation's f32 reciprocal, about 1e-7
//   relative).
// The CPU reference runs the Newton-Schulz products as single-threaded BLAS calls, the E matrices in parallel
// (OpenMP). The CUDA path (ops/cuda/gemm/muon_newton_schulz.cu, ops/cuda/elementwise/muon_step.cu) runs the products as
// bf16 cuBLASLt GEMMs with fp32 accumulation, strided-batched over the E matrices (three per step), and the
// elementwise parts as fused f32 kernels: param, m f32, grad f32|bf16|f16; newton_schulz's x, out bf16|f16|f32.
// Deterministic on both (fixed-order sums); CUDA bf16 against the CPU's f32 is within rho 2e-2 (muon.md §9 test 1).
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

struct MuonHyper {
    double lr = 1e-3;
    double momentum = 0.95;  // mu
    bool nesterov = true;
    int ns_steps = 5;     // quintic steps (muon.ns_steps)
    bool hybrid = false;  // muon.ns_coeffs = "hybrid": 8 quintic steps, then 2 of (2, -1.5, 0.5) (ns_steps unused)
    double scale_factor = 0.2;
    double weight_decay = 0.1;

    int total_steps() const {
        return hybrid ? 10 : ns_steps;
    }
    // The coefficients (a, b, c) of Newton-Schulz step k: Keller Jordan's quintic (3.4445, -4.7750, 2.0315), whose
    // slope at 0 is maximal; the hybrid's last two steps (2, -1.5, 0.5) pin the singular values near 1.
    void coeffs(int k, double& a, double& b, double& c) const {
        if (hybrid && k >= 8) {
            a = 2.0, b = -1.5, c = 0.5;
        } else {
            a = 3.4445, b = -4.7750, c = 2.0315;
        }
    }
};

void muon_step(const Tensor& param,
               const Tensor& grad,
               const Tensor& m,
               const MuonHyper& hyper,
               double grad_scale,
               const Tensor& update_sq = {},
               const Tensor& param_copy = {},
               const Tensor& n_norm = {});

// muon_step in two halves around a newton_schulz of the caller's, for a matrix split over tensor-parallel ranks
// (muon.md §3 "TP-sharded matrices": each rank forms its slice of the direction, the slices are gathered whole and
// orthogonalised, and each rank applies its slice of the result). muon_momentum, newton_schulz, muon_apply equal
// muon_step bit for bit on the CPU (the same operations in the same order).
//   muon_momentum: g = grad grad_scale; m = mu m + g (in place); n = g + mu m (nesterov) or m, written.
//     grad, m, n [E, A, B]; CPU: one float dtype; CUDA: m, n f32, grad f32|bf16|f16.
//   muon_apply: param = decay param - step o, with decay = 1 - lr wd and step = lr scale_factor sqrt(max(A, B)) of
//     the whole matrix (the caller's: a slice does not know it); update_sq, param_copy as muon_step's.
//     param, o [E, A, B]; CPU: one float dtype; CUDA: param f32, o f32|bf16.
void muon_momentum(const Tensor& grad, const Tensor& m, const Tensor& n, const MuonHyper& hyper, double grad_scale);
void muon_apply(const Tensor& param,
                const Tensor& o,
                double decay,
                double step,
                const Tensor& update_sq = {},
                const Tensor& param_copy = {});

// Newton-Schulz alone (muon_step's orthogonalisation, exposed for the tests and the benchmark): out [E, A, B] = the
// orthogonalised x [E, A, B], each matrix normalised by its Frobenius norm first.
void newton_schulz(const Tensor& x, const Tensor& out, const MuonHyper& hyper);

}  // namespace mt::ops
