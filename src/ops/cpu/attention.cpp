// CPU reference of GQA attention, causal or bidirectional (AttentionMask::causal), with optional document masking
// (AttentionMask::doc_start). Per (batch, head)
// the queries go in blocks of kQBlock rows; a block's scores against the keys it may see (positions < the block's end)
// come from one GEMM into a [kQBlock, T] scratch, the causal mask and the softmax are applied to that scratch row by
// row, and a second GEMM multiplies by V. The backward recomputes the probabilities from the saved lse (as
// FlashAttention) and uses three more GEMMs per block. Memory is O(kQBlock * T) per thread, and every GEMM is
// single-threaded BLAS (see blas.h).
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/cpu/vec_math.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kQBlock = 64;  // query rows per score block

// The keys [lo, end) the query at key position pos of batch row bb sees: from its document's start (and with a window
// from pos - window + 1) up to itself when causal, or to its document's end when not (AttentionMask::causal).
struct KeyRange {
    int64_t lo, end;
};
KeyRange key_range(const int32_t* doc_start, int64_t window, bool causal, int64_t bb, int64_t tk, int64_t pos) {
    const int32_t* row = doc_start != nullptr ? doc_start + bb * tk : nullptr;
    const int64_t lo = row != nullptr ? row[pos] : 0;
    KeyRange r{window > 0 ? std::max(lo, pos - window + 1) : lo, pos + 1};
    if (!causal) {
        r.end = tk;
        if (row != nullptr)
            for (int64_t s = pos + 1; s < tk; ++s)
                if (row[s] == s) {  // the next document's first token
                    r.end = s;
                    break;
                }
    }
    return r;
}
}  // namespace

// For each (b, h) with kv head kh = h / (hq / hkv), and query i at key position p = tk - t + i (the queries are the
// last t of the tk positions) with keys [lo, end) from key_range: lo = max(doc_start[b, p], p - window + 1)
// (doc_start 0 without document masking, no window term when window is 0), end = p + 1 when causal, else the end of
// p's document (tk without document masking):
//   s[j] = q[b, i, h] . k[b, j, kh] / sqrt(d) for lo <= j < end;  lse[b, h, i] = log(sum_j exp(s[j]))
//   out[b, i, h] = sum_j exp(s[j] - lse) v[b, j, kh];  max_logit[b, h, i] = max_j s[j] (when asked for)
// The score GEMM still covers keys [0, p] (all tk keys when not causal); the keys outside [lo, end) are zeroed after
// the softmax of [lo, end) (a reference: the CUDA kernels skip the tiles outside).
template <typename T>
void attention_fwd(const T* q,
                   const T* k,
                   const T* v,
                   T* out,
                   T* lse,
                   T* max_logit,
                   const int32_t* doc_start,
                   int64_t window,
                   bool causal,
                   int64_t b,
                   int64_t t,
                   int64_t tk,
                   int64_t hq,
                   int64_t hkv,
                   int64_t d) {
    blas_use_one_thread();
    const int64_t group = hq / hkv, qs = hq * d, ks = hkv * d;  // row strides of q/out and k/v
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
    const int64_t off = tk - t;  // the key position of query 0
#pragma omp parallel if (b * hq * t * tk * d >= kParallelMinWork)
    {
        std::vector<T> scores(static_cast<size_t>(kQBlock * tk));  // [rows, keys] of one block
#pragma omp for schedule(dynamic, 1)
        for (int64_t unit = 0; unit < b * hq; ++unit) {
            const int64_t bb = unit / hq, h = unit % hq, kh = h / group;
            const T* qh = q + bb * t * qs + h * d;     // [t, d], row stride qs
            const T* kh_ = k + bb * tk * ks + kh * d;  // [tk, d], row stride ks
            const T* vh = v + bb * tk * ks + kh * d;   // [tk, d], row stride ks
            T* oh = out + bb * t * qs + h * d;         // [t, d], row stride qs
            T* lh = lse + unit * t;                    // [t]
            T* mh = max_logit != nullptr ? max_logit + unit * t : nullptr;
            for (int64_t r0 = 0; r0 < t; r0 += kQBlock) {
                const int64_t rows = std::min(kQBlock, t - r0), keys = causal ? off + r0 + rows : tk;
                T* s = scores.data();  // [rows, keys]
                gemm(false, true, rows, keys, d, scale, qh + r0 * qs, qs, kh_, ks, T(0), s, keys);
                for (int64_t i = 0; i < rows; ++i) {
                    T* sr = s + i * keys;  // [keys]; keys j < lo and j >= valid are masked
                    const auto [lo, valid] = key_range(doc_start, window, causal, bb, tk, off + r0 + i);
                    T* sv = sr + lo;  // the visible keys [lo, valid)
                    const int64_t nv = valid - lo;
                    const T mx = max_value(sv, nv);
                    exp_affine(sv, sv, nv, T(1), -mx);
                    T sum = 0;
#pragma omp simd reduction(+ : sum)
                    for (int64_t j = 0; j < nv; ++j) sum += sv[j];
                    const T inv = T(1) / sum;
                    for (int64_t j = 0; j < nv; ++j) sv[j] *= inv;
                    std::fill(sr, sv, T(0));
                    std::fill(sr + valid, sr + keys, T(0));
                    lh[r0 + i] = mx + std::log(sum);
                    if (mh != nullptr) mh[r0 + i] = mx;
                }
                gemm(false, false, rows, d, keys, T(1), s, keys, vh, ks, T(0), oh + r0 * qs, qs);
            }
        }
    }
}

// With p = exp(s - lse) (0 where masked) and D_i = dout_i . out_i, per (b, h) and query block:
//   dp = dout v^T;  ds = p * (dp - D_i)
//   dq = ds k / sqrt(d) (written);  dk += ds^T q / sqrt(d);  dv += p^T dout
// A task owns one kv head of one batch row and runs the query heads of its group in order, so dk and dv are summed
// in a fixed order; they are zeroed first (written, =).
template <typename T>
void attention_bwd(const T* q,
                   const T* k,
                   const T* v,
                   const T* out,
                   const T* lse,
                   const T* dout,
                   T* dq,
                   T* dk,
                   T* dv,
                   const int32_t* doc_start,
                   int64_t window,
                   bool causal,
                   int64_t b,
                   int64_t t,
                   int64_t tk,
                   int64_t hq,
                   int64_t hkv,
                   int64_t d) {
    blas_use_one_thread();
    const int64_t group = hq / hkv, qs = hq * d, ks = hkv * d;
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
    const int64_t off = tk - t;  // the key position of query 0
#pragma omp parallel if (b * hq * t * tk * d >= kParallelMinWork)
    {
        std::vector<T> probs(static_cast<size_t>(kQBlock * tk));  // [rows, keys]: p
        std::vector<T> grads(static_cast<size_t>(kQBlock * tk));  // [rows, keys]: dp, then ds
#pragma omp for schedule(dynamic, 1)
        for (int64_t unit = 0; unit < b * hkv; ++unit) {
            const int64_t bb = unit / hkv, kh = unit % hkv;
            const T* kh_ = k + bb * tk * ks + kh * d;  // [tk, d], row stride ks
            const T* vh = v + bb * tk * ks + kh * d;
            T* dkh = dk + bb * tk * ks + kh * d;
            T* dvh = dv + bb * tk * ks + kh * d;
            for (int64_t j = 0; j < tk; ++j) {
                std::fill(dkh + j * ks, dkh + j * ks + d, T(0));
                std::fill(dvh + j * ks, dvh + j * ks + d, T(0));
            }
            for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
                const T* qh = q + bb * t * qs + h * d;  // [t, d], row stride qs
                const T* oh = out + bb * t * qs + h * d;
                const T* doh = dout + bb * t * qs + h * d;
                T* dqh = dq + bb * t * qs + h * d;
                const T* lh = lse + (bb * hq + h) * t;  // [t]
                for (int64_t r0 = 0; r0 < t; r0 += kQBlock) {
                    const int64_t rows = std::min(kQBlock, t - r0), keys = causal ? off + r0 + rows : tk;
                    T* p = probs.data();  // [rows, keys]
                    T* g = grads.data();  // [rows, keys]
                    gemm(false, true, rows, keys, d, scale, qh + r0 * qs, qs, kh_, ks, T(0), p, keys);
                    gemm(false, true, rows, keys, d, T(1), doh + r0 * qs, qs, vh, ks, T(0), g, keys);
                    for (int64_t i = 0; i < rows; ++i) {
                        T* pr = p + i * keys;  // [keys]
                        T* gr = g + i * keys;  // [keys]
                        const T* o_i = oh + (r0 + i) * qs;
                        const T* do_i = doh + (r0 + i) * qs;
                        T di = 0;
#pragma omp simd reduction(+ : di)
                        for (int64_t c = 0; c < d; ++c) di += do_i[c] * o_i[c];
                        const auto [lo, valid] = key_range(doc_start, window, causal, bb, tk, off + r0 + i);
                        const T l = lh[r0 + i];
                        exp_affine(pr + lo, pr + lo, valid - lo, T(1), -l);
                        for (int64_t j = lo; j < valid; ++j) gr[j] = pr[j] * (gr[j] - di);
                        std::fill(pr, pr + lo, T(0));
                        std::fill(gr, gr + lo, T(0));
                        std::fill(pr + valid, pr + keys, T(0));
                        std::fill(gr + valid, gr + keys, T(0));
                    }
                    gemm(false, false, rows, d, keys, scale, g, keys, kh_, ks, T(0), dqh + r0 * qs, qs);
                    gemm(true, false, keys, d, rows, scale, g, keys, qh + r0 * qs, qs, T(1), dkh, ks);
                    gemm(true, false, keys, d, rows, T(1), p, keys, doh + r0 * qs, qs, T(1), dvh, ks);
                }
            }
        }
    }
}

template void attention_fwd<float>(const float*,
                                   const float*,
                                   const float*,
                                   float*,
                                   float*,
                                   float*,
                                   const int32_t*,
                                   int64_t,
                                   bool,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   int64_t);
template void attention_fwd<double>(const double*,
                                    const double*,
                                    const double*,
                                    double*,
                                    double*,
                                    double*,
                                    const int32_t*,
                                    int64_t,
                                    bool,
                                    int64_t,
                                    int64_t,
                                    int64_t,
                                    int64_t,
                                    int64_t,
                                    int64_t);
template void attention_bwd<float>(const float*,
                                   const float*,
                                   const float*,
                                   const float*,
                                   const float*,
                                   const float*,
                                   float*,
                                   float*,
                                   float*,
                                   const int32_t*,
                                   int64_t,
                                   bool,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   int64_t);
template void attention_bwd<double>(const double*,
                                    const double*,
                                    const double*,
                                    const double*,
                                    const double*,
                                    const double*,
                                    double*,
                                    double*,
                                    double*,
                                    const int32_t*,
                                    int64_t,
                                    bool,
                                    int64_t,
                                    int64_t,
                                    int64_t,
                                    int64_t,
                                    int64_t,
                                    int64_t);

namespace {

// q, k, v, lse on the CPU, one float dtype (ops/attention.cpp checked the shapes).
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, std::string_view op) {
    check_float_arg(q, op, "q", 4);
    check_float_arg(k, op, "k", 4);
    check_float_arg(v, op, "v", 4);
    check_float_arg(lse, op, "lse", 3);
    check_dtype_as(k, q, op, "k", "q");
    check_dtype_as(v, q, op, "v", "q");
    check_dtype_as(lse, q, op, "lse", "q");
}

}  // namespace

// The CPU kernel of ops::attention_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void attention_fwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const AttentionOptions& options,
                   const AttentionMask& mask,
                   const Tensor& max_logit) {
    constexpr std::string_view op = "attention_fwd";
    if (options.chosen != nullptr) *options.chosen = "cpu-reference";
    check_qkv(q, k, v, lse, op);
    check_float_arg(out, op, "out", 4);
    check_dtype_as(out, q, op, "out", "q");
    if (max_logit.defined()) check_dtype_as(max_logit, lse, op, "max_logit", "lse");
    const int32_t* doc_start = mask.doc_start.defined() ? mask.doc_start.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(q.dtype(),
                      op,
                      cpu::attention_fwd(q.data<scalar_t>(),
                                         k.data<scalar_t>(),
                                         v.data<scalar_t>(),
                                         out.data<scalar_t>(),
                                         lse.data<scalar_t>(),
                                         max_logit.defined() ? max_logit.data<scalar_t>() : nullptr,
                                         doc_start,
                                         mask.window,
                                         mask.causal,
                                         q.size(0),
                                         q.size(1),
                                         k.size(1),
                                         q.size(2),
                                         k.size(2),
                                         q.size(3)));
}
MT_REGISTER_KERNEL(attention_fwd, cpu, attention_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::attention_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void attention_bwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const Tensor& dout,
                   const Tensor& dq,
                   const Tensor& dk,
                   const Tensor& dv,
                   const AttentionOptions& options,
                   const AttentionMask& mask) {
    constexpr std::string_view op = "attention_bwd";
    if (options.chosen != nullptr) *options.chosen = "cpu-reference";
    check_qkv(q, k, v, lse, op);
    const std::pair<const Tensor*, std::string_view> like_q[] = {{&out, "out"}, {&dout, "dout"}, {&dq, "dq"}};
    for (const auto& [t, name] : like_q) {
        check_float_arg(*t, op, name, 4);
        check_dtype_as(*t, q, op, name, "q");
    }
    const std::pair<const Tensor*, std::string_view> like_k[] = {{&dk, "dk"}, {&dv, "dv"}};
    for (const auto& [t, name] : like_k) {
        check_float_arg(*t, op, name, 4);
        check_dtype_as(*t, q, op, name, "q");
    }
    const int32_t* doc_start = mask.doc_start.defined() ? mask.doc_start.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(q.dtype(),
                      op,
                      cpu::attention_bwd(q.data<scalar_t>(),
                                         k.data<scalar_t>(),
                                         v.data<scalar_t>(),
                                         out.data<scalar_t>(),
                                         lse.data<scalar_t>(),
                                         dout.data<scalar_t>(),
                                         dq.data<scalar_t>(),
                                         dk.data<scalar_t>(),
                                         dv.data<scalar_t>(),
                                         doc_start,
                                         mask.window,
                                         mask.causal,
                                         q.size(0),
                                         q.size(1),
                                         k.size(1),
                                         q.size(2),
                                         k.size(2),
                                         q.size(3)));
}
MT_REGISTER_KERNEL(attention_bwd, cpu, attention_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
