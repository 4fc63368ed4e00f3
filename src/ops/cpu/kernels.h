// The CPU reference kernels behind the op entry points (src/ops/NAME.cpp), one file each in src/ops/cpu/NAME.cpp,
// instantiated for float and double. They take raw contiguous row-major pointers whose shapes the entry point has
// already checked; the shape of every pointer is in the comment above its kernel, as in the op headers.
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

// Below this much work (elements, or multiply-adds for GEMM-based ops) a kernel runs on the calling thread: waking
// the OpenMP team costs more than it saves. Chunking never depends on it, so results are the same either way.
constexpr int64_t kParallelMinWork = int64_t{1} << 15;

// ids [n] (already range-checked), weight [V, c], out [n, c]; dweight += scatter of dout [n, c].
template <typename T>
void embedding_fwd(const int32_t* ids, const T* weight, T* out, int64_t n, int64_t c);
template <typename T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dweight, int64_t n, int64_t c);

// x [n, k], w [m, k], bias [m] or null, y [n, m]; dx [n, k] or null (=), dw [m, k] (+=), dbias [m] or null (+=).
template <typename T>
void linear_fwd(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t k, int64_t m);
template <typename T>
void linear_bwd(
    const T* x, const T* w, const T* dy, T* dx, T* dw, T* dbias, int64_t n, int64_t k, int64_t m, bool accumulate_dx);

// x, y, dx [n, c], weight, dweight [c], rstd [n].
template <typename T>
void rmsnorm_fwd(const T* x, const T* weight, double eps, T* y, T* rstd, int64_t n, int64_t c);
template <typename T>
void rmsnorm_bwd(const T* x,
                 const T* weight,
                 const T* rstd,
                 const T* dy,
                 const T* dresidual,
                 T* dx,
                 T* dweight,
                 int64_t n,
                 int64_t c);

// x, y [b, t, h, d]; y may alias x. inverse = true applies the transposed rotation (the backward).
template <typename T>
void rope_rotate(
    const T* x, T* y, int64_t b, int64_t t, int64_t h, int64_t d, double theta, int64_t pos_offset, bool inverse);

// q, out, dout, dq [b, t, hq, d]; k, v, dk, dv [b, t, hkv, d]; lse [b, hq, t].
template <typename T>
void attention_fwd(
    const T* q, const T* k, const T* v, T* out, T* lse, int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d);
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
                   int64_t b,
                   int64_t t,
                   int64_t hq,
                   int64_t hkv,
                   int64_t d);

// gate, up, out, dout, dgate, dup [n] (any shape, flattened).
template <typename T>
void swiglu_fwd(const T* gate, const T* up, T* out, int64_t n);
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n);

// logits, dlogits [n, v] (dlogits may alias logits); targets [n] (already range-checked); losses, lse, dlosses [n].
template <typename T>
void cross_entropy_fwd(
    const T* logits, const int32_t* targets, int32_t ignore_index, T* losses, T* lse, int64_t n, int64_t v);
template <typename T>
void cross_entropy_bwd(const T* logits,
                       const int32_t* targets,
                       const T* lse,
                       int32_t ignore_index,
                       const T* dlosses,
                       T* dlogits,
                       int64_t n,
                       int64_t v);

// a, b, out [n] (out may alias a or b); da += dout, db += dout.
template <typename T>
void add_fwd(const T* a, const T* b, T* out, int64_t n);
template <typename T>
void add_bwd(const T* dout, T* da, T* db, int64_t n);

// One AdamW step over param, grad, m, v [n] (see ops/adamw.h for the formula).
template <typename T>
void adamw_step(T* param,
                const T* grad,
                T* m,
                T* v,
                int64_t n,
                double lr,
                double beta1,
                double beta2,
                double eps,
                double weight_decay,
                int64_t step,
                double grad_scale);

// sum(x^2) over x [n] in f64: fixed blocks of kNormBlock elements, each summed in order, then the block sums in
// block order, so the result does not depend on the thread count.
constexpr int64_t kNormBlock = 4096;
template <typename T>
double sum_squares(const T* x, int64_t n);

}  // namespace mt::ops::cpu
