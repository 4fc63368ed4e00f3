// DType tables and half-precision conversions.
#include "core/dtype.h"

#include <array>

#include "core/error.h"

namespace mt::core {

namespace {
struct DTypeInfo {
    DType dtype;
    size_t size;
    std::string_view name;
    std::string_view st_name;
};
constexpr std::array<DTypeInfo, 8> kDTypes = {{
    {DType::f32, 4, "f32", "F32"},
    {DType::f64, 8, "f64", "F64"},
    {DType::bf16, 2, "bf16", "BF16"},
    {DType::f16, 2, "f16", "F16"},
    {DType::i32, 4, "i32", "I32"},
    {DType::i64, 8, "i64", "I64"},
    {DType::u16, 2, "u16", "U16"},
    {DType::u8, 1, "u8", "U8"},
}};
const DTypeInfo& info(DType d) {
    for (const auto& i : kDTypes)
        if (i.dtype == d) return i;
    fail(ExitCode::internal, "unknown dtype {}", static_cast<int>(d));
}
}  // namespace

size_t dtype_size(DType dtype) {
    return info(dtype).size;
}
std::string_view dtype_name(DType dtype) {
    return info(dtype).name;
}
std::string_view dtype_safetensors_name(DType dtype) {
    return info(dtype).st_name;
}
bool dtype_from_safetensors_name(std::string_view name, DType* out) {
    for (const auto& i : kDTypes)
        if (i.st_name == name) {
            *out = i.dtype;
            return true;
        }
    return false;
}
bool dtype_from_name(std::string_view name, DType* out) {
    for (const auto& i : kDTypes)
        if (i.name == name) {
            *out = i.dtype;
            return true;
        }
    return false;
}
std::string_view device_name(Device device) {
    return device == Device::cpu ? "cpu" : "cuda";
}

uint16_t f32_to_f16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
    uint32_t mantissa = bits & 0x7fffffu;
    if (((bits >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
    if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exponent <= 0) {
        if (exponent < -10) return static_cast<uint16_t>(sign);
        mantissa |= 0x800000u;
        const int shift = 14 - exponent;
        uint32_t half = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1);
        const uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(half);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1f;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else {
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400u)) {
                mantissa <<= 1;
                --exponent;
            }
            mantissa &= 0x3ffu;
            bits = sign | (exponent << 23) | (mantissa << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
    }
    float x;
    std::memcpy(&x, &bits, 4);
    return x;
}

}  // namespace mt::core
