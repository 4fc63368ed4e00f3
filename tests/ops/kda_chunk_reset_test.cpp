// KdaOptions::chunk_reset (ops/kda.h), the per-(row, chunk) flags that restart KDA's state at a chunk, on the CPU
// chunked reference (the CUDA scans read the same flags: tests/ops/kda_varlen_gpu_test.cpp): flags at the chunks
// where documents start equal the per-document split in f64 (outputs, st and every gradient including ds0, so no
// gradient crosses a flagged chunk), a flag at chunk 0 replaces s0 by zero and gives ds0 = 0 exactly, and the flags'
// argument checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kda_inputs.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

TEST(KdaChunkReset, FlagsRestartTheStateAsDocumentsDo) {
    // Rows of 90 tokens in chunks of 32 (the last one short): documents at 0, 32, 64 and at 0, 64.
    const int64_t t = 90, chunk = 32;
    const KdaInputs in = kda_make_inputs({2, t, 1, 2, 8, 6}, KdaGateRegime::near_zero, true, 23);
    KdaOptions split{.algorithm = KdaAlgorithm::chunked, .chunk_size = chunk};
    split.doc_start = mt::testing::doc_start_map({{0, 32, 64}, {0, 64}}, t);
    const KdaResult e = kda_run_use(in, split, {}, 3);
    KdaOptions flags{.algorithm = KdaAlgorithm::chunked, .chunk_size = chunk};
    flags.chunk_reset = Tensor::zeros({2, 3}, DType::i32);
    for (int64_t i : {1, 2, 5}) core::tensor_set_flat(flags.chunk_reset, i, 1.0);
    const KdaResult a = kda_run_use(in, flags, {}, 3);
    const auto ta = kda_result_tensors(a), te = kda_result_tensors(e);
    ASSERT_EQ(ta.size(), te.size());
    for (size_t i = 0; i < ta.size(); ++i)
        EXPECT_LE(mt::testing::rho(ta[i].second, te[i].second), 1e-12) << ta[i].first;
    // Without the flags the results are far from the split (the comparison above can fail).
    const KdaResult none = kda_run_use(in, KdaOptions{.algorithm = KdaAlgorithm::chunked, .chunk_size = chunk}, {}, 3);
    EXPECT_GT(mt::testing::rho(none.out, e.out), 1e-3);
    EXPECT_GT(mt::testing::rho(none.ds0, e.ds0), 1e-3);

    // Row 0 restarts at chunk 0 too: as if its s0 were zero, and no gradient reaches its s0.
    KdaOptions at_zero = flags;
    at_zero.chunk_reset = flags.chunk_reset.clone();
    core::tensor_set_flat(at_zero.chunk_reset, 0, 1.0);
    const KdaResult z = kda_run_use(in, at_zero, {}, 3);
    const Tensor s0_zero_row0 = in.s0.clone();
    s0_zero_row0.select(0, 0).zero();
    const KdaResult no_s0 = kda_run_use(KdaInputs{in.q, in.k, in.v, in.g, in.beta, s0_zero_row0}, flags, {}, 3);
    EXPECT_LE(mt::testing::rho(z.out, no_s0.out), 1e-12);
    EXPECT_LE(mt::testing::rho(z.st, no_s0.st), 1e-12);
    EXPECT_LE(mt::testing::rho(z.dq, no_s0.dq), 1e-12);
    const int64_t row = z.ds0.numel() / 2;
    for (int64_t i = 0; i < row; ++i) EXPECT_EQ(core::tensor_get_flat(z.ds0, i), 0.0) << "ds0 of row 0 at " << i;
    for (int64_t i = row; i < 2 * row; ++i)
        EXPECT_EQ(core::tensor_get_flat(z.ds0, i), core::tensor_get_flat(no_s0.ds0, i)) << "ds0 of row 1 at " << i;
}

TEST(OpArgs, KdaChunkReset) {
    const KdaInputs in = kda_make_inputs({2, 40, 1, 2, 4, 4}, KdaGateRegime::bounded, false, 3);
    const Tensor out = op_like(in.v);
    KdaOptions options;  // chunk 64: one chunk
    options.chunk_reset = Tensor::zeros({2, 2}, DType::i32);
    expect_op_error([&] { kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options); },
                    "kda_fwd: options.chunk_reset has shape [2, 2], expected [2, 1]");
    options.chunk_reset = Tensor::zeros({2, 1}, DType::f32);
    expect_op_error([&] { kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options); },
                    "kda_fwd: options.chunk_reset has dtype f32, expected i32");
    options.chunk_reset = Tensor::zeros({2, 1}, DType::i32);
    options.doc_start = mt::testing::doc_start_map({{0, 7}, {0}}, 40);
    expect_op_error([&] { kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options); },
                    "kda_fwd: options.chunk_reset and options.doc_start exclude each other");
    options.doc_start = Tensor();
    options.algorithm = KdaAlgorithm::recurrent;
    expect_op_error([&] { kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options); },
                    "kda_fwd: options.chunk_reset needs the chunked algorithm");
}

}  // namespace
}  // namespace mt::ops::test
