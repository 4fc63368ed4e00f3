// Counter-based random numbers: Philox4x32-10 and the normal draw live in core/philox.h, shared with the GPU fill.
#include "core/rng.h"

#include <cmath>

#include "core/philox.h"

namespace mt::core {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
    const Philox4 b = philox4x32_block(seed, stream, counter);
    return {b.v[0], b.v[1], b.v[2], b.v[3]};
}

float rng_uniform(uint64_t seed, uint64_t stream, uint64_t offset) {
    const auto block = philox4x32(seed, stream, offset / 4);
    return static_cast<float>(block[offset % 4] >> 8) * (1.0f / 16777216.0f);
}

uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t offset) {
    const auto block = philox4x32(seed, stream, offset / 2);
    const size_t lane = (offset % 2) * 2;
    return (static_cast<uint64_t>(block[lane]) << 32) | block[lane + 1];
}

double rng_normal(uint64_t seed, uint64_t stream, uint64_t offset) {
    return philox_normal(seed, stream, offset);
}

namespace {
// Writes value(i) to every element of a contiguous float tensor. The type is resolved once, outside the loop:
// tensor_set_flat checks contiguity (a strides vector) per element, which was most of the time of drawing a
// model's billions of initial weights. Each element is its own draw (counter i), so threads give the same values
// as one thread.
template <typename Value>
void fill_flat(const Tensor& t, const char* what, Value value) {
    MT_CHECK(t.device() == Device::cpu && t.is_contiguous() && dtype_is_float(t.dtype()),
             "{} needs a contiguous float host tensor",
             what);
    const int64_t n = t.numel();
    auto fill = [&](auto* out, auto convert) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) out[i] = convert(value(i));
    };
    switch (t.dtype()) {
        case DType::f32:
            fill(static_cast<float*>(t.raw()), [](double v) { return static_cast<float>(v); });
            break;
        case DType::f64:
            fill(static_cast<double*>(t.raw()), [](double v) { return v; });
            break;
        case DType::bf16:
            fill(static_cast<uint16_t*>(t.raw()), [](double v) { return f32_to_bf16(static_cast<float>(v)); });
            break;
        case DType::f16:
            fill(static_cast<uint16_t*>(t.raw()), [](double v) { return f32_to_f16(static_cast<float>(v)); });
            break;
        default:
            break;
    }
}
}  // namespace

void rng_fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, double mean, double std, uint64_t offset) {
    fill_flat(t, "rng_fill_normal", [&](int64_t i) {
        return mean + std * rng_normal(seed, stream, offset + static_cast<uint64_t>(i));
    });
}

void rng_fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, double lo, double hi) {
    fill_flat(t, "rng_fill_uniform", [&](int64_t i) {
        return lo + (hi - lo) * rng_uniform(seed, stream, static_cast<uint64_t>(i));
    });
}

uint64_t hash_name(const char* name) {
    uint64_t h = 1469598103934665603ull;
    for (const char* p = name; *p; ++p) {
        h ^= static_cast<unsigned char>(*p);
        h *= 1099511628211ull;
    }
    return h;
}

}  // namespace mt::core
