// CRC-32C (slicing-by-8 tables, SSE4.2 instruction when available) and a small SHA-256.
#include "core/crc32c.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mt::core {

namespace {

struct CrcTables {
    uint32_t t[8][256];
    CrcTables() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
    }
};

uint32_t crc32c_sw(const uint8_t* p, size_t n, uint32_t crc) {
    static const CrcTables tables;
    const auto& t = tables.t;
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        w ^= crc;
        crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
              t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
    return crc;
}

#if defined(__x86_64__)
// The hardware path runs three chains at once over consecutive lanes of kLane bytes: the crc32 instruction has a
// latency of three cycles and a throughput of one, so one chain leaves two thirds of the unit idle (about 9 GB/s
// against 25). The CRC register is linear over GF(2), so the register after lanes A, B, C from register r is
// Z(Z(R_A(r)) ^ R_B(0)) ^ R_C(0), where R_X(r) is the register after X from r and Z the register after kLane zero
// bytes, one fixed linear map applied through four byte tables.
constexpr size_t kLane = 4096;

struct LaneShift {
    uint32_t t[4][256];
    LaneShift() {
        static const uint8_t zeros[kLane] = {};
        uint32_t bit[32];
        for (int i = 0; i < 32; ++i) bit[i] = crc32c_sw(zeros, kLane, uint32_t{1} << i);
        for (int k = 0; k < 4; ++k)
            for (uint32_t b = 0; b < 256; ++b) {
                uint32_t v = 0;
                for (int j = 0; j < 8; ++j)
                    if (b & (1u << j)) v ^= bit[8 * k + j];
                t[k][b] = v;
            }
    }
    uint32_t operator()(uint32_t x) const {
        return t[0][x & 0xff] ^ t[1][(x >> 8) & 0xff] ^ t[2][(x >> 16) & 0xff] ^ t[3][x >> 24];
    }
};

__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const uint8_t* p, size_t n, uint32_t crc) {
    uint64_t c = crc;
    if (n >= 3 * kLane) {
        static const LaneShift shift;
        while (n >= 3 * kLane) {
            uint64_t c1 = 0, c2 = 0;
            for (size_t i = 0; i < kLane; i += 8) {
                uint64_t w0, w1, w2;
                std::memcpy(&w0, p + i, 8);
                std::memcpy(&w1, p + kLane + i, 8);
                std::memcpy(&w2, p + 2 * kLane + i, 8);
                c = _mm_crc32_u64(c, w0);
                c1 = _mm_crc32_u64(c1, w1);
                c2 = _mm_crc32_u64(c2, w2);
            }
            c = shift(shift(static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
            p += 3 * kLane;
            n -= 3 * kLane;
        }
    }
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = static_cast<uint32_t>(c);
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
bool have_sse42() {
    static const bool has = __builtin_cpu_supports("sse4.2");
    return has;
}
#endif

constexpr uint32_t kSha256K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) {
    return (x >> n) | (x << (32 - n));
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t init) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t crc = ~init;
#if defined(__x86_64__)
    if (have_sse42()) return ~crc32c_hw(p, n, crc);
#endif
    return ~crc32c_sw(p, n, crc);
}

namespace {

// Polynomials modulo P in the reflected form the register uses: bit 31 is x^0, bit 0 is x^31.
constexpr uint32_t kReflectedPoly = 0x82F63B78u;

uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {  // a's terms from x^0 up; b times x for each
        if (a & bit) product ^= b;
        b = (b & 1u) ? (b >> 1) ^ kReflectedPoly : b >> 1;
    }
    return product;
}

// x^(8 n) modulo P: the product of x^(2^k) over the bits k of 8 n, the squares precomputed once.
uint32_t x_pow_8n_mod_p(uint64_t n) {
    static const auto squares = [] {
        std::array<uint32_t, 67> t{};
        t[0] = 1u << 30;  // x^1
        for (size_t k = 1; k < t.size(); ++k) t[k] = multiply_mod_p(t[k - 1], t[k - 1]);
        return t;
    }();
    uint32_t result = 1u << 31;  // x^0
    for (size_t k = 3; n != 0; n >>= 1, ++k)
        if (n & 1u) result = multiply_mod_p(result, squares[k]);
    return result;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
    // The register is linear over GF(2) and the initial and final inversions cancel between the two CRCs, so the
    // CRC of a ++ b is crc_a shifted over len_b zero bytes, plus crc_b.
    return multiply_mod_p(x_pow_8n_mod_p(len_b), crc_a) ^ crc_b;
}

std::string crc32c_hex(uint32_t crc) {
    return fmt::format("{:08x}", crc);
}

Sha256::Sha256() : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
        w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) | (uint32_t{p[4 * i + 2]} << 8) |
               uint32_t{p[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
        const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
        const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kSha256K[i] + w[i];
        const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
}

void Sha256::update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    while (n > 0) {
        const size_t take = std::min(n, buf_.size() - buf_len_);
        std::memcpy(buf_.data() + buf_len_, p, take);
        buf_len_ += take;
        p += take;
        n -= take;
        if (buf_len_ == buf_.size()) {
            block(buf_.data());
            buf_len_ = 0;
        }
    }
}

std::array<uint8_t, 32> Sha256::digest() {
    const uint64_t bits = total_ * 8;
    const uint8_t pad = 0x80;
    update(&pad, 1);
    const uint8_t zero = 0;
    while (buf_len_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    std::array<uint8_t, 32> out{};
    for (int i = 0; i < 8; ++i)
        for (int k = 0; k < 4; ++k) out[4 * i + k] = static_cast<uint8_t>(h_[i] >> (24 - 8 * k));
    return out;
}

std::string sha256_hex(std::string_view bytes) {
    Sha256 sha;
    sha.update(bytes.data(), bytes.size());
    std::string hex;
    for (uint8_t b : sha.digest()) hex += fmt::format("{:02x}", b);
    return hex;
}

}  // namespace mt::core
