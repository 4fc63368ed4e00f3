// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
#include "core/rng.h"

#include <cmath>

namespace mt::core {

namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
    const uint64_t p = static_cast<uint64_t>(a) * b;
    *hi = static_cast<uint32_t>(p >> 32);
    *lo = static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
    uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(kPhiloxM0, c0, &hi0, &lo0);
        mulhilo(kPhiloxM1, c2, &hi1, &lo1);
        const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += kPhiloxW0;
        k1 += kPhiloxW1;
    }
    return {c0, c1, c2, c3};
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
    const auto block = philox4x32(seed, stream, offset);
    const uint64_t a = (static_cast<uint64_t>(block[0]) << 32 | block[1]) >> 11;
    const uint64_t b = (static_cast<uint64_t>(block[2]) << 32 | block[3]) >> 11;
    const double u1 = (static_cast<double>(a) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(b) * 0x1.0p-53;          // [0, 1)
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
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

void rng_fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, double mean, double std) {
    fill_flat(t, "rng_fill_normal", [&](int64_t i) {
        return mean + std * rng_normal(seed, stream, static_cast<uint64_t>(i));
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
