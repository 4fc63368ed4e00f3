// GEMM wrappers over OpenBLAS's cblas (see blas.h for the threading rule).
#include "ops/cpu/blas.h"

#include <cblas.h>

#include <algorithm>

namespace mt::ops::cpu {

void blas_use_one_thread() {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

namespace {

// C = beta * C for an empty inner dimension (BLAS is not called with k == 0).
template <typename T>
void scale_rows(int64_t m, int64_t n, T beta, T* c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
}

CBLAS_TRANSPOSE trans(bool t) {
    return t ? CblasTrans : CblasNoTrans;
}

int ld(int64_t x) {
    return static_cast<int>(std::max<int64_t>(1, x));
}

}  // namespace

void gemm(bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          float alpha,
          const float* a,
          int64_t lda,
          const float* b,
          int64_t ldb,
          float beta,
          float* c,
          int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) return scale_rows(m, n, beta, c, ldc);
    cblas_sgemm(CblasRowMajor,
                trans(trans_a),
                trans(trans_b),
                static_cast<int>(m),
                static_cast<int>(n),
                static_cast<int>(k),
                alpha,
                a,
                ld(lda),
                b,
                ld(ldb),
                beta,
                c,
                ld(ldc));
}

void gemm(bool trans_a,
          bool trans_b,
          int64_t m,
          int64_t n,
          int64_t k,
          double alpha,
          const double* a,
          int64_t lda,
          const double* b,
          int64_t ldb,
          double beta,
          double* c,
          int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) return scale_rows(m, n, beta, c, ldc);
    cblas_dgemm(CblasRowMajor,
                trans(trans_a),
                trans(trans_b),
                static_cast<int>(m),
                static_cast<int>(n),
                static_cast<int>(k),
                alpha,
                a,
                ld(lda),
                b,
                ld(ldb),
                beta,
                c,
                ld(ldc));
}

}  // namespace mt::ops::cpu
