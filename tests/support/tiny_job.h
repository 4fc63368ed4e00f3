// Test helpers: a small learnable token shard and a job config sized for fast CPU tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/llmc_shard.h"
#include "train/config.h"

namespace mt::testing {

// A fresh directory under the test temp dir, unique per test.
inline std::string fresh_dir(const std::string& name) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string dir = ::testing::TempDir() + "mt_" + info->test_suite_name() + "_" + info->name() + "_" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
}

// Tokens with structure a small model can learn: a noisy repeated pattern over `vocab` ids.
inline std::vector<int32_t> pattern_tokens(int64_t n, int64_t vocab, uint64_t seed) {
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const bool noise = core::rng_uniform(seed, 1, static_cast<uint64_t>(i)) < 0.1f;
        tokens[static_cast<size_t>(i)] =
            noise ? static_cast<int32_t>(core::rng_u64(seed, 2, static_cast<uint64_t>(i)) % vocab)
                  : static_cast<int32_t>((i * 7 + (i / 13)) % vocab);
    }
    return tokens;
}

// Writes a shard of tiny_job's vocabulary (61) holding documents that end at EOT 60: 400 short ones of 2..6 tokens and
// 12 long ones of 40..200, so that at seq_len 16 and 32 the short ones are a curriculum's replay and the long ones
// long. Returns the path (dir/docs.bin).
inline std::string write_document_shard(const std::string& dir) {
    std::vector<int32_t> tokens;
    for (uint64_t d = 0; d < 412; ++d) {
        const bool is_long = d % 34 == 33;
        const int64_t len = is_long ? 40 + static_cast<int64_t>(core::rng_u64(1, 2, d) % 161)
                                    : 2 + static_cast<int64_t>(core::rng_u64(1, 3, d) % 5);
        for (int64_t i = 0; i + 1 < len; ++i)
            tokens.push_back(static_cast<int32_t>((d * 7 + static_cast<uint64_t>(i) * 3) % 60));
        tokens.push_back(60);
    }
    const std::string path = dir + "/docs.bin";
    data::llmc_write_shard(path, tokens, 61);
    return path;
}

// Overrides that shrink configs/shapes_tiny.toml's vision tower to one block of width 32 for fast CPU tests.
inline std::vector<std::string> tiny_vision_overrides() {
    return {"vision.layers=1", "vision.dim=32", "vision.heads=2", "vision.mlp=64"};
}

// Overrides that make tiny_job's model a small MoE on the CPU (4 experts of width 16, top 2), followed by `more`.
inline std::vector<std::string> tiny_moe_overrides(const std::vector<std::string>& more) {
    std::vector<std::string> o = {
        "run.device=\"cpu\"", "moe.enabled=true", "moe.num_experts=4", "moe.top_k=2", "moe.expert_ffn_dim=16"};
    o.insert(o.end(), more.begin(), more.end());
    return o;
}

// Writes train/val shards into dir and returns a config of a 2-layer GQA model over them. The pattern corpus has no
// documents (and the bytes tokenizer's EOT, 256, is outside its vocabulary of 61): document masking is off.
inline train::JobConfig tiny_job(const std::string& dir, std::vector<std::string> overrides = {}) {
    const int64_t vocab = 61;
    data::llmc_write_shard(dir + "/train.bin", pattern_tokens(20000, vocab, 1), vocab);
    data::llmc_write_shard(dir + "/val.bin", pattern_tokens(3000, vocab, 2), vocab);
    const std::string toml = "[run]\ndir = \"" + dir + "/run\"\nseed = 7\nthreads = 2\n" +
                             "[model]\nvocab_size = 61\nd_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\n"
                             "d_ff = 64\nmax_seq_len = 64\ntie_embeddings = false\n"
                             "[data]\ndocument_mask = false\npaths = [\"" +
                             dir + "/train.bin\"]\nval_paths = [\"" + dir +
                             "/val.bin\"]\n"
                             "[train]\nsteps = 8\nbatch_size = 4\nseq_len = 16\ngrad_accum = 2\nlr = 1e-2\n"
                             "warmup_steps = 2\neval_every = 0\neval_batches = 2\n"
                             "[checkpoint]\nevery_steps = 0\n";
    return train::config_parse(toml, dir + "/job.toml", overrides);
}

}  // namespace mt::testing
