// The CUDA side of every op: the entry points in src/ops/NAME.cpp check shapes and call these for tensors on a
// CUDA device. Each is defined in src/ops/cuda/NAME.cu (bf16 storage, fp32 accumulation; the dtypes each accepts
// are in its .cu file); in a build without nvcc, cuda_ops_stub.cpp defines them all to fail with ExitCode::device.
// Arguments and semantics are those of the public headers (src/ops/NAME.h).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/adamw.h"
#include "ops/kda.h"
#include "ops/moe_permute.h"
#include "ops/moe_router.h"
#include "ops/op_common.h"

namespace mt::ops::cuda {

void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out);
void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight);

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y);
void linear_bwd(const Tensor& x,
                const Tensor& w,
                const Tensor& dy,
                const Tensor& dx,
                const Tensor& dw,
                const Tensor& dbias,
                bool accumulate_dx);

void rmsnorm_fwd(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
void rmsnorm_bwd(const Tensor& x,
                 const Tensor& weight,
                 const Tensor& rstd,
                 const Tensor& dy,
                 const Tensor& dx,
                 const Tensor& dweight,
                 const Tensor& dresidual);

void rope_fwd(const Tensor& x, double theta, int64_t pos_offset, const Tensor& y);
void rope_bwd(const Tensor& dy, double theta, int64_t pos_offset, const Tensor& dx);

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
void attention_bwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const Tensor& dout,
                   const Tensor& dq,
                   const Tensor& dk,
                   const Tensor& dv);

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out);
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate, const Tensor& dup);

void cross_entropy_fwd(
    const Tensor& logits, const Tensor& targets, int32_t ignore_index, const Tensor& losses, const Tensor& lse);
void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits);

void add_fwd(const Tensor& a, const Tensor& b, const Tensor& out);
void add_bwd(const Tensor& dout, const Tensor& da, const Tensor& db);

// param_copy may be undefined (no model copy to write).
void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale,
                const Tensor& param_copy);

double global_norm(const std::vector<Tensor>& tensors);

// KDA (ops/kda.h), the chunked algorithm with chunk_size 64 or 32: q, k, v, g, beta, out (and dout and the input
// gradients) bf16, f16 or f32, one dtype; the states s0, st, dst, ds0 f32.
void kda_fwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& out,
             const Tensor& st,
             const ops::KdaOptions& options,
             ops::KdaSaved* saved);
void kda_bwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& dout,
             const Tensor& dst,
             const Tensor& dq,
             const Tensor& dk,
             const Tensor& dv,
             const Tensor& dg,
             const Tensor& dbeta,
             const Tensor& ds0,
             const ops::KdaOptions& options,
             const ops::KdaSaved* saved);

// The small ops of the KDA layer (ops/kda_gate.h, causal_conv1d.h, l2norm.h, sigmoid.h, sigmoid_gate.h); the dtypes
// each accepts are in its .cu file.
void kda_gate_fwd(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const Tensor& g, bool lower_bound, double lower);
void kda_gate_bwd(const Tensor& u,
                  const Tensor& a_log,
                  const Tensor& bias,
                  const Tensor& dg,
                  const Tensor& du,
                  const Tensor& da_log,
                  const Tensor& dbias,
                  bool lower_bound,
                  double lower);
void causal_conv1d_fwd(const Tensor& x, const Tensor& w, const Tensor& y, bool silu);
void causal_conv1d_bwd(
    const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw, bool silu);
void l2norm_fwd(const Tensor& x, double scale, double eps, const Tensor& y, const Tensor& rinv);
void l2norm_bwd(const Tensor& x, const Tensor& rinv, double scale, const Tensor& dy, const Tensor& dx);
void sigmoid_fwd(const Tensor& x, const Tensor& y);
void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx);
void sigmoid_gate_fwd(const Tensor& x, const Tensor& z, const Tensor& out);
void sigmoid_gate_bwd(const Tensor& x, const Tensor& z, const Tensor& dout, const Tensor& dx, const Tensor& dz);

// MoE (ops/moe_router.h, moe_permute.h, moe_unpermute.h, grouped_linear.h): src/ops/cuda/moe_*.cu and
// grouped_linear.cu. The router's scores, gates, cutoff and gate gradients may be f32 with bf16/f16 logits (the
// layer keeps routing in f32); index tensors are trusted (written by the router and the plan, not range-checked).
void moe_router_fwd(const Tensor& logits,
                    const Tensor& bias,
                    const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& cutoff,
                    const MoeRouterOptions& options);
void moe_router_bwd(const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& dgates,
                    const Tensor& dscores,
                    const Tensor& dlogits,
                    const MoeRouterOptions& options);
// Returns R: N * K without a capacity (no synchronisation), else offsets[E] copied back (one synchronisation).
int64_t moe_permute_plan(const Tensor& indices,
                         const Tensor& gates,
                         int64_t num_experts,
                         int64_t capacity,
                         MoeDropPolicy policy,
                         const Tensor& offsets,
                         const Tensor& slot_row,
                         const Tensor& row_token);
void moe_permute_fwd(const Tensor& x, const Tensor& row_token, const Tensor& xp);
void moe_permute_bwd(const Tensor& slot_row, const Tensor& dxp, const Tensor& dx);
void moe_unpermute_fwd(const Tensor& yp, const Tensor& slot_row, const Tensor& gates, const Tensor& y);
void moe_unpermute_bwd(const Tensor& yp,
                       const Tensor& slot_row,
                       const Tensor& gates,
                       const Tensor& dy,
                       const Tensor& dyp,
                       const Tensor& dgates);
// offsets: the host copy of the plan's [E + 1] offsets (the GEMM shapes are chosen on the host).
void grouped_linear_fwd(const Tensor& x, const Tensor& w, const int32_t* offsets, const Tensor& y);
void grouped_linear_bwd(const Tensor& x,
                        const Tensor& w,
                        const int32_t* offsets,
                        const Tensor& dy,
                        const Tensor& dx,
                        const Tensor& dw,
                        bool accumulate_dx);

// The MoE balancer's and metrics' device counting (nn/moe_balance.h, nn/moe_layer.h), src/ops/cuda/moe_balance.cu.
// counts [E] i64 += rows per expert of indices [N, K] i32 (integer atomics: exact in any order).
void moe_expert_counts(const Tensor& indices, const Tensor& counts);
// hist [E, B] i64 += QB's histogram of r = cutoff_i - s_ij (bins in double exactly as MoeBalancer's CPU path).
void moe_qb_histogram(const Tensor& scores, const Tensor& cutoff, double lower, double upper, const Tensor& hist);
// acc [1] f64 += sum over tokens of H(s_t / sum s_t) / ln E, in a fixed order.
void moe_token_entropy_sum(const Tensor& scores, const Tensor& acc);
// The micro-batch aux loss of nn::moe_aux_loss (one synchronisation: the loss comes back to the host).
double moe_aux_loss(const Tensor& scores, const Tensor& indices, double coeff, bool probs, const Tensor& dscores);

}  // namespace mt::ops::cuda
