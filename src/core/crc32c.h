// Checksums: CRC-32C (Castagnoli; checkpoint files, TensorBoard records, conventions §7.3) and SHA-256
// (model signatures in checkpoint manifests).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::core {

// CRC-32C of n bytes: reflected polynomial 0x82F63B78, init 0xFFFFFFFF, final XOR 0xFFFFFFFF.
// Chainable: crc32c(b, nb, crc32c(a, na)) == crc32c(a ++ b). Uses SSE4.2 when the CPU has it.
// @param[in] data  the bytes (may be null when n == 0)
// @param[in] n     byte count
// @param[in] init  the CRC of the preceding bytes (0 for a fresh start)
uint32_t crc32c(const void* data, size_t n, uint32_t init = 0);

// The CRC-32C of a ++ b from crc32c(a), crc32c(b) and b's length, without reading the bytes again: a multiplication
// by x^(8 len_b) modulo the polynomial (GF(2) arithmetic, about 64 steps of 32 bits), so pieces of a file summed
// apart can be joined in order.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// TensorBoard/TFRecord masked CRC: ((crc >> 15) | (crc << 17)) + 0xA282EAD8 (mod 2^32).
inline uint32_t masked_crc32c(uint32_t crc) {
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// CRC as 8 lower-case hex digits ("1a2b3c4d"), the manifest spelling.
std::string crc32c_hex(uint32_t crc);

// Incremental SHA-256 (FIPS 180-4).
class Sha256 {
   public:
    Sha256();
    // Appends n bytes to the message.
    void update(const void* data, size_t n);
    // Finishes the message and returns the 32-byte digest; the object must not be updated afterwards.
    std::array<uint8_t, 32> digest();

   private:
    void block(const uint8_t* p);
    std::array<uint32_t, 8> h_;
    std::array<uint8_t, 64> buf_{};
    size_t buf_len_ = 0;
    uint64_t total_ = 0;
};

// SHA-256 of a byte string as 64 lower-case hex digits.
std::string sha256_hex(std::string_view bytes);

}  // namespace mt::core
