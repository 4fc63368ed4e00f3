// GEMM wrappers over OpenBLAS's cblas (see blas.h for the threading rule).
#include "ops/cpu/blas.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace mt::ops::cpu {

void blas_use_one_thread() {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

const char* blas_kernel_name() {
    return openblas_get_corename();
}

void blas_select_kernels(char** argv) {
    if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::strcmp(openblas_get_corename(), "Prescott") != 0) return;
    __builtin_cpu_init();
    const char* kernels = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        kernels = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        kernels = "Haswell";
    if (kernels == nullptr) return;
    // Set even if the exec fails, so that a child process this one starts gets the right kernels.
    setenv("OPENBLAS_CORETYPE", kernels, 1);
    execv("/proc/self/exe", argv);
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
