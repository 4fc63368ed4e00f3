// GEMM for the CPU reference ops, and the threading rule that goes with it.
//
// Threading rule: OpenBLAS runs single-threaded, and all CPU parallelism comes from OpenMP over fixed-size chunks
// of work, each chunk making its own single-threaded BLAS call. Debian's OpenBLAS is the pthreads build, whose
// own worker pool would otherwise compete with the OpenMP pool for the same cores (and a BLAS call made inside an
// OpenMP region would fan out again). Chunk boundaries never depend on the thread count, so results are bitwise
// the same for any OMP_NUM_THREADS. Every op that calls BLAS first calls blas_use_one_thread() outside its
// parallel region; it pins OpenBLAS to one thread for the whole process (moetrain code calls BLAS only from ops).
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

// Sets OpenBLAS to one thread if it is not already; call outside OpenMP parallel regions.
void blas_use_one_thread();

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X^T when trans_x. Handles empty sizes (m, n or
// k == 0) without calling BLAS. Single-threaded (see above), so safe inside OpenMP regions.
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
          int64_t ldc);
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
          int64_t ldc);

// Number of fixed-size chunks covering n items.
inline int64_t chunk_count(int64_t n, int64_t chunk) {
    return (n + chunk - 1) / chunk;
}

}  // namespace mt::ops::cpu
