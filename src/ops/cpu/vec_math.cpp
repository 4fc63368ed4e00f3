// Vectorized exp and max (see vec_math.h), written once over a GCC vector type and compiled twice: with 4-lane
// vectors for baseline x86-64 (SSE2) and with 8-lane vectors for AVX2, picked at the first call. Neither path uses
// FMA, so both give bitwise the same results.
#include "ops/cpu/vec_math.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace mt::ops::cpu {

namespace {

typedef float Float4 __attribute__((vector_size(16)));
typedef int32_t Int4 __attribute__((vector_size(16)));
typedef float Float8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));

// v = exp(v) lane by lane: v = n ln2 + r with n = round(v / ln2) and |r| <= ln2 / 2; exp(r) by the Cephes expf
// polynomial; 2^n built in the exponent bits. (Vectors by reference: by value they would change the ABI.)
template <typename F, typename I>
[[gnu::always_inline]] inline void exp_lanes(F& v) {
    const F lo = F{} - 87.33f, hi = F{} + 88.37f, zero = {};
    const float round = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits
    F x = v < lo ? lo : v;
    x = x > hi ? hi : x;
    const F t = x * 1.44269504088896341f + round;
    const F n = t - round;
    const F r = x - n * 0.693359375f - n * -2.12194440e-4f;
    F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const F er = p * r * r + r + 1.0f;
    const I bits = ((__builtin_bit_cast(I, t) - 0x4b400000) + 127) << 23;  // 0x4b400000: the bits of `round`
    const F y = er * __builtin_bit_cast(F, bits);
    v = v < lo ? zero : y;
}

// y = exp(a x + b) in blocks of one vector; the tail is padded to a full vector.
template <typename F, typename I>
[[gnu::always_inline]] inline void exp_affine_lanes(const float* x, float* y, int64_t n, float a, float b) {
    constexpr int64_t kLanes = sizeof(F) / sizeof(float);
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        F v;
        std::memcpy(&v, x + i, sizeof(v));
        v = v * a + b;
        exp_lanes<F, I>(v);
        std::memcpy(y + i, &v, sizeof(v));
    }
    if (i < n) {
        F v = {};
        std::memcpy(&v, x + i, static_cast<size_t>(n - i) * sizeof(float));
        v = v * a + b;
        exp_lanes<F, I>(v);
        std::memcpy(y + i, &v, static_cast<size_t>(n - i) * sizeof(float));
    }
}

// max over x in blocks of one vector (the tail padded with -inf), then over the lanes.
template <typename F>
[[gnu::always_inline]] inline float max_lanes(const float* x, int64_t n) {
    constexpr int64_t kLanes = sizeof(F) / sizeof(float);
    const float lowest = -std::numeric_limits<float>::infinity();
    F m = F{} + lowest;
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        F v;
        std::memcpy(&v, x + i, sizeof(v));
        m = v > m ? v : m;
    }
    if (i < n) {
        F v = F{} + lowest;
        std::memcpy(&v, x + i, static_cast<size_t>(n - i) * sizeof(float));
        m = v > m ? v : m;
    }
    float result = m[0];
    for (int64_t lane = 1; lane < kLanes; ++lane) result = m[lane] > result ? m[lane] : result;
    return result;
}

void exp_affine_sse(const float* x, float* y, int64_t n, float a, float b) {
    exp_affine_lanes<Float4, Int4>(x, y, n, a, b);
}

[[gnu::target("avx2")]] void exp_affine_avx2(const float* x, float* y, int64_t n, float a, float b) {
    exp_affine_lanes<Float8, Int8>(x, y, n, a, b);
}

float max_value_sse(const float* x, int64_t n) {
    return max_lanes<Float4>(x, n);
}

[[gnu::target("avx2")]] float max_value_avx2(const float* x, int64_t n) {
    return max_lanes<Float8>(x, n);
}

bool has_avx2() {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    return avx2;
}

}  // namespace

void exp_affine(const float* x, float* y, int64_t n, float a, float b) {
    has_avx2() ? exp_affine_avx2(x, y, n, a, b) : exp_affine_sse(x, y, n, a, b);
}

void exp_affine(const double* x, double* y, int64_t n, double a, double b) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(a * x[i] + b);
}

float max_value(const float* x, int64_t n) {
    return has_avx2() ? max_value_avx2(x, n) : max_value_sse(x, n);
}

double max_value(const double* x, int64_t n) {
    double result = x[0];
    for (int64_t i = 1; i < n; ++i) result = x[i] > result ? x[i] : result;
    return result;
}

}  // namespace mt::ops::cpu
