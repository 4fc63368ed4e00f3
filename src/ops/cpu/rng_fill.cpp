// CPU reference of the counter-based normal fill (ops/rng_fill.h): core::rng_fill_normal, one draw per element, each
// its own Philox counter, so any thread count gives the same values.
#include "ops/rng_fill.h"

#include "core/rng.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

bool any_float(core::DType dtype) {
    return core::dtype_is_float(dtype);
}

}  // namespace

void rng_fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std) {
    check_dtype_in(out, {DType::f32, DType::f64, DType::bf16, DType::f16}, "rng_fill_normal", "out");
    core::rng_fill_normal(out, seed, stream, mean, std, offset);
}
MT_REGISTER_KERNEL(rng_fill_normal, cpu, rng_fill_normal, any_float);

}  // namespace mt::ops::cpu
