// Entry point of the counter-based normal fill: contiguity and finite arguments, then the CPU reference or the CUDA
// kernel.
#include "ops/rng_fill.h"

#include <cmath>
#include <string_view>

#include "ops/registry.h"

namespace mt::ops {

void rng_fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std) {
    constexpr std::string_view op = "rng_fill_normal";
    check_arg(out, op, "out", out.ndim());
    MT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.0,
             "{}: mean {} and std {} must be finite, std >= 0",
             op,
             mean,
             std);
    MT_CALL_KERNEL(rng_fill_normal, out.device(), out, seed, stream, offset, mean, std);
}

}  // namespace mt::ops
