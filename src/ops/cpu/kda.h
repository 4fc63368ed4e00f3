// The KDA CPU references on raw pointers (kda_recurrent.cpp: kda.md §2; kda_chunked.cpp: §3-§4), called by the
// registered kernels in cpu/kda.cpp. Shapes: q, k [B, T, H, K]; v, out [B, T, HV, V]; g [B, T, HV, K];
// beta [B, T, HV]; states [B, HV, K, V].
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

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
// tiles instead of the anchored matmul ones. Same pointer conventions as the recurrent pair. reset: null, or
// [B, ceil(T / chunk)] flags (ops::KdaOptions::chunk_reset): the state entering a flagged chunk is zero.
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
                     bool pairwise,
                     const int32_t* reset = nullptr);
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
                     bool pairwise,
                     const int32_t* reset = nullptr);

// KDA gate over u, g [n, hv, k], a_log [hv] (null: a = 1), bias [hv, k]. lower_bound: g = l sigmoid(a (u + b));
// otherwise (softplus) g = -a softplus(u + b). du written; da_log (null when a_log is) and dbias accumulate.

// One step of context parallelism's affine state fold (nn/layers/kda_cp.cpp), in f64 on the host, for each of
// `heads` heads h: out_h = c_h + M_h in_h (transpose false: the forward fold, S_out = M S_in + h) or
// out_h = c_h + M_h^T in_h (transpose true: the backward fold, dS_in = M^T dS_out + own). M_h [K, K] (row stride ldm)
// starts at m + h * m_head, c_h [K, V] (row stride ldc) at c + h * c_head; in and out are dense [heads, K, V] and must
// not overlap. One single-threaded GEMM per head, OpenMP over the heads: the result does not depend on the thread
// count.
void kda_state_affine(int64_t heads,
                      int64_t k,
                      int64_t v,
                      const double* m,
                      int64_t ldm,
                      int64_t m_head,
                      const double* c,
                      int64_t ldc,
                      int64_t c_head,
                      bool transpose,
                      const double* in,
                      double* out);

}  // namespace mt::ops::cpu
