// The curriculum in the config and the trainer: [[long.stages]] parsed, written back and refused when bad (exit 2
// naming the key); the trainer switches stage and row length at the configured tokens, records the stage in the
// manifest and resumes mid-stage with bitwise equal losses; the passkey prompt; configs/tiny_curriculum.toml.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/doc_index.h"
#include "data/llmc_shard.h"
#include "data/tokenizer.h"
#include "ops/global_norm.h"
#include "support/tiny_job.h"
#include "train/passkey.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;
using mt::testing::tiny_job;

// Two stages: 16 tokens for 3 steps (4 x 2 rows of 16 = 128 tokens per step, 384 tokens), then 32 tokens.
JobConfig curriculum_job(const std::string& dir, const std::string& run, std::vector<std::string> extra = {}) {
    const std::string docs = mt::testing::write_document_shard(dir);
    std::vector<std::string> o = {"run.dir=\"" + dir + "/" + run + "\"",
                                  "data.paths=[\"" + docs + "\"]",
                                  "data.eot_token=60",
                                  "model.max_seq_len=32",
                                  "long.passkey_eval=false",
                                  "long.stages=[{seq_len=16, tokens=384, long_fraction=0.25}, "
                                  "{seq_len=32, tokens=100000, long_fraction=0.5}]"};
    o.insert(o.end(), extra.begin(), extra.end());
    return tiny_job(dir, o);
}

void expect_usage_error(const std::string& dir, const std::string& stages, const std::string& needle) {
    try {
        curriculum_job(dir, "bad", {"long.stages=" + stages});
        ADD_FAILURE() << "expected exit 2 for " << stages;
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::usage) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(CurriculumConfig, ParsesWritesBackAndRefusesBadStages) {
    const std::string dir = fresh_dir("cfg");
    const JobConfig c = curriculum_job(dir, "run");
    ASSERT_EQ(c.long_ctx.stages.size(), 2u);
    EXPECT_EQ(c.long_ctx.stages[1].seq_len, 32);
    EXPECT_EQ(c.long_ctx.stages[1].tokens, 100000);
    EXPECT_EQ(c.long_ctx.stages[0].long_fraction, 0.25);
    // The resolved TOML holds the stages and reads back the same.
    const JobConfig again = config_parse(c.to_toml(), "resolved.toml");
    ASSERT_EQ(again.long_ctx.stages.size(), 2u);
    EXPECT_EQ(again.long_ctx.stages[1].long_fraction, 0.5);
    EXPECT_EQ(again.to_toml(), c.to_toml());
    // A stage without long_fraction is the natural mix, and stays one through the resolved TOML.
    const JobConfig natural = curriculum_job(dir, "run", {"long.stages=[{seq_len=16, tokens=10}]"});
    EXPECT_LT(natural.long_ctx.stages[0].long_fraction, 0.0);
    EXPECT_LT(config_parse(natural.to_toml(), "r.toml").long_ctx.stages[0].long_fraction, 0.0);

    expect_usage_error(dir, "[{seq_len=32, tokens=10}, {seq_len=16, tokens=10}]", "long.stages[1].seq_len = 16");
    expect_usage_error(dir, "[{seq_len=16, tokens=10}, {seq_len=16, tokens=10}]", "long.stages[1].seq_len");
    expect_usage_error(dir, "[{seq_len=16, tokens=0}]", "long.stages[0].tokens");
    expect_usage_error(dir, "[{seq_len=16, tokens=10, long_fraction=1.5}]", "long.stages[0].long_fraction");
    expect_usage_error(dir, "[{seq_len=16, tokens=10, long_fraction=-0.1}]", "long.stages[0].long_fraction");
    expect_usage_error(dir, "[{seq_len=64, tokens=10}]", "long.stages[0].seq_len = 64 exceeds model.max_seq_len");
    expect_usage_error(dir, "[{seq_len=16, tokens=10, lenght=3}]", "long.stages[0].lenght");
    expect_usage_error(dir, "[{tokens=10}]", "long.stages[0].seq_len is missing");
    expect_usage_error(dir, "[{seq_len=\"16\", tokens=10}]", "long.stages[0].seq_len must be an integer");
    expect_usage_error(dir, "3", "long.stages must be an array of tables");
    // A per-stage RoPE base (ABF) is taken; on a model without RoPE attention layers it is exit 2.
    const std::string abf = "long.stages=[{seq_len=16, tokens=10, rope_base=50000.0}]";
    EXPECT_EQ(curriculum_job(dir, "abf", {abf}).long_ctx.stages[0].rope_base, 50000.0);
    try {
        curriculum_job(dir, "bad", {"model.layer_pattern=\"K\"", abf});
        ADD_FAILURE() << "expected exit 2 for a RoPE base without RoPE layers";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::usage) << e.what();
        EXPECT_NE(std::string(e.what()).find("long.stages[0].rope_base"), std::string::npos) << e.what();
    }
}

// Validation data too short for a later stage's rows is exit 3 naming its file when the trainer is built, not at
// that stage's switch.
TEST(CurriculumTrainer, ValidationTooShortForALaterStageFailsAtTheStart) {
    const std::string dir = fresh_dir("short_val");
    const JobConfig cfg = curriculum_job(dir, "run");  // stages of 16 and 32 tokens
    data::llmc_write_shard(dir + "/short_val.bin", std::vector<int32_t>(20, 1), 61);
    JobConfig short_val = cfg;
    short_val.data.val_paths = {dir + "/short_val.bin"};
    try {
        Trainer trainer(short_val, false);
        ADD_FAILURE() << "expected exit 3 for validation data shorter than stage 1's rows";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::data) << e.what();
        EXPECT_NE(std::string(e.what()).find("short_val.bin"), std::string::npos) << e.what();
    }
}

// A stage's rope_base rotates the attention layers from its first step on (ABF); a stage without one goes back to
// model.rope_theta.
TEST(CurriculumTrainer, StageRopeBaseReachesTheModel) {
    const std::string dir = fresh_dir("abf");
    Trainer trainer(curriculum_job(dir,
                                   "run",
                                   {"long.stages=[{seq_len=16, tokens=384, long_fraction=0.25}, "
                                    "{seq_len=32, tokens=100000, long_fraction=0.5, rope_base=500000.0}]"}),
                    false);
    const double theta = trainer.config().model.rope_theta;
    for (int64_t s = 0; s < 5; ++s) {
        trainer.train_step();
        EXPECT_EQ(trainer.model().config().rope_theta, s < 3 ? theta : 500000.0) << "step " << s;
    }
}

// The stage follows the tokens: 3 steps at 16, then 32; every step's batch is the stage's length; tokens_seen adds
// each step at its own length.
TEST(CurriculumTrainer, SwitchesStageAtTheConfiguredTokens) {
    const std::string dir = fresh_dir("switch");
    Trainer trainer(curriculum_job(dir, "run"), false);
    EXPECT_EQ(trainer.rows_per_step(), 8);
    for (int64_t s = 0; s < 5; ++s) {
        const int64_t stage = s < 3 ? 0 : 1, seq = s < 3 ? 16 : 32;
        const StepResult r = trainer.train_step();
        EXPECT_TRUE(std::isfinite(r.loss));
        EXPECT_EQ(trainer.stage(), stage) << "step " << s;
        EXPECT_EQ(trainer.seq_len(), seq) << "step " << s;
    }
    EXPECT_EQ(trainer.tokens_seen(5), 3 * 8 * 16 + 2 * 8 * 32);
    EXPECT_EQ(trainer.tokens_seen(3), 384);
}

// long.tokens_per_gpu raises the segments per stage: 4 rows of 64 tokens (256 per pass) run in one pass, 4 rows of 128
// as 2 segments of 64 (the largest multiple of 64 whose 4 rows hold at most 256 tokens), with the losses of the run
// that holds each stage in one pass (segments are exact); the stage event names the stage's segments.
TEST(CurriculumTrainer, TokensPerGpuRaisesTheSegmentsPerStage) {
    const std::string dir = fresh_dir("tokens_per_gpu");
    auto job = [&](const std::string& run, std::vector<std::string> extra) {
        extra.insert(
            extra.end(),
            {"model.max_seq_len=128", "long.stages=[{seq_len=64, tokens=1024}, {seq_len=128, tokens=100000}]"});
        return curriculum_job(dir, run, extra);
    };
    const JobConfig cfg = job("segmented", {"long.tokens_per_gpu=256"});
    EXPECT_FALSE(config_segments_for_length(cfg, 64).enabled());
    EXPECT_EQ(config_segments_for_length(cfg, 128).tokens, 64);
    EXPECT_EQ(config_segments_for_length(cfg, 1024).tokens, 64);
    Trainer segmented(cfg, false), whole(job("whole", {}), false);
    for (int64_t s = 0; s < 4; ++s) {  // 2 steps of 4 x 2 rows of 64 tokens, then 128
        const double a = segmented.train_step().loss, b = whole.train_step().loss;
        EXPECT_EQ(segmented.model().segment_bounds().size(), s < 2 ? 2u : 3u) << "step " << s;
        EXPECT_EQ(whole.model().segment_bounds().size(), 2u) << "step " << s;
        EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << "step " << s;
    }
    // Explicit segments win over the target.
    EXPECT_EQ(config_segments_for_length(job("explicit", {"long.tokens_per_gpu=256", "long.segments=4"}), 128).count,
              4);
}

std::vector<double> losses(Trainer& t, int64_t until) {
    std::vector<double> out;
    while (t.step() < until) out.push_back(t.train_step().loss);
    return out;
}

// Straight 6 steps against 2, a checkpoint mid-stage 0, a step past it (discarded), resume, 4 more (through the
// switch at step 3): bitwise equal losses. The manifest records the stage and its tokens.
TEST(CurriculumTrainer, ResumeMidStageIsBitIdentical) {
    const std::string dir = fresh_dir("resume");
    std::vector<double> straight, resumed;
    {
        Trainer t(curriculum_job(dir, "straight"), false);
        straight = losses(t, 6);
    }
    std::string ckpt;
    {
        Trainer t(curriculum_job(dir, "split"), false);
        resumed = losses(t, 2);
        t.save_checkpoint();
        t.train_step();
    }
    {
        std::ifstream in(dir + "/split/checkpoints/step_00000002/manifest.json");
        const auto m = nlohmann::json::parse(in);
        EXPECT_EQ(m.at("data").at("stage"), 0);
        EXPECT_EQ(m.at("data").at("stage_step"), 2);
        EXPECT_EQ(m.at("data").at("stage_tokens"), 2 * 8 * 16);
        EXPECT_EQ(m.at("tokens_seen"), 2 * 8 * 16);
    }
    {
        Trainer t(curriculum_job(dir, "split"), false);
        ASSERT_TRUE(t.resume_latest());
        EXPECT_EQ(t.step(), 2);
        const auto rest = losses(t, 6);
        resumed.insert(resumed.end(), rest.begin(), rest.end());
        EXPECT_EQ(t.stage(), 1);
    }
    ASSERT_EQ(straight.size(), resumed.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
    // A schedule that puts step 2 elsewhere (stage 0 of 1 step) is refused rather than resumed at the wrong place.
    Trainer other(curriculum_job(dir,
                                 "split",
                                 {"long.stages=[{seq_len=16, tokens=128, long_fraction=0.25}, "
                                  "{seq_len=32, tokens=100000, long_fraction=0.5}]"}),
                  false);
    try {
        other.resume_latest();
        ADD_FAILURE() << "expected exit 4";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::checkpoint) << e.what();
        EXPECT_NE(std::string(e.what()).find("curriculum stage 0"), std::string::npos) << e.what();
    }
}

// The passkey prompt: seq_len + 1 tokens ending with the key, the key sentence after the introduction at depth 0, after
// the last whole filler sentence at depth 1, and never earlier at a greater depth.
TEST(Passkey, PromptHoldsTheKeyAtItsDepthAndEndsWithIt) {
    const data::ByteTokenizer bytes;
    const size_t intro = std::string("A pass key is hidden in the text below. Remember it.\n").size();
    const size_t filler =
        std::string("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n")
            .size();
    for (const int64_t seq : {256, 1000}) {
        size_t last = 0;
        for (int d = 0; d < kPasskeyDepths; ++d) {
            const PasskeyPrompt p = passkey_prompt(bytes, seq, 9, 1, d);
            ASSERT_EQ(static_cast<int64_t>(p.tokens.size()), seq + 1);
            ASSERT_EQ(p.key.size(), 5u);
            EXPECT_EQ(p.key_tokens, 5);
            const std::string text = bytes.decode(p.tokens);
            EXPECT_EQ(text.substr(text.size() - 5), p.key);
            const std::string needle = "The pass key is " + p.key + ". Remember it. " + p.key + " is the pass key.\n";
            const size_t at = text.find(needle);
            ASSERT_NE(at, std::string::npos);
            EXPECT_GE(at, last) << "seq " << seq << " depth " << d;
            last = at;
            const size_t tail = needle.size() + std::string("What is the pass key? The pass key is ").size() + 5;
            if (d == 0) {
                EXPECT_EQ(at, intro);
            }
            if (d == kPasskeyDepths - 1) {
                EXPECT_GT(at + tail + filler, text.size());
                EXPECT_LE(at + tail, text.size());
            }
        }
    }
    EXPECT_TRUE(passkey_prompt(bytes, 100, 9, 1, 0).tokens.empty()) << "too short for the prompt";
    EXPECT_NE(passkey_prompt(bytes, 256, 9, 1, 0).key, passkey_prompt(bytes, 256, 9, 2, 0).key);
}

// The KDA final states behind long/kda_state_rms: one per KDA layer (block index), [B, HV, K, V], the state after the
// last forward's rows: a second trainer's forward over the same batch with the same (not yet updated) weights gives it
// again, another batch another.
TEST(CurriculumTrainer, KdaFinalStatesAreThoseOfTheLastForward) {
    const std::string dir = fresh_dir("kda");
    const std::vector<std::string> o = {"model.layer_pattern=\"KKA\"", "model.n_layers=3", "train.grad_accum=1"};
    Trainer t(tiny_job(dir, o), false);
    EXPECT_TRUE(t.model().kda_final_states().empty()) << "no forward yet";
    t.train_step();
    const auto states = t.model().kda_final_states();
    ASSERT_EQ(states.size(), 2u);
    EXPECT_EQ(states[0].first, 0);
    EXPECT_EQ(states[1].first, 1);
    const auto& m = t.config().model;
    EXPECT_EQ(states[0].second.shape(), (core::Shape{4, m.kda_num_v_heads(), m.kda_head_dim(), m.kda_head_v_dim()}));
    const double sq = ops::global_norm_sq(states[1].second);
    EXPECT_GT(sq, 0.0);
    Trainer fresh(tiny_job(dir, o), false);
    core::Tensor in = core::Tensor::zeros({4, 16}, core::DType::i32),
                 tg = core::Tensor::zeros({4, 16}, core::DType::i32);
    fresh.fill_batch(0, 0, in, tg);
    fresh.model().forward(in, tg, false);
    EXPECT_NEAR(ops::global_norm_sq(fresh.model().kda_final_states()[1].second), sq, 1e-9 * sq);
    fresh.fill_batch(5, 0, in, tg);
    fresh.model().forward(in, tg, false);
    EXPECT_GT(std::abs(ops::global_norm_sq(fresh.model().kda_final_states()[1].second) - sq), 1e-6 * sq);
}

TEST(ShippedConfigs, TinyCurriculumParsesAsDescribed) {
    const auto cfg = config_load(std::string(MT_SOURCE_DIR) + "/configs/tiny_curriculum.toml");
    const auto& s = cfg.long_ctx.stages;
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0].seq_len, 128);
    EXPECT_LT(s[0].long_fraction, 0.0) << "stage 0 is the natural mix";
    EXPECT_EQ(s[2].seq_len, cfg.model.max_seq_len);
    EXPECT_EQ(s[1].long_fraction, 0.25);
    EXPECT_EQ(cfg.model.layer_pattern, "KKKA");
    // 20 steps per stage at 8 rows.
    for (const auto& st : s) EXPECT_EQ(st.tokens, 20 * cfg.train.batch_size * st.seq_len);
}

}  // namespace
}  // namespace mt::train
