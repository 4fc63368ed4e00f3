// The OpenBLAS kernels of the process: the first call of every main() (moetrain, the test binaries, the benchmarks).
// In core, beside the backends, because it is process setup, not an op: it only asks OpenBLAS what it chose.
#pragma once

namespace mt::core {

// Debian 12's OpenBLAS (0.3.21) picks its kernels from the CPU model when it loads and falls back to the SSE3
// "Prescott" ones on Intel models newer than it knows, Sapphire Rapids among them (OpenMathLib/OpenBLAS#4267, fixed
// in 0.3.25): 2-4x slower GEMMs on such a machine (docs/PERFORMANCE.md). OpenBLAS reads OPENBLAS_CORETYPE only when it
// loads, so the first thing a main() does is call this: when the variable is unset, OpenBLAS chose Prescott and the
// CPU has AVX-512 (SkylakeX kernels) or AVX2 + FMA (Haswell), it sets the variable and re-executes the program with
// the same arguments (before MPI or anything else starts). A variable the user set is left alone; when the re-exec
// fails the program goes on with the slow kernels.
void blas_select_kernels(char** argv);
// The kernels OpenBLAS uses ("SkylakeX", "Haswell", "Prescott", ...).
const char* blas_kernel_name();

}  // namespace mt::core
