// main() of mt_tests: GoogleTest's own main, after OpenBLAS is given the kernels this CPU allows (ops/cpu/blas.h:
// Debian's OpenBLAS falls back to slow generic ones on newer Intel CPUs, which made the whole suite several times
// slower on such machines).
#include <gtest/gtest.h>

#include "core/blas_kernels.h"

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
