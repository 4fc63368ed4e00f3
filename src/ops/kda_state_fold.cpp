// The per-head affine map of context parallelism's KDA state fold (declared in ops/kda.h; host memory): a K x K by
// K x V product per head, the heads spread over OpenMP and each product one single-threaded BLAS call (the threading
// rule of ops/cpu/blas.h). It was a scalar loop nest in KdaCp that read the state down its columns: about 60 ms per
// span and direction at 16 heads of 128 x 128 (docs/PERFORMANCE.md, issue 28).
#include <algorithm>

#include "ops/cpu/blas.h"
#include "ops/cpu/threading.h"
#include "ops/kda.h"

namespace mt::ops {

namespace {

// out_h = c_h + op(M_h) in_h per head, M_h the last k of each row of v + k columns of maps, c_h [k, v] with row
// stride ldc and head stride c_head.
void fold_step(int64_t heads,
               int64_t k,
               int64_t v,
               const double* maps,
               const double* c,
               int64_t ldc,
               int64_t c_head,
               bool transpose,
               const double* in,
               double* out) {
    cpu::blas_use_one_thread();
    const int64_t state = k * v, row = v + k;
#pragma omp parallel for schedule(static) if (heads * k * state >= cpu::kParallelMinWork)
    for (int64_t h = 0; h < heads; ++h) {
        double* o = out + h * state;
        const double* ch = c + h * c_head;
        for (int64_t i = 0; i < k; ++i) std::copy_n(ch + i * ldc, v, o + i * v);
        cpu::gemm(transpose, false, k, v, k, 1.0, maps + h * k * row + v, row, in + h * state, v, 1.0, o, v);
    }
}

}  // namespace

void kda_state_fold_fwd(int64_t heads, int64_t k, int64_t v, const double* maps, const double* in, double* out) {
    fold_step(heads, k, v, maps, maps, v + k, k * (v + k), false, in, out);  // c = each row's h columns
}

void kda_state_fold_bwd(
    int64_t heads, int64_t k, int64_t v, const double* maps, const double* own, const double* in, double* out) {
    fold_step(heads, k, v, maps, own, v, k * v, true, in, out);
}

}  // namespace mt::ops
