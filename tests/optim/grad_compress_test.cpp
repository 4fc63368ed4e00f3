// optim::GradCompressor and Ef21Receiver (muon.md §6, §9 test 8): bf16_sr is unbiased and keyed by (seed, step,
// bucket, rank, element); sign_ef's error-feedback identity and its exact bit layout; topk_ef21's EF21 identities
// and its int8/u16 layout; message sizes; state save/load resumes bitwise; determinism across runs and thread
// counts; bad input fails naming the field.
#include "optim/grad_compress.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "support/rho.h"

namespace {

using mt::core::DType;
using mt::core::Tensor;
using mt::optim::CompressOptions;
using mt::optim::Ef21Receiver;
using mt::optim::GradCompressor;
using Bytes = std::vector<uint8_t>;

std::vector<float> randn(int64_t n, uint64_t seed, uint64_t stream) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] = static_cast<float>(mt::core::rng_normal(seed, stream, static_cast<uint64_t>(i)));
    return v;
}

double rho(std::vector<double> a, std::vector<double> b) {
    const mt::core::Shape shape{static_cast<int64_t>(a.size())};
    return mt::testing::rho(Tensor::borrow(a.data(), shape, DType::f64), Tensor::borrow(b.data(), shape, DType::f64));
}

std::vector<float> decoded(const CompressOptions& options, const Bytes& message, int64_t n) {
    std::vector<float> acc(static_cast<size_t>(n), 0.0f);
    GradCompressor::decode_add(options, message, acc);
    return acc;
}

Bytes f32_bytes(float x) {
    uint32_t u = 0;
    std::memcpy(&u, &x, sizeof(u));
    return {static_cast<uint8_t>(u),
            static_cast<uint8_t>(u >> 8),
            static_cast<uint8_t>(u >> 16),
            static_cast<uint8_t>(u >> 24)};
}

// The message of a failing call, or a test failure when it does not throw.
std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const mt::core::Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected an mt::core::Error";
    return {};
}

#define EXPECT_ERROR_NAMES(call, field) \
    EXPECT_NE(error_of([&] { call; }).find(field), std::string::npos) << error_of([&] { call; })

// 10^4 draws of each value (one region of 10^4 copies, every element its own Philox draw): every draw is one of the
// two bf16 neighbours, and the mean is within 3 standard errors of x (so exactly x when x is a bf16 value).
TEST(GradCompressBf16Sr, UnbiasedMeanOfManyDraws) {
    const CompressOptions options{.level = 1, .seed = 42};
    const int64_t n = 10000;
    const float values[] = {1.0f, -3.5f, 0.0f, 1.0f + 0x1p-9f, 0.1f, -0.3337f, 1e-30f, 1e-40f, -2.5e-39f, 3.0e38f};
    int64_t step = 0;
    for (float x : values) {
        GradCompressor c(options, n);
        const std::vector<float> g(static_cast<size_t>(n), x);
        const std::vector<float> out = decoded(options, c.encode(g, {.step = ++step, .bucket = 3, .rank = 1}), n);
        uint32_t u = 0;
        std::memcpy(&u, &x, sizeof(u));
        const double lo = mt::core::bf16_to_f32(static_cast<uint16_t>(u >> 16));
        const double hi = mt::core::bf16_to_f32(static_cast<uint16_t>((u >> 16) + 1));
        double sum = 0.0;
        for (float y : out) {
            EXPECT_TRUE(y == lo || y == hi) << x << " drew " << y;
            sum += y;
        }
        const double p = (x - lo) / (hi - lo);  // chance of rounding away from zero
        const double se = std::fabs(hi - lo) * std::sqrt(p * (1 - p)) / std::sqrt(static_cast<double>(n));
        EXPECT_LE(std::fabs(sum / n - x), 3 * se) << "x = " << x << " p = " << p;
    }
}

// The message is n little-endian bf16 values; exactly representable values pass unchanged, and decode adds.
TEST(GradCompressBf16Sr, MessageIsTheBf16Values) {
    const CompressOptions options{.level = 1, .seed = 7};
    EXPECT_EQ(GradCompressor::message_bytes(options, 5), 10);
    GradCompressor c(options, 3);
    const Bytes m = c.encode(std::vector<float>{1.0f, -2.0f, 0.5f}, {.step = 1});
    EXPECT_EQ(m, (Bytes{0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F}));
    std::vector<float> acc{1.0f, 1.0f, 1.0f};
    c.decode_add(m, acc);
    EXPECT_EQ(acc, (std::vector<float>{2.0f, -1.0f, 1.5f}));
    EXPECT_TRUE(c.state().empty());
}

// Each of seed, step, bucket and rank changes the draws; the element key is the index in the bucket, so a region
// split in two (the second with first_element) gives the same bytes as the whole.
TEST(GradCompressBf16Sr, DrawsAreKeyedBySeedStepBucketRankAndElement) {
    const int64_t n = 1001, m = 387;
    const std::vector<float> g = randn(n, 1, 0);
    auto encode = [&](uint64_t seed, mt::optim::CompressKey key) {
        GradCompressor c({.level = 1, .seed = seed}, n);
        return c.encode(g, key);
    };
    const Bytes base = encode(5, {.step = 2, .bucket = 3, .rank = 4});
    EXPECT_EQ(encode(5, {.step = 2, .bucket = 3, .rank = 4}), base);
    EXPECT_NE(encode(6, {.step = 2, .bucket = 3, .rank = 4}), base);
    EXPECT_NE(encode(5, {.step = 1, .bucket = 3, .rank = 4}), base);
    EXPECT_NE(encode(5, {.step = 2, .bucket = 2, .rank = 4}), base);
    EXPECT_NE(encode(5, {.step = 2, .bucket = 3, .rank = 5}), base);
    GradCompressor head({.level = 1, .seed = 5}, m), tail({.level = 1, .seed = 5}, n - m, m);
    Bytes split = head.encode(std::span(g).first(m), {.step = 2, .bucket = 3, .rank = 4});
    const Bytes rest = tail.encode(std::span(g).subspan(m), {.step = 2, .bucket = 3, .rank = 4});
    split.insert(split.end(), rest.begin(), rest.end());
    EXPECT_EQ(split, base);
}

// chunk = 8 and 10 elements: a chunk of 8 and a last chunk of 2 (its sigma over its own 2 elements). Bit i of byte j
// is element 8j + i; -0 sends bit 1; sigma follows each chunk's bits as little-endian f32.
TEST(GradCompressSignEf, BitLayoutOfTwoChunks) {
    const CompressOptions options{.level = 2, .chunk = 8};
    GradCompressor c(options, 10);
    // Chunk 0: sum of squares 32, sigma = sqrt(32 / 8) = 2; bits 1 0 1 0 1 1 0 1 -> 0b10110101 = 0xB5.
    // Chunk 1: sum of squares 4.5, sigma = sqrt(4.5 / 2) = 1.5 = 0x3FC00000; bits 0 1 -> 0x02.
    const std::vector<float> g{4.0f, -2.0f, 0.0f, -2.0f, 2.0f, -0.0f, -2.0f, 0.0f, -1.5f, 1.5f};
    EXPECT_EQ(c.message_bytes(), 10);
    const Bytes m = c.encode(g, {});
    EXPECT_EQ(m, (Bytes{0xB5, 0x00, 0x00, 0x00, 0x40, 0x02, 0x00, 0x00, 0xC0, 0x3F}));
    const std::vector<float> e(c.state().begin(), c.state().end());
    EXPECT_EQ(e, (std::vector<float>{2.0f, 0.0f, -2.0f, 0.0f, 0.0f, -2.0f, 0.0f, -2.0f, 0.0f, 0.0f}));
    EXPECT_EQ(decoded(options, m, 10),
              (std::vector<float>{2.0f, -2.0f, 2.0f, -2.0f, 2.0f, 2.0f, -2.0f, 2.0f, -1.5f, 1.5f}));
    // Next step compresses p = g + e: with g = 0, chunk 0 is e, sigma = sqrt(16 / 8); chunk 1 is zero (sigma 0,
    // every bit 1).
    const Bytes next = c.encode(std::vector<float>(10, 0.0f), {});
    EXPECT_EQ(next[0], 0x5B);  // bits 1 1 0 1 1 0 1 0 (0 >= 0 sends 1)
    EXPECT_EQ(Bytes(next.begin() + 1, next.begin() + 5), f32_bytes(std::sqrt(2.0f)));
    EXPECT_EQ(Bytes(next.begin() + 5, next.end()), (Bytes{0x03, 0x00, 0x00, 0x00, 0x00}));
    // The norms of the first encode: ||C(p) - p|| = ||e_new||, ||p|| = ||g||.
    GradCompressor fresh(options, 10);
    fresh.encode(g, {});
    EXPECT_DOUBLE_EQ(fresh.last_stats().g_sq, 36.5);
    EXPECT_DOUBLE_EQ(fresh.last_stats().p_sq, 36.5);
    EXPECT_DOUBLE_EQ(fresh.last_stats().err_sq, 16.0);
    EXPECT_DOUBLE_EQ(fresh.last_stats().e_sq, 16.0);
    EXPECT_DOUBLE_EQ(fresh.last_stats().compression_error(), std::sqrt(16.0 / 36.5));
}

// sum_t sent_t + e_T = sum_t g_t over 20 steps of random gradients (chunks 2048, 2048 and a last one of 904), and
// ||e|| / ||g|| stays bounded.
TEST(GradCompressSignEf, ErrorFeedbackIdentity) {
    const CompressOptions options{.level = 2};
    const int64_t n = 5000;
    GradCompressor c(options, n);
    std::vector<double> sent(static_cast<size_t>(n), 0.0), sum_g(static_cast<size_t>(n), 0.0);
    for (int t = 0; t < 20; ++t) {
        const std::vector<float> g = randn(n, 9, static_cast<uint64_t>(t));
        const std::vector<float> s = decoded(options, c.encode(g, {.step = t}), n);
        for (int64_t i = 0; i < n; ++i) {
            sent[static_cast<size_t>(i)] += s[static_cast<size_t>(i)];
            sum_g[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
        }
        EXPECT_LT(c.last_stats().ef_ratio(), 2.0) << "step " << t;
    }
    double e_sq = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        sent[static_cast<size_t>(i)] += c.state()[static_cast<size_t>(i)];
        e_sq += static_cast<double>(c.state()[static_cast<size_t>(i)]) * c.state()[static_cast<size_t>(i)];
    }
    EXPECT_LE(rho(sent, sum_g), 1e-6);
    EXPECT_NEAR(c.last_stats().e_sq, e_sq, 1e-9 * e_sq);
}

// 1 + 32/C bits per element when C is a multiple of 8 dividing n; otherwise ceil(L/8) + 4 bytes per chunk.
TEST(GradCompressSignEf, CompressedSizeIsOnePlus32OverCBitsPerElement) {
    for (int64_t chunk : {8, 64, 2048}) {
        const int64_t n = 4 * chunk;
        const double bits = 8.0 * GradCompressor::message_bytes({.level = 2, .chunk = chunk}, n) / n;
        EXPECT_DOUBLE_EQ(bits, 1.0 + 32.0 / chunk) << "chunk " << chunk;
    }
    EXPECT_EQ(GradCompressor::message_bytes({.level = 2, .chunk = 10}, 25), 2 * (2 + 4) + (1 + 4));
    EXPECT_EQ(GradCompressor::message_bytes({.level = 2}, 0), 0);
}

// rho = 0.3 over 10 elements keeps k = 3: |-2| first, then two of the three ties at 1.2 (indices 3 and 4, not 9).
// scale = 2/127; -2 -> -127, 1.2 -> round(76.2) = 76. Layout: f32 scale | u16 offsets | int8 values.
TEST(GradCompressTopkEf21, Int8AndU16LayoutOfOneChunk) {
    const CompressOptions options{.level = 3, .topk_density = 0.3};
    GradCompressor c(options, 10);
    EXPECT_EQ(c.message_bytes(), 4 + 3 * 3);
    const std::vector<float> g{0.5f, -2.0f, 0.1f, 1.2f, -1.2f, 0.0f, 0.25f, 0.3f, -0.2f, 1.2f};
    const Bytes m = c.encode(g, {});
    const float scale = 2.0f / 127.0f;
    Bytes expected = f32_bytes(scale);
    for (uint8_t b : {0x01, 0x00, 0x03, 0x00, 0x04, 0x00, 0x81, 0x4C, 0xB4}) expected.push_back(b);
    EXPECT_EQ(m, expected);
    std::vector<float> h(10, 0.0f);
    h[1] = -127.0f * scale;
    h[3] = 76.0f * scale;
    h[4] = -76.0f * scale;
    EXPECT_EQ(std::vector<float>(c.state().begin(), c.state().end()), h);
    EXPECT_EQ(decoded(options, m, 10), h);
}

// Two chunks (65536 and 10): k = llround(65536 / 24) = 2731 and max(1, llround(10 / 24)) = 1. Offsets are within the
// chunk and ascending; ties among zeros go to the lowest indices.
TEST(GradCompressTopkEf21, OffsetsAreWithinEachChunk) {
    const CompressOptions options{.level = 3};
    const int64_t n = mt::optim::kTopkChunk + 10;
    GradCompressor c(options, n);
    EXPECT_EQ(c.message_bytes(), (4 + 3 * 2731) + (4 + 3 * 1));
    std::vector<float> g(static_cast<size_t>(n), 0.0f);
    g[100] = -5.0f;
    g[40000] = 2.0f;
    for (int64_t i = 0; i < 10; ++i) g[static_cast<size_t>(mt::optim::kTopkChunk + i)] = 0.01f;
    g[mt::optim::kTopkChunk + 7] = 0.25f;
    const Bytes m = c.encode(g, {});
    const int64_t k = 2731;
    EXPECT_EQ(Bytes(m.begin(), m.begin() + 4), f32_bytes(5.0f / 127.0f));
    auto offset = [&](int64_t j) { return m[4 + 2 * j] | (m[5 + 2 * j] << 8); };
    auto value = [&](int64_t j) { return static_cast<int8_t>(m[4 + 2 * k + j]); };
    for (int64_t j = 0; j < k - 1; ++j) ASSERT_EQ(offset(j), j) << j;
    EXPECT_EQ(offset(k - 1), 40000);
    EXPECT_EQ(value(100), -127);
    EXPECT_EQ(value(k - 1), 51);  // 2 / (5/127) = 50.8
    for (int64_t j = 0; j < k - 1; ++j)
        if (j != 100) {
            ASSERT_EQ(value(j), 0) << j;
        }
    const Bytes tail(m.begin() + 4 + 3 * k, m.end());
    Bytes expected = f32_bytes(0.25f / 127.0f);
    for (uint8_t b : {0x07, 0x00, 0x7F}) expected.push_back(b);
    EXPECT_EQ(tail, expected);
}

// EF21 over 3 senders and 12 steps: each sender's h_w is exactly the sum of what it sent (f32, bitwise), and the
// owner's h is the mean of the senders' h_w (rho <= 1e-6: the sums run in another order).
TEST(GradCompressTopkEf21, Ef21Identity) {
    const CompressOptions options{.level = 3};
    const int64_t n = mt::optim::kTopkChunk + 4465;
    const int senders = 3;
    std::vector<GradCompressor> c;
    for (int w = 0; w < senders; ++w) c.emplace_back(options, n);
    Ef21Receiver owner(options, n);
    std::vector<std::vector<float>> sent(senders, std::vector<float>(static_cast<size_t>(n), 0.0f));
    for (int t = 0; t < 12; ++t) {
        std::vector<Bytes> messages;
        for (int w = 0; w < senders; ++w) {
            messages.push_back(c[w].encode(randn(n, 21, static_cast<uint64_t>(100 * w + t)), {.step = t, .rank = w}));
            c[w].decode_add(messages.back(), sent[w]);
        }
        owner.update(std::vector<std::span<const uint8_t>>(messages.begin(), messages.end()));
    }
    std::vector<double> mean(static_cast<size_t>(n), 0.0), h(owner.h().begin(), owner.h().end());
    for (int w = 0; w < senders; ++w) {
        EXPECT_EQ(sent[w], std::vector<float>(c[w].state().begin(), c[w].state().end())) << "sender " << w;
        for (int64_t i = 0; i < n; ++i) mean[static_cast<size_t>(i)] += c[w].state()[static_cast<size_t>(i)] / 3.0;
    }
    EXPECT_LE(rho(h, mean), 1e-6);
}

// A constant gradient: h_w converges to it, so ||g - h_w|| / ||g|| falls from ~1 toward the int8 noise.
TEST(GradCompressTopkEf21, EstimateConvergesToAConstantGradient) {
    GradCompressor c({.level = 3}, mt::optim::kTopkChunk);
    const std::vector<float> g = randn(mt::optim::kTopkChunk, 3, 0);
    c.encode(g, {});
    const double first = c.last_stats().ef_ratio();
    EXPECT_GT(first, 0.5);
    for (int t = 1; t < 200; ++t) c.encode(g, {.step = t});
    EXPECT_LT(c.last_stats().ef_ratio(), 1e-2);
    EXPECT_NEAR(c.last_stats().e_sq, c.last_stats().err_sq, 1e-6 * c.last_stats().g_sq);
}

// Saving the state after 5 steps and loading it into a fresh compressor gives bitwise the same 6th message and
// state (and, for level 3, the same owner h).
TEST(GradCompressState, SaveLoadResumesBitwise) {
    const int64_t n = mt::optim::kTopkChunk + 123;
    for (int level : {1, 2, 3}) {
        const CompressOptions options{.level = level, .chunk = 1000, .seed = 5};
        GradCompressor a(options, n, 17);
        Ef21Receiver owner_a({.level = 3}, n);
        for (int t = 0; t < 5; ++t) {
            const Bytes m = a.encode(randn(n, 4, static_cast<uint64_t>(t)), {.step = t, .bucket = 1, .rank = 2});
            if (level == 3) owner_a.update(std::vector<std::span<const uint8_t>>{m});
        }
        const std::vector<float> saved(a.state().begin(), a.state().end());
        const std::vector<float> saved_h(owner_a.h().begin(), owner_a.h().end());
        GradCompressor b(options, n, 17);
        b.load_state(saved);
        Ef21Receiver owner_b({.level = 3}, n);
        owner_b.load_state(saved_h);
        const std::vector<float> g = randn(n, 4, 5);
        const Bytes ma = a.encode(g, {.step = 5, .bucket = 1, .rank = 2});
        const Bytes mb = b.encode(g, {.step = 5, .bucket = 1, .rank = 2});
        EXPECT_EQ(ma, mb) << "level " << level;
        EXPECT_TRUE(std::equal(a.state().begin(), a.state().end(), b.state().begin(), b.state().end()));
        if (level == 3) {
            owner_a.update(std::vector<std::span<const uint8_t>>{ma});
            owner_b.update(std::vector<std::span<const uint8_t>>{mb});
            EXPECT_TRUE(std::equal(owner_a.h().begin(), owner_a.h().end(), owner_b.h().begin(), owner_b.h().end()));
        }
        b.reset_state();
        for (float x : b.state()) ASSERT_EQ(x, 0.0f);
    }
}

// The same inputs give the same bytes, state and norms: twice in a row, and with 1 or 3 OpenMP threads.
TEST(GradCompressDeterminism, SameInputsSameBytesAtAnyThreadCount) {
    const int64_t n = 2 * mt::optim::kTopkChunk + 999;
    const int saved = omp_get_max_threads();
    for (int level : {1, 2, 3}) {
        const CompressOptions options{.level = level, .seed = 11};
        auto run = [&](int threads) {
            omp_set_num_threads(threads);
            GradCompressor c(options, n);
            std::vector<Bytes> messages;
            for (int t = 0; t < 3; ++t)
                messages.push_back(
                    c.encode(randn(n, 8, static_cast<uint64_t>(t)), {.step = t, .bucket = 2, .rank = 1}));
            messages.push_back(Bytes(reinterpret_cast<const uint8_t*>(c.state().data()),
                                     reinterpret_cast<const uint8_t*>(c.state().data() + c.state().size())));
            const mt::optim::CompressStats s = c.last_stats();
            messages.push_back(Bytes(reinterpret_cast<const uint8_t*>(&s), reinterpret_cast<const uint8_t*>(&s + 1)));
            return messages;
        };
        const auto one = run(1);
        EXPECT_EQ(run(1), one) << "level " << level;
        EXPECT_EQ(run(3), one) << "level " << level;
    }
    omp_set_num_threads(saved);
}

TEST(GradCompressErrors, BadOptionsAndSizesNameTheField) {
    EXPECT_ERROR_NAMES(GradCompressor({.level = 0}, 10), "compress.level");
    EXPECT_ERROR_NAMES(GradCompressor({.level = 4}, 10), "compress.level");
    EXPECT_ERROR_NAMES(GradCompressor({.level = 2, .chunk = 0}, 10), "compress.chunk");
    EXPECT_ERROR_NAMES(GradCompressor({.level = 3, .topk_density = 0.0}, 10), "compress.topk_density");
    EXPECT_ERROR_NAMES(GradCompressor({.level = 3, .topk_density = 1.5}, 10), "compress.topk_density");
    EXPECT_ERROR_NAMES(GradCompressor({.level = 2}, -1), "n = -1");
    EXPECT_ERROR_NAMES(Ef21Receiver({.level = 2}, 10), "Ef21Receiver");

    GradCompressor c({.level = 2, .chunk = 4}, 10);
    const std::vector<float> g(10, 1.0f);
    Bytes out(static_cast<size_t>(c.message_bytes()));
    EXPECT_ERROR_NAMES(c.encode(std::vector<float>(9, 1.0f), {}, out), "g elements");
    EXPECT_ERROR_NAMES(c.encode(g, {}, std::span(out).first(out.size() - 1)), "out bytes");
    EXPECT_ERROR_NAMES(c.encode(g, {.rank = -1}, out), "CompressKey.rank");
    EXPECT_ERROR_NAMES(c.encode(g, {.step = int64_t{1} << 40}, out), "CompressKey.step");
    std::vector<float> acc(10, 0.0f);
    EXPECT_ERROR_NAMES(c.decode_add(std::span(out).first(3), acc), "message bytes");
    EXPECT_ERROR_NAMES(c.load_state(std::vector<float>(11, 0.0f)), "load_state");
    EXPECT_ERROR_NAMES(mt::optim::grad_compress_decode_mean(c.options(), {}, acc), "messages is empty");

    // A non-finite gradient fails before the error buffer changes.
    std::vector<float> bad = g;
    bad[3] = std::nanf("");
    c.encode(g, {}, out);
    const std::vector<float> before(c.state().begin(), c.state().end());
    EXPECT_ERROR_NAMES(c.encode(bad, {}, out), "g[3]");
    EXPECT_TRUE(std::equal(before.begin(), before.end(), c.state().begin(), c.state().end()));

    // A level-3 message whose offsets are not ascending is refused.
    const CompressOptions topk{.level = 3, .topk_density = 0.3};
    GradCompressor t(topk, 10);
    Bytes m = t.encode(std::vector<float>{0.5f, -2.0f, 0.1f, 1.2f, -1.2f, 0.0f, 0.25f, 0.3f, -0.2f, 1.2f}, {});
    std::swap(m[4], m[6]);
    EXPECT_ERROR_NAMES(GradCompressor::decode_add(topk, m, acc), "topk_ef21 message: chunk 0 entry 1");
}

}  // namespace
