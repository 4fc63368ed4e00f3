// Cases and argument checks of the embedding op (ops/embedding.h), including out-of-range ids (exit 3) and the
// vocabulary-sharded form (vocab-parallel embedding: the shards' outputs sum to the whole table's).
#include "ops/embedding.h"

#include <gtest/gtest.h>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// Ids repeat (n > vocab in most cases), so the backward's accumulation into shared rows is exercised.
OpCase embedding_case(int64_t n, int64_t vocab, int64_t c) {
    const std::string name = fmt::format("embedding_n{}_v{}_c{}", n, vocab, c);
    return {"embedding", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"ids", op_rand_ids({n}, s, 0, 0, static_cast<int32_t>(vocab)), GradKind::none},
                            {"weight", op_randn({vocab, c}, s, 1), GradKind::accumulated}};
                p.forward = [](const std::vector<Tensor>& in) {
                    Tensor out = op_like(in[1], {in[0].size(0), in[1].size(1)});
                    embedding_fwd(in[0], in[1], out);
                    return std::vector<Tensor>{out};
                };
                p.backward = [](const std::vector<Tensor>& in,
                                const std::vector<Tensor>& dout,
                                const std::vector<Tensor>& grads) { embedding_bwd(in[0], dout[0], grads[1]); };
                return p;
            }};
}

// A shard of a vocabulary of `total` ids: the table holds the rows of [first, first + vocab), the ids are drawn from
// the whole vocabulary, so some fall outside the shard (zero rows in the forward, skipped by the backward).
OpCase embedding_shard_case(int64_t n, int64_t vocab, int64_t c, int64_t first, int64_t total) {
    const std::string name = fmt::format("embedding_n{}_v{}_c{}_shard{}of{}", n, vocab, c, first, total);
    const VocabShard shard{first, total};
    return {"embedding", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"ids", op_rand_ids({n}, s, 0, 0, static_cast<int32_t>(total)), GradKind::none},
                            {"weight", op_randn({vocab, c}, s, 1), GradKind::accumulated}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor out = op_like(in[1], {in[0].size(0), in[1].size(1)});
                    embedding_fwd(in[0], in[1], out, shard);
                    return std::vector<Tensor>{out};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) { embedding_bwd(in[0], dout[0], grads[1], shard); };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(embedding_case(1, 1, 1));
    op_register(embedding_case(7, 5, 3));
    op_register(embedding_case(13, 11, 17));
    op_register(embedding_case(97, 257, 131));  // more than one column block of the backward
    op_register(embedding_case(300, 7, 70));    // many repeats of every id
    op_register(embedding_case(300, 37, 130));  // large enough to run on the OpenMP team
    // CUDA sizes: the 8-wide vector path, several row and column blocks of the backward, a large vocabulary.
    op_register(op_parity_only(embedding_case(1031, 500, 1024)));
    op_register(op_parity_only(embedding_case(517, 50257, 72)));
    // Vocabulary shards: the first, a middle and the last of a vocabulary; one whose ids mostly miss it.
    op_register(embedding_shard_case(13, 4, 17, 0, 11));
    op_register(embedding_shard_case(29, 4, 5, 4, 11));
    op_register(embedding_shard_case(97, 50, 131, 207, 257));
    op_register(embedding_shard_case(300, 7, 70, 100, 300));
    op_register(op_parity_only(embedding_shard_case(1031, 500, 1024, 250, 1200)));
    op_register(op_parity_only(embedding_shard_case(517, 25128, 72, 25129, 50257)));
    return true;
}();

TEST(OpArgs, EmbeddingShapesAndDtypes) {
    const Tensor ids = Tensor::zeros({3}, DType::i32), w = Tensor::zeros({5, 4}, DType::f32);
    const Tensor out = Tensor::zeros({3, 4}, DType::f32);
    embedding_fwd(ids, w, out);
    expect_op_error(
        [&] {
            embedding_fwd(ids, w, Tensor::zeros({3, 5}, DType::f32));
        },
        "embedding_fwd: out has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { embedding_fwd(Tensor::zeros({3}, DType::i64), w, out); },
                    "embedding_fwd: ids has dtype i64, expected i32");
    expect_op_error([&] { embedding_fwd(ids, w.to(DType::bf16), out); }, "embedding_fwd: weight has dtype bf16");
    expect_op_error([&] { embedding_fwd(ids, w, out.to(DType::f64)); },
                    "embedding_fwd: out has dtype f64, expected f32 (the dtype of weight)");
    expect_op_error(
        [&] {
            embedding_fwd(Tensor::zeros({3, 1}, DType::i32), w, out);
        },
        "embedding_fwd: ids has shape [3, 1] (rank 2), expected rank 1");
    expect_op_error([&] { embedding_fwd(op_noncontiguous({3}, DType::i32), w, out); },
                    "embedding_fwd: ids must be contiguous");
    expect_op_error(
        [&] {
            embedding_fwd(ids, w, op_cuda_view({3, 4}, DType::f32));
        },
        "embedding_fwd: out is on cuda but ids is on cpu; all tensors of one call must be on the same device");
    expect_op_error(
        [&] {
            embedding_bwd(ids, op_cuda_view({3, 4}, DType::f32), w);
        },
        "embedding_bwd: dout is on cuda but ids is on cpu");

    embedding_bwd(ids, out, w);
    expect_op_error(
        [&] {
            embedding_bwd(ids, Tensor::zeros({2, 4}, DType::f32), w);
        },
        "embedding_bwd: dout has shape [2, 4], expected [3, 4]");
    expect_op_error([&] { embedding_bwd(ids, out, w.to(DType::f64)); },
                    "embedding_bwd: dweight has dtype f64, expected f32 (the dtype of dout)");
    expect_op_error(
        [&] {
            embedding_bwd(ids, out, op_noncontiguous({5, 4}, DType::f32));
        },
        "embedding_bwd: dweight must be contiguous");
}

// An id outside the table is bad token data: exit 3, naming the position and the id; nothing is written.
TEST(OpEmbedding, IdOutOfRangeIsDataError) {
    const Tensor w = Tensor::zeros({5, 2}, DType::f32), out = Tensor::zeros({4, 2}, DType::f32);
    Tensor ids = Tensor::zeros({4}, DType::i32);
    ids.data<int32_t>()[2] = 5;
    expect_op_error([&] { embedding_fwd(ids, w, out); },
                    "embedding_fwd: ids[2] = 5 is outside the embedding table [0, 5)",
                    core::ExitCode::data);
    expect_op_error([&] { embedding_bwd(ids, out, w); }, "embedding_bwd: ids[2] = 5", core::ExitCode::data);
    ids.data<int32_t>()[2] = -1;
    expect_op_error([&] { embedding_fwd(ids, w, out); }, "ids[2] = -1", core::ExitCode::data);
    ids.data<int32_t>()[2] = 4;
    embedding_fwd(ids, w, out);
}

// The table split into shards of a vocabulary of 11 ids, 6 + 5 and 4 + 4 + 3 rows (f64): the shards' outputs sum
// to the whole table's lookup and their gradients, side by side, are the whole table's gradient, exactly (each
// position's row comes from one shard, and every shard adds its rows' positions in the same order).
TEST(OpEmbedding, ShardsSumToTheWholeTable) {
    const int64_t n = 23, vocab = 11, c = 5;
    const Tensor ids = op_rand_ids({n}, 7, 0, 0, static_cast<int32_t>(vocab));
    const Tensor weight = op_randn({vocab, c}, 7, 1), dout = op_randn({n, c}, 7, 2);
    const Tensor out = Tensor::zeros({n, c}, DType::f64), dweight = op_like(weight);
    embedding_fwd(ids, weight, out);
    embedding_bwd(ids, dout, dweight);
    for (const std::vector<int64_t>& widths : {std::vector<int64_t>{6, 5}, std::vector<int64_t>{4, 4, 3}}) {
        const Tensor sum = op_like(out), dweight_shards = op_like(dweight);
        int64_t first = 0;
        for (const int64_t width : widths) {
            const VocabShard shard{first, vocab};
            const Tensor w = weight.slice(0, first, first + width).clone();
            const Tensor out_r = Tensor::zeros({n, c}, DType::f64), dw_r = op_like(w);
            out_r.fill(1.0);  // every row is written, the others' rows with zeros
            embedding_fwd(ids, w, out_r, shard);
            embedding_bwd(ids, dout, dw_r, shard);
            for (int64_t i = 0; i < n * c; ++i)
                core::tensor_set_flat(sum, i, core::tensor_get_flat(sum, i) + core::tensor_get_flat(out_r, i));
            dweight_shards.slice(0, first, first + width).copy_from(dw_r);
            first += width;
        }
        for (int64_t i = 0; i < n * c; ++i)
            EXPECT_EQ(core::tensor_get_flat(sum, i), core::tensor_get_flat(out, i))
                << widths.size() << " shards, " << i;
        for (int64_t i = 0; i < vocab * c; ++i)
            EXPECT_EQ(core::tensor_get_flat(dweight_shards, i), core::tensor_get_flat(dweight, i))
                << widths.size() << " shards, " << i;
    }
}

// Sharded, the ids are global: one outside the whole vocabulary is bad token data (exit 3), one outside the shard
// but inside the vocabulary is not. A shard that does not fit its vocabulary is the caller's bug (exit 1).
TEST(OpEmbedding, ShardedIdOutOfRangeIsDataError) {
    const VocabShard shard{4, 11};
    const Tensor w = Tensor::zeros({4, 2}, DType::f32), out = Tensor::zeros({4, 2}, DType::f32);
    Tensor ids = Tensor::zeros({4}, DType::i32);
    ids.data<int32_t>()[1] = 10;
    embedding_fwd(ids, w, out, shard);
    embedding_bwd(ids, out, w, shard);
    ids.data<int32_t>()[2] = 11;
    expect_op_error([&] { embedding_fwd(ids, w, out, shard); },
                    "embedding_fwd: ids[2] = 11 is outside the embedding table [0, 11)",
                    core::ExitCode::data);
    expect_op_error([&] { embedding_bwd(ids, out, w, shard); }, "embedding_bwd: ids[2] = 11", core::ExitCode::data);
    ids.data<int32_t>()[2] = -1;
    expect_op_error([&] { embedding_fwd(ids, w, out, shard); }, "ids[2] = -1", core::ExitCode::data);
    ids.data<int32_t>()[2] = 0;
    expect_op_error(
        [&] {
            embedding_fwd(ids, w, out, VocabShard{8, 11});
        },
        "embedding_fwd: the vocabulary shard [8, 12) is not inside a vocabulary of 11 ids");
    expect_op_error(
        [&] {
            embedding_bwd(ids, out, w, VocabShard{-1, 11});
        },
        "embedding_bwd: the vocabulary shard [-1, 3) is not inside a vocabulary of 11 ids");
    expect_op_error(
        [&] {
            embedding_fwd(ids, w, out, VocabShard{4, 0});
        },
        "an unsharded call has first = 0 and total = 0");
}

// On the GPU: an id outside the table is found on the device and reported as on the CPU (exit 3, naming the first
// bad position); an unsupported dtype names the argument.
void cuda_errors() {
    const core::Device gpu = core::Device::cuda;
    const Tensor w = Tensor::zeros({5, 8}, DType::bf16, gpu), out = Tensor::zeros({6, 8}, DType::bf16, gpu);
    Tensor ids = Tensor::zeros({6}, DType::i32);
    ids.data<int32_t>()[4] = 5;
    ids.data<int32_t>()[2] = -3;
    const Tensor ids_dev = ids.to_device(gpu);
    expect_op_error([&] { embedding_fwd(ids_dev, w, out); },
                    "embedding_fwd: ids[2] = -3 is outside the embedding table [0, 5)",
                    core::ExitCode::data);
    expect_op_error(
        [&] {
            embedding_bwd(ids_dev, out, Tensor::zeros({5, 8}, DType::f32, gpu));
        },
        "embedding_bwd: ids[2] = -3",
        core::ExitCode::data);
    expect_op_error([&] { embedding_fwd(Tensor::zeros({6}, DType::i32, gpu), w.to(DType::f64), out); },
                    "embedding_fwd: weight has dtype f64, expected bf16, f16 or f32");
    // Sharded: checked against the whole vocabulary of 9 ids (ids[4] = 5 lies in it, ids[2] = 9 does not).
    ids.data<int32_t>()[2] = 9;
    const Tensor ids_big = ids.to_device(gpu);
    expect_op_error(
        [&] {
            embedding_fwd(ids_big, w, out, VocabShard{3, 9});
        },
        "embedding_fwd: ids[2] = 9 is outside the embedding table [0, 9)",
        core::ExitCode::data);
    expect_op_error(
        [&] {
            embedding_bwd(ids_big, out, Tensor::zeros({5, 8}, DType::f32, gpu), VocabShard{3, 9});
        },
        "embedding_bwd: ids[2] = 9",
        core::ExitCode::data);
}

[[maybe_unused]] const bool kRegisteredCuda = [] {
    op_register_parity_check("embedding", "embedding_cuda_errors", cuda_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
