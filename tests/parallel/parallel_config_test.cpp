// The [parallel] config keys and the trainer's refusal of layouts it cannot run, in one process without MPI.
#include <gtest/gtest.h>

#include "core/error.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::core::Error;
using mt::core::ExitCode;

namespace {

template <typename F>
void expect_usage_error(F&& f, std::initializer_list<const char*> needles) {
    try {
        f();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
        for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(ParallelConfig, KeysParseAndRejectBadValues) {
    const std::string dir = mt::testing::fresh_dir("cfg");
    const auto cfg = mt::testing::tiny_job(dir, {"parallel.dp=2", "parallel.bucket_mb=0.5"});
    EXPECT_EQ(cfg.parallel.dp, 2);
    EXPECT_EQ(cfg.parallel.tp, 1);
    EXPECT_EQ(cfg.parallel.bucket_mb, 0.5);
    EXPECT_EQ(mt::testing::tiny_job(dir).parallel.dp, 0);  // the default fills the world
    expect_usage_error([&] { mt::testing::tiny_job(dir, {"parallel.tp=0"}); }, {"parallel.tp"});
    expect_usage_error([&] { mt::testing::tiny_job(dir, {"parallel.bucket_mb=0"}); }, {"parallel.bucket_mb"});
}

TEST(ParallelConfig, TrainerRefusesLayoutsItCannotRun) {
    const std::string dir = mt::testing::fresh_dir("layout");
    // One process cannot hold dp = 2.
    expect_usage_error([&] { mt::train::Trainer t(mt::testing::tiny_job(dir, {"parallel.dp=2"}), false); },
                       {"parallel.tp x cp x ep x dp x pp", "1 process"});
    expect_usage_error([&] { mt::train::Trainer t(mt::testing::tiny_job(dir, {"parallel.ep=2"}), false); },
                       {"parallel.ep = 2", "moe.enabled"});
}

// Tensor parallelism's divisibility rules (parallel.md §2), checked when the config is read (exit 2 naming the keys).
TEST(ParallelConfig, TensorParallelRefusesWhatItCannotSplit) {
    const std::string dir = mt::testing::fresh_dir("tp");
    auto job = [&](std::vector<std::string> o) { return mt::testing::tiny_job(dir, o); };
    // tiny_job: 4 query heads, 2 kv heads, d_ff 64, vocabulary 61, batch 4 x 16 tokens.
    EXPECT_EQ(job({"parallel.tp=2"}).parallel.sequence_parallel, true);  // the default with tp
    expect_usage_error([&] { job({"parallel.tp=3"}); }, {"model.n_heads = 4", "parallel.tp = 3"});
    EXPECT_NO_THROW(job({"parallel.tp=4"}));  // 2 kv heads, each replicated on 2 ranks
    expect_usage_error(
        [&] {
            job({"parallel.tp=4", "model.head_dim=8", "model.n_heads=12", "model.n_kv_heads=6"});
        },
        {"model.n_kv_heads = 6 and parallel.tp = 4"});
    expect_usage_error([&] { job({"parallel.tp=2", "model.d_ff=65"}); }, {"model.d_ff = 65"});
    expect_usage_error(
        [&] {
            job({"parallel.tp=2", "parallel.pad_vocab=false"});
        },
        {"model.vocab_size = 61", "parallel.pad_vocab = false"});
    EXPECT_NO_THROW(job({"parallel.tp=2", "parallel.pad_vocab=false", "model.vocab_size=62"}));
    expect_usage_error(
        [&] {
            job({"parallel.tp=2", "train.batch_size=1", "train.seq_len=15"});
        },
        {"train.batch_size x train.seq_len = 1 x 15", "parallel.tp = 2"});
    EXPECT_NO_THROW(
        job({"parallel.tp=2", "train.batch_size=1", "train.seq_len=15", "parallel.sequence_parallel=false"}));
    EXPECT_NO_THROW(job({"parallel.tp=2", "model.layer_pattern=\"AK\""}));
    expect_usage_error(
        [&] {
            job({"parallel.tp=2", "model.layer_pattern=\"AK\"", "kda.num_heads=3"});
        },
        {"kda.num_heads = 3", "parallel.tp = 2"});
    const std::vector<std::string> moe = {"parallel.tp=2", "moe.enabled=true", "moe.top_k=2", "moe.expert_ffn_dim=16"};
    auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), moe.begin(), moe.end());
        return extra;
    };
    EXPECT_NO_THROW(job(with({"moe.num_experts=4"})));
    expect_usage_error(
        [&] {
            job(with({"moe.num_experts=6", "parallel.ep=2"}));
        },
        {"moe.num_experts = 6 is not divisible by parallel.tp x parallel.ep = 2 x 2"});
    expect_usage_error(
        [&] {
            job(with({"moe.num_experts=4", "moe.capacity_factor=1.5"}));
        },
        {"moe.capacity_factor > 0"});
    expect_usage_error(
        [&] {
            job({"parallel.tp=4", "model.n_kv_heads=4", "model.vocab_size=5"});
        },
        {"leaves the last of parallel.tp = 4 vocabulary shards"});
}

// Pipeline parallelism's rules (parallel.md §3): exit 2 naming the keys.
TEST(ParallelConfig, PipelineRefusesWhatItCannotSplit) {
    const std::string dir = mt::testing::fresh_dir("pp");
    auto job = [&](std::vector<std::string> o) { return mt::testing::tiny_job(dir, o); };
    // tiny_job: 2 layers, grad_accum 2.
    EXPECT_NO_THROW(job({"parallel.pp=2"}));
    expect_usage_error([&] { job({"parallel.pp=4"}); },
                       {"model.n_layers = 2 is fewer than parallel.pp x pp.virtual_stages = 4 x 1"});
    expect_usage_error([&] { job({"parallel.pp=2", "pp.virtual_stages=2"}); }, {"pp.schedule = \"interleaved\""});
    expect_usage_error(
        [&] {
            job({"parallel.pp=2", "model.n_layers=4", "pp.layers_per_stage=[3, 2]"});
        },
        {"pp.layers_per_stage has 2 entries summing to 5"});
    expect_usage_error(
        [&] {
            job({"parallel.pp=4",
                 "model.n_layers=8",
                 "pp.schedule=\"interleaved\"",
                 "pp.virtual_stages=2",
                 "train.grad_accum=2"});
        },
        {"train.grad_accum = 2 to be a multiple of parallel.pp = 4"});
    expect_usage_error(
        [&] {
            job({"parallel.pp=2", "long.segments=2", "attnres.mode=\"block\""});
        },
        {"long.segments with parallel.pp > 1 runs without Block AttnRes"});
    expect_usage_error(
        [&] {
            job({"parallel.pp=2", "parallel.tp=2", "model.n_kv_heads=4", "long.segments=2"});
        },
        {"long.segments with parallel.pp > 1 runs without Block AttnRes and tensor parallelism"});
}

// Context parallelism's rules (long_context.md §7): every sequence length and explicit segment length a multiple of
// 2 x cp x 64, the per-batch MoE settings refused, and under tensor parallelism a cp rank's token rows divisible by
// tp: exit 2 naming the keys. The mode keys take their two spellings.
TEST(ParallelConfig, ContextParallelRefusesWhatItCannotRun) {
    const std::string dir = mt::testing::fresh_dir("cp");
    auto job = [&](std::vector<std::string> o) { return mt::testing::tiny_job(dir, o); };
    const std::vector<std::string> cp2 = {"parallel.cp=2", "train.seq_len=256", "model.max_seq_len=256"};
    auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), cp2.begin(), cp2.end());
        return extra;
    };
    EXPECT_NO_THROW(job(cp2));
    EXPECT_EQ(job(cp2).parallel.cp_attn, mt::nn::CpAttnMode::allgather);  // the defaults
    EXPECT_EQ(job(cp2).parallel.cp_kda, mt::nn::CpKdaMode::affine);
    EXPECT_EQ(job(with({"cp.kda=\"relay\""})).parallel.cp_kda, mt::nn::CpKdaMode::relay);
    EXPECT_NO_THROW(job(with({"model.layer_pattern=\"KA\"", "data.document_mask=true", "data.eot_token=0"})));
    expect_usage_error([&] { job(with({"cp.kda=\"ring\""})); }, {"cp.kda"});
    expect_usage_error([&] { job({"parallel.cp=2"}); },
                       {"train.seq_len = 16 is not a multiple of 2 x parallel.cp x 64 = 256"});
    expect_usage_error(
        [&] {
            job({"parallel.cp=4", "train.seq_len=256", "model.max_seq_len=256"});
        },
        {"train.seq_len = 256", "2 x parallel.cp x 64 = 512"});
    EXPECT_NO_THROW(job(with({"parallel.pp=2"})));  // cp ranks of a stage talk to the same cp rank of the next
    EXPECT_NO_THROW(job(with({"parallel.tp=2"})));
    // Sequence parallelism splits a cp rank's rows: 1 x 256 / 2 over tp = 3.
    expect_usage_error(
        [&] {
            job(with({"parallel.tp=3",
                      "model.n_heads=3",
                      "model.n_kv_heads=3",
                      "model.head_dim=8",
                      "model.d_ff=66",
                      "train.batch_size=1"}));
        },
        {"train.batch_size x train.seq_len / parallel.cp = 1 x 256 / 2 is not divisible by parallel.tp = 3"});
    // Segments under cp: each segment zigzagged alone, so explicit segment lengths are multiples of 2 x cp x 64.
    EXPECT_NO_THROW(job({"parallel.cp=2", "train.seq_len=512", "model.max_seq_len=512", "long.segments=2"}));
    EXPECT_NO_THROW(job(with({"long.segment_tokens=256"})));
    // long.tokens_per_gpu counts a cp rank's tokens (batch_size x seq_len / cp) and cuts whole cp granules.
    const mt::train::JobConfig target = job(with({"long.tokens_per_gpu=512", "train.batch_size=2"}));
    EXPECT_FALSE(mt::train::config_segments_for_length(target, 512).enabled());  // 2 x 512 / 2 = 512
    EXPECT_EQ(mt::train::config_segments_for_length(target, 1024).tokens, 512);  // 2 x 512 / 2 per pass
    EXPECT_EQ(mt::train::config_segments_for_length(target, 4096).tokens, 512);
    expect_usage_error([&] { job(with({"long.segment_tokens=64"})); },
                       {"long.segment_tokens = 64 is not a multiple of 2 x parallel.cp x 64 = 256"});
    EXPECT_NO_THROW(job(with({"attn.window_layers=[2]", "attn.window=32"})));  // window layers fetch their halo
    EXPECT_EQ(job(with({"cp.attn=\"ring\""})).parallel.cp_attn, mt::nn::CpAttnMode::ring);
    expect_usage_error(
        [&] {
            job(with({"moe.enabled=true", "moe.top_k=2", "moe.expert_ffn_dim=16", "moe.capacity_factor=1.5"}));
        },
        {"parallel.cp = 2 with moe.capacity_factor > 0"});
}
