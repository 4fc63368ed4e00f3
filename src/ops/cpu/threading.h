// The CPU references' threading threshold (the threading rule itself is in blas.h).
#pragma once

#include <cstdint>

namespace mt::ops::cpu {

// Below this much work (elements, or multiply-adds for GEMM-based ops) a kernel runs on the calling thread: waking
// the OpenMP team costs more than it saves. Chunking never depends on it, so results are the same either way.
constexpr int64_t kParallelMinWork = int64_t{1} << 15;

}  // namespace mt::ops::cpu
