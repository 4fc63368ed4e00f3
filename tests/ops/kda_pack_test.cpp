// The packed (varlen) document path of KDA on the CPU (ops/kda.h KdaDocuments::packed, ops/cpu/kda_pack.h): the host
// maps of the packed layout (hand-computed, and invariants over random maps), and the packed path through the CPU
// chunked reference with its chunk_reset flags against the per-document split in f64 (rho <= 1e-12 for out, st and
// every gradient including ds0) over documents shorter than a chunk, exactly a chunk, across chunk boundaries, one
// token long, a row of one document, s0 / st / dst each defined and undefined, and B = 2 with a different layout per
// row. The CUDA packed path runs the same host code; tests/ops/kda_varlen_gpu_test.cpp checks it there.
#include "ops/cpu/kda_pack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kda_inputs.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

using Starts = std::vector<std::vector<int64_t>>;

TEST(KdaPackPlan, HandComputedLayout) {
    // Row 0: documents [0, 3), [3, 4), [4, 9), [9, 10); row 1: one document [0, 10). Chunks of 4.
    const cpu::KdaPackPlan p = cpu::kda_pack_plan(mt::testing::doc_start_map({{0, 3, 4, 9}, {0}}, 10), 4);
    // Row 0 packs to 4 + 4 + 8 + 4 = 20 tokens, row 1 to 12: T' = 20, 5 chunks.
    EXPECT_EQ(p.tp, 20);
    EXPECT_EQ(p.nc, 5);
    EXPECT_EQ(p.documents, 5);
    EXPECT_FALSE(p.one_document_per_row());
    const std::vector<int32_t> src = {0,  1,  2,  -1, 3,  -1, -1, -1, 4,  5,  6,  7,  8,  -1, -1, -1, 9,  -1, -1, -1,
                                      10, 11, 12, 13, 14, 15, 16, 17, 18, 19, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    const std::vector<int32_t> dst = {0, 1, 2, 4, 8, 9, 10, 11, 12, 16, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
    const std::vector<int32_t> reset = {0, 1, 1, 0, 1, 0, 0, 0, 0, 0};
    EXPECT_EQ(p.src, src);
    EXPECT_EQ(p.dst, dst);
    EXPECT_EQ(p.reset, reset);
}

TEST(KdaPackPlan, OneDocumentPerRowPacksToWholeChunks) {
    const cpu::KdaPackPlan p = cpu::kda_pack_plan(mt::testing::doc_start_map({{0}, {0}}, 70), 64);
    EXPECT_TRUE(p.one_document_per_row());
    EXPECT_EQ(p.tp, 128);
    for (int32_t r : p.reset) EXPECT_EQ(r, 0);
}

// Over random maps: every token has one packed position and back (src o dst = id), its document keeps its order and
// starts on a chunk boundary, the flags mark exactly the documents after each row's first, nothing else is real.
TEST(KdaPackPlan, InvariantsOverRandomMaps) {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t b = 1 + trial % 3, t = 1 + static_cast<int64_t>(rng() % 300), chunk = trial % 2 ? 64 : 32;
        Starts starts(static_cast<size_t>(b));
        for (auto& row : starts) {
            row.push_back(0);
            const int64_t density = 1 + static_cast<int64_t>(rng() % 80);  // mean document length
            for (int64_t i = 1; i < t; ++i)
                if (static_cast<int64_t>(rng() % static_cast<uint32_t>(density)) == 0) row.push_back(i);
        }
        const Tensor map = mt::testing::doc_start_map(starts, t);
        const cpu::KdaPackPlan p = cpu::kda_pack_plan(map, chunk);
        SCOPED_TRACE(::testing::Message() << "trial " << trial << ", B " << b << ", T " << t << ", chunk " << chunk);
        ASSERT_EQ(p.tp % chunk, 0);
        ASSERT_EQ(p.nc, p.tp / chunk);
        int64_t real = 0, flags = 0, docs = 0, longest = 0;
        for (int32_t s : p.src) real += s >= 0;
        for (int32_t r : p.reset) flags += r != 0;
        EXPECT_EQ(real, b * t);
        for (int64_t row = 0; row < b; ++row) {
            const auto& st = starts[static_cast<size_t>(row)];
            docs += static_cast<int64_t>(st.size());
            int64_t packed = 0;
            for (size_t i = 0; i < st.size(); ++i) {
                const int64_t first = st[i], end = i + 1 < st.size() ? st[i + 1] : t;
                const int64_t p0 = p.dst[static_cast<size_t>(row * t + first)] - row * p.tp;
                EXPECT_EQ(p0 % chunk, 0) << "document at " << first << " does not start on a chunk boundary";
                EXPECT_EQ(p.reset[static_cast<size_t>(row * p.nc + p0 / chunk)], i > 0 ? 1 : 0);
                for (int64_t x = first; x < end; ++x) {
                    const int32_t at = p.dst[static_cast<size_t>(row * t + x)];
                    EXPECT_EQ(at - row * p.tp - p0, x - first);
                    EXPECT_EQ(p.src[static_cast<size_t>(at)], row * t + x);
                }
                packed += (end - first + chunk - 1) / chunk * chunk;
            }
            longest = std::max(longest, packed);
        }
        EXPECT_EQ(flags, docs - b);
        EXPECT_EQ(p.documents, docs);
        EXPECT_EQ(p.tp, longest);
    }
}

struct Layout {
    const char* name;
    int64_t t;
    Starts starts;
};

// Row layouts: documents shorter than a chunk, a one-token document, across chunk boundaries, a row of one document
// (no reset), whole chunks (32 and 64), consecutive one-token documents, and B = 2 rows of different layouts.
const Layout kLayouts[] = {
    {"short_and_one_token_with_single_row", 150, {{0, 10, 30, 31, 94}, {0}}},
    {"whole_chunks_and_crossing", 192, {{0, 64, 128}, {0, 1, 100, 191}}},
    {"tiny_documents", 40, {{0, 5, 6, 7, 8, 39}}},
};

TEST(KdaDocumentPacked, EqualsTheSplitInF64) {
    const KdaUse uses[] = {{true, true, true}, {false, false, false}, {true, false, true}, {false, true, false}};
    double worst = 0.0;
    int compared = 0;
    for (const Layout& l : kLayouts) {
        const int64_t b = static_cast<int64_t>(l.starts.size());
        const KdaInputs in = kda_make_inputs({b, l.t, 1, 2, 8, 6}, KdaGateRegime::bounded, true, 17);
        for (int64_t chunk : {32, 64}) {
            for (const KdaUse& use : uses) {
                SCOPED_TRACE(::testing::Message() << l.name << ", chunk " << chunk << ", s0 " << use.s0 << ", st "
                                                  << use.st << ", dst " << use.dst);
                KdaOptions options{.algorithm = KdaAlgorithm::chunked, .chunk_size = chunk};
                options.doc_start = mt::testing::doc_start_map(l.starts, l.t);
                options.documents = KdaDocuments::split;
                std::string split_ran, packed_ran;
                const KdaResult split = kda_run_use(in, options, use, 9, &split_ran);
                options.documents = KdaDocuments::packed;
                const KdaResult packed = kda_run_use(in, options, use, 9, &packed_ran);
                EXPECT_EQ(split_ran, "cpu-chunked");
                EXPECT_EQ(packed_ran, "packed cpu-chunked");  // the packed path ran, with the chunked reference
                const auto a = kda_result_tensors(packed), e = kda_result_tensors(split);
                ASSERT_EQ(a.size(), e.size());
                for (size_t i = 0; i < a.size(); ++i) {
                    const double r = mt::testing::rho(a[i].second, e[i].second);
                    EXPECT_LE(r, 1e-12) << a[i].first;
                    worst = std::max(worst, r);
                    ++compared;
                }
            }
        }
    }
    std::printf("[ KDA ] packed vs split documents, f64, %d tensors: worst rho %.3e\n", compared, worst);
}

// The comparison above can fail: on these inputs (little decay, so a carried state matters) the document map moves
// every tensor by far more than its budget, so a packed path that carried the state across a document start, or let
// a gradient through one, would differ from the split.
TEST(KdaDocumentPacked, DocumentsChangeTheResult) {
    const Layout& l = kLayouts[0];
    const KdaInputs in = kda_make_inputs({2, l.t, 1, 2, 8, 6}, KdaGateRegime::near_zero, true, 17);
    KdaOptions options{.algorithm = KdaAlgorithm::chunked, .chunk_size = 32};
    const KdaResult whole = kda_run_use(in, options, {}, 9);
    options.doc_start = mt::testing::doc_start_map(l.starts, l.t);
    options.documents = KdaDocuments::packed;
    const KdaResult packed = kda_run_use(in, options, {}, 9);
    const auto a = kda_result_tensors(packed), e = kda_result_tensors(whole);
    ASSERT_EQ(a.size(), e.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_GT(mt::testing::rho(a[i].second, e[i].second), 1e-3) << a[i].first;
}

TEST(OpArgs, KdaPackedDocuments) {
    const KdaInputs in = kda_make_inputs({2, 40, 1, 2, 4, 4}, KdaGateRegime::bounded, false, 3);
    const Tensor out = op_like(in.v);
    KdaOptions options{.algorithm = KdaAlgorithm::recurrent};
    options.doc_start = mt::testing::doc_start_map({{0, 7}, {0}}, 40);
    options.documents = KdaDocuments::packed;
    expect_op_error([&] { kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options); },
                    "kda_fwd: KdaDocuments::packed runs the chunked algorithm only");
}

}  // namespace
}  // namespace mt::ops::test
