// Element types and devices, with their sizes and names (including the safetensors spelling).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mt::core {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u16, u8 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);              // "f32", "bf16", ...
std::string_view dtype_safetensors_name(DType dtype);  // "F32", "BF16", ...
bool dtype_from_safetensors_name(std::string_view name, DType* out);
bool dtype_from_name(std::string_view name, DType* out);
std::string_view device_name(Device device);

inline bool dtype_is_float(DType d) {
    return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16;
}

// bf16 <-> f32 with round-to-nearest-even (NaN stays NaN).
inline uint16_t f32_to_bf16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
}
inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &bits, 4);
    return x;
}
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);

// Maps a C++ element type to its DType (used by typed accessors).
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
    static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
    static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<int32_t> {
    static constexpr DType value = DType::i32;
};
template <>
struct DTypeOf<int64_t> {
    static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<uint16_t> {
    static constexpr DType value = DType::u16;
};
template <>
struct DTypeOf<uint8_t> {
    static constexpr DType value = DType::u8;
};

}  // namespace mt::core
