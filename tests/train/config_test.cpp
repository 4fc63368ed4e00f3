// Job config: parsing, overrides, and every kind of bad input naming the file and field.
#include "train/config.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "train/config_drift.h"
#include "train/config_schema.h"

using mt::core::Error;
using mt::core::ExitCode;
using mt::nn::AttnResMode;
using mt::nn::KdaSave;
using mt::nn::MoeBalanceMode;
using mt::train::config_load;
using mt::train::config_parse;
using mt::train::JobConfig;

namespace {

const char* kGood = R"(
[model]
d_model = 64
n_heads = 4
n_kv_heads = 2
[data]
paths = ["a.bin"]
[train]
lr = 1e-3
seq_len = 32
)";

// Runs f, expects an Error with the given code whose message contains every needle.
template <typename F>
void expect_error(F&& f, ExitCode code, std::initializer_list<const char*> needles) {
    try {
        f();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(Config, ParsesAndOverrides) {
    auto c = config_parse(kGood, "job.toml", {"train.steps=7", "run.name=abc", "data.val_paths=[\"v.bin\"]"});
    EXPECT_EQ(c.model.d_model, 64);
    EXPECT_EQ(c.model.n_kv_heads, 2);
    EXPECT_EQ(c.train.lr, 1e-3);
    EXPECT_EQ(c.train.steps, 7);
    EXPECT_EQ(c.run.name, "abc");
    ASSERT_EQ(c.data.val_paths.size(), 1u);
    // The resolved TOML parses back to the same config.
    auto again = config_parse(c.to_toml(), "resolved");
    EXPECT_EQ(again.to_toml(), c.to_toml());
    EXPECT_EQ(again.train.steps, 7);
}

TEST(Config, IntegerAcceptedWhereNumberExpected) {
    auto c = config_parse(kGood, "job.toml", {"train.lr=1"});
    EXPECT_EQ(c.train.lr, 1.0);
}

TEST(Config, MalformedTomlNamesFileAndLine) {
    expect_error([] { config_parse("[model]\nd_model = = 3\n", "bad.toml"); },
                 ExitCode::usage,
                 {"malformed TOML", "line 2", "bad.toml"});
}

TEST(Config, UnknownKeySuggestsTheRightOne) {
    try {
        config_parse(std::string(kGood) + "stpes = 3\n", "job.toml");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("train.stpes"), std::string::npos);
        EXPECT_NE(e.hint().find("train.steps"), std::string::npos);
    }
    expect_error([] { config_parse(kGood, "job.toml", {"modle.d_model=3"}); }, ExitCode::usage, {"modle.d_model"});
}

TEST(Config, WrongTypeNamesField) {
    expect_error([] { config_parse(kGood, "job.toml", {"train.steps=\"ten\""}); },
                 ExitCode::usage,
                 {"train.steps", "integer", "job.toml"});
    expect_error(
        [] { config_parse(kGood, "job.toml", {"model.tie_embeddings=3"}); }, ExitCode::usage, {"model.tie_embeddings"});
    expect_error([] { config_parse(kGood, "job.toml", {"data.paths=3"}); }, ExitCode::usage, {"data.paths"});
}

TEST(Config, OutOfRangeNamesField) {
    expect_error(
        [] { config_parse(kGood, "job.toml", {"train.lr=-0.1"}); }, ExitCode::usage, {"train.lr", "out of range"});
    expect_error(
        [] { config_parse(kGood, "job.toml", {"train.batch_size=0"}); }, ExitCode::usage, {"train.batch_size"});
    expect_error([] { config_parse(kGood, "job.toml", {"train.schedule=\"linear\""}); },
                 ExitCode::usage,
                 {"train.schedule", "cosine"});
    expect_error([] { config_parse(kGood, "job.toml", {"model.n_kv_heads=3"}); }, ExitCode::usage, {"n_kv_heads"});
    expect_error([] { config_parse(kGood, "job.toml", {"train.seq_len=100000"}); }, ExitCode::usage, {"max_seq_len"});
}

TEST(Config, MissingFileIsNamed) {
    expect_error([] { config_load("/nonexistent/job.toml"); }, ExitCode::usage, {"/nonexistent/job.toml"});
}

TEST(Config, MalformedOverride) {
    expect_error([] { config_parse(kGood, "job.toml", {"steps"}); }, ExitCode::usage, {"steps"});
}

TEST(Config, LayerPatternAndKdaKeys) {
    auto dense = config_parse(kGood, "job.toml");
    EXPECT_EQ(dense.model.layer_pattern, "A");
    EXPECT_TRUE(dense.model.attn_rope());  // the all-attention model keeps RoPE
    EXPECT_EQ(dense.model.n_kda_layers(), 0);
    auto c = config_parse(kGood,
                          "job.toml",
                          {"model.n_layers=8",
                           "model.layer_pattern=\"KKKA\"",
                           "kda.num_v_heads=8",
                           "kda.head_dim=32",
                           "kda.gate=\"softplus\"",
                           "kda.gate_lower_bound=-2.5",
                           "kda.chunk_size=32",
                           "kda.save=\"states\""});
    EXPECT_EQ(c.model.n_kda_layers(), 6);
    EXPECT_TRUE(c.model.layer_is_kda(0));
    EXPECT_FALSE(c.model.layer_is_kda(3));
    EXPECT_FALSE(c.model.layer_is_kda(7));
    EXPECT_FALSE(c.model.attn_rope());  // hybrid: NoPE attention by default
    EXPECT_EQ(c.model.kda_num_heads(), 4);
    EXPECT_EQ(c.model.kda_num_v_heads(), 8);
    EXPECT_EQ(c.model.kda_head_v_dim(), 32);
    EXPECT_EQ(c.model.kda.gate, mt::ops::KdaGateKind::softplus);
    EXPECT_EQ(c.model.kda.gate_lower_bound, -2.5);
    EXPECT_EQ(dense.model.kda.save, KdaSave::none);  // the KDA op keeps nothing for the backward by default
    EXPECT_EQ(c.model.kda.save, KdaSave::states);
    EXPECT_TRUE(
        config_parse(kGood, "job.toml", {"model.layer_pattern=\"KA\"", "model.attn_pos=\"rope\""}).model.attn_rope());
    EXPECT_FALSE(config_parse(kGood, "job.toml", {"model.attn_pos=\"nope\""}).model.attn_rope());
    // The [kda] section round-trips through the resolved TOML.
    auto again = config_parse(c.to_toml(), "resolved");
    EXPECT_EQ(again.to_toml(), c.to_toml());
    EXPECT_EQ(again.model.layer_pattern, "KKKA");
    EXPECT_EQ(again.model.kda.chunk_size, 32);
    EXPECT_EQ(again.model.kda.save, KdaSave::states);
}

TEST(Config, LayerPatternAndKdaErrorsNameTheKey) {
    expect_error([] { config_parse(kGood, "job.toml", {"model.layer_pattern=\"KXA\""}); },
                 ExitCode::usage,
                 {"model.layer_pattern", "KXA", "job.toml"});
    expect_error([] { config_parse(kGood, "job.toml", {"model.layer_pattern=\"\""}); },
                 ExitCode::usage,
                 {"model.layer_pattern"});
    expect_error([] { config_parse(kGood, "job.toml", {"model.layer_pattern=\"KKA\""}); },
                 ExitCode::usage,
                 {"model.layer_pattern", "does not divide model.n_layers = 4"});
    expect_error([] { config_parse(kGood, "job.toml", {"model.attn_pos=\"alibi\""}); },
                 ExitCode::usage,
                 {"model.attn_pos", "nope"});
    expect_error([] { config_parse(kGood, "job.toml", {"kda.gate=\"exp\""}); }, ExitCode::usage, {"kda.gate"});
    expect_error([] { config_parse(kGood, "job.toml", {"kda.gate_lower_bound=0"}); },
                 ExitCode::usage,
                 {"kda.gate_lower_bound = 0 is out of range: must be >= -5 and < 0"});
    expect_error([] { config_parse(kGood, "job.toml", {"kda.gate_lower_bound=-6"}); },
                 ExitCode::usage,
                 {"kda.gate_lower_bound", "out of range"});
    expect_error([] { config_parse(kGood, "job.toml", {"kda.chunk_size=48"}); }, ExitCode::usage, {"kda.chunk_size"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"model.layer_pattern=\"KA\"", "kda.num_v_heads=6"});
        },
        ExitCode::usage,
        {"kda.num_v_heads = 6"});
    expect_error([] { config_parse(kGood, "job.toml", {"kda.num_hedas=2"}); }, ExitCode::usage, {"kda.num_hedas"});
    // An odd head dimension is fine when no attention layer uses RoPE.
    EXPECT_NO_THROW(config_parse(kGood, "job.toml", {"model.head_dim=15", "model.layer_pattern=\"KA\""}));
    expect_error([] { config_parse(kGood, "job.toml", {"model.head_dim=15"}); }, ExitCode::usage, {"RoPE"});
}

// [moe] with nested tables ([moe.quantile], [moe.alarm]); overrides reach nested keys; the resolved TOML round trips.
TEST(Config, MoeSectionWithNestedTables) {
    const std::string toml = std::string(kGood) + R"(
[moe]
enabled = true
num_experts = 32
top_k = 4
balance = "sign_bias"
[moe.quantile]
update_interval = 100
ema = 0.5
[moe.alarm]
action = "stop"
window = 7
)";
    auto c = config_parse(toml, "job.toml", {"moe.quantile.bins=250", "moe.sign_bias.rate=0.01"});
    EXPECT_TRUE(c.model.moe_enabled);
    EXPECT_EQ(c.model.moe.num_experts, 32);
    EXPECT_EQ(c.model.moe.top_k, 4);
    EXPECT_EQ(c.model.moe.balance.mode, MoeBalanceMode::sign_bias);
    EXPECT_EQ(c.model.moe.balance.update_interval, 100);
    EXPECT_EQ(c.model.moe.balance.ema, 0.5);
    EXPECT_EQ(c.model.moe.balance.bins, 250);
    EXPECT_EQ(c.model.moe.balance.sign_rate, 0.01);
    EXPECT_EQ(c.model.moe.alarm.window, 7);
    EXPECT_EQ(c.moe.alarm_action, "stop");
    EXPECT_EQ(c.model.n_moe_layers(), 3);  // n_layers defaults to 4, first_k_dense to 1: layers 1-3
    auto again = config_parse(c.to_toml(), "resolved");
    EXPECT_EQ(again.to_toml(), c.to_toml());
    EXPECT_EQ(again.model.moe.balance.bins, 250);
    EXPECT_EQ(again.model.moe.balance.mode, MoeBalanceMode::sign_bias);
    // An override may create the nested table too.
    EXPECT_EQ(config_parse(kGood, "job.toml", {"moe.alarm.start_step=3"}).model.moe.alarm.start_step, 3);
}

TEST(Config, MoeErrorsNameTheKey) {
    expect_error([] { config_parse(kGood, "job.toml", {"moe.quantile.binz=3"}); },
                 ExitCode::usage,
                 {"moe.quantile.binz", "job.toml"});
    expect_error([] { config_parse(kGood, "job.toml", {"moe.balance=\"loss_free\""}); },
                 ExitCode::usage,
                 {"moe.balance", "quantile"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=6"});
        },
        ExitCode::usage,
        {"moe.top_k = 6", "moe.num_experts = 4"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=4"});
        },
        ExitCode::usage,
        {"moe.balance", "above moe.top_k"});
    expect_error(
        [] { config_parse(kGood, "job.toml", {"moe.num_experts=2048"}); }, ExitCode::usage, {"moe.num_experts"});
    // Quantile Balancing's EMA must stay below 1 (the balancer's contract); other methods ignore it.
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"moe.enabled=true", "moe.quantile.ema=1"});
        },
        ExitCode::usage,
        {"moe.quantile.ema = 1", "[0, 1)", "job.toml"});
    EXPECT_NO_THROW(
        config_parse(kGood, "job.toml", {"moe.enabled=true", "moe.quantile.ema=1", "moe.balance=\"none\""}));
}

// Block AttnRes mixes at most 32 sources (the embedding and one per block): too many blocks is a config error.
TEST(Config, AttnResBlocksThatDoNotFitNameTheKeys) {
    EXPECT_NO_THROW(config_parse(kGood, "job.toml", {"attnres.mode=\"full\"", "model.n_layers=15"}));
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attnres.mode=\"full\"", "model.n_layers=16"});
        },
        ExitCode::usage,
        {"attnres.mode = \"full\"", "model.n_layers = 16", "33 sources", "attnres.block_size", "job.toml"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attnres.mode=\"block\"", "attnres.block_size=2", "model.n_layers=32"});
        },
        ExitCode::usage,
        {"33 sources"});
}

// An enum-valued key: each spelling of nn::EnumNames<E> parses to its value and round-trips through the resolved
// TOML; a bad value names the key and lists the choices in the table's order.
template <typename E>
void expect_enum_key(const char* key, E (*field)(const JobConfig&)) {
    std::string listed;
    for (const auto& [value, name] : mt::nn::EnumNames<E>::names) {
        const auto c = config_parse(kGood, "job.toml", {std::string(key) + "=\"" + name + "\""});
        EXPECT_EQ(field(c), value) << key << " = " << name;
        EXPECT_EQ(field(config_parse(c.to_toml(), "resolved")), value) << key << " = " << name;
        listed += (listed.empty() ? "" : ", ") + std::string(name);
    }
    const std::string needle = "config value " + std::string(key) + " = \"bogus\" is not one of: " + listed;
    expect_error([&] { config_parse(kGood, "job.toml", {std::string(key) + "=\"bogus\""}); },
                 ExitCode::usage,
                 {needle.c_str(), "job.toml"});
}

TEST(Config, EnumKeysParseEverySpelling) {
    using mt::ops::KdaAlgorithm, mt::ops::KdaGateKind, mt::ops::MoeDropPolicy, mt::ops::MoeScore;
    expect_enum_key<KdaGateKind>("kda.gate", [](const JobConfig& c) { return c.model.kda.gate; });
    expect_enum_key<KdaAlgorithm>("kda.algorithm", [](const JobConfig& c) { return c.model.kda.algorithm; });
    expect_enum_key<KdaSave>("kda.save", [](const JobConfig& c) { return c.model.kda.save; });
    expect_enum_key<AttnResMode>("attnres.mode", [](const JobConfig& c) { return c.model.attnres.mode; });
    expect_enum_key<MoeScore>("moe.score", [](const JobConfig& c) { return c.model.moe.score; });
    expect_enum_key<MoeDropPolicy>("moe.drop_policy", [](const JobConfig& c) { return c.model.moe.drop_policy; });
    expect_enum_key<MoeBalanceMode>("moe.balance", [](const JobConfig& c) { return c.model.moe.balance.mode; });
    // The defaults; a value of the wrong type.
    const auto c = config_parse(kGood, "job.toml");
    EXPECT_EQ(c.model.attnres.mode, AttnResMode::off);
    EXPECT_EQ(c.model.moe.balance.mode, MoeBalanceMode::quantile);
    expect_error([] { config_parse(kGood, "job.toml", {"kda.save=\"all\""}); },
                 ExitCode::usage,
                 {"kda.save = \"all\" is not one of: none, states_bf16, tiles, states, workspace"});
    expect_error([] { config_parse(kGood, "job.toml", {"attnres.mode=true"}); },
                 ExitCode::usage,
                 {"attnres.mode must be a string"});
}

// A key that was replaced fails naming itself and what to write instead, from the file and from --set alike.
TEST(Config, RemovedKeysNameTheirReplacement) {
    expect_error([] { config_parse(std::string(kGood) + "[kda]\nsave_tiles = true\n", "job.toml"); },
                 ExitCode::usage,
                 {"config key `kda.save_tiles` was removed: write kda.save = \"tiles\" instead", "job.toml"});
    const std::pair<const char*, const char*> kOverrides[] = {
        {"kda.save_states=false", "`kda.save_states` was removed: write kda.save = \"states\" instead"},
        {"kda.save_workspace=true", "`kda.save_workspace` was removed: write kda.save = \"workspace\" instead"}};
    for (const auto& [set, needle] : kOverrides)
        expect_error([&] { config_parse(kGood, "job.toml", {set}); }, ExitCode::usage, {needle});
    // Only the key that existed is named as removed: residual under [train] (kGood's last table) is a plain typo.
    expect_error([] { config_parse(std::string(kGood) + "residual = \"block_attnres\"\n", "job.toml"); },
                 ExitCode::usage,
                 {"unknown config key `train.residual`"});
    try {
        config_parse(kGood, "job.toml", {"model.residual=\"block_attnres\""});
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("config key `model.residual` was removed: write attnres.mode = "
                                             "\"off\" | \"block\" | \"full\" instead"),
                  std::string::npos)
            << e.what();
        EXPECT_NE(e.hint().find("\"block_attnres\" is \"block\""), std::string::npos) << e.hint();
    }
}

// A checkpoint of an older moetrain spells the residual mode twice and kda.save as three booleans: its config reads
// in today's keys, so resume compares it key by key and grad-dump parses it.
TEST(Config, SavedConfigOfAnOlderVersionUpgrades) {
    const JobConfig now = config_parse(kGood, "job.toml", {"kda.save=\"states\"", "attnres.mode=\"block\""});
    std::string old = now.to_toml();
    const std::string save_line = "save = 'states'\n";
    ASSERT_NE(old.find(save_line), std::string::npos) << old;
    old.replace(
        old.find(save_line), save_line.size(), "save_states = true\nsave_tiles = false\nsave_workspace = false\n");
    old.replace(old.find("[model]\n"), 8, "[model]\nresidual = 'block_attnres'\n");
    expect_error([&] { config_parse(old, "manifest.json"); }, ExitCode::usage, {"kda.save"});
    const JobConfig upgraded = config_parse(mt::train::config_upgrade_saved(old), "manifest.json");
    EXPECT_EQ(upgraded.to_toml(), now.to_toml());
    EXPECT_TRUE(mt::train::config_drift(old, now.to_toml()).empty());
    // The highest level set wins; none set is "none"; a config in today's keys comes back as it was.
    std::string all_off = old;
    all_off.replace(all_off.find("save_states = true"), 18, "save_states = false");
    EXPECT_EQ(config_parse(mt::train::config_upgrade_saved(all_off), "m").model.kda.save, KdaSave::none);
    std::string both = old;
    both.replace(both.find("save_workspace = false"), 22, "save_workspace = true");
    EXPECT_EQ(config_parse(mt::train::config_upgrade_saved(both), "m").model.kda.save, KdaSave::workspace);
    EXPECT_EQ(mt::train::config_upgrade_saved(now.to_toml()), now.to_toml());
    // Drift still shows a real difference behind a renamed key.
    const auto drift = mt::train::config_drift(all_off, now.to_toml());
    ASSERT_EQ(drift.size(), 1u);
    EXPECT_EQ(drift[0].key, "kda.save");
    EXPECT_EQ(drift[0].saved, "'none'");
    EXPECT_EQ(drift[0].now, "'states'");
}

// Every schema row says what it is for, keys are unique, and the reference page has a row per key and per removed key.
TEST(Config, EverySchemaRowHasHelpAndADocsRow) {
    JobConfig c;
    const std::vector<mt::train::Field> rows = mt::train::config_schema(c);
    const std::string docs = mt::train::config_docs();
    std::set<std::string> keys;
    for (const auto& f : rows) {
        EXPECT_FALSE(f.help.empty()) << f.key;
        EXPECT_TRUE(keys.insert(f.key).second) << f.key << " twice";
        EXPECT_NE(docs.find("| `" + f.key + "` |"), std::string::npos) << f.key;
        if (std::holds_alternative<mt::train::EnumField>(f.ptr)) {
            EXPECT_GE(f.choices.size(), 2u) << f.key;
        }
    }
    for (const auto& r : mt::train::config_removed_keys()) {
        EXPECT_EQ(keys.count(r.key), 0u) << r.key;
        EXPECT_NE(docs.find("| `" + std::string(r.key) + "` |"), std::string::npos) << r.key;
    }
    EXPECT_NE(docs.find("| `kda.save` | string | `\"none\"` | none, states_bf16, tiles, states, workspace |"),
              std::string::npos);
    EXPECT_NE(docs.find("| `moe.top_k` | int | 4 | 1..1024 |"), std::string::npos);
    EXPECT_NE(docs.find("| `kda.gate_lower_bound` | float | -5 | [-5, 0) |"), std::string::npos);
}

// data.document_mask: on by default in a job config (a bare nn::ModelConfig leaves it off); data.eot_token resolves
// to the tokenizer's EOT unless set, and an EOT outside the vocabulary (also the default one: the bytes tokenizer's
// 256 in a vocabulary of 100) and a missing SentencePiece model are refused naming the key or the file.
TEST(Config, DocumentMaskResolvesTheEotTokenAndRefusesBadInput) {
    EXPECT_TRUE(config_parse(kGood, "job.toml").model.document_mask);
    EXPECT_FALSE(mt::nn::ModelConfig{}.document_mask);
    EXPECT_FALSE(config_parse(kGood, "job.toml", {"data.document_mask=false"}).model.document_mask);
    expect_error([] { config_parse(kGood, "job.toml", {"model.vocab_size=100"}); },
                 ExitCode::usage,
                 {"data.eot_token = 256", "model.vocab_size = 100"});
    const JobConfig on = config_parse(kGood, "job.toml", {"data.document_mask=true", "model.vocab_size=300"});
    EXPECT_TRUE(on.model.document_mask);
    EXPECT_EQ(on.model.eot_token, 256);  // the bytes tokenizer's EOT
    EXPECT_EQ(config_parse(kGood, "job.toml", {"data.document_mask=true", "data.eot_token=5"}).model.eot_token, 5);
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"data.document_mask=true", "data.eot_token=300"});
        },
        ExitCode::usage,
        {"data.eot_token = 300", "model.vocab_size = 257"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"data.document_mask=true", "data.tokenizer=\"/nonexistent/sp.model\""});
        },
        ExitCode::data,
        {"/nonexistent/sp.model"});
    // Every mixer takes the map on the GPU too (KDA by running each document as its own sequence).
    EXPECT_TRUE(
        config_parse(kGood, "job.toml", {"data.document_mask=true", "run.device=\"cuda\""}).model.document_mask);
    EXPECT_TRUE(config_parse(
                    kGood, "job.toml", {"data.document_mask=true", "run.device=\"cuda\"", "model.layer_pattern=\"KA\""})
                    .model.document_mask);
}

// long.segments / long.segment_tokens set the model's segments; segment tokens that are not KDA chunk multiples in a
// model with KDA layers, both keys at once, segment_recompute = false and MoE that is per batch (a capacity factor,
// the auxiliary loss) exit 2 naming the key.
TEST(Config, SegmentKeysAndBadInput) {
    EXPECT_EQ(config_parse(kGood, "job.toml", {"long.segments=4"}).model.segments.count, 4);
    EXPECT_EQ(config_parse(kGood, "job.toml", {"long.segment_tokens=100"}).model.segments.tokens, 100);
    EXPECT_EQ(config_parse(kGood, "job.toml", {"long.segment_tokens=128", "model.layer_pattern=\"KA\""})
                  .model.segments.tokens,
              128);
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"long.segment_tokens=100", "model.layer_pattern=\"KA\""});
        },
        ExitCode::usage,
        {"long.segment_tokens = 100", "kda.chunk_size = 64"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"long.segments=2", "long.segment_tokens=64"});
        },
        ExitCode::usage,
        {"long.segments = 2", "long.segment_tokens = 64"});
    expect_error([] { config_parse(kGood, "job.toml", {"long.segments=0"}); }, ExitCode::usage, {"long.segments"});
    EXPECT_TRUE(config_parse(kGood, "job.toml", {"long.segments=2", "long.offload_kv=true"}).model.segments.offload_kv);
    expect_error([] { config_parse(kGood, "job.toml", {"long.offload_kv=true"}); },
                 ExitCode::usage,
                 {"long.offload_kv = true needs sequence segments"});
    expect_error([] { config_parse(kGood, "job.toml", {"long.segment_recompute=false"}); },
                 ExitCode::usage,
                 {"long.segment_recompute = false"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"long.segments=2", "moe.enabled=true", "moe.capacity_factor=1.25"});
        },
        ExitCode::usage,
        {"long.segments", "moe.capacity_factor = 1.25"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"long.segments=2", "moe.enabled=true", "moe.balance=\"aux_loss\""});
        },
        ExitCode::usage,
        {"long.segments", "aux_loss"});
}

// attn.*: the window layers are read as 1-based layer numbers; a window above model.max_seq_len, a layer past
// model.n_layers or on a KDA layer, and too many global tokens exit 2 naming the key.
TEST(Config, WindowAttentionKeysAndBadInput) {
    const JobConfig c =
        config_parse(kGood,
                     "job.toml",
                     {"attn.window=16", "attn.window_layers=[1, 3]", "attn.global_tokens=2", "attn.sink_logit=true"});
    EXPECT_EQ(c.model.attn.window, 16);
    EXPECT_EQ(c.model.attn.window_layers, (std::vector<int64_t>{1, 3}));
    EXPECT_TRUE(c.model.layer_is_window(0));
    EXPECT_FALSE(c.model.layer_is_window(1));
    EXPECT_TRUE(c.model.layer_is_window(2));
    EXPECT_NE(c.to_toml().find("window_layers = [ 1, 3 ]"), std::string::npos) << c.to_toml();
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attn.window=1000", "attn.window_layers=[1]"});
        },
        ExitCode::usage,
        {"attn.window = 1000", "model.max_seq_len"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attn.window_layers=[5]", "attn.window=16"});
        },
        ExitCode::usage,
        {"attn.window_layers", "layer 5"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attn.window_layers=[0]", "attn.window=16"});
        },
        ExitCode::usage,
        {"attn.window_layers"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attn.window_layers=[1]", "model.layer_pattern=\"KA\"", "attn.window=16"});
        },
        ExitCode::usage,
        {"attn.window_layers", "KDA"});
    expect_error(
        [] { config_parse(kGood, "job.toml", {"attn.global_tokens=33"}); }, ExitCode::usage, {"attn.global_tokens"});
    expect_error(
        [] {
            config_parse(kGood, "job.toml", {"attn.window_layers=[\"a\"]", "attn.window=16"});
        },
        ExitCode::usage,
        {"attn.window_layers", "integers"});
}
