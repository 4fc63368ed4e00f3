// CPU reference kernels of KDA (ops/kda.h) and of the small ops of the KDA layer (ops/kda_gate.h,
// ops/causal_conv1d.h, ops/l2norm.h, ops/sigmoid.h, ops/sigmoid_gate.h), instantiated for float and double. They
// take raw contiguous row-major pointers whose shapes the entry points have checked; shapes are in the comments.
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

// KDA sizes: q, k [b, t, h, k]; v, out [b, t, hv, v]; g [b, t, hv, k]; beta [b, t, hv]; states [b, hv, k, v].
struct KdaDims {
    int64_t b, t, h, hv, k, v;
};

// The token loop of kda.md §2. s0, st may be null (zero initial state; final state not wanted).
template <typename T>
void kda_recurrent_fwd(
    const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0, T* out, T* st, const KdaDims& d);
// Its backward; dst may be null (zero), ds0 null when s0 is. dq, dk, dv, dg, dbeta, ds0 written (=).
template <typename T>
void kda_recurrent_bwd(const T* q,
                       const T* k,
                       const T* v,
                       const T* g,
                       const T* beta,
                       const T* s0,
                       const T* dout,
                       const T* dst,
                       T* dq,
                       T* dk,
                       T* dv,
                       T* dg,
                       T* dbeta,
                       T* ds0,
                       const KdaDims& d);

// The chunked algorithm of kda.md §4 (chunk 64 or 32, sub-chunks of 16); pairwise picks the per-entry diagonal
// tiles instead of the anchored matmul ones. Same pointer conventions as the recurrent pair.
template <typename T>
void kda_chunked_fwd(const T* q,
                     const T* k,
                     const T* v,
                     const T* g,
                     const T* beta,
                     const T* s0,
                     T* out,
                     T* st,
                     const KdaDims& d,
                     int64_t chunk,
                     bool pairwise);
template <typename T>
void kda_chunked_bwd(const T* q,
                     const T* k,
                     const T* v,
                     const T* g,
                     const T* beta,
                     const T* s0,
                     const T* dout,
                     const T* dst,
                     T* dq,
                     T* dk,
                     T* dv,
                     T* dg,
                     T* dbeta,
                     T* ds0,
                     const KdaDims& d,
                     int64_t chunk,
                     bool pairwise);

// KDA gate over u, g [n, hv, k], a_log [hv] (null: a = 1), bias [hv, k]. lower_bound: g = l sigmoid(a (u + b));
// otherwise (softplus) g = -a softplus(u + b). du written; da_log (null when a_log is) and dbias accumulate.
template <typename T>
void kda_gate_fwd(
    const T* u, const T* a_log, const T* bias, T* g, int64_t n, int64_t hv, int64_t k, bool lower_bound, double l);
template <typename T>
void kda_gate_bwd(const T* u,
                  const T* a_log,
                  const T* bias,
                  const T* dg,
                  T* du,
                  T* da_log,
                  T* dbias,
                  int64_t n,
                  int64_t hv,
                  int64_t k,
                  bool lower_bound,
                  double l);

// Causal depthwise conv over x, y [b, t, c] with w [c, width] (tap width-1 on the current token), then SiLU when
// silu. dx written, dw accumulated.
template <typename T>
void causal_conv1d_fwd(const T* x, const T* w, T* y, int64_t b, int64_t t, int64_t c, int64_t width, bool silu);
template <typename T>
void causal_conv1d_bwd(
    const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t b, int64_t t, int64_t c, int64_t width, bool silu);

// Row L2 norm over x, y, dx [n, c]: y = scale x r, r = 1 / sqrt(|x|^2 + eps) saved in rinv [n]. dx written.
template <typename T>
void l2norm_fwd(const T* x, T* y, T* rinv, int64_t n, int64_t c, double scale, double eps);
template <typename T>
void l2norm_bwd(const T* x, const T* rinv, const T* dy, T* dx, int64_t n, int64_t c, double scale);

// y = sigmoid(x) over [n]; dx = dy y (1 - y) written.
template <typename T>
void sigmoid_fwd(const T* x, T* y, int64_t n);
template <typename T>
void sigmoid_bwd(const T* y, const T* dy, T* dx, int64_t n);

// out = x sigmoid(z) over [n]; dx, dz written.
template <typename T>
void sigmoid_gate_fwd(const T* x, const T* z, T* out, int64_t n);
template <typename T>
void sigmoid_gate_bwd(const T* x, const T* z, const T* dout, T* dx, T* dz, int64_t n);

}  // namespace mt::ops::cpu
