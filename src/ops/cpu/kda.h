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

}  // namespace mt::ops::cpu
