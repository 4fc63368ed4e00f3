// The three gradient codecs of muon.md §6 on the CPU: encode (with the sender's error-feedback update), decode_add
// and the owner's EF21 estimate. Work is split by chunk (level 1: blocks of kStatBlock elements); each chunk writes
// its own fixed byte range of the message and its own partial norms, which are summed in chunk order afterwards, so
// no result depends on the number of OpenMP threads.
#include "optim/grad_compress.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/stochastic_round.h"

namespace mt::optim {

namespace {

constexpr int64_t kStatBlock = 4096;  // level 1's unit of parallel work and of partial norms
constexpr int64_t kMaxElement = int64_t{1} << 42;

void put_u16(uint8_t* p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
}

uint16_t get_u16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

void put_f32(uint8_t* p, float x) {
    uint32_t u = 0;
    std::memcpy(&u, &x, sizeof(u));
    for (int b = 0; b < 4; ++b) p[b] = static_cast<uint8_t>(u >> (8 * b));
}

float get_f32(const uint8_t* p) {
    const uint32_t u = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                       (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
    float x = 0;
    std::memcpy(&x, &u, sizeof(x));
    return x;
}

int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// Level 2's bytes for a chunk of `len` elements; level 3's kept count and bytes for a chunk of `len`.
int64_t sign_chunk_bytes(int64_t len) {
    return ceil_div(len, 8) + 4;
}

int64_t topk_kept(double density, int64_t len) {
    return std::clamp<int64_t>(std::llround(density * static_cast<double>(len)), 1, len);
}

int64_t topk_chunk_bytes(double density, int64_t len) {
    return 4 + 3 * topk_kept(density, len);
}

void check_options(const CompressOptions& options) {
    MT_CHECK(options.level >= kCompressBf16Sr && options.level <= kCompressTopkEf21,
             "compress.level = {} is not 1 (bf16_sr), 2 (sign_ef) or 3 (topk_ef21)",
             options.level);
    MT_CHECK(
        options.level != kCompressSignEf || options.chunk > 0, "compress.chunk = {} must be positive", options.chunk);
    MT_CHECK(options.level != kCompressTopkEf21 || (options.topk_density > 0 && options.topk_density <= 1),
             "compress.topk_density = {} must lie in (0, 1]",
             options.topk_density);
}

// Runs chunk(c, begin, len) for every chunk of `chunk` elements of [0, n) in parallel and sums the returned partial
// norms in chunk order.
template <typename Chunk>
CompressStats for_each_chunk(int64_t n, int64_t chunk, Chunk&& fn) {
    const int64_t chunks = ceil_div(n, chunk);
    std::vector<CompressStats> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t begin = c * chunk;
        partial[static_cast<size_t>(c)] = fn(c, begin, std::min(chunk, n - begin));
    }
    CompressStats total;
    for (const CompressStats& s : partial) total += s;
    return total;
}

double sq(double x) {
    return x * x;
}

}  // namespace

double CompressStats::ef_ratio() const {
    return g_sq > 0 ? std::sqrt(e_sq / g_sq) : 0.0;
}

double CompressStats::compression_error() const {
    return p_sq > 0 ? std::sqrt(err_sq / p_sq) : 0.0;
}

GradCompressor::GradCompressor(const CompressOptions& options, int64_t n, int64_t first_element)
    : options_(options), n_(n), first_element_(first_element) {
    check_options(options);
    MT_CHECK(n >= 0, "compressed region size n = {} must not be negative", n);
    MT_CHECK(first_element >= 0 && first_element + n <= kMaxElement,
             "compressed region [first_element = {}, + n = {}) must lie in [0, 2^42)",
             first_element,
             n);
    if (options.level != kCompressBf16Sr) state_.assign(static_cast<size_t>(n), 0.0f);
}

int64_t GradCompressor::message_bytes(const CompressOptions& options, int64_t n) {
    check_options(options);
    MT_CHECK(n >= 0, "message_bytes: region size n = {} must not be negative", n);
    switch (options.level) {
        case kCompressBf16Sr:
            return 2 * n;
        case kCompressSignEf: {
            const int64_t full = n / options.chunk, rest = n % options.chunk;
            return full * sign_chunk_bytes(options.chunk) + (rest > 0 ? sign_chunk_bytes(rest) : 0);
        }
        default: {
            const int64_t full = n / kTopkChunk, rest = n % kTopkChunk;
            return full * topk_chunk_bytes(options.topk_density, kTopkChunk) +
                   (rest > 0 ? topk_chunk_bytes(options.topk_density, rest) : 0);
        }
    }
}

void GradCompressor::encode(std::span<const float> g, const CompressKey& key, std::span<uint8_t> out) {
    MT_CHECK_SHAPE(static_cast<int64_t>(g.size()), n_, "GradCompressor::encode: g elements vs the region's n");
    MT_CHECK_SHAPE(static_cast<int64_t>(out.size()), message_bytes(), "GradCompressor::encode: out bytes");
    MT_CHECK(key.step >= 0 && key.step < (int64_t{1} << 40), "CompressKey.step = {} must lie in [0, 2^40)", key.step);
    MT_CHECK(key.bucket >= 0 && key.bucket < (int64_t{1} << 24),
             "CompressKey.bucket = {} must lie in [0, 2^24)",
             key.bucket);
    MT_CHECK(key.rank >= 0 && key.rank < (int64_t{1} << 24), "CompressKey.rank = {} must lie in [0, 2^24)", key.rank);
    const float* gp = g.data();
    int64_t first_bad = n_;
#pragma omp parallel for schedule(static) reduction(min : first_bad)
    for (int64_t i = 0; i < n_; ++i)
        if (!std::isfinite(gp[i])) first_bad = std::min(first_bad, i);
    MT_CHECK(first_bad == n_,
             "GradCompressor::encode: g[{}] = {} is not finite (skip the step on overflow before compressing)",
             first_bad,
             first_bad < n_ ? gp[first_bad] : 0.0f);
    switch (options_.level) {
        case kCompressBf16Sr:
            stats_ = encode_bf16_sr(g, key, out);
            break;
        case kCompressSignEf:
            stats_ = encode_sign_ef(g, out);
            break;
        default:
            stats_ = encode_topk_ef21(g, out);
            break;
    }
}

std::vector<uint8_t> GradCompressor::encode(std::span<const float> g, const CompressKey& key) {
    std::vector<uint8_t> out(static_cast<size_t>(message_bytes()));
    encode(g, key, out);
    return out;
}

CompressStats GradCompressor::encode_bf16_sr(std::span<const float> g,
                                             const CompressKey& key,
                                             std::span<uint8_t> out) const {
    const uint64_t stream = static_cast<uint64_t>(key.step) << 24 | static_cast<uint64_t>(key.bucket);
    const uint64_t rank_bits = static_cast<uint64_t>(key.rank) << 40;
    const float* gp = g.data();
    return for_each_chunk(n_, kStatBlock, [&](int64_t, int64_t begin, int64_t len) {
        CompressStats s;
        std::array<uint32_t, 4> block{};
        uint64_t cached = ~uint64_t{0};
        for (int64_t i = begin; i < begin + len; ++i) {
            const uint64_t j = static_cast<uint64_t>(first_element_ + i);
            if (j / 4 != cached) {
                cached = j / 4;
                block = core::philox4x32(options_.seed, stream, rank_bits | cached);
            }
            const float x = gp[i];
            const uint16_t h = core::f32_to_bf16_stochastic(x, block[j % 4]);
            put_u16(out.data() + 2 * i, h);
            s.g_sq += sq(x);
            s.err_sq += sq(static_cast<double>(core::bf16_to_f32(h)) - x);
        }
        s.p_sq = s.g_sq;
        return s;
    });
}

CompressStats GradCompressor::encode_sign_ef(std::span<const float> g, std::span<uint8_t> out) {
    const int64_t chunk = options_.chunk, stride = sign_chunk_bytes(chunk);
    const float* gp = g.data();
    float* e = state_.data();
    return for_each_chunk(n_, chunk, [&](int64_t c, int64_t begin, int64_t len) {
        CompressStats s;
        for (int64_t i = begin; i < begin + len; ++i) {
            const float p = gp[i] + e[i];
            s.g_sq += sq(gp[i]);
            s.p_sq += sq(p);
        }
        const float sigma = static_cast<float>(std::sqrt(s.p_sq / static_cast<double>(len)));
        uint8_t* bits = out.data() + c * stride;
        std::memset(bits, 0, static_cast<size_t>(ceil_div(len, 8)));
        for (int64_t i = 0; i < len; ++i) {
            const float p = gp[begin + i] + e[begin + i];
            const bool bit = p >= 0.0f;
            if (bit) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
            const float sent = bit ? sigma : -sigma;
            e[begin + i] = p - sent;
            s.err_sq += sq(static_cast<double>(sent) - p);
            s.e_sq += sq(e[begin + i]);
        }
        put_f32(bits + ceil_div(len, 8), sigma);
        return s;
    });
}

CompressStats GradCompressor::encode_topk_ef21(std::span<const float> g, std::span<uint8_t> out) {
    const double density = options_.topk_density;
    const int64_t stride = topk_chunk_bytes(density, kTopkChunk);
    const float* gp = g.data();
    float* h = state_.data();
    return for_each_chunk(n_, kTopkChunk, [&](int64_t c, int64_t begin, int64_t len) {
        CompressStats s;
        std::vector<float> delta(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) delta[i] = gp[begin + i] - h[begin + i];
        // The k largest magnitudes, ties toward the lower index: a strict total order, so the kept set is unique.
        const int64_t k = topk_kept(density, len);
        std::vector<uint16_t> kept(static_cast<size_t>(len));
        std::iota(kept.begin(), kept.end(), uint16_t{0});
        auto larger = [&](uint16_t a, uint16_t b) {
            const float ma = std::fabs(delta[a]), mb = std::fabs(delta[b]);
            return ma > mb || (ma == mb && a < b);
        };
        if (k < len) std::nth_element(kept.begin(), kept.begin() + k, kept.end(), larger);
        kept.resize(static_cast<size_t>(k));
        std::sort(kept.begin(), kept.end());
        float max_abs = 0.0f;
        for (uint16_t o : kept) max_abs = std::max(max_abs, std::fabs(delta[o]));
        const float scale = max_abs / 127.0f;
        uint8_t* msg = out.data() + c * stride;
        put_f32(msg, scale);
        uint8_t* offsets = msg + 4;
        int8_t* values = reinterpret_cast<int8_t*>(msg + 4 + 2 * k);
        size_t next = 0;  // cursor into kept (ascending offsets)
        for (int64_t i = 0; i < len; ++i) {
            const float d = delta[i];
            float sent = 0.0f;
            if (next < kept.size() && kept[next] == i) {
                long q = 0;
                if (scale > 0.0f) q = std::clamp(std::lround(d / scale), -127L, 127L);
                put_u16(offsets + 2 * next, static_cast<uint16_t>(i));
                values[next] = static_cast<int8_t>(q);
                sent = static_cast<float>(q) * scale;
                h[begin + i] += sent;
                ++next;
            }
            const float gi = gp[begin + i];
            s.g_sq += sq(gi);
            s.p_sq += sq(d);
            s.err_sq += sq(static_cast<double>(sent) - d);
            s.e_sq += sq(static_cast<double>(gi) - h[begin + i]);
        }
        return s;
    });
}

void GradCompressor::decode_add(const CompressOptions& options,
                                std::span<const uint8_t> message,
                                std::span<float> acc) {
    const int64_t n = static_cast<int64_t>(acc.size());
    MT_CHECK_SHAPE(static_cast<int64_t>(message.size()),
                   message_bytes(options, n),
                   "GradCompressor::decode_add: message bytes vs message_bytes(acc.size())");
    const uint8_t* msg = message.data();
    float* out = acc.data();
    if (options.level == kCompressBf16Sr) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) out[i] += core::bf16_to_f32(get_u16(msg + 2 * i));
        return;
    }
    if (options.level == kCompressSignEf) {
        const int64_t stride = sign_chunk_bytes(options.chunk);
        for_each_chunk(n, options.chunk, [&](int64_t c, int64_t begin, int64_t len) {
            const uint8_t* bits = msg + c * stride;
            const float sigma = get_f32(bits + ceil_div(len, 8));
            for (int64_t i = 0; i < len; ++i) out[begin + i] += (bits[i / 8] >> (i % 8)) & 1u ? sigma : -sigma;
            return CompressStats{};
        });
        return;
    }
    // Level 3: a malformed chunk is recorded per chunk (no exception escapes the parallel loop) and reported after.
    const double density = options.topk_density;
    const int64_t stride = topk_chunk_bytes(density, kTopkChunk);
    std::vector<int64_t> bad(static_cast<size_t>(ceil_div(n, kTopkChunk)), -1);
    for_each_chunk(n, kTopkChunk, [&](int64_t c, int64_t begin, int64_t len) {
        const int64_t k = topk_kept(density, len);
        const uint8_t* chunk = msg + c * stride;
        const float scale = get_f32(chunk);
        const int8_t* values = reinterpret_cast<const int8_t*>(chunk + 4 + 2 * k);
        int64_t previous = -1;
        for (int64_t j = 0; j < k; ++j) {
            const int64_t o = get_u16(chunk + 4 + 2 * j);
            if (o <= previous || o >= len || values[j] == -128) {
                bad[static_cast<size_t>(c)] = j;
                break;
            }
            out[begin + o] += static_cast<float>(values[j]) * scale;
            previous = o;
        }
        return CompressStats{};
    });
    for (size_t c = 0; c < bad.size(); ++c)
        MT_CHECK(bad[c] < 0,
                 "topk_ef21 message: chunk {} entry {} has an offset out of order or past the chunk, or the value "
                 "-128",
                 c,
                 bad[c]);
}

void GradCompressor::load_state(std::span<const float> saved) {
    MT_CHECK_SHAPE(static_cast<int64_t>(saved.size()),
                   static_cast<int64_t>(state_.size()),
                   "GradCompressor::load_state: saved state elements vs the region's state");
    std::copy(saved.begin(), saved.end(), state_.begin());
}

void GradCompressor::reset_state() {
    std::fill(state_.begin(), state_.end(), 0.0f);
}

void grad_compress_decode_mean(const CompressOptions& options,
                               std::span<const std::span<const uint8_t>> messages,
                               std::span<float> out) {
    MT_CHECK(!messages.empty(), "grad_compress_decode_mean: messages is empty (R must be at least 1)");
    std::fill(out.begin(), out.end(), 0.0f);
    for (const auto& m : messages) GradCompressor::decode_add(options, m, out);
    const float r = static_cast<float>(messages.size());
    float* o = out.data();
    const int64_t n = static_cast<int64_t>(out.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] /= r;
}

Ef21Receiver::Ef21Receiver(const CompressOptions& options, int64_t n)
    : options_(options), h_(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0f), sum_(h_.size(), 0.0f) {
    check_options(options);
    MT_CHECK(
        options.level == kCompressTopkEf21, "Ef21Receiver needs compress.level = 3 (topk_ef21), not {}", options.level);
    MT_CHECK(n >= 0, "Ef21Receiver: region size n = {} must not be negative", n);
}

void Ef21Receiver::update(std::span<const std::span<const uint8_t>> messages) {
    grad_compress_decode_mean(options_, messages, sum_);
    const int64_t n = static_cast<int64_t>(h_.size());
    float* h = h_.data();
    const float* m = sum_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) h[i] += m[i];
}

void Ef21Receiver::load_state(std::span<const float> saved) {
    MT_CHECK_SHAPE(static_cast<int64_t>(saved.size()),
                   static_cast<int64_t>(h_.size()),
                   "Ef21Receiver::load_state: saved h elements vs the region's n");
    std::copy(saved.begin(), saved.end(), h_.begin());
}

void Ef21Receiver::reset_state() {
    std::fill(h_.begin(), h_.end(), 0.0f);
}

}  // namespace mt::optim
