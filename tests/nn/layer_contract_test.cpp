// The layers' constructors check their contract alike: the same kind of mistake (a head or expert count that does
// not fit its partner) ends with the same exit code in the KDA and the MoE layer, 1 (MT_CHECK: a caller's bug),
// naming the key; the config parser rejects the same settings first, with exit 2 (usage), naming the key and the
// file.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "nn/layers/kda_layer.h"
#include "nn/layers/moe_layer.h"
#include "train/config.h"

namespace mt::nn {
namespace {

// The exit code and message of f's Error; fails the test when f returns.
template <typename F>
std::pair<core::ExitCode, std::string> error_of(F&& f) {
    try {
        f();
    } catch (const core::Error& e) {
        return {e.code(), e.what()};
    }
    ADD_FAILURE() << "expected an error";
    return {core::ExitCode::ok, ""};
}

ModelConfig small_model() {
    ModelConfig c;
    c.d_model = 8;
    c.n_layers = 2;
    c.n_heads = 2;
    return c;
}

TEST(LayerContract, KdaAndMoeFailAlikeForACountThatDoesNotFit) {
    ModelConfig kda = small_model();
    kda.kda.num_heads = 4;
    kda.kda.num_v_heads = 6;  // not a multiple of the q/k heads
    MoeConfig moe;
    moe.num_experts = 4;
    moe.top_k = 6;  // more experts per token than there are
    ParamTable a, b;
    const auto [kda_code, kda_message] = error_of([&] { KdaLayer layer(a, "layers.0.kda", kda); });
    const auto [moe_code, moe_message] = error_of([&] { MoeLayer layer(b, "layers.1.moe", small_model(), moe); });
    EXPECT_EQ(kda_code, core::ExitCode::internal) << kda_message;
    EXPECT_EQ(moe_code, kda_code) << moe_message;
    EXPECT_NE(kda_message.find("layers.0.kda: kda.num_v_heads = 6"), std::string::npos) << kda_message;
    EXPECT_NE(moe_message.find("layers.1.moe: moe.top_k = 6"), std::string::npos) << moe_message;
}

TEST(LayerContract, TheConfigParserRejectsTheSameMistakesFirstWithTheUsageCode) {
    const std::string job = "[data]\npaths = [\"a.bin\"]\n";
    const auto [kda_code, kda_message] = error_of([&] {
        train::config_parse(job, "job.toml", {"model.layer_pattern=\"KA\"", "kda.num_heads=4", "kda.num_v_heads=6"});
    });
    const auto [moe_code, moe_message] = error_of([&] {
        train::config_parse(job, "job.toml", {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=6"});
    });
    EXPECT_EQ(kda_code, core::ExitCode::usage) << kda_message;
    EXPECT_EQ(moe_code, core::ExitCode::usage) << moe_message;
    EXPECT_NE(kda_message.find("kda.num_v_heads = 6"), std::string::npos) << kda_message;
    EXPECT_NE(moe_message.find("moe.top_k = 6"), std::string::npos) << moe_message;
    EXPECT_NE(kda_message.find("job.toml"), std::string::npos) << kda_message;
    EXPECT_NE(moe_message.find("job.toml"), std::string::npos) << moe_message;
}

}  // namespace
}  // namespace mt::nn
