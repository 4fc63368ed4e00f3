// Tests for checkpoint directories: write/open round trip, DONE handling, size and CRC checks, retention, region
// assembly and model-signature fit checks.
#include "train/checkpoint_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "core/crc32c.h"
#include "core/file_util.h"

using namespace mt;
using core::DType;
using core::ExitCode;
using core::Tensor;
using train::CheckpointTensor;
using train::TensorSpec;
namespace fs = std::filesystem;

namespace {

class CheckpointIo : public ::testing::Test {
   protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        root_ = (fs::temp_directory_path() / fmt::format("mt_ckpt_{}_{}", ::getpid(), info->name())).string();
        fs::remove_all(root_);
    }
    void TearDown() override {
        fs::remove_all(root_);
    }
    std::string step_dir(int64_t step) const {
        return (fs::path(root_) / train::checkpoint_dir_name(step)).string();
    }
    // A small model state: two params with AdamW moments.
    std::vector<CheckpointTensor> state(double shift = 0.0) const {
        std::vector<CheckpointTensor> out;
        for (const auto& [name, shape] :
             std::vector<std::pair<std::string, core::Shape>>{{"embed.weight", {5, 4}}, {"norm.weight", {4}}}) {
            for (const char* kind : {"param", "adamw.m", "adamw.v"}) {
                Tensor t = Tensor::zeros(shape, DType::f32);
                for (int64_t i = 0; i < t.numel(); ++i) core::tensor_set_flat(t, i, shift + i * 0.5 + kind[0]);
                out.push_back({name, kind, t});
            }
        }
        return out;
    }
    std::string write(int64_t step, const train::RetentionPolicy& keep = {}) {
        return train::checkpoint_write(root_, step, state(static_cast<double>(step)), extra_, keep);
    }
    std::string root_;
    nlohmann::json extra_ = {
        {"config_toml", "[model]\ndim = 4\n"}, {"tokens_seen", 1024}, {"rng", {{"seed", 7}, {"step", 3}}}};
};

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
    try {
        fn();
        ADD_FAILURE() << "no error thrown";
    } catch (const core::Error& e) {
        EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(ExitCode::checkpoint)) << e.what();
        for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

std::vector<std::string> dir_names(const std::string& root) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

TEST_F(CheckpointIo, DirName) {
    EXPECT_EQ(train::checkpoint_dir_name(1000), "step_00001000");
    EXPECT_EQ(train::checkpoint_dir_name(0), "step_00000000");
}

TEST_F(CheckpointIo, WriteOpenRoundTrip) {
    const std::string dir = write(10);
    EXPECT_EQ(dir, step_dir(10));
    EXPECT_EQ(core::read_file(dir + "/DONE"), "step=10\n");
    EXPECT_EQ(dir_names(dir), (std::vector<std::string>{"DONE", "manifest.json", "rank_00000.safetensors"}));
    EXPECT_EQ(dir_names(root_), (std::vector<std::string>{"step_00000010"}));

    const auto ck = train::checkpoint_open(dir, true);
    const auto& m = ck.manifest();
    EXPECT_EQ(m["format"], "moetrain-checkpoint");
    EXPECT_EQ(m["version"], 1);
    EXPECT_EQ(m["step"], 10);
    EXPECT_EQ(ck.step(), 10);
    EXPECT_EQ(m["moetrain_version"], MT_VERSION);
    EXPECT_TRUE(m["created_unix"].is_number_float());
    EXPECT_EQ(m["config_toml"], "[model]\ndim = 4\n");
    EXPECT_EQ(m["tokens_seen"], 1024);
    EXPECT_EQ(m["rng"]["seed"], 7);
    ASSERT_EQ(m["files"].size(), 1u);
    EXPECT_EQ(m["files"][0]["name"], "rank_00000.safetensors");
    EXPECT_EQ(m["files"][0]["bytes"], core::file_size(dir + "/rank_00000.safetensors"));
    EXPECT_EQ(m["files"][0]["crc32c"], core::crc32c_hex(core::file_crc32c(dir + "/rank_00000.safetensors")));
    ASSERT_EQ(m["tensors"].size(), 6u);
    const auto& t0 = m["tensors"][0];
    EXPECT_EQ(t0["name"], "embed.weight");
    EXPECT_EQ(t0["kind"], "param");
    EXPECT_EQ(t0["dtype"], "F32");
    EXPECT_EQ(t0["global_shape"], nlohmann::json({5, 4}));
    EXPECT_EQ(t0["key"], "param/embed.weight");
    EXPECT_EQ(t0["offset"], nlohmann::json({0, 0}));
    EXPECT_EQ(t0["shape"], nlohmann::json({5, 4}));
    const train::SafetensorsFile shard(dir + "/rank_00000.safetensors");
    EXPECT_EQ(shard.metadata(), (std::map<std::string, std::string>{{"format", "moetrain-shard"}, {"version", "1"}}));

    for (const auto& t : state(10.0)) {
        const Tensor dst = Tensor::zeros(t.tensor.shape(), DType::f32);
        ck.read_into(t.kind, t.name, dst);
        for (int64_t i = 0; i < dst.numel(); ++i)
            EXPECT_EQ(core::tensor_get_flat(dst, i), core::tensor_get_flat(t.tensor, i));
    }
    EXPECT_EQ(ck.names("adamw.v"), (std::vector<std::string>{"embed.weight", "norm.weight"}));
    expect_error([&] { ck.read_into("param", "missing.weight", Tensor::zeros({4}, DType::f32)); },
                 {"missing.weight", dir});
    expect_error(
        [&] {
            ck.read_into("adamw.m", "embed.weight", Tensor::zeros({4, 5}, DType::f32));
        },
        {"embed.weight", "[5, 4]", "[4, 5]", dir});
}

TEST_F(CheckpointIo, RewritingAStepReplacesIt) {
    write(5);
    const std::string dir = train::checkpoint_write(root_, 5, state(99.0), extra_, {});
    EXPECT_EQ(dir_names(root_), (std::vector<std::string>{"step_00000005"}));
    const auto ck = train::checkpoint_open(dir, true);
    EXPECT_EQ(ck.read("param", "norm.weight").at({0}), 99.0 + 'p');
}

TEST_F(CheckpointIo, FindLatestSkipsIncompleteAndTmp) {
    EXPECT_FALSE(train::checkpoint_find_latest(root_).has_value());
    write(10);
    write(20);
    // A half-written step 30 (no DONE), a leftover 40.tmp with DONE inside, and unrelated names.
    fs::copy(step_dir(20), step_dir(30));
    fs::remove(step_dir(30) + "/DONE");
    fs::copy(step_dir(20), step_dir(40) + ".tmp");
    fs::create_directories(root_ + "/step_50");
    fs::create_directories(root_ + "/notes");
    EXPECT_EQ(train::checkpoint_find_latest(root_).value(), step_dir(20));
    expect_error([&] { train::checkpoint_open(step_dir(30), false); },
                 {"no DONE marker: the checkpoint is incomplete", step_dir(30)});
}

TEST_F(CheckpointIo, TruncatedRankFileFailsTheSizeCheck) {
    const std::string dir = write(3);
    const std::string rank = dir + "/rank_00000.safetensors";
    fs::resize_file(rank, core::file_size(rank) - 4);
    expect_error([&] { train::checkpoint_open(dir, false); }, {rank, "truncated"});
}

TEST_F(CheckpointIo, CrcMismatchIsFoundWithVerify) {
    const std::string dir = write(3);
    const std::string rank = dir + "/rank_00000.safetensors";
    std::string bytes = core::read_file(rank);
    bytes[bytes.size() - 2] ^= 0x40;  // inside the last tensor's data; the size stays
    core::write_file_atomic(rank, bytes);
    EXPECT_NO_THROW(train::checkpoint_open(dir, false));
    expect_error([&] { train::checkpoint_open(dir, true); }, {rank, "CRC-32C"});
}

TEST_F(CheckpointIo, BadManifestNamesTheFile) {
    const std::string dir = write(3);
    const std::string manifest = dir + "/manifest.json";
    const std::string good = core::read_file(manifest);
    core::write_file_atomic(manifest, std::string("{\"format\": "));
    expect_error([&] { train::checkpoint_open(dir, false); }, {manifest, "JSON"});
    for (const char* field : {"files", "tensors", "step", "format"}) {
        auto m = nlohmann::json::parse(good);
        m.erase(field);
        core::write_file_atomic(manifest, m.dump());
        expect_error([&] { train::checkpoint_open(dir, false); }, {manifest, field});
    }
    auto m = nlohmann::json::parse(good);
    m["version"] = 2;
    core::write_file_atomic(manifest, m.dump());
    expect_error([&] { train::checkpoint_open(dir, false); }, {manifest, "version"});
    m = nlohmann::json::parse(good);
    m["tensors"][1]["shape"] = {4, 5};
    core::write_file_atomic(manifest, m.dump());
    expect_error([&] { train::checkpoint_open(dir, false); }, {"embed.weight", dir});
    m = nlohmann::json::parse(good);
    m["files"][0]["name"] = "../rank_00000.safetensors";
    core::write_file_atomic(manifest, m.dump());
    expect_error([&] { train::checkpoint_open(dir, false); }, {manifest, "files[0].name"});
}

TEST_F(CheckpointIo, RetentionKeepsLastAndMultiples) {
    for (int s = 1; s <= 6; ++s) write(s, {.keep_last = 3, .keep_every = 0});
    EXPECT_EQ(dir_names(root_), (std::vector<std::string>{"step_00000004", "step_00000005", "step_00000006"}));
    fs::remove_all(root_);
    for (int s = 1; s <= 7; ++s) write(s, {.keep_last = 2, .keep_every = 3});
    EXPECT_EQ(dir_names(root_), (std::vector<std::string>{"step_00000003", "step_00000006", "step_00000007"}));
    fs::remove_all(root_);
    for (int s = 1; s <= 4; ++s) write(s, {.keep_last = 0, .keep_every = 0});
    EXPECT_EQ(dir_names(root_).size(), 4u);
}

TEST_F(CheckpointIo, RetentionLeavesNewerStepsAndCleansLeftovers) {
    for (int s : {10, 20, 30}) write(s, {.keep_last = 0});
    fs::create_directories(step_dir(12) + ".tmp");  // an interrupted write
    fs::create_directories(step_dir(13));           // a half-written checkpoint
    // Resuming from an older step: step 11 is written while 20 and 30 exist; only steps <= 11 are candidates.
    write(11, {.keep_last = 1});
    EXPECT_EQ(dir_names(root_),
              (std::vector<std::string>{
                  "step_00000011", "step_00000012.tmp", "step_00000013", "step_00000020", "step_00000030"}));
    write(14, {.keep_last = 1});
    EXPECT_EQ(dir_names(root_), (std::vector<std::string>{"step_00000014", "step_00000020", "step_00000030"}));
}

TEST_F(CheckpointIo, AssemblesBoxAndFlatRegions) {
    // A checkpoint written by a 2-way sharded run: a [4, 3] param as two row boxes, its adamw.m as two flat ranges,
    // its adamw.v as two column boxes (not runs of the flattened tensor).
    const std::string dir = step_dir(7);
    fs::create_directories(dir);
    Tensor full = Tensor::zeros({4, 3}, DType::f32);
    for (int64_t i = 0; i < 12; ++i) core::tensor_set_flat(full, i, i + 1.0);
    const Tensor flat = full.reshape({12});
    const auto r0 = train::safetensors_write(
        dir + "/rank_00000.safetensors",
        {{"param/w", full.slice(0, 0, 1)}, {"adamw.m/w", flat.slice(0, 0, 5)}, {"adamw.v/w", full.slice(1, 0, 1)}},
        {});
    const auto r1 = train::safetensors_write(
        dir + "/rank_00001.safetensors",
        {{"param/w", full.slice(0, 1, 4)}, {"adamw.m/w", flat.slice(0, 5, 12)}, {"adamw.v/w", full.slice(1, 1, 3)}},
        {});
    nlohmann::json m = {
        {"format", "moetrain-checkpoint"},
        {"version", 1},
        {"step", 7},
        {"files",
         {{{"name", "rank_00000.safetensors"}, {"bytes", r0.bytes}, {"crc32c", core::crc32c_hex(r0.crc32c)}},
          {{"name", "rank_00001.safetensors"}, {"bytes", r1.bytes}, {"crc32c", core::crc32c_hex(r1.crc32c)}}}},
        {"tensors",
         {{{"name", "w"},
           {"kind", "param"},
           {"dtype", "F32"},
           {"global_shape", {4, 3}},
           {"file", "rank_00000.safetensors"},
           {"key", "param/w"},
           {"offset", {0, 0}},
           {"shape", {1, 3}}},
          {{"name", "w"},
           {"kind", "param"},
           {"dtype", "F32"},
           {"global_shape", {4, 3}},
           {"file", "rank_00001.safetensors"},
           {"key", "param/w"},
           {"offset", {1, 0}},
           {"shape", {3, 3}}},
          {{"name", "w"},
           {"kind", "adamw.m"},
           {"dtype", "F32"},
           {"global_shape", {4, 3}},
           {"file", "rank_00000.safetensors"},
           {"key", "adamw.m/w"},
           {"flat_range", {0, 5}}},
          {{"name", "w"},
           {"kind", "adamw.m"},
           {"dtype", "F32"},
           {"global_shape", {4, 3}},
           {"file", "rank_00001.safetensors"},
           {"key", "adamw.m/w"},
           {"flat_range", {5, 12}}},
          {{"name", "w"},
           {"kind", "adamw.v"},
           {"dtype", "F32"},
           {"global_shape", {4, 3}},
           {"file", "rank_00000.safetensors"},
           {"key", "adamw.v/w"},
           {"offset", {0, 0}},
           {"shape", {4, 1}}},
          {{"name", "w"},
           {"kind", "adamw.v"},
           {"dtype", "F32"},
           {"global_shape", {4, 3}},
           {"file", "rank_00001.safetensors"},
           {"key", "adamw.v/w"},
           {"offset", {0, 1}},
           {"shape", {4, 2}}}}}};
    core::write_file_atomic(dir + "/manifest.json", m.dump());
    core::write_file_atomic(dir + "/DONE", std::string("step=7\n"));
    const auto ck = train::checkpoint_open(dir, true);
    for (const char* kind : {"param", "adamw.m", "adamw.v"}) {
        // read_flat: any range of the flattened tensor, across region boundaries, converting f32 -> f64.
        for (const auto& [begin, n] :
             std::vector<std::pair<int64_t, int64_t>>{{0, 12}, {0, 3}, {2, 5}, {4, 8}, {11, 1}}) {
            const Tensor part = Tensor::zeros({n}, DType::f64);
            ck.read_flat(kind, "w", begin, part);
            for (int64_t i = 0; i < n; ++i) EXPECT_EQ(core::tensor_get_flat(part, i), begin + i + 1.0) << kind;
        }
        const Tensor dst = Tensor::zeros({4, 3}, DType::f64);
        ck.read_into(kind, "w", dst);
        for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(core::tensor_get_flat(dst, i), i + 1.0) << kind;
        const Tensor wide = Tensor::zeros({4, 5}, DType::f32);  // a strided destination
        ck.read_into(kind, "w", wide.slice(1, 1, 4));
        EXPECT_EQ(wide.at({3, 3}), 12.0);
        EXPECT_EQ(wide.at({3, 4}), 0.0);
    }
}

TEST_F(CheckpointIo, ModelSignatureIsOrderIndependent) {
    const std::vector<TensorSpec> a = {{"b", {2, 3}, DType::f32}, {"a", {4}, DType::bf16}};
    const std::vector<TensorSpec> b = {{"a", {4}, DType::bf16}, {"b", {2, 3}, DType::f32}};
    EXPECT_EQ(train::model_signature(a), train::model_signature(b));
    EXPECT_EQ(train::model_signature(a).size(), 64u);
    EXPECT_EQ(train::model_signature(b), core::sha256_hex("a\t[4]\tBF16\nb\t[2, 3]\tF32\n"));
    EXPECT_NE(train::model_signature(a), train::model_signature({{"b", {3, 2}, DType::f32}, {"a", {4}, DType::bf16}}));
}

TEST_F(CheckpointIo, CheckFitsNamesTheFirstDifferingTensor) {
    const std::vector<TensorSpec> model = {{"embed.weight", {5, 4}, DType::f32}, {"norm.weight", {4}, DType::f32}};
    extra_["model_signature"] = train::model_signature(model);
    const std::string dir = write(10);
    const auto ck = train::checkpoint_open(dir, false);
    EXPECT_NO_THROW(train::checkpoint_check_fits(ck.manifest(), model, dir));

    const auto fails_with = [&](const std::vector<TensorSpec>& other, const std::string& message) {
        try {
            train::checkpoint_check_fits(ck.manifest(), other, dir);
            ADD_FAILURE() << "fits: " << message;
        } catch (const core::Error& e) {
            EXPECT_EQ(static_cast<int>(e.code()), 4);
            EXPECT_EQ(std::string(e.what()), "checkpoint does not fit the model: " + message + " [" + dir + "]");
            EXPECT_FALSE(e.hint().empty());
        }
    };
    fails_with({{"embed.weight", {6, 4}, DType::f32}, {"norm.weight", {8}, DType::f32}},
               "tensor embed.weight has shape [5, 4] in the checkpoint but [6, 4] in the model");
    fails_with({{"embed.weight", {5, 4}, DType::f32}, {"norm.weight", {4}, DType::bf16}},
               "tensor norm.weight has dtype F32 in the checkpoint but BF16 in the model");
    fails_with(
        {{"embed.weight", {5, 4}, DType::f32}, {"head.weight", {4}, DType::f32}, {"norm.weight", {4}, DType::f32}},
        "tensor head.weight is missing from the checkpoint");
    fails_with({{"norm.weight", {4}, DType::f32}}, "the checkpoint has tensor embed.weight, which the model does not");
}
